/* Gradient rules of the layer ops: MatMul, Gemm, pippin::MatMulAdd, Softmax/LogSoftmax,
 * LayerNormalization and SoftmaxCrossEntropyLoss. Input and parameter
 * gradients are separate nodes so the I/W split can put them apart. */
#include <stdio.h>
#include <string.h>

#include "autodiff_internal.h"

#include "status_internal.h"
/* W if b = Transpose(W) of a 2-D W (nn.Linear on 3-D inputs, tied heads),
 * else -1. */
static int transposed_weight(const pp_graph *g, int b) {
    const pp_value *v = &g->values[b];
    if (v->kind != PP_VALUE_NODE) return -1;
    const pp_node *t = &g->nodes[v->producer];
    if (strcmp(t->op_type, "Transpose") != 0 || (t->domain[0] && strcmp(t->domain, "ai.onnx")) ||
        t->n_in != 1 || t->in[0] < 0)
        return -1;
    const pp_value *w = &g->values[t->in[0]];
    if ((w->data ? w->data->ndim : w->ndim) != 2) return -1;
    const int64_t *perm;
    int np = pp_node_attr_ints(t, "perm", &perm);
    if (np >= 0 && !(np == 2 && perm[0] == 1 && perm[1] == 0)) return -1;
    return t->in[0];
}

/* da = dy b^T (region I), db = a^T dy (region W). For b = W^T both read or
 * write W directly: W^T is not kept for the backward. */
PP_GRAD_RULE(matmul) {
    int a = pp_ad_in(c, 0), b = pp_ad_in(c, 1), w = transposed_weight(c->g, b);
    for (int k = 0; k < 2; k++) {
        if (!c->need[k]) continue;
        int shape, id, gv;
        PP_TRY(pp_grad_shape_of(c, k == 0 ? a : (w >= 0 ? w : b), &shape));
        int in[3] = {c->dy[0], k == 0 ? (w >= 0 ? w : b) : a, shape};
        PP_TRY(pp_grad_emit(c, k == 0 ? "MatMulGradA" : "MatMulGradB", "pippin", 3, in, 1, NULL,
                            &gv, &id));
        if (w >= 0) PP_TRY(pp_node_set_int(c->g, id, "weight_t", 1));
        if (k == 1 && w >= 0) PP_TRY(pp_ad_contribute(c, w, gv));
        else c->dx[k] = gv;
    }
    return PP_OK;
}

/* pippin::MatMulAdd(x, W, bias?) without an activation, as
 * pp_graph_optimize_for_training fuses it: Y = x op(W) + bias. dx = dy
 * op(W)^T (region I) and dW (region W) read and write W in place, as the
 * MatMul rule does for W^T (weight_t = transB); dbias sums dy to [N]. */
PP_GRAD_RULE(matmul_add) {
    const pp_node *n = &c->g->nodes[c->node];
    if (pp_node_attr_string(n, "activation", "")[0])
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "no gradient for MatMulAdd with activation '%s' "
                             "(pp_graph_optimize_for_training never fuses one)",
                             pp_node_attr_string(n, "activation", ""));
    if (n->n_in > 3 || n->n_out > 1)
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "no gradient for MatMulAdd with a residual input or a "
                             "Split's parts as outputs (pp_graph_optimize_for_training never fuses one)");
    int trans_b = pp_node_attr_int(n, "transB", 0) != 0;
    int x = pp_ad_in(c, 0), w = pp_ad_in(c, 1), bias = pp_ad_in(c, 2);
    for (int k = 0; k < 2; k++) {
        if (!c->need[k]) continue;
        int shape, id;
        PP_TRY(pp_grad_shape_of(c, k == 0 ? x : w, &shape));
        int in[3] = {c->dy[0], k == 0 ? w : x, shape};
        PP_TRY(pp_grad_emit(c, k == 0 ? "MatMulGradA" : "MatMulGradB", "pippin", 3, in, 1, NULL, &c->dx[k],
                            &id));
        if (trans_b) PP_TRY(pp_node_set_int(c->g, id, "weight_t", 1));
    }
    if (bias >= 0 && c->need[2]) PP_TRY(pp_grad_sum_to(c, c->dy[0], bias, &c->dx[2]));
    return PP_OK;
}

