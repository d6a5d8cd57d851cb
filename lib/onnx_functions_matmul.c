/* ONNX function bodies of the optimizer's GEMM ops (lib/opt_matmul.c,
 * lib/ops/matmul_fused.c): pippin::MatMulAdd in every form the matmul pass
 * makes (bias, transB, packed weight, fused activation, residual, Split)
 * and pippin::PackWeight, so an optimized inference graph exported as
 * ONNX loads in ONNX Runtime and onnx.checker. */
#include <stdio.h>
#include <string.h>

#include "onnx_functions.h"

#include "status_internal.h"

/* Lines: y = the activation of pippin::MatMulAdd node n ("relu", "gelu",
 * "gelu_tanh") applied to x, in lib/ops/matmul_fused.c's arithmetic and
 * order (0.5 x (1 + erf(x * 0.70710678)), and the tanh form with its
 * constants): ONNX's Gelu is opset 20's. */
static pp_status fused_activation(const pp_node *n, pp_fn_body *b, const char *x, const char *y) {
    const char *act = pp_node_attr_string(n, "activation", "");
    if (!strcmp(act, "relu")) {
        pp_fn_line(b, "%s = Relu(%s)", y, x);
        return PP_OK;
    }
    int tanh_form = !strcmp(act, "gelu_tanh");
    if (!tanh_form && strcmp(act, "gelu") != 0) return pp_error(PP_ERR_UNSUPPORTED, "activation '%s'", act);
    pp_fn_float(b, "g_half", 0.5);
    pp_fn_float(b, "g_one", 1);
    if (tanh_form) {
        pp_fn_float(b, "g_k0", 0.7978845608028654);
        pp_fn_float(b, "g_k1", 0.044715);
        pp_fn_line(b, "g_c1 = Mul(g_k1, %s)", x); /* 0.044715f * x * x * x, left to right */
        pp_fn_line(b, "g_c2 = Mul(g_c1, %s)", x);
        pp_fn_line(b, "g_c3 = Mul(g_c2, %s)", x);
        pp_fn_line(b, "g_s = Add(%s, g_c3)", x);
        pp_fn_line(b, "g_u = Mul(g_k0, g_s)");
        pp_fn_line(b, "g_f = Tanh(g_u)");
    } else {
        pp_fn_float(b, "g_rs2", 0.70710678118654752);
        pp_fn_line(b, "g_u = Mul(%s, g_rs2)", x);
        pp_fn_line(b, "g_f = Erf(g_u)");
    }
    pp_fn_line(b, "g_e = Add(g_one, g_f)");
    pp_fn_line(b, "g_hx = Mul(g_half, %s)", x);
    pp_fn_line(b, "%s = Mul(g_hx, g_e)", y);
    return PP_OK;
}

/* pippin::MatMulAdd(a, b[, c[, r]]) -> y, or the parts of a Split (the
 * optimizer's fusion, lib/opt_matmul.c; the kernel is
 * lib/ops/matmul_fused.c): act(a @ op(b) + c) + r. One Gemm on a folded to
 * 2-D, whose transB follows the node's attribute; b packed by
 * pippin::PackWeight ([ceil(N/16), K, 16], attribute packed_n = N) is
 * unpacked to [K, N] first. A node without a bias is written with zeros
 * for it (lib/onnx_export.c), but one with a residual and no bias passes
 * it absent: no C then. The activation, then r (broadcast as the Add the
 * optimizer took in), then the Split by the node's "axis" and "split". */
