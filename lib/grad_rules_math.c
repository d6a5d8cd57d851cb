/* Gradient rules of elementwise arithmetic, activations, reductions and
 * Where. Broadcast operands get their gradient summed back to their shape. */
#include <stdio.h>
#include <string.h>

#include "autodiff_internal.h"

#include "status_internal.h"
PP_GRAD_RULE(add) {
    for (int k = 0; k < 2; k++)
        if (c->need[k]) PP_TRY(pp_grad_sum_to(c, c->dy[0], pp_ad_in(c, k), &c->dx[k]));
    return PP_OK;
}

PP_GRAD_RULE(sub) {
    if (c->need[0]) PP_TRY(pp_grad_sum_to(c, c->dy[0], pp_ad_in(c, 0), &c->dx[0]));
    if (c->need[1]) {
        int s;
        PP_TRY(pp_grad_sum_to(c, c->dy[0], pp_ad_in(c, 1), &s));
        PP_TRY(pp_grad_op1(c, "Neg", "", s, -2, &c->dx[1]));
    }
    return PP_OK;
}

PP_GRAD_RULE(mul) {
    int a = pp_ad_in(c, 0), b = pp_ad_in(c, 1);
    for (int k = 0; k < 2; k++) {
        if (!c->need[k]) continue;
        int t;
        PP_TRY(pp_grad_op1(c, "Mul", "", c->dy[0], k == 0 ? b : a, &t));
        PP_TRY(pp_grad_sum_to(c, t, k == 0 ? a : b, &c->dx[k]));
    }
    return PP_OK;
}

PP_GRAD_RULE(div) {
    int a = pp_ad_in(c, 0), b = pp_ad_in(c, 1), y = pp_ad_out(c, 0);
    if (c->need[0]) { /* da = dy / b */
        int t;
        PP_TRY(pp_grad_op1(c, "Div", "", c->dy[0], b, &t));
        PP_TRY(pp_grad_sum_to(c, t, a, &c->dx[0]));
    }
    if (c->need[1]) { /* db = -dy * a / b^2 = -(dy * y) / b */
        int t, u, s;
        PP_TRY(pp_grad_op1(c, "Mul", "", c->dy[0], y, &t));
        PP_TRY(pp_grad_op1(c, "Div", "", t, b, &u));
        PP_TRY(pp_grad_sum_to(c, u, b, &s));
        PP_TRY(pp_grad_op1(c, "Neg", "", s, -2, &c->dx[1]));
    }
    return PP_OK;
}

PP_GRAD_RULE(pow) {
    int x = pp_ad_in(c, 0), p = pp_ad_in(c, 1), y = pp_ad_out(c, 0);
    if (c->need[0]) { /* dx = dy * p * x^(p-1) */
        int one, pm1, xp, t, u;
        PP_TRY(pp_grad_const_f32(c, 1.0f, &one));
        PP_TRY(pp_grad_op1(c, "Sub", "", p, one, &pm1));
        PP_TRY(pp_grad_op1(c, "Pow", "", x, pm1, &xp));
        PP_TRY(pp_grad_op1(c, "Mul", "", xp, p, &t));
        PP_TRY(pp_grad_op1(c, "Mul", "", c->dy[0], t, &u));
        PP_TRY(pp_grad_sum_to(c, u, x, &c->dx[0]));
    }
    if (c->need[1]) { /* dp = dy * y * log(x) */
        int lx, t, u;
        PP_TRY(pp_grad_op1(c, "Log", "", x, -2, &lx));
        PP_TRY(pp_grad_op1(c, "Mul", "", y, lx, &t));
        PP_TRY(pp_grad_op1(c, "Mul", "", c->dy[0], t, &u));
        PP_TRY(pp_grad_sum_to(c, u, p, &c->dx[1]));
    }
    return PP_OK;
}

PP_GRAD_RULE(neg) { return pp_grad_op1(c, "Neg", "", c->dy[0], -2, &c->dx[0]); }

PP_GRAD_RULE(exp) { return pp_grad_op1(c, "Mul", "", c->dy[0], pp_ad_out(c, 0), &c->dx[0]); }

PP_GRAD_RULE(log) { return pp_grad_op1(c, "Div", "", c->dy[0], pp_ad_in(c, 0), &c->dx[0]); }