/* pippin::CausalAttention(Q, K, V[, mask_ref]), as
 * pp_graph_optimize_for_training fuses it: one
 * pippin::CausalAttentionGrad(dY, Q, K, V[, mask_ref]) gives dQ, dK and dV
 * in their operands' layouts (lib/ops/attention_grad.c), recomputing the
 * probabilities from Q and K, so the stash keeps Q, K and V instead of the
 * T x T scores of every head. All of it is input gradient (region I). */
PP_GRAD_RULE(causal_attention) {
    const pp_node *n = &c->g->nodes[c->node];
    int m = pp_ad_in(c, 3), in[5] = {c->dy[0], pp_ad_in(c, 0), pp_ad_in(c, 1), pp_ad_in(c, 2), m}, id;
    uint8_t want[3] = {c->need[0], c->need[1], c->need[2]};
    if (!want[0] && !want[1] && !want[2]) return PP_OK;
    /* read before emitting: adding nodes moves the node array */
    char layouts[4][8];
    static const char *const names[4] = {"q_layout", "k_layout", "v_layout", "out_layout"};
    static const char *const defaults[4] = {"bhtd", "bhdt", "bhtd", "bhtd"};
    for (int k = 0; k < 4; k++) snprintf(layouts[k], sizeof layouts[k], "%s", pp_node_attr_string(n, names[k], defaults[k]));
    float scale = pp_node_attr_float(n, "scale", 1.0f);
    int64_t scale_div = pp_node_attr_int(n, "scale_div", 0);
    PP_TRY(pp_grad_emit(c, "CausalAttentionGrad", "pippin", m >= 0 ? 5 : 4, in, 3, want, c->dx, &id));
    for (int k = 0; k < 4; k++) PP_TRY(pp_node_set_string(c->g, id, names[k], layouts[k]));
    PP_TRY(pp_node_set_float(c->g, id, "scale", scale));
    if (scale_div) PP_TRY(pp_node_set_int(c->g, id, "scale_div", 1));
    return PP_OK;
}

/* *out = Gemm(p, q) with the given flags. */
static pp_status gemm(pp_grad_ctx *c, int p, int q, int ta, int tb, float alpha, int *out) {
    int in[2] = {p, q}, id;
    PP_TRY(pp_grad_emit(c, "Gemm", "", 2, in, 1, NULL, out, &id));
    if (ta) PP_TRY(pp_node_set_int(c->g, id, "transA", 1));
    if (tb) PP_TRY(pp_node_set_int(c->g, id, "transB", 1));
    if (alpha != 1.0f) PP_TRY(pp_node_set_float(c->g, id, "alpha", alpha));
    return PP_OK;
}

/* Y = alpha op(A) op(B) + beta C, all 2-D: each gradient is one Gemm. */
PP_GRAD_RULE(gemm) {
    const pp_node *n = &c->g->nodes[c->node];
    float alpha = pp_node_attr_float(n, "alpha", 1.0f), beta = pp_node_attr_float(n, "beta", 1.0f);
    int ta = pp_node_attr_int(n, "transA", 0) != 0, tb = pp_node_attr_int(n, "transB", 0) != 0;
    int a = pp_ad_in(c, 0), b = pp_ad_in(c, 1), cc = pp_ad_in(c, 2), dy = c->dy[0];
    if (c->need[0]) {
        if (!ta) PP_TRY(gemm(c, dy, b, 0, !tb, alpha, &c->dx[0]));  /* dY op(B)^T */
        else PP_TRY(gemm(c, b, dy, tb, 1, alpha, &c->dx[0]));       /* op(B) dY^T */
    }
    if (c->need[1]) {
        if (!tb) PP_TRY(gemm(c, a, dy, !ta, 0, alpha, &c->dx[1]));  /* op(A)^T dY */
        else PP_TRY(gemm(c, dy, a, 1, ta, alpha, &c->dx[1]));       /* dY^T op(A) */
    }
    if (cc >= 0 && c->need[2]) { /* need[] has entries only for the inputs the node has */
        int s;
        PP_TRY(pp_grad_sum_to(c, dy, cc, &s));
        if (beta != 1.0f) {
            int bv;
            PP_TRY(pp_grad_const_f32(c, beta, &bv));
            PP_TRY(pp_grad_op1(c, "Mul", "", s, bv, &s));
        }
        c->dx[2] = s;
    }
    return PP_OK;
}