static pp_status matmul_add(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    int packed = pp_node_attr_int(n, "packed_n", 0) > 0, split = n->n_out > 1;
    if ((packed || split) && g->opset < 13)
        return pp_error(PP_ERR_UNSUPPORTED, "packed weights or a fused Split need opset 13 (the graph's is %lld)",
                        (long long)g->opset);
    int bias = n->n_in < 3 || pp_fn_has_in(n, 2), residual = pp_fn_has_in(n, 3);
    b->inputs = "a, b, c, r";
    if (split) {
        size_t len = 0;
        b->out_buf[0] = '\0';
        for (int k = 0; k < n->n_out && len + 8 < sizeof b->out_buf; k++)
            len += (size_t)snprintf(b->out_buf + len, sizeof b->out_buf - len, "%spart%d", k ? ", " : "", k);
        b->outputs = b->out_buf;
    } else {
        b->outputs = "y";
    }
    pp_fn_line(b, "i0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "big = Constant<value_ints=[9223372036854775807]>()");
    pp_fn_line(b, "sa = Shape(a)");
    pp_fn_line(b, "k = Slice(sa, m1, big)");
    pp_fn_line(b, "s2 = Concat<axis=0>(m1, k)");
    pp_fn_line(b, "a2 = Reshape(a, s2)");
    const char *w = "b";
    if (packed) { /* panels [P, K, 16] -> [K, P * 16] -> the first N columns */
        pp_fn_line(b, "i1 = Constant<value_ints=[1]>()");
        pp_fn_line(b, "bt = Transpose<perm=[1, 0, 2]>(b)");
        pp_fn_line(b, "sbt = Shape(bt)");
        pp_fn_line(b, "bk = Slice(sbt, i0, i1)");
        pp_fn_line(b, "swide = Concat<axis=0>(bk, m1)");
        pp_fn_line(b, "bwide = Reshape(bt, swide)");
        pp_fn_line(b, "pn = Constant<value_int=@packed_n:i>()");
        pp_fn_line(b, "pn1 = Reshape(pn, i1)");
        pp_fn_line(b, "bw = Slice(bwide, i0, pn1, i1)");
        w = "bw";
    }
    pp_fn_line(b, "y2 = Gemm<transB=%s>(a2, %s%s)", packed ? "0" : "@transB:i", w, bias ? ", c" : "");
    pp_fn_line(b, "lead = Slice(sa, i0, m1)");
    pp_fn_line(b, "sy2 = Shape(y2)");
    pp_fn_line(b, "nn = Slice(sy2, m1, big)");
    pp_fn_line(b, "sy = Concat<axis=0>(lead, nn)");
    const char *last = split || residual ? "yb" : "y";
    if (pp_node_attr_string(n, "activation", "")[0]) {
        pp_fn_line(b, "ya = Reshape(y2, sy)");
        PP_TRY(fused_activation(n, b, "ya", last));
    } else {
        pp_fn_line(b, "%s = Reshape(y2, sy)", last);
    }
    if (residual) {
        pp_fn_line(b, "%s = Add(yb, r)", split ? "yr" : "y");
        last = "yr";
    }
    if (split) {
        pp_fn_line(b, "sizes = Constant<value_ints=@split:ints>()");
        pp_fn_line(b, "%s = Split<axis=@axis:i>(%s, sizes)", b->outputs, last);
    }
    return PP_OK;
}

/* pippin::PackWeight(w) -> p: op(w) [K, N] (w^T with transB) with its
 * columns padded with zeros to a multiple of 16, as [ceil(N/16), K, 16]
 * panels (lib/ops/matmul_fused.c): what MatMulAdd's packed_n body reads. */
static pp_status pack_weight(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    if (g->opset < 13) return pp_error(PP_ERR_UNSUPPORTED, "needs opset 13 (the graph's is %lld)", (long long)g->opset);
    b->inputs = "w";
    b->outputs = "p";
    if (pp_node_attr_int(n, "transB", 0)) pp_fn_line(b, "wt = Transpose<perm=[1, 0]>(w)");
    else pp_fn_line(b, "wt = Identity(w)");
    pp_fn_line(b, "i0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "i1 = Constant<value_ints=[1]>()");
    pp_fn_line(b, "i2 = Constant<value_ints=[2]>()");
    pp_fn_line(b, "nr = Constant<value_ints=[16]>()");
    pp_fn_line(b, "nr1 = Constant<value_ints=[15]>()");
    pp_fn_line(b, "sw = Shape(wt)");
    pp_fn_line(b, "kk = Slice(sw, i0, i1)");
    pp_fn_line(b, "nn = Slice(sw, i1, i2)");
    pp_fn_line(b, "nu = Add(nn, nr1)");
    pp_fn_line(b, "np = Div(nu, nr)");
    pp_fn_line(b, "nw = Mul(np, nr)");
    pp_fn_line(b, "extra = Sub(nw, nn)");
    pp_fn_line(b, "pads = Concat<axis=0>(i0, i0, i0, extra)");
    pp_fn_line(b, "wp = Pad(wt, pads)");
    pp_fn_line(b, "s3 = Concat<axis=0>(kk, np, nr)");
    pp_fn_line(b, "w3 = Reshape(wp, s3)");
    pp_fn_line(b, "p = Transpose<perm=[1, 0, 2]>(w3)");
    return PP_OK;
}

const pp_fn_entry pp_fn_matmul[] = {
    {"MatMulAdd", matmul_add},
    {"PackWeight", pack_weight},
    {NULL},
};
