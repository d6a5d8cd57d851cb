/* ONNX function bodies of the convolution and pooling gradients
 * (lib/ops/conv.c, pool.c). The geometry (pads, strides, dilations, group)
 * differs from node to node, so it reaches the body by attribute reference;
 * the rank is written in (one per model in practice). auto_pad other than
 * NOTSET or VALID has no body: its pads depend on the shapes. */
#include <stdio.h>
#include <string.h>

#include "onnx_functions.h"

#include "status_internal.h"

static pp_status geometry_ok(const pp_node *n, int rank) {
    const char *ap = pp_node_attr_string(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") != 0 && strcmp(ap, "VALID") != 0)
        return pp_error(PP_ERR_UNSUPPORTED, "auto_pad '%s' (the body takes explicit pads)", ap);
    if (rank < 3) return pp_error(PP_ERR_UNSUPPORTED, "an unknown or too small rank");
    return PP_OK;
}

/* "2, 3, ..., rank-1" */
static const char *spatial_axes(int rank, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int d = 2; d < rank && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", d > 2 ? ", " : "", d);
    return buf;
}

/* Lines: dst = src cut to the spatial dims of shape (a 1-D shape tensor). */
static void crop_to(pp_fn_body *b, int rank, const char *src, const char *shape, const char *dst) {
    char ax[64], zeros[64];
    size_t len = 0;
    zeros[0] = '\0';
    for (int d = 2; d < rank; d++) len += (size_t)snprintf(zeros + len, sizeof zeros - len, "%s0", d > 2 ? ", " : "");
    pp_fn_line(b, "c_ax = Constant<value_ints=[%s]>()", spatial_axes(rank, ax, sizeof ax));
    pp_fn_line(b, "c_st = Constant<value_ints=[%s]>()", zeros);
    pp_fn_line(b, "c_two = Constant<value_ints=[2]>()");
    pp_fn_line(b, "c_big = Constant<value_ints=[9223372036854775807]>()");
    pp_fn_line(b, "c_sp = Slice(%s, c_two, c_big)", shape);
    pp_fn_line(b, "%s = Slice(%s, c_st, c_sp, c_ax)", dst, src);
}

/* ConvGradInput(dy, W, shape_x): ConvTranspose of dy with W. dy gets one
 * zero row at the end of each spatial axis so the result covers all of x
 * (x's trailing rows that no window reached, output_padding's, get 0) and is
 * then cut to x's size. */
static pp_status conv_input(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    int r = pp_fn_in_rank(g, n, 1) >= 0 ? pp_fn_in_rank(g, n, 1) : pp_fn_shape_len(g, n, 2);
    PP_TRY(geometry_ok(n, r));
    b->inputs = "dy, w, shape_x";
    b->outputs = "dx";
    char pads[128];
    size_t len = 0;
    for (int d = 0; d < 2 * r; d++)
        len += (size_t)snprintf(pads + len, sizeof pads - len, "%s%d", d ? ", " : "", d >= r + 2 ? 1 : 0);
    pp_fn_line(b, "pv = Constant<value_ints=[%s]>()", pads);
    pp_fn_line(b, "dyp = Pad(dy, pv)");
    pp_fn_line(b, "full = ConvTranspose<pads=@pads:ints, strides=@strides:ints, dilations=@dilations:ints, "
                  "group=@group:i>(dyp, w)");
    crop_to(b, r, "full", "shape_x", "dx");
    return PP_OK;
}

/* Lines: dw [O, Cg, k] with dw[o, c, k] = sum over n, p of kern[n, o, p]
 * src_pad[n, c, p s + k d], src [N, G*Cg, sp] (pads, strides, dilations and
 * group by reference): a Conv of src (channels of each group moved to the
 * batch) with kern as the kernel, strides and dilations swapped, grouped by
 * the forward's groups, cut to W's kernel size. */
static void weight_lines(pp_fn_body *b, int r, const char *src, const char *kern) {
    char p1[64], p2[64];
    size_t l1 = 0, l2 = 0;
    /* [N, G, Cg, sp] -> [Cg, G, N, sp]; [N, O, sp] <-> [O, N, sp] */
    l1 += (size_t)snprintf(p1, sizeof p1, "2, 1, 0");
    l2 += (size_t)snprintf(p2, sizeof p2, "1, 0");
    for (int d = 2; d < r; d++) {
        l1 += (size_t)snprintf(p1 + l1, sizeof p1 - l1, ", %d", d + 1);
        l2 += (size_t)snprintf(p2 + l2, sizeof p2 - l2, ", %d", d);
    }
    pp_fn_line(b, "i0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "i1 = Constant<value_ints=[1]>()");
    pp_fn_line(b, "i2 = Constant<value_ints=[2]>()");
    pp_fn_line(b, "big = Constant<value_ints=[9223372036854775807]>()");
    pp_fn_line(b, "sx = Shape(%s)", src);
    pp_fn_line(b, "nb = Slice(sx, i0, i1)");
    pp_fn_line(b, "ch = Slice(sx, i1, i2)");
    pp_fn_line(b, "sp = Slice(sx, i2, big)");
    pp_fn_line(b, "cg = Slice(shape_w, i1, i2)");
    pp_fn_line(b, "grp = Div(ch, cg)");
    pp_fn_line(b, "s5 = Concat<axis=0>(nb, grp, cg, sp)");
    pp_fn_line(b, "x5 = Reshape(%s, s5)", src);
    pp_fn_line(b, "xt = Transpose<perm=[%s]>(x5)", p1);
    pp_fn_line(b, "gn = Mul(grp, nb)");
    pp_fn_line(b, "s4 = Concat<axis=0>(cg, gn, sp)");
    pp_fn_line(b, "xg = Reshape(xt, s4)");
    pp_fn_line(b, "dyt = Transpose<perm=[%s]>(%s)", p2, kern);
    pp_fn_line(b, "cw = Conv<pads=@pads:ints, strides=@dilations:ints, dilations=@strides:ints, "
                  "group=@group:i>(xg, dyt)");
    pp_fn_line(b, "wt = Transpose<perm=[%s]>(cw)", p2);
    crop_to(b, r, "wt", "shape_w", "dw");
}

/* Lines: db = out summed over the batch and spatial dims. */
static void bias_lines(pp_fn_body *b, int r, const char *out) {
    char p3[64], ax[64];
    snprintf(p3, sizeof p3, "0, %s", spatial_axes(r, ax, sizeof ax));
    pp_fn_line(b, "rb = Constant<value_ints=[%s]>()", p3);
    pp_fn_line(b, "db = ReduceSum<keepdims=0>(%s, rb)", out);
}

/* ConvGradWeight(dy, x, shape_w) -> dW, dB. */
static pp_status conv_weight(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    int r = pp_fn_shape_len(g, n, 2) >= 0 ? pp_fn_shape_len(g, n, 2) : pp_fn_in_rank(g, n, 1);
    PP_TRY(geometry_ok(n, r));
    b->inputs = "dy, x, shape_w";
    b->outputs = "dw, db";
    weight_lines(b, r, "x", "dy");
    bias_lines(b, r, "dy");
    return PP_OK;
}

/* ConvTranspose X [N, C, in] * W [C, M/G, k] -> Y [N, M, out] is the input
 * gradient of the Conv Y -> X with the same W and geometry (lib/ops/
 * conv_transpose.c). Its explicit pads are that Conv's, output_padding only
 * adds rows at Y's end, so with output_shape or auto_pad SAME (pads from the
 * shapes) there is no body. */
static pp_status ct_geometry_ok(const pp_node *n, int rank) {
    if (pp_node_attr(n, "output_shape"))
        return pp_error(PP_ERR_UNSUPPORTED, "output_shape (the body takes explicit pads)");
    return geometry_ok(n, rank);
}

/* ConvTransposeGradInput(dY, W, shape_x) -> dX = Conv(dY, W) with the
 * forward's geometry, cut to X's size (output_padding's rows make the Conv
 * a step longer where output_padding >= stride). */
static pp_status ct_input(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    int r = pp_fn_in_rank(g, n, 1) >= 0 ? pp_fn_in_rank(g, n, 1) : pp_fn_shape_len(g, n, 2);
    PP_TRY(ct_geometry_ok(n, r));
    b->inputs = "dy, w, shape_x";
    b->outputs = "dx";
    pp_fn_line(b, "full = Conv<pads=@pads:ints, strides=@strides:ints, dilations=@dilations:ints, "
                  "group=@group:i>(dy, w)");
    crop_to(b, r, "full", "shape_x", "dx");
    return PP_OK;
}

/* ConvTransposeGradWeight(dY, X, shape_w) -> dW, dB: Conv's weight
 * gradient with X in the role of dy and dY in the role of the Conv's input;
 * dB sums dY. */
static pp_status ct_weight(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    int r = pp_fn_shape_len(g, n, 2) >= 0 ? pp_fn_shape_len(g, n, 2) : pp_fn_in_rank(g, n, 1);
    PP_TRY(ct_geometry_ok(n, r));
    b->inputs = "dy, x, shape_w";
    b->outputs = "dw, db";
    weight_lines(b, r, "dy", "x");
    bias_lines(b, r, "dy");
    return PP_OK;
}

/* MaxPoolGrad(dy, indices, shape_x): indices are MaxPool's, flat over all of
 * x; dy is scatter-added there. */
static pp_status maxpool(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    b->inputs = "dy, indices, shape_x";
    b->outputs = "dx";
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "nx = ReduceProd<keepdims=1>(shape_x)");
    pp_fn_line(b, "zeros = ConstantOfShape(nx)");
    pp_fn_line(b, "ix = Reshape(indices, m1)");
    pp_fn_line(b, "gf = Reshape(dy, m1)");
    pp_fn_line(b, "acc = ScatterElements<axis=0, reduction='add'>(zeros, ix, gf)");
    pp_fn_line(b, "dx = Reshape(acc, shape_x)");
    return PP_OK;
}

/* "v, v, ..." (k times) */
static const char *repeat(int k, int v, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < k && len < cap; i++) len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", v);
    return buf;
}

