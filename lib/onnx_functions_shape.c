/* ONNX function bodies of the data-movement gradients (lib/ops/grad_shape.c,
 * misc.c, pad.c, pool.c's global pools, pippin.c): SumToShape,
 * ExpandReduced, GatherGrad, GatherElementsGrad, SliceGrad, TileGrad,
 * PadGrad, SplitLike, the global pool gradients and the PipeSplit marker.
 * Slice, Tile and Pad gradients run the forward op on a tensor of x's flat
 * positions and scatter-add dy to the positions it read, so every index rule
 * of the forward (negative, clamped, stepped, reflected) is ONNX's own. */
#include <stdio.h>
#include <string.h>

#include "onnx_functions.h"

#include "status_internal.h"

const char *pp_fn_swap_last(int rank, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int d = 0; d < rank && len < cap; d++) {
        int p = d == rank - 2 ? rank - 1 : d == rank - 1 ? rank - 2 : d;
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", d ? ", " : "", p);
    }
    return buf;
}

/* dst = ReduceSum over the axes where shape (padded with leading 1s to src's
 * rank) differs from src's shape, reshaped to shape. */
void pp_fn_sum_to(pp_fn_body *b, const char *t, const char *src, const char *shape, const char *dst) {
    pp_fn_line(b, "%sgs = Shape(%s)", t, src);
    pp_fn_line(b, "%sgr = Shape(%sgs)", t, t);
    pp_fn_line(b, "%str = Shape(%s)", t, shape);
    pp_fn_line(b, "%sd = Sub(%sgr, %str)", t, t, t);
    pp_fn_line(b, "%sone = Constant<value_ints=[1]>()", t);
    pp_fn_line(b, "%sones = Expand(%sone, %sd)", t, t, t);
    pp_fn_line(b, "%spt = Concat<axis=0>(%sones, %s)", t, t, shape);
    pp_fn_line(b, "%seq = Equal(%spt, %sgs)", t, t, t);
    pp_fn_line(b, "%sne = Not(%seq)", t, t);
    pp_fn_line(b, "%snz = NonZero(%sne)", t, t);
    pp_fn_line(b, "%sm1 = Constant<value_ints=[-1]>()", t);
    pp_fn_line(b, "%saxes = Reshape(%snz, %sm1)", t, t, t);
    pp_fn_line(b, "%sr = ReduceSum<keepdims=1, noop_with_empty_axes=1>(%s, %saxes)", t, src, t);
    pp_fn_line(b, "%s = Reshape(%sr, %s)", dst, t, shape);
}

static pp_status sum_to_shape(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    b->inputs = "grad, shape";
    b->outputs = "out";
    pp_fn_sum_to(b, "", "grad", "shape", "out");
    return PP_OK;
}

/* ExpandReduced(dy, shape_x[, axes]): dy reshaped to x's shape with 1 at the
 * reduced axes, broadcast to x's shape, divided by the count for a mean. */
static pp_status expand_reduced(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, shape_x, axes_in";
    b->outputs = "dx";
    const int64_t *attr_axes = NULL;
    int n_attr = pp_node_attr_ints(n, "axes", &attr_axes);
    int given = pp_fn_has_in(n, 2) || n_attr > 0;
    if (!given && pp_node_attr_int(n, "noop_with_empty_axes", 0)) {
        pp_fn_line(b, "dx = Reshape(dy, shape_x)");
        return PP_OK;
    }
    pp_fn_line(b, "one = Constant<value_int=1>()");
    if (!given) {
        pp_fn_line(b, "so = Shape(shape_x)");
        pp_fn_line(b, "kept = Expand(one, so)");
    } else {
        if (pp_fn_has_in(n, 2)) {
            pp_fn_line(b, "ax = Cast<to=7>(axes_in)");
        } else {
            char list[256];
            size_t len = 0;
            for (int i = 0; i < n_attr && len < sizeof list; i++)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%lld", i ? ", " : "",
                                        (long long)attr_axes[i]);
            pp_fn_line(b, "ax = Constant<value_ints=[%s]>()", list);
        }
        pp_fn_line(b, "zero = Constant<value_int=0>()");
        pp_fn_line(b, "r = Size(shape_x)");
        pp_fn_line(b, "neg = Less(ax, zero)");
        pp_fn_line(b, "axr = Add(ax, r)");
        pp_fn_line(b, "axn = Where(neg, axr, ax)");
        pp_fn_line(b, "pos = Range(zero, r, one)");
        pp_fn_line(b, "c1 = Constant<value_ints=[1]>()");
        pp_fn_line(b, "c0 = Constant<value_ints=[0]>()");
        pp_fn_line(b, "pc = Unsqueeze(pos, c1)");
        pp_fn_line(b, "ar = Unsqueeze(axn, c0)");
        pp_fn_line(b, "hit = Equal(pc, ar)");
        pp_fn_line(b, "hi = Cast<to=7>(hit)");
        pp_fn_line(b, "cnt = ReduceSum<keepdims=0>(hi, c1)");
        pp_fn_line(b, "red = Greater(cnt, zero)");
        pp_fn_line(b, "kept = Where(red, one, shape_x)");
    }
    pp_fn_line(b, "v = Reshape(dy, kept)");
    const char *res = pp_node_attr_int(n, "mean", 0) ? "e" : "dx";
    pp_fn_line(b, "%s = Expand(v, shape_x)", res);
    if (strcmp(res, "e") == 0) {
        pp_fn_line(b, "nx = Size(e)");
        pp_fn_line(b, "nd = Size(dy)");
        pp_fn_line(b, "nxf = Cast<to=1>(nx)");
        pp_fn_line(b, "ndf = Cast<to=1>(nd)");
        pp_fn_line(b, "c = Div(nxf, ndf)");
        pp_fn_line(b, "dx = Div(e, c)");
    }
    return PP_OK;
}

