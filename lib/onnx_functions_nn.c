/* ONNX function bodies of the layer gradients (lib/ops/grad_nn.c,
 * grad_bn.c, group_norm.c): MatMul's two halves, Softmax
 * and LogSoftmax, LayerNormalization, BatchNormalization, GroupNorm and
 * SoftmaxCrossEntropyLoss, recomputing the statistics from the stashed input
 * as the kernels do. Means are ReduceSum / count (ReduceMean changed form in
 * opset 18). */
#include <stdio.h>
#include <string.h>

#include "onnx_functions.h"

#include "status_internal.h"

/* Lines: <flag>, the node's int attribute attr as a bool, read through
 * ArgMax's select_last_index (default 0 like weight_t's and transB's)
 * since a function body cannot branch on an attribute that may be absent. */
static void attr_flag(pp_fn_body *b, const char *attr, const char *flag) {
    pp_fn_line(b, "%sv = Constant<value_floats=[1.0, 1.0]>()", flag);
    pp_fn_line(b, "%si = ArgMax<axis=0, keepdims=0, select_last_index=@%s:i>(%sv)", flag, attr, flag);
    pp_fn_line(b, "%s = Cast<to=9>(%si)", flag, flag);
}

static void weight_t_flag(pp_fn_body *b) { attr_flag(b, "weight_t", "wt"); }

/* Lines: dst = flag ? src : src with its last two dims swapped (keep = 1),
 * or the other way round (keep = 0). */
static void swap_by_flag(pp_fn_body *b, const char *flag, int keep, const char *src, const char *dst) {
    pp_fn_line(b, "%s_t = Einsum<equation='...ij->...ji'>(%s)", src, src);
    pp_fn_line(b, "%s_m1 = Constant<value_ints=[-1]>()", src);
    pp_fn_line(b, "%s_f = Reshape(%s, %s_m1)", src, src, src);
    pp_fn_line(b, "%s_ft = Reshape(%s_t, %s_m1)", src, src, src);
    pp_fn_line(b, "%s_s = Shape(%s)", src, src);
    pp_fn_line(b, "%s_st = Shape(%s_t)", src, src);
    const char *yes = keep ? "" : "t", *no = keep ? "t" : "";
    pp_fn_line(b, "%s_sel = Where(%s, %s_f%s, %s_f%s)", src, flag, src, yes, src, no);
    pp_fn_line(b, "%s_ss = Where(%s, %s_s%s, %s_s%s)", src, flag, src, yes, src, no);
    pp_fn_line(b, "%s = Reshape(%s_sel, %s_ss)", dst, src, src);
}

/* Lines: dst = wt ? src : src with its last two dims swapped. */
static void swap_unless_wt(pp_fn_body *b, const char *src, const char *dst) { swap_by_flag(b, "wt", 1, src, dst); }

static int one_d(const pp_graph *g, const pp_node *n) {
    for (int k = 0; k < 2; k++) {
        int r = pp_fn_in_rank(g, n, k);
        if (r >= 0 && r < 2) return 1;
    }
    int r = pp_fn_shape_len(g, n, 2);
    return r >= 0 && r < 2;
}

/* MatMulGradA(dy, b, shape_a) -> da = dy b^T, summed to a's shape over the
 * batch dims a was broadcast along; with weight_t = 1 the input is
 * W = b^T (2-D) and da = dy W. */
static pp_status mm_grad_a(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    if (one_d(g, n)) return pp_error(PP_ERR_UNSUPPORTED, "a 1-D operand");
    b->inputs = "dy, b, shape_a";
    b->outputs = "da";
    weight_t_flag(b);
    swap_unless_wt(b, "b", "bt");
    pp_fn_line(b, "full = MatMul(dy, bt)");
    pp_fn_sum_to(b, "s_", "full", "shape_a", "da");
    return PP_OK;
}

/* MatMulGradB(dy, a, shape_b) -> db = a^T dy summed to b's shape; with
 * weight_t = 1 the output is W's gradient, its transpose. */
