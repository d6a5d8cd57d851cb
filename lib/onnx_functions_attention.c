/* ONNX function bodies of pippin::CausalAttention and
 * pippin::CausalAttentionGrad (lib/ops/attention.c, attention_grad.c), the
 * fused attention a training graph carries (lib/onnx_functions.h).
 *
 * Both bring Q, K and V to [..., T, D] (and K^T), recompute the masked
 * probabilities P the way the kernel does, then take the products. The
 * mask is built from the score's dims and mask_ref's last two (a, b):
 * query i sees key j when b is 1 or j <= i' (i' = 0 when a is 1, else i),
 * the kernel's rule; masked scores become -1e30, whose exp is exactly 0 in
 * float, as the kernel's skipped keys are. The gradient body multiplies
 * by the scale where the kernel multiplies by its reciprocal: within
 * rounding. The scale is written as a
 * constant: nodes with different scales need different bodies (the export
 * then says so), which one causal attention per model never does. */
#include <string.h>

#include "onnx_functions.h"

#include "status_internal.h"

/* dst in [..., T, D] from src in layout lay ("bhtd", "bthd", or "bhdt" for
 * a K^T given as [..., D, T]). */
static void to_rows(pp_fn_body *b, const char *lay, const char *src, const char *dst) {
    if (!strcmp(lay, "bthd")) pp_fn_line(b, "%s = Transpose<perm=[0, 2, 1, 3]>(%s)", dst, src);
    else if (!strcmp(lay, "bhdt")) pp_fn_line(b, "%s = Einsum<equation='...ij->...ji'>(%s)", dst, src);
    else pp_fn_line(b, "%s = Identity(%s)", dst, src);
}

/* The inverse: dst in layout lay from src in [..., T, D]. */
static void from_rows(pp_fn_body *b, const char *lay, const char *src, const char *dst) {
    to_rows(b, lay, src, dst); /* each of the three is its own inverse */
}

/* qh, kh, vh ([..., T, D]), the scale c, the visible-key mask vis and the
 * probabilities p; mask is the formal parameter of mask_ref (or NULL). */
static pp_status forward_lines(const pp_node *n, pp_fn_body *b, const char *mask) {
    const char *ql = pp_node_attr_string(n, "q_layout", "bhtd"), *kl = pp_node_attr_string(n, "k_layout", "bhdt");
    const char *vl = pp_node_attr_string(n, "v_layout", "bhtd");
    float scale = pp_node_attr_float(n, "scale", 1.0f);
    int div = pp_node_attr_int(n, "scale_div", 0) != 0;
    to_rows(b, ql, "q", "qh");
    to_rows(b, kl, "k", "kh");
    to_rows(b, vl, "v", "vh");
    pp_fn_line(b, "kt = Einsum<equation='...ij->...ji'>(kh)");
    pp_fn_line(b, "s0 = MatMul(qh, kt)");
    pp_fn_float(b, "c", (double)scale);
    pp_fn_line(b, "s1 = %s(s0, c)", div ? "Div" : "Mul");
    /* the mask: rows i of a, keys j of b */
    pp_fn_line(b, "m2 = Constant<value_ints=[-2]>()");
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "big = Constant<value_ints=[9223372036854775807]>()");
    pp_fn_line(b, "ss = Shape(s1)");
    pp_fn_line(b, "tq = Slice(ss, m2, m1)");
    pp_fn_line(b, "tk = Slice(ss, m1, big)");
    if (mask) {
        pp_fn_line(b, "sm = Shape(%s)", mask);
        pp_fn_line(b, "ma = Slice(sm, m2, m1)");
        pp_fn_line(b, "mb = Slice(sm, m1, big)");
    } else {
        pp_fn_line(b, "ma = Identity(tq)");
        pp_fn_line(b, "mb = Identity(tk)");
    }
    pp_fn_line(b, "z = Constant<value_int=0>()");
    pp_fn_line(b, "one = Constant<value_int=1>()");
    pp_fn_line(b, "tq0 = Squeeze(tq)");
    pp_fn_line(b, "tk0 = Squeeze(tk)");
    pp_fn_line(b, "ri = Range(z, tq0, one)");
    pp_fn_line(b, "cj = Range(z, tk0, one)");
    pp_fn_line(b, "ax1 = Constant<value_ints=[1]>()");
    pp_fn_line(b, "ax0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "rows = Unsqueeze(ri, ax1)");
    pp_fn_line(b, "cols = Unsqueeze(cj, ax0)");
    pp_fn_line(b, "one1 = Constant<value_ints=[1]>()");
    pp_fn_line(b, "a_one = Equal(ma, one1)");
    pp_fn_line(b, "b_one = Equal(mb, one1)");
    pp_fn_line(b, "a_many = Not(a_one)");
    pp_fn_line(b, "keep_i = Cast<to=7>(a_many)");
    pp_fn_line(b, "ip = Mul(rows, keep_i)");
    pp_fn_line(b, "seen = LessOrEqual(cols, ip)");
    pp_fn_line(b, "vis2 = Or(seen, b_one)");
    /* a mask of higher rank than the scores pads them (and Y) with its
     * leading 1s, as the kernel does */
    if (mask) pp_fn_line(b, "vis = Expand(vis2, sm)");
    else pp_fn_line(b, "vis = Identity(vis2)");
    pp_fn_float(b, "ninf", -1e30);
    pp_fn_line(b, "s2 = Where(vis, s1, ninf)");
    pp_fn_line(b, "p = Softmax<axis=-1>(s2)");
    return PP_OK;
}