/* AveragePoolGrad(dy, shape_x): dx = the adjoint of the pool, dy / count
 * spread over each window. count per window (lib/ops/pool.c): its taps
 * inside x (count_include_pad 0) or inside the padded x (1), never those
 * past the pads that ceil_mode's last window reaches: a Conv of ones
 * with a mask of x padded with count_include_pad and then with a stride of
 * zeros (room for ceil_mode's window), cut to dy's size. The spread is a
 * ConvTranspose with a kernel of ones, cut from the pads on to x's size.
 * The geometry is the node's by reference, its defaults when absent. */
static pp_status avgpool(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    const int64_t *ks = NULL;
    int r = pp_node_attr_ints(n, "kernel_shape", &ks);
    if (r < 1 || r > 3) return pp_error(PP_ERR_UNSUPPORTED, "kernel_shape of %d dims", r);
    PP_TRY(geometry_ok(n, r + 2));
    int valid = strcmp(pp_node_attr_string(n, "auto_pad", "NOTSET"), "VALID") == 0;
    int has_st = pp_node_attr(n, "strides") != NULL, has_dl = pp_node_attr(n, "dilations") != NULL;
    b->inputs = "dy, shape_x";
    b->outputs = "dx";
    char geo[96] = "", buf[64], ax[64];
    snprintf(geo, sizeof geo, "%s%s%s", has_st ? "strides=@strides:ints" : "", has_st && has_dl ? ", " : "",
             has_dl ? "dilations=@dilations:ints" : "");
    char open[8] = "", close[8] = "";
    if (geo[0]) snprintf(open, sizeof open, "<"), snprintf(close, sizeof close, ">");
    pp_fn_float(b, "fone", 1);
    pp_fn_line(b, "ks = Constant<value_ints=@kernel_shape:ints>()");
    if (has_st) pp_fn_line(b, "st = Constant<value_ints=@strides:ints>()");
    else pp_fn_line(b, "st = Constant<value_ints=[%s]>()", repeat(r, 1, buf, sizeof buf));
    if (pp_node_attr(n, "pads") && !valid) pp_fn_line(b, "pd = Constant<value_ints=@pads:ints>()");
    else pp_fn_line(b, "pd = Constant<value_ints=[%s]>()", repeat(2 * r, 0, buf, sizeof buf));
    /* count_include_pad as 0.0 or 1.0 (ArgMax's select_last_index: 0 when absent) */
    pp_fn_line(b, "cv = Constant<value_floats=[1.0, 1.0]>()");
    pp_fn_line(b, "ci = ArgMax<axis=0, keepdims=0, select_last_index=@count_include_pad:i>(cv)");
    pp_fn_line(b, "cip = Cast<to=1>(ci)");
    pp_fn_line(b, "c0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "c2 = Constant<value_ints=[2]>()");
    pp_fn_line(b, "cr = Constant<value_ints=[%d]>()", r);
    pp_fn_line(b, "c2r = Constant<value_ints=[%d]>()", 2 * r);
    pp_fn_line(b, "big = Constant<value_ints=[9223372036854775807]>()");
    pp_fn_line(b, "z2 = Constant<value_ints=[0, 0]>()");
    pp_fn_line(b, "o2 = Constant<value_ints=[1, 1]>()");
    pp_fn_line(b, "zr = Constant<value_ints=[%s]>()", repeat(r, 0, buf, sizeof buf));
    pp_fn_line(b, "axs = Constant<value_ints=[%s]>()", spatial_axes(r + 2, ax, sizeof ax));
    pp_fn_line(b, "pb = Slice(pd, c0, cr)");
    pp_fn_line(b, "pe = Slice(pd, cr, c2r)");
    pp_fn_line(b, "insp = Slice(shape_x, c2, big)");
    pp_fn_line(b, "sdy = Shape(dy)");
    pp_fn_line(b, "outsp = Slice(sdy, c2, big)");
    /* the count of each window */
    pp_fn_line(b, "msh = Concat<axis=0>(o2, insp)");
    pp_fn_line(b, "ones = Expand(fone, msh)");
    pp_fn_line(b, "pads1 = Concat<axis=0>(z2, pb, z2, pe)");
    pp_fn_line(b, "mask1 = Pad(ones, pads1, cip)");
    pp_fn_line(b, "pads2 = Concat<axis=0>(z2, zr, z2, st)");
    pp_fn_line(b, "mask = Pad(mask1, pads2)");
    pp_fn_line(b, "ksh = Concat<axis=0>(o2, ks)");
    pp_fn_line(b, "kone = Expand(fone, ksh)");
    pp_fn_line(b, "cfull = Conv%s%s%s(mask, kone)", open, geo, close);
    pp_fn_line(b, "cnt = Slice(cfull, zr, outsp, axs)");
    pp_fn_line(b, "cntc = Max(cnt, fone)");
    pp_fn_line(b, "share = Div(dy, cntc)");
    /* spread over the windows, [N*C, 1, padded x...] */
    pp_fn_line(b, "m1 = Constant<value_ints=[-1, 1]>()");
    pp_fn_line(b, "gsh = Concat<axis=0>(m1, outsp)");
    pp_fn_line(b, "gb = Reshape(share, gsh)");
    pp_fn_line(b, "spread = ConvTranspose%s%s%s(gb, kone)", open, geo, close);
    pp_fn_line(b, "ssp = Shape(spread)");
    pp_fn_line(b, "lsp = Slice(ssp, c2, big)");
    pp_fn_line(b, "end = Add(pb, insp)");
    pp_fn_line(b, "short = Sub(end, lsp)");
    pp_fn_line(b, "tail = Max(short, zr)");
    pp_fn_line(b, "pads3 = Concat<axis=0>(z2, zr, z2, tail)");
    pp_fn_line(b, "full = Pad(spread, pads3)");
    pp_fn_line(b, "cut = Slice(full, pb, end, axs)");
    pp_fn_line(b, "dx = Reshape(cut, shape_x)");
    return PP_OK;
}

const pp_fn_entry pp_fn_conv[] = {
    {"ConvGradInput", conv_input},
    {"ConvGradWeight", conv_weight},
    {"ConvTransposeGradInput", ct_input},
    {"ConvTransposeGradWeight", ct_weight},
    {"MaxPoolGrad", maxpool},
    {"AveragePoolGrad", avgpool},
    {NULL, NULL},
};