static pp_status mm_grad_b(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    if (one_d(g, n)) return pp_error(PP_ERR_UNSUPPORTED, "a 1-D operand");
    b->inputs = "dy, a, shape_b";
    b->outputs = "db";
    weight_t_flag(b);
    pp_fn_line(b, "full = Einsum<equation='...mk,...mn->...kn'>(a, dy)");
    /* the shape summed to: b's, i.e. W's with its two dims swapped */
    pp_fn_line(b, "i0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "m2 = Constant<value_ints=[-2]>()");
    pp_fn_line(b, "big = Constant<value_ints=[9223372036854775807]>()");
    pp_fn_line(b, "lead = Slice(shape_b, i0, m2)");
    pp_fn_line(b, "d2 = Slice(shape_b, m2, m1)");
    pp_fn_line(b, "d1 = Slice(shape_b, m1, big)");
    pp_fn_line(b, "sw = Concat<axis=0>(lead, d1, d2)");
    pp_fn_line(b, "target = Where(wt, sw, shape_b)");
    pp_fn_sum_to(b, "s_", "full", "target", "r");
    swap_unless_wt(b, "r", "rt");
    pp_fn_line(b, "db = Einsum<equation='...ij->...ji'>(rt)");
    return PP_OK;
}

/* Softmax (log 0) / LogSoftmax (log 1) gradient along the axis; coerce2d
 * flattens the dims from the axis on first, as opset < 13 did. */
static pp_status softmax_like(const pp_graph *g, const pp_node *n, pp_fn_body *b, int log) {
    (void)g;
    b->inputs = "dy, y";
    b->outputs = "dx";
    long long axis = (long long)pp_node_attr_int(n, "axis", -1);
    const char *gy = "dy", *yy = "y";
    if (pp_node_attr_int(n, "coerce2d", 0)) {
        pp_fn_line(b, "gf = Flatten<axis=%lld>(dy)", axis);
        pp_fn_line(b, "yf = Flatten<axis=%lld>(y)", axis);
        gy = "gf", yy = "yf", axis = 1;
    }
    pp_fn_line(b, "axes = Constant<value_ints=[%lld]>()", axis);
    if (log) {
        pp_fn_line(b, "s = ReduceSum<keepdims=1>(%s, axes)", gy);
        pp_fn_line(b, "e = Exp(%s)", yy);
        pp_fn_line(b, "es = Mul(e, s)");
        pp_fn_line(b, "r = Sub(%s, es)", gy);
    } else {
        pp_fn_line(b, "gyp = Mul(%s, %s)", gy, yy);
        pp_fn_line(b, "s = ReduceSum<keepdims=1>(gyp, axes)");
        pp_fn_line(b, "d = Sub(%s, s)", gy);
        pp_fn_line(b, "r = Mul(%s, d)", yy);
    }
    if (strcmp(gy, "dy") != 0) {
        pp_fn_line(b, "sh = Shape(dy)");
        pp_fn_line(b, "dx = Reshape(r, sh)");
    } else {
        pp_fn_line(b, "dx = Identity(r)");
    }
    return PP_OK;
}

static pp_status softmax(const pp_graph *g, const pp_node *n, pp_fn_body *b) { return softmax_like(g, n, b, 0); }
static pp_status log_softmax(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    return softmax_like(g, n, b, 1);
}

/* Rows of x flattened at the axis: xf [rows, n], gf (dy), the row count n
 * as float cnt, and xhat, rstd as the forward computed them. */
static void ln_stats(pp_fn_body *b, const pp_node *n) {
    long long axis = (long long)pp_node_attr_int(n, "axis", -1);
    pp_fn_float(b, "eps", pp_node_attr_float(n, "epsilon", 1e-5f));
    pp_fn_line(b, "one_ax = Constant<value_ints=[1]>()");
    pp_fn_line(b, "xf = Flatten<axis=%lld>(x)", axis);
    pp_fn_line(b, "gf = Flatten<axis=%lld>(dy)", axis);
    pp_fn_line(b, "sf = Shape(xf)");
    pp_fn_line(b, "two = Constant<value_ints=[2]>()");
    pp_fn_line(b, "ni = Slice(sf, one_ax, two)");
    pp_fn_line(b, "cnt = Cast<to=1>(ni)");
    pp_fn_line(b, "sx = ReduceSum<keepdims=1>(xf, one_ax)");
    pp_fn_line(b, "mean = Div(sx, cnt)");
    pp_fn_line(b, "xc = Sub(xf, mean)");
    pp_fn_line(b, "xc2 = Mul(xc, xc)");
    pp_fn_line(b, "sv = ReduceSum<keepdims=1>(xc2, one_ax)");
    pp_fn_line(b, "var = Div(sv, cnt)");
    pp_fn_line(b, "ve = Add(var, eps)");
    pp_fn_line(b, "sd = Sqrt(ve)");
    pp_fn_float(b, "fone", 1);
    pp_fn_line(b, "rstd = Div(fone, sd)");
    pp_fn_line(b, "xhat = Mul(xc, rstd)");
}

/* dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = dy * scale */
static pp_status ln_input(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, x, scale";
    b->outputs = "dx";
    ln_stats(b, n);
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "wf = Reshape(scale, m1)");
    pp_fn_line(b, "gw = Mul(gf, wf)");
    pp_fn_line(b, "sa = ReduceSum<keepdims=1>(gw, one_ax)");
    pp_fn_line(b, "ma = Div(sa, cnt)");
    pp_fn_line(b, "gx = Mul(gw, xhat)");
    pp_fn_line(b, "sb = ReduceSum<keepdims=1>(gx, one_ax)");
    pp_fn_line(b, "mb = Div(sb, cnt)");
    pp_fn_line(b, "t1 = Sub(gw, ma)");
    pp_fn_line(b, "t2 = Mul(xhat, mb)");
    pp_fn_line(b, "t3 = Sub(t1, t2)");
    pp_fn_line(b, "d = Mul(rstd, t3)");
    pp_fn_line(b, "shx = Shape(x)");
    pp_fn_line(b, "dx = Reshape(d, shx)");
    return PP_OK;
}