/* y = 1/x: dx = -dy * y * y */
PP_GRAD_RULE(reciprocal) {
    int y = pp_ad_out(c, 0), t, u;
    PP_TRY(pp_grad_op1(c, "Mul", "", y, y, &t));
    PP_TRY(pp_grad_op1(c, "Mul", "", c->dy[0], t, &u));
    return pp_grad_op1(c, "Neg", "", u, -2, &c->dx[0]);
}

/* dx = dy * sign(x) (0 at 0, as PyTorch) */
PP_GRAD_RULE(abs) {
    int s;
    PP_TRY(pp_grad_op1(c, "Sign", "", pp_ad_in(c, 0), -2, &s));
    return pp_grad_op1(c, "Mul", "", c->dy[0], s, &c->dx[0]);
}

/* pippin::<Op>Grad(dy, t) with the forward's attributes copied. */
static pp_status unary(pp_grad_ctx *c, int t) {
    const pp_node *n = &c->g->nodes[c->node];
    char op[64];
    snprintf(op, sizeof op, "%sGrad", n->op_type);
    float alpha = pp_node_attr_float(n, "alpha", 0.01f);
    const char *approx = pp_node_attr_string(n, "approximate", NULL);
    char approx_copy[16] = "";
    if (approx) snprintf(approx_copy, sizeof approx_copy, "%s", approx);
    int is_leaky = strcmp(n->op_type, "LeakyRelu") == 0;
    int in[2] = {c->dy[0], t}, id;
    PP_TRY(pp_grad_emit(c, op, "pippin", 2, in, 1, NULL, &c->dx[0], &id));
    if (is_leaky) PP_TRY(pp_node_set_float(c->g, id, "alpha", alpha));
    if (approx) PP_TRY(pp_node_set_string(c->g, id, "approximate", approx_copy));
    return PP_OK;
}

PP_GRAD_RULE(unary_y) { return unary(c, pp_ad_out(c, 0)); }
PP_GRAD_RULE(unary_x) { return unary(c, pp_ad_in(c, 0)); }

pp_status pp_grad_expand_reduced(pp_grad_ctx *c, int v, int shape, int mean, int *out) {
    const pp_node *n = &c->g->nodes[c->node];
    int64_t keepdims = pp_node_attr_int(n, "keepdims", 1);
    int64_t noop = pp_node_attr_int(n, "noop_with_empty_axes", 0);
    const int64_t *ax = NULL;
    int n_ax = pp_node_attr_ints(n, "axes", &ax);
    int64_t axes[PP_MAX_DIMS];
    if (n_ax > PP_MAX_DIMS) return pp_node_error(n, PP_ERR_UNSUPPORTED, "too many axes");
    for (int i = 0; i < n_ax; i++) axes[i] = ax[i];
    int axes_in = pp_ad_in(c, 1), id;
    int in[3] = {v, shape, axes_in};
    PP_TRY(pp_grad_emit(c, "ExpandReduced", "pippin", axes_in >= 0 ? 3 : 2, in, 1, NULL, out, &id));
    PP_TRY(pp_node_set_int(c->g, id, "keepdims", keepdims));
    PP_TRY(pp_node_set_int(c->g, id, "noop_with_empty_axes", noop));
    PP_TRY(pp_node_set_int(c->g, id, "mean", mean));
    if (n_ax >= 0) PP_TRY(pp_node_set_ints(c->g, id, "axes", n_ax, axes));
    return PP_OK;
}

PP_GRAD_RULE(reduce) {
    int shape, mean = strcmp(c->g->nodes[c->node].op_type, "ReduceMean") == 0;
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &shape));
    return pp_grad_expand_reduced(c, c->dy[0], shape, mean, &c->dx[0]);
}

PP_GRAD_RULE(where) {
    int cond = pp_ad_in(c, 0), zero;
    PP_TRY(pp_grad_const_f32(c, 0.0f, &zero));
    for (int k = 1; k < 3; k++) {
        if (!c->need[k]) continue;
        int in[3] = {cond, k == 1 ? c->dy[0] : zero, k == 1 ? zero : c->dy[0]}, t;
        PP_TRY(pp_grad_emit(c, "Where", "", 3, in, 1, NULL, &t, NULL));
        PP_TRY(pp_grad_sum_to(c, t, pp_ad_in(c, k), &c->dx[k]));
    }
    return PP_OK;
}