/* GatherGrad(dy, indices, shape_data): dy seen as [outer, n_indices,
 * inner] around the axis is scatter-added along it into zeros [outer, dim,
 * inner]. The axis comes by attribute reference, so nodes of every axis
 * share the body; negative axes and indices count from the end. */
static pp_status gather(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, indices, shape_data";
    b->outputs = "dx";
    if (pp_node_attr(n, "axis")) pp_fn_line(b, "a = Constant<value_int=@axis:i>()");
    else pp_fn_line(b, "a = Constant<value_int=0>()");
    pp_fn_line(b, "zero = Constant<value_int=0>()");
    pp_fn_line(b, "one = Constant<value_int=1>()");
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "c0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "big = Constant<value_ints=[9223372036854775807]>()");
    pp_fn_line(b, "r = Size(shape_data)");
    pp_fn_line(b, "aneg = Less(a, zero)");
    pp_fn_line(b, "ar = Add(a, r)");
    pp_fn_line(b, "an = Where(aneg, ar, a)");
    pp_fn_line(b, "an1 = Add(an, one)");
    pp_fn_line(b, "av = Unsqueeze(an, c0)");
    pp_fn_line(b, "av1 = Unsqueeze(an1, c0)");
    pp_fn_line(b, "lead = Slice(shape_data, c0, av)");
    pp_fn_line(b, "trail = Slice(shape_data, av1, big)");
    pp_fn_line(b, "dimv = Slice(shape_data, av, av1)");
    pp_fn_line(b, "outer = ReduceProd<keepdims=1>(lead)");
    pp_fn_line(b, "inner = ReduceProd<keepdims=1>(trail)");
    pp_fn_line(b, "s3 = Concat<axis=0>(outer, m1, inner)");
    pp_fn_line(b, "g3 = Reshape(dy, s3)");
    pp_fn_line(b, "sd3 = Concat<axis=0>(outer, dimv, inner)");
    pp_fn_line(b, "zeros = ConstantOfShape(sd3)");
    pp_fn_line(b, "ix = Cast<to=7>(indices)");
    pp_fn_line(b, "dim = Squeeze(dimv, c0)");
    pp_fn_line(b, "ineg = Less(ix, zero)");
    pp_fn_line(b, "ixd = Add(ix, dim)");
    pp_fn_line(b, "ixn = Where(ineg, ixd, ix)");
    pp_fn_line(b, "s13 = Constant<value_ints=[1, -1, 1]>()");
    pp_fn_line(b, "i3 = Reshape(ixn, s13)");
    pp_fn_line(b, "sg3 = Shape(g3)");
    pp_fn_line(b, "ie = Expand(i3, sg3)");
    pp_fn_line(b, "acc = ScatterElements<axis=1, reduction='add'>(zeros, ie, g3)");
    pp_fn_line(b, "dx = Reshape(acc, shape_data)");
    return PP_OK;
}

static pp_status gather_elements(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, indices, shape_x";
    b->outputs = "dx";
    pp_fn_line(b, "zeros = ConstantOfShape(shape_x)");
    pp_fn_line(b, "ix = Cast<to=7>(indices)");
    pp_fn_line(b, "dx = ScatterElements<axis=%lld, reduction='add'>(zeros, ix, dy)",
               (long long)pp_node_attr_int(n, "axis", 0));
    return PP_OK;
}