/* dscale = sum over rows of dy * xhat, dbias = sum of dy; shaped x[axis:] */
static pp_status ln_weight(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, x";
    b->outputs = "dscale, dbias";
    ln_stats(b, n);
    pp_fn_line(b, "zero_ax = Constant<value_ints=[0]>()");
    pp_fn_line(b, "ax = Constant<value_ints=[%lld]>()", (long long)pp_node_attr_int(n, "axis", -1));
    pp_fn_line(b, "big = Constant<value_ints=[9223372036854775807]>()");
    pp_fn_line(b, "shx = Shape(x)");
    pp_fn_line(b, "shw = Slice(shx, ax, big)");
    pp_fn_line(b, "gx = Mul(gf, xhat)");
    pp_fn_line(b, "ds = ReduceSum<keepdims=0>(gx, zero_ax)");
    pp_fn_line(b, "dscale = Reshape(ds, shw)");
    pp_fn_line(b, "dbs = ReduceSum<keepdims=0>(gf, zero_ax)");
    pp_fn_line(b, "dbias = Reshape(dbs, shw)");
    return PP_OK;
}

/* x and dy as [N, C, rest]; mean and rstd per channel ([1, C, 1]): the
 * batch's own in training mode, else the given running ones; xhat. */
static void bn_stats(pp_fn_body *b, const pp_node *n, int training) {
    pp_fn_float(b, "eps", pp_node_attr_float(n, "epsilon", 1e-5f));
    pp_fn_float(b, "fone", 1);
    pp_fn_line(b, "s3 = Constant<value_ints=[0, 0, -1]>()");
    pp_fn_line(b, "v3 = Constant<value_ints=[1, -1, 1]>()");
    pp_fn_line(b, "red = Constant<value_ints=[0, 2]>()");
    pp_fn_line(b, "x3 = Reshape(x, s3)");
    pp_fn_line(b, "g3 = Reshape(dy, s3)");
    pp_fn_line(b, "sz = Size(x)");
    pp_fn_line(b, "szf = Cast<to=1>(sz)");
    pp_fn_line(b, "shx = Shape(x)");
    pp_fn_line(b, "one_ax = Constant<value_ints=[1]>()");
    pp_fn_line(b, "two = Constant<value_ints=[2]>()");
    pp_fn_line(b, "ci = Slice(shx, one_ax, two)");
    pp_fn_line(b, "cf = Cast<to=1>(ci)");
    pp_fn_line(b, "cnt = Div(szf, cf)");
    if (training) {
        pp_fn_line(b, "sx = ReduceSum<keepdims=1>(x3, red)");
        pp_fn_line(b, "mu = Div(sx, cnt)");
        pp_fn_line(b, "xc = Sub(x3, mu)");
        pp_fn_line(b, "xc2 = Mul(xc, xc)");
        pp_fn_line(b, "sv = ReduceSum<keepdims=1>(xc2, red)");
        pp_fn_line(b, "var = Div(sv, cnt)");
    } else {
        pp_fn_line(b, "mu = Reshape(mean, v3)");
        pp_fn_line(b, "var = Reshape(var_in, v3)");
        pp_fn_line(b, "xc = Sub(x3, mu)");
    }
    pp_fn_line(b, "ve = Add(var, eps)");
    pp_fn_line(b, "sd = Sqrt(ve)");
    pp_fn_line(b, "inv = Div(fone, sd)");
    pp_fn_line(b, "xhat = Mul(xc, inv)");
}