/* Y = P V, in out_layout. */
static pp_status attention(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "q, k, v, mask";
    b->outputs = "y";
    PP_TRY(forward_lines(n, b, pp_fn_has_in(n, 3) ? "mask" : NULL));
    pp_fn_line(b, "yh = MatMul(p, vh)");
    from_rows(b, pp_node_attr_string(n, "out_layout", "bhtd"), "yh", "y");
    return PP_OK;
}

/* dV = P^T dY, dS = P (dY V^T - rowsum) c, dQ = dS K, dK = dS^T Q, each in
 * its operand's layout. */
static pp_status attention_grad(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    b->inputs = "dy, q, k, v, mask";
    b->outputs = "dq, dk, dv";
    PP_TRY(forward_lines(n, b, pp_fn_has_in(n, 4) ? "mask" : NULL));
    to_rows(b, pp_node_attr_string(n, "out_layout", "bhtd"), "dy", "dyh");
    pp_fn_line(b, "pt = Einsum<equation='...ij->...ji'>(p)");
    pp_fn_line(b, "dvh = MatMul(pt, dyh)");
    pp_fn_line(b, "vt = Einsum<equation='...ij->...ji'>(vh)");
    pp_fn_line(b, "dp = MatMul(dyh, vt)");
    pp_fn_line(b, "pdp = Mul(dp, p)");
    pp_fn_line(b, "dot = ReduceSum<keepdims=1>(pdp, m1)");
    pp_fn_line(b, "dd = Sub(dp, dot)");
    pp_fn_line(b, "ds0 = Mul(p, dd)");
    pp_fn_line(b, "ds = %s(ds0, c)", pp_node_attr_int(n, "scale_div", 0) ? "Div" : "Mul");
    pp_fn_line(b, "dqh = MatMul(ds, kh)");
    pp_fn_line(b, "dst = Einsum<equation='...ij->...ji'>(ds)");
    pp_fn_line(b, "dkh = MatMul(dst, qh)");
    from_rows(b, pp_node_attr_string(n, "q_layout", "bhtd"), "dqh", "dql");
    from_rows(b, pp_node_attr_string(n, "k_layout", "bhdt"), "dkh", "dkl");
    from_rows(b, pp_node_attr_string(n, "v_layout", "bhtd"), "dvh", "dvl");
    /* each its operand's shape (a wider mask padded the products) */
    pp_fn_line(b, "sq = Shape(q)");
    pp_fn_line(b, "sk = Shape(k)");
    pp_fn_line(b, "sv = Shape(v)");
    pp_fn_line(b, "dq = Reshape(dql, sq)");
    pp_fn_line(b, "dk = Reshape(dkl, sk)");
    pp_fn_line(b, "dv = Reshape(dvl, sv)");
    return PP_OK;
}

const pp_fn_entry pp_fn_attention[] = {
    {"CausalAttention", attention},
    {"CausalAttentionGrad", attention_grad},
    {NULL, NULL},
};