/* pos: x's flat positions shaped like x; nx: their count (1-D). */
static void positions(pp_fn_body *b) {
    pp_fn_line(b, "zero = Constant<value_int=0>()");
    pp_fn_line(b, "one = Constant<value_int=1>()");
    pp_fn_line(b, "nxs = ReduceProd<keepdims=0>(shape_x)");
    pp_fn_line(b, "flat = Range(zero, nxs, one)");
    pp_fn_line(b, "pos = Reshape(flat, shape_x)");
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "nx = Reshape(nxs, m1)");
}

/* dx = dy scatter-added into x's flat positions read (p, shaped like dy;
 * -1 for a fill position, sent to a spare slot that is dropped). */
static void scatter_back(pp_fn_body *b, const char *p) {
    pp_fn_line(b, "c0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "pf = Reshape(%s, m1)", p);
    pp_fn_line(b, "fill = Less(pf, zero)");
    pp_fn_line(b, "pk = Where(fill, nxs, pf)");
    pp_fn_line(b, "c1 = Constant<value_ints=[1]>()");
    pp_fn_line(b, "nx1 = Add(nx, c1)");
    pp_fn_line(b, "zeros = ConstantOfShape(nx1)");
    pp_fn_line(b, "gf = Reshape(dy, m1)");
    pp_fn_line(b, "acc = ScatterElements<axis=0, reduction='add'>(zeros, pk, gf)");
    pp_fn_line(b, "keep = Slice(acc, c0, nx)");
    pp_fn_line(b, "dx = Reshape(keep, shape_x)");
}

/* SliceGrad(dy, shape_x, starts, ends[, axes[, steps]]) */
static pp_status slice(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, shape_x, starts, ends, axes, steps";
    b->outputs = "dx";
    positions(b);
    pp_fn_line(b, "read = Slice(pos, starts, ends%s%s)", pp_fn_has_in(n, 4) ? ", axes" : "",
               pp_fn_has_in(n, 5) ? (pp_fn_has_in(n, 4) ? ", steps" : ", , steps") : "");
    scatter_back(b, "read");
    return PP_OK;
}

/* TileGrad(dy, shape_x): repeats = dy's shape / x's. */
static pp_status tile(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    b->inputs = "dy, shape_x";
    b->outputs = "dx";
    positions(b);
    pp_fn_line(b, "sd = Shape(dy)");
    pp_fn_line(b, "reps = Div(sd, shape_x)");
    pp_fn_line(b, "read = Tile(pos, reps)");
    scatter_back(b, "read");
    return PP_OK;
}

/* PadGrad(dy, shape_x[, pads]) with the forward's mode (pads as the
 * attribute before opset 11). */
static pp_status pad(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, shape_x, pads, axes";
    b->outputs = "dx";
    if (pp_fn_has_in(n, 3)) return pp_error(PP_ERR_UNSUPPORTED, "an axes input (opset 18 Pad)");
    positions(b);
    if (!pp_fn_has_in(n, 2)) {
        const int64_t *p = NULL;
        int np = pp_node_attr_ints(n, "pads", &p);
        char list[512];
        size_t len = 0;
        list[0] = '\0';
        for (int i = 0; i < np && len < sizeof list; i++)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%lld", i ? ", " : "", (long long)p[i]);
        pp_fn_line(b, "pv = Constant<value_ints=[%s]>()", list);
    } else {
        pp_fn_line(b, "pv = Cast<to=7>(pads)");
    }
    pp_fn_line(b, "fillv = Constant<value_int=-1>()");
    pp_fn_line(b, "read = Pad<mode='%s'>(pos, pv, fillv)", pp_node_attr_string(n, "mode", "constant"));
    scatter_back(b, "read");
    return PP_OK;
}

/* SplitLike(dy, shape_0, ..., shape_k-1): Split along the axis into the
 * pieces' lengths there. */
static pp_status split_like(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    char *in_list = b->in_buf, *out_list = b->out_buf;
    size_t cap = sizeof b->in_buf;
    int k = n->n_in - 1, r = pp_fn_in_rank(g, n, 0);
    long long axis = (long long)pp_node_attr_int(n, "axis", 0);
    if (axis < 0 && r < 0) return pp_error(PP_ERR_UNSUPPORTED, "a negative axis on an unknown rank");
    if (axis < 0) axis += r;
    if (k < 1 || k > 16) return pp_error(PP_ERR_UNSUPPORTED, "%d pieces (the body handles 1 to 16)", k);
    size_t li = (size_t)snprintf(in_list, cap, "dy"), lo = 0;
    out_list[0] = '\0';
    char parts[512];
    size_t lp = 0;
    parts[0] = '\0';
    pp_fn_line(b, "a0 = Constant<value_ints=[%lld]>()", axis);
    pp_fn_line(b, "a1 = Constant<value_ints=[%lld]>()", axis + 1);
    for (int i = 0; i < k; i++) {
        li += (size_t)snprintf(in_list + li, cap - li, ", s%d", i);
        lo += (size_t)snprintf(out_list + lo, cap - lo, "%sd%d", i ? ", " : "", i);
        lp += (size_t)snprintf(parts + lp, sizeof parts - lp, "%sl%d", i ? ", " : "", i);
        pp_fn_line(b, "l%d = Slice(s%d, a0, a1)", i, i);
    }
    pp_fn_line(b, "lens = Concat<axis=0>(%s)", parts);
    pp_fn_line(b, "%s = Split<axis=%lld>(dy, lens)", out_list, axis);
    b->inputs = in_list;
    b->outputs = out_list;
    return PP_OK;
}

/* GlobalAveragePoolGrad(dy [N, C, 1...], shape_x): dy / plane, broadcast. */
static pp_status gavg(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    b->inputs = "dy, shape_x";
    b->outputs = "dx";
    pp_fn_line(b, "e = Expand(dy, shape_x)");
    pp_fn_line(b, "nx = Size(e)");
    pp_fn_line(b, "nd = Size(dy)");
    pp_fn_line(b, "nxf = Cast<to=1>(nx)");
    pp_fn_line(b, "ndf = Cast<to=1>(nd)");
    pp_fn_line(b, "c = Div(nxf, ndf)");
    pp_fn_line(b, "dx = Div(e, c)");
    return PP_OK;
}

/* GlobalMaxPoolGrad(dy, x): dy to the first maximum of each plane. */
static pp_status gmax(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    b->inputs = "dy, x";
    b->outputs = "dx";
    pp_fn_line(b, "s3 = Constant<value_ints=[0, 0, -1]>()");
    pp_fn_line(b, "x3 = Reshape(x, s3)");
    pp_fn_line(b, "am = ArgMax<axis=2, keepdims=1, select_last_index=0>(x3)");
    pp_fn_line(b, "s1 = Constant<value_ints=[0, 0, 1]>()");
    pp_fn_line(b, "g3 = Reshape(dy, s1)");
    pp_fn_line(b, "sh3 = Shape(x3)");
    pp_fn_line(b, "zeros = ConstantOfShape(sh3)");
    pp_fn_line(b, "d3 = ScatterElements<axis=2>(zeros, am, g3)");
    pp_fn_line(b, "shx = Shape(x)");
    pp_fn_line(b, "dx = Reshape(d3, shx)");
    return PP_OK;
}

/* The stage marker: an identity on each of its k inputs. */
static pp_status pipe_split(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    char *in_list = b->in_buf, *out_list = b->out_buf;
    size_t cap = sizeof b->in_buf;
    int k = n->n_in;
    if (k != n->n_out || k < 1 || k > 16)
        return pp_error(PP_ERR_UNSUPPORTED, "%d inputs, %d outputs (the body handles 1 to 16, equal)", k,
                        n->n_out);
    size_t li = 0, lo = 0;
    for (int i = 0; i < k; i++) {
        const char *in = k == 1 ? "x" : NULL, *out = k == 1 ? "y" : NULL;
        char inb[16], outb[16];
        if (!in) snprintf(inb, sizeof inb, "x%d", i), in = inb;
        if (!out) snprintf(outb, sizeof outb, "y%d", i), out = outb;
        li += (size_t)snprintf(in_list + li, cap - li, "%s%s", i ? ", " : "", in);
        lo += (size_t)snprintf(out_list + lo, cap - lo, "%s%s", i ? ", " : "", out);
        pp_fn_line(b, "%s = Identity(%s)", out, in);
    }
    b->inputs = in_list;
    b->outputs = out_list;
    return PP_OK;
}

const pp_fn_entry pp_fn_shape[] = {
    {"SumToShape", sum_to_shape},
    {"ExpandReduced", expand_reduced},
    {"GatherGrad", gather},
    {"GatherElementsGrad", gather_elements},
    {"SliceGrad", slice},
    {"TileGrad", tile},
    {"PadGrad", pad},
    {"SplitLike", split_like},
    {"GlobalAveragePoolGrad", gavg},
    {"GlobalMaxPoolGrad", gmax},
    {"PipeSplit", pipe_split},
    {NULL, NULL},
};