static pp_status bn_input(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    int training = pp_node_attr_int(n, "training_mode", 0) != 0;
    b->inputs = "dy, x, scale, mean, var_in";
    b->outputs = "dx";
    bn_stats(b, n, training);
    pp_fn_line(b, "sc = Reshape(scale, v3)");
    pp_fn_line(b, "k = Mul(sc, inv)");
    if (training) {
        pp_fn_line(b, "sg = ReduceSum<keepdims=1>(g3, red)");
        pp_fn_line(b, "mdy = Div(sg, cnt)");
        pp_fn_line(b, "gx = Mul(g3, xhat)");
        pp_fn_line(b, "sgx = ReduceSum<keepdims=1>(gx, red)");
        pp_fn_line(b, "mdyx = Div(sgx, cnt)");
        pp_fn_line(b, "t1 = Sub(g3, mdy)");
        pp_fn_line(b, "t2 = Mul(xhat, mdyx)");
        pp_fn_line(b, "t3 = Sub(t1, t2)");
        pp_fn_line(b, "d = Mul(k, t3)");
    } else {
        pp_fn_line(b, "d = Mul(k, g3)");
    }
    pp_fn_line(b, "dx = Reshape(d, shx)");
    return PP_OK;
}

static pp_status bn_weight(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    int training = pp_node_attr_int(n, "training_mode", 0) != 0;
    b->inputs = "dy, x, mean, var_in";
    b->outputs = "dscale, dbias";
    bn_stats(b, n, training);
    pp_fn_line(b, "gx = Mul(g3, xhat)");
    pp_fn_line(b, "dscale = ReduceSum<keepdims=0>(gx, red)");
    pp_fn_line(b, "dbias = ReduceSum<keepdims=0>(g3, red)");
    return PP_OK;
}

/* x and dy as x4 [N, G, C/G, spatial] (G: num_groups, absent: one group
 * per channel, InstanceNormalization's); the scale as sc4 [1, G, C/G or 1,
 * 1], per channel or per group as its length says; each (n, g) group's
 * mean, inv = 1 / sqrt(var + eps) and xhat, cnt its element count. */