/* Softmax: dx = y (dy - sum(dy y)); LogSoftmax: dx = dy - exp(y) sum(dy). */
PP_GRAD_RULE(softmax) {
    const pp_node *n = &c->g->nodes[c->node];
    int legacy = c->g->opset < 13; /* opset < 13 flattens to 2-D at axis (default 1) */
    int64_t axis = pp_node_attr_int(n, "axis", legacy ? 1 : -1);
    const char *op = strcmp(n->op_type, "Softmax") == 0 ? "SoftmaxGrad" : "LogSoftmaxGrad";
    int in[2] = {c->dy[0], pp_ad_out(c, 0)}, id;
    PP_TRY(pp_grad_emit(c, op, "pippin", 2, in, 1, NULL, &c->dx[0], &id));
    PP_TRY(pp_node_set_int(c->g, id, "axis", axis));
    if (legacy) PP_TRY(pp_node_set_int(c->g, id, "coerce2d", 1));
    return PP_OK;
}

PP_GRAD_RULE(layer_norm) {
    const pp_node *n = &c->g->nodes[c->node];
    if ((n->n_out > 1 && c->dy[1] >= 0) || (n->n_out > 2 && c->dy[2] >= 0))
        return pp_node_error(n, PP_ERR_UNSUPPORTED,
                             "no gradient through the Mean/InvStdDev outputs");
    int64_t axis = pp_node_attr_int(n, "axis", -1);
    float eps = pp_node_attr_float(n, "epsilon", 1e-5f);
    int x = pp_ad_in(c, 0), scale = pp_ad_in(c, 1), bias = pp_ad_in(c, 2), id;
    if (c->need[0]) { /* region I: dx */
        int in[3] = {c->dy[0], x, scale};
        PP_TRY(pp_grad_emit(c, "LayerNormGradInput", "pippin", 3, in, 1, NULL, &c->dx[0], &id));
        PP_TRY(pp_node_set_int(c->g, id, "axis", axis));
        PP_TRY(pp_node_set_float(c->g, id, "epsilon", eps));
    }
    uint8_t want[2] = {c->need[1], (uint8_t)(bias >= 0 && c->need[2])};
    if (want[0] || want[1]) { /* region W: dscale, dbias */
        int in[2] = {c->dy[0], x}, outs[2];
        PP_TRY(pp_grad_emit(c, "LayerNormGradWeight", "pippin", 2, in, 2, want, outs, &id));
        PP_TRY(pp_node_set_int(c->g, id, "axis", axis));
        PP_TRY(pp_node_set_float(c->g, id, "epsilon", eps));
        if (want[0]) c->dx[1] = outs[0];
        if (want[1]) c->dx[2] = outs[1];
    }
    return PP_OK;
}

PP_GRAD_RULE(sce_loss) {
    const pp_node *n = &c->g->nodes[c->node];
    const char *red = pp_node_attr_string(n, "reduction", "mean");
    char reduction[16];
    snprintf(reduction, sizeof reduction, "%s", red);
    int has_ignore = pp_node_attr(n, "ignore_index") != NULL;
    int64_t ignore = pp_node_attr_int(n, "ignore_index", 0);
    int scores = pp_ad_in(c, 0), labels = pp_ad_in(c, 1), weights = pp_ad_in(c, 2);
    int parts[2] = {-1, -1}, id;
    if (c->dy[0] >= 0) {
        int in[4] = {c->dy[0], scores, labels, weights};
        PP_TRY(pp_grad_emit(c, "SoftmaxCrossEntropyLossGrad", "pippin", weights >= 0 ? 4 : 3, in,
                            1, NULL, &parts[0], &id));
        PP_TRY(pp_node_set_string(c->g, id, "reduction", reduction));
        if (has_ignore) PP_TRY(pp_node_set_int(c->g, id, "ignore_index", ignore));
    }
    if (pp_ad_out(c, 1) >= 0 && c->dy[1] >= 0) { /* through the log_prob output */
        int in[2] = {c->dy[1], pp_ad_out(c, 1)};
        PP_TRY(pp_grad_emit(c, "LogSoftmaxGrad", "pippin", 2, in, 1, NULL, &parts[1], &id));
        PP_TRY(pp_node_set_int(c->g, id, "axis", 1));
    }
    if (parts[0] >= 0 && parts[1] >= 0)
        return pp_grad_op1(c, "Add", "", parts[0], parts[1], &c->dx[0]);
    c->dx[0] = parts[0] >= 0 ? parts[0] : parts[1];
    return PP_OK;
}
