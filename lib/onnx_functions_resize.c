/* ONNX function body of pippin::ResizeGrad (lib/ops/resize.c), the adjoint
 * of Resize / Upsample in modes nearest and linear. Both are separable: along
 * each axis a, y = x contracted with a weight matrix M_a [out_a, in_a]. The
 * body gets M_a from ONNX Runtime's own Resize: resizing the identity
 * [in_a, in_a] along its second axis with the forward's scale (or size) and
 * modes gives M_a^T, so every coordinate and rounding rule is Resize's; dy
 * is then contracted with each in turn (Einsum). The rank is written in. */
#include <stdio.h>
#include <string.h>

#include "onnx_functions.h"

#include "status_internal.h"

/* How the forward passed its scales (lib/grad_rules_resize.c's 'form'). */
enum { FORM_RESIZE, FORM_SCALES_INPUT, FORM_SCALES_ATTR };

/* ResizeGrad(dy, shape_x, the forward's inputs 1..) */
static pp_status resize_grad(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    int64_t form = pp_node_attr_int(n, "form", FORM_RESIZE);
    int r = pp_fn_shape_len(g, n, 1) >= 0 ? pp_fn_shape_len(g, n, 1) : pp_fn_in_rank(g, n, 0);
    /* else the length of scales or sizes (an empty scales is 0 long) */
    for (int k = 3; k <= 4 && r < 1 && form == FORM_RESIZE; k++) r = pp_fn_shape_len(g, n, k);
    if (r < 0 && form == FORM_SCALES_INPUT) r = pp_fn_shape_len(g, n, 2);
    if (r < 0 && form == FORM_SCALES_ATTR && pp_node_attr(n, "scales")) r = pp_node_attr(n, "scales")->n;
    if (r < 1 || r > 8) return pp_error(PP_ERR_UNSUPPORTED, "an unknown rank");
    if (pp_node_attr(n, "axes")) return pp_error(PP_ERR_UNSUPPORTED, "an axes attribute (opset 18 Resize)");
    const char *kar = pp_node_attr_string(n, "keep_aspect_ratio_policy", "stretch");
    if (strcmp(kar, "stretch") != 0) return pp_error(PP_ERR_UNSUPPORTED, "keep_aspect_ratio_policy '%s'", kar);
    /* sizes (form 0 with a sizes input) or scales, as a 1-D tensor per axis */
    int use_sizes = form == FORM_RESIZE && pp_fn_has_in(n, 4);
    if (form == FORM_RESIZE) {
        b->inputs = "dy, shape_x, roi, scales, sizes";
        if (!use_sizes && !pp_fn_has_in(n, 3)) return pp_error(PP_ERR_UNSUPPORTED, "no scales nor sizes");
    } else if (form == FORM_SCALES_INPUT) {
        b->inputs = "dy, shape_x, scales";
    } else {
        b->inputs = "dy, shape_x";
        pp_fn_line(b, "scales = Constant<value_floats=@scales:floats>()");
    }
    b->outputs = "dx";
    /* the modes, by reference where the node sets them (the defaults are
     * Resize's own otherwise) */
    char modes[256] = "";
    if (form == FORM_RESIZE) {
        static const char *const names[] = {"mode", "coordinate_transformation_mode", "nearest_mode"};
        size_t len = 0;
        for (int k = 0; k < 3; k++)
            if (pp_node_attr(n, names[k]))
                len += (size_t)snprintf(modes + len, sizeof modes - len, "%s%s=@%s:s", len ? ", " : "<",
                                        names[k], names[k]);
        if (len) snprintf(modes + len, sizeof modes - len, ">");
    } else { /* Resize 10 and Upsample: asymmetric coordinates, nearest rounds down */
        const char *mode = pp_node_attr_string(n, "mode", "nearest");
        snprintf(modes, sizeof modes, "<mode='%s', coordinate_transformation_mode='asymmetric', nearest_mode='floor'>",
                 strcmp(mode, "nearest") ? "linear" : "nearest");
    }
    pp_fn_float(b, "fone", 1);
    pp_fn_line(b, "one1 = Constant<value_floats=[1.0]>()");
    char cur[16] = "dy", next[16];
    for (int a = 0; a < r; a++) {
        pp_fn_line(b, "a%d = Constant<value_ints=[%d]>()", a, a);
        pp_fn_line(b, "a%de = Constant<value_ints=[%d]>()", a, a + 1);
        pp_fn_line(b, "in%d = Slice(shape_x, a%d, a%de)", a, a, a);
        pp_fn_line(b, "sq%d = Concat<axis=0>(in%d, in%d)", a, a, a);
        pp_fn_line(b, "z%d = ConstantOfShape(sq%d)", a, a);
        pp_fn_line(b, "e%d = EyeLike(z%d)", a, a);
        if (use_sizes) {
            pp_fn_line(b, "o%d = Slice(sizes, a%d, a%de)", a, a, a);
            pp_fn_line(b, "sz%d = Concat<axis=0>(in%d, o%d)", a, a, a);
            pp_fn_line(b, "m%d = Resize%s(e%d, , , sz%d)", a, modes, a, a);
        } else {
            pp_fn_line(b, "s%d = Slice(scales, a%d, a%de)", a, a, a);
            pp_fn_line(b, "sf%d = Cast<to=1>(s%d)", a, a);
            pp_fn_line(b, "sc%d = Concat<axis=0>(one1, sf%d)", a, a);
            pp_fn_line(b, "m%d = Resize%s(e%d, , sc%d)", a, modes, a, a);
        }
        /* cur's axis a (length out_a, 'y') against m [in_a, out_a] ('zy') */
        char lhs[9], out[9];
        for (int d = 0; d < r; d++) lhs[d] = out[d] = (char)('a' + d);
        lhs[a] = 'y';
        out[a] = 'z';
        lhs[r] = out[r] = '\0';
        if (a + 1 < r) snprintf(next, sizeof next, "g%d", a);
        else snprintf(next, sizeof next, "dx");
        pp_fn_line(b, "%s = Einsum<equation='%s,zy->%s'>(%s, m%d)", next, lhs, out, cur, a);
        memcpy(cur, next, sizeof cur);
    }
    return PP_OK;
}

const pp_fn_entry pp_fn_resize[] = {
    {"ResizeGrad", resize_grad},
    {NULL, NULL},
};