static void gn_stats(pp_fn_body *b, const pp_node *n, const char *scale_len) {
    pp_fn_float(b, "eps", pp_node_attr_float(n, "epsilon", 1e-5f));
    pp_fn_float(b, "fone", 1);
    pp_fn_line(b, "c0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "c1 = Constant<value_ints=[1]>()");
    pp_fn_line(b, "c2 = Constant<value_ints=[2]>()");
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "red = Constant<value_ints=[2, 3]>()");
    pp_fn_line(b, "shx = Shape(x)");
    pp_fn_line(b, "ch = Slice(shx, c1, c2)");
    if (pp_node_attr(n, "num_groups")) {
        pp_fn_line(b, "gs = Constant<value_int=@num_groups:i>()");
        pp_fn_line(b, "grp = Unsqueeze(gs, c0)");
    } else {
        pp_fn_line(b, "grp = Identity(ch)");
    }
    pp_fn_line(b, "cg = Div(ch, grp)");
    pp_fn_line(b, "s4 = Concat<axis=0>(c0, grp, cg, m1)");
    pp_fn_line(b, "x4 = Reshape(x, s4)");
    pp_fn_line(b, "g4 = Reshape(dy, s4)");
    pp_fn_line(b, "ps = Div(%s, grp)", scale_len);
    pp_fn_line(b, "ss4 = Concat<axis=0>(c1, grp, ps, c1)");
    pp_fn_line(b, "sx4 = Shape(x4)");
    pp_fn_line(b, "four = Constant<value_ints=[4]>()");
    pp_fn_line(b, "sp = Slice(sx4, c2, four)");
    pp_fn_line(b, "mi = ReduceProd<keepdims=0>(sp)");
    pp_fn_line(b, "cnt = Cast<to=1>(mi)");
    pp_fn_line(b, "sx = ReduceSum<keepdims=1>(x4, red)");
    pp_fn_line(b, "mu = Div(sx, cnt)");
    pp_fn_line(b, "xc = Sub(x4, mu)");
    pp_fn_line(b, "xc2 = Mul(xc, xc)");
    pp_fn_line(b, "sv = ReduceSum<keepdims=1>(xc2, red)");
    pp_fn_line(b, "var = Div(sv, cnt)");
    pp_fn_line(b, "ve = Add(var, eps)");
    pp_fn_line(b, "sd = Sqrt(ve)");
    pp_fn_line(b, "inv = Div(fone, sd)");
    pp_fn_line(b, "xhat = Mul(xc, inv)");
}

/* GroupNormGradInput(dy, x, scale) -> dx = inv * (gw - mean(gw) - xhat *
 * mean(gw * xhat)) per group, gw = dy * scale. */
static pp_status gn_input(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, x, scale";
    b->outputs = "dx";
    pp_fn_line(b, "shs = Shape(scale)");
    gn_stats(b, n, "shs");
    pp_fn_line(b, "sc4 = Reshape(scale, ss4)");
    pp_fn_line(b, "gw = Mul(g4, sc4)");
    pp_fn_line(b, "sa = ReduceSum<keepdims=1>(gw, red)");
    pp_fn_line(b, "ma = Div(sa, cnt)");
    pp_fn_line(b, "gx = Mul(gw, xhat)");
    pp_fn_line(b, "sb = ReduceSum<keepdims=1>(gx, red)");
    pp_fn_line(b, "mb = Div(sb, cnt)");
    pp_fn_line(b, "t1 = Sub(gw, ma)");
    pp_fn_line(b, "t2 = Mul(xhat, mb)");
    pp_fn_line(b, "t3 = Sub(t1, t2)");
    pp_fn_line(b, "d = Mul(inv, t3)");
    pp_fn_line(b, "dx = Reshape(d, shx)");
    return PP_OK;
}

/* GroupNormGradWeight(dy, x, shape_scale) -> dscale = sum of dy * xhat,
 * dbias = sum of dy, over what each scale entry covers. */
static pp_status gn_weight(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, x, shape_scale";
    b->outputs = "dscale, dbias";
    gn_stats(b, n, "shape_scale");
    pp_fn_line(b, "gx = Mul(g4, xhat)");
    pp_fn_sum_to(b, "a_", "gx", "ss4", "ds4");
    pp_fn_line(b, "dscale = Reshape(ds4, shape_scale)");
    pp_fn_sum_to(b, "b_", "g4", "ss4", "db4");
    pp_fn_line(b, "dbias = Reshape(db4, shape_scale)");
    return PP_OK;
}

