/* Gradient rules of pooling (MaxPool, AveragePool, GlobalAveragePool,
 * GlobalMaxPool) and of the activations Clip, HardSigmoid, HardSwish, Elu,
 * Selu, Softplus, Softsign and PRelu. The kernels they emit are in
 * lib/ops/pool.c and lib/ops/grad_act.c. */
#include <stdio.h>
#include <string.h>

#include "autodiff_internal.h"
#include "grow.h"

#include "status_internal.h"

/* Copies every attribute of the forward node onto node id. */
static pp_status copy_attrs(pp_grad_ctx *c, int id) {
    int n_attr = c->g->nodes[c->node].n_attr;
    for (int i = 0; i < n_attr; i++) {
        const pp_attr *a = &c->g->nodes[c->node].attrs[i];
        char name[128];
        snprintf(name, sizeof name, "%s", a->name);
        switch (a->type) {
        case PP_ATTR_INT: PP_TRY(pp_node_set_int(c->g, id, name, a->i)); break;
        case PP_ATTR_FLOAT: PP_TRY(pp_node_set_float(c->g, id, name, a->f)); break;
        case PP_ATTR_STRING: {
            char s[128];
            snprintf(s, sizeof s, "%s", a->s ? a->s : "");
            PP_TRY(pp_node_set_string(c->g, id, name, s));
            break;
        }
        case PP_ATTR_INTS: {
            int64_t v[16];
            int n = a->n < 16 ? a->n : 16;
            memcpy(v, a->ints, sizeof(int64_t) * (size_t)n);
            PP_TRY(pp_node_set_ints(c->g, id, name, n, v));
            break;
        }
        default: break; /* pooling and activations have no other kinds */
        }
    }
    return PP_OK;
}

/* Marks node as a forward-side helper (region F), as pp_grad_shape_of does
 * for Shape: it runs with the forward, so the backward keeps its result
 * rather than the activation it reads. */
static pp_status mark_side(pp_grad_ctx *c, int node) {
    pp_ad_state *st = c->priv;
    if (!st) return PP_OK;
    int old = st->cap_side;
    PP_TRY(PP_GROW(st->side, st->cap_side, node));
    if (st->cap_side > old) memset(st->side + old, 0, (size_t)(st->cap_side - old));
    st->side[node] = 1;
    return PP_OK;
}

PP_GRAD_RULE(maxpool) {
    int x = pp_ad_in(c, 0), idx = pp_ad_out(c, 1), shape, id;
    const pp_node *n = &c->g->nodes[c->node];
    if (idx < 0 || pp_node_attr_int(n, "storage_order", 0) != 0) {
        /* The argmax indices, taken with the forward. Y is kept as a value
         * of its own, unused: ONNX requires MaxPool's first output, and a
         * written training graph must load elsewhere (ONNX Runtime). */
        int out[2];
        PP_TRY(pp_grad_emit(c, "MaxPool", "", 1, &x, 2, NULL, out, &id));
        PP_TRY(copy_attrs(c, id));
        PP_TRY(pp_node_set_int(c->g, id, "storage_order", 0));
        PP_TRY(mark_side(c, id));
        idx = out[1];
    }
    PP_TRY(pp_grad_shape_of(c, x, &shape));
    int in[3] = {c->dy[0], idx, shape};
    return pp_grad_emit(c, "MaxPoolGrad", "pippin", 3, in, 1, NULL, &c->dx[0], NULL);
}

PP_GRAD_RULE(avgpool) {
    int shape, id;
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &shape));
    int in[2] = {c->dy[0], shape};
    PP_TRY(pp_grad_emit(c, "AveragePoolGrad", "pippin", 2, in, 1, NULL, &c->dx[0], &id));
    return copy_attrs(c, id);
}

PP_GRAD_RULE(global_avgpool) {
    int shape;
    PP_TRY(pp_grad_shape_of(c, pp_ad_in(c, 0), &shape));
    return pp_grad_op1(c, "GlobalAveragePoolGrad", "pippin", c->dy[0], shape, &c->dx[0]);
}

PP_GRAD_RULE(global_maxpool) {
    return pp_grad_op1(c, "GlobalMaxPoolGrad", "pippin", c->dy[0], pp_ad_in(c, 0), &c->dx[0]);
}

/* pippin::<Op>Grad(dy, x[, min, max]) with the forward's attributes. */
PP_GRAD_RULE(activation) {
    const pp_node *n = &c->g->nodes[c->node];
    char op[64];
    snprintf(op, sizeof op, "%sGrad", n->op_type);
    int in[4] = {c->dy[0], pp_ad_in(c, 0), pp_ad_in(c, 1), pp_ad_in(c, 2)}, n_in = 4, id;
    if (strcmp(n->op_type, "Clip") != 0) n_in = 2;
    while (n_in > 2 && in[n_in - 1] < 0) n_in--;
    PP_TRY(pp_grad_emit(c, op, "pippin", n_in, in, 1, NULL, &c->dx[0], &id));
    return copy_attrs(c, id);
}

/* y = x < 0 ? slope * x : x (slope broadcast to x).
 * dx = Where(x < 0, dy * slope, dy); dslope = SumTo(dy * min(x, 0)). The two
 * share no node, so the slope's gradient is all W work. */
PP_GRAD_RULE(prelu) {
    int x = pp_ad_in(c, 0), slope = pp_ad_in(c, 1), zero;
    PP_TRY(pp_grad_const_f32(c, 0.0f, &zero));
    if (c->need[0]) {
        int cond, t;
        PP_TRY(pp_grad_op1(c, "Less", "", x, zero, &cond));
        PP_TRY(pp_grad_op1(c, "Mul", "", c->dy[0], slope, &t));
        int in[3] = {cond, t, c->dy[0]};
        PP_TRY(pp_grad_emit(c, "Where", "", 3, in, 1, NULL, &c->dx[0], NULL));
    }
    if (c->need[1]) {
        int m, u;
        PP_TRY(pp_grad_op1(c, "Min", "", x, zero, &m));
        PP_TRY(pp_grad_op1(c, "Mul", "", c->dy[0], m, &u));
        PP_TRY(pp_grad_sum_to(c, u, slope, &c->dx[1]));
    }
    return PP_OK;
}