/* SoftmaxCrossEntropyLossGrad(dloss, scores [N, C, d...], labels[, weights]):
 * (softmax(scores) - onehot(label)) * coef per row, coef = dloss (none),
 * dloss (sum) or dloss / sum of the rows' weights (mean), times the label's
 * weight; rows with ignore_index get 0. */
static pp_status sce(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dloss, scores, labels, weights";
    b->outputs = "dx";
    const char *red = pp_node_attr_string(n, "reduction", "mean");
    if (strcmp(red, "none") && strcmp(red, "sum") && strcmp(red, "mean"))
        return pp_error(PP_ERR_UNSUPPORTED, "unknown reduction '%s'", red);
    int weighted = pp_fn_has_in(n, 3), ignore = pp_node_attr(n, "ignore_index") != NULL;
    pp_fn_line(b, "p = Softmax<axis=1>(scores)");
    pp_fn_line(b, "lab = Cast<to=7>(labels)");
    pp_fn_line(b, "zi = Constant<value_int=0>()");
    if (ignore) {
        pp_fn_line(b, "ign = Constant<value_int=%lld>()", (long long)pp_node_attr_int(n, "ignore_index", 0));
        pp_fn_line(b, "isig = Equal(lab, ign)");
        pp_fn_line(b, "valid = Not(isig)");
        pp_fn_line(b, "labz = Where(valid, lab, zi)");
        pp_fn_line(b, "vf = Cast<to=1>(valid)");
    } else {
        pp_fn_line(b, "labz = Identity(lab)");
    }
    pp_fn_line(b, "shs = Shape(scores)");
    pp_fn_line(b, "one_ax = Constant<value_ints=[1]>()");
    pp_fn_line(b, "two = Constant<value_ints=[2]>()");
    pp_fn_line(b, "depth = Slice(shs, one_ax, two)");
    pp_fn_line(b, "vals = Constant<value_floats=[0.0, 1.0]>()");
    pp_fn_line(b, "oh = OneHot<axis=1>(labz, depth, vals)");
    pp_fn_line(b, "diff = Sub(p, oh)");
    /* w: the weight of each row (label weight, 0 when ignored), if any */
    const char *w = NULL;
    if (weighted) {
        pp_fn_line(b, "wl = Gather<axis=0>(weights, labz)");
        w = "wl";
        if (ignore) {
            pp_fn_line(b, "wv = Mul(wl, vf)");
            w = "wv";
        }
    } else if (ignore) {
        w = "vf";
    }
    const char *coef = "dloss";
    if (strcmp(red, "mean") == 0) {
        if (w) {
            pp_fn_line(b, "den = ReduceSum<keepdims=0>(%s)", w);
        } else {
            pp_fn_line(b, "nl = Size(labels)");
            pp_fn_line(b, "den = Cast<to=1>(nl)");
        }
        pp_fn_line(b, "dm = Div(dloss, den)");
        coef = "dm";
    }
    if (w) {
        pp_fn_line(b, "cw = Mul(%s, %s)", coef, w);
        coef = "cw";
    }
    if (strcmp(red, "none") == 0 || w) {
        pp_fn_line(b, "cu = Unsqueeze(%s, one_ax)", coef);
        coef = "cu";
    }
    pp_fn_line(b, "dx = Mul(diff, %s)", coef);
    return PP_OK;
}

const pp_fn_entry pp_fn_nn[] = {
    {"MatMulGradA", mm_grad_a},
    {"MatMulGradB", mm_grad_b},
    {"SoftmaxGrad", softmax},
    {"LogSoftmaxGrad", log_softmax},
    {"LayerNormGradInput", ln_input},
    {"LayerNormGradWeight", ln_weight},
    {"BatchNormGradInput", bn_input},
    {"BatchNormGradWeight", bn_weight},
    {"GroupNormGradInput", gn_input},
    {"GroupNormGradWeight", gn_weight},
    {"SoftmaxCrossEntropyLossGrad", sce},
    {NULL, NULL},
};
