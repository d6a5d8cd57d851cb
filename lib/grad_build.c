/* Node-building helpers for gradient rules: naming, constants, run-time
 * shapes and un-broadcasting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff_internal.h"
#include "grow.h"
#include "op.h"

#include "status_internal.h"
pp_status pp_ad_state_init(pp_ad_state *st, const pp_graph *g) {
    memset(st, 0, sizeof *st);
    st->n_fwd_nodes = g->n_nodes;
    st->n_fwd_values = g->n_values;
    st->shape_of = malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
    if (!st->shape_of) return pp_error(PP_ERR_NOMEM, "out of memory in autodiff");
    for (int v = 0; v < g->n_values; v++) st->shape_of[v] = -1;
    return PP_OK;
}

void pp_ad_state_clear(pp_ad_state *st) {
    free(st->shape_of);
    free(st->side);
    memset(st, 0, sizeof *st);
}

pp_status pp_ad_contribute(pp_grad_ctx *c, int v, int gv) {
    pp_ad_state *st = c->priv;
    if (st->n_extra >= 4) return pp_error(PP_ERR_INTERNAL, "too many extra gradients from a rule");
    st->extra_v[st->n_extra] = v;
    st->extra_g[st->n_extra++] = gv;
    return PP_OK;
}

int pp_ad_is_side(const pp_ad_state *st, int node) {
    return node >= 0 && node < st->cap_side && st->side[node];
}

static pp_status mark_side(pp_ad_state *st, int node) {
    int old = st->cap_side;
    PP_TRY(PP_GROW(st->side, st->cap_side, node));
    if (st->cap_side > old) memset(st->side + old, 0, (size_t)(st->cap_side - old));
    st->side[node] = 1;
    return PP_OK;
}

pp_status pp_grad_emit(pp_grad_ctx *c, const char *op_type, const char *domain, int n_in,
                       const int *in, int n_out, const uint8_t *want, int *out, int *node) {
    pp_graph *g = c->g;
    char base[512], name[600];
    const char *fwd = c->node >= 0 ? g->nodes[c->node].name : "";
    snprintf(base, sizeof base, "%s/grad/%s", fwd && fwd[0] ? fwd : "autodiff", op_type);
    snprintf(name, sizeof name, "%s", pp_graph_unique_name(g, base));
    const char *names[64];
    if (n_out > 64) return pp_error(PP_ERR_INTERNAL, "gradient node with %d outputs", n_out);
    for (int i = 0; i < n_out; i++) names[i] = want && !want[i] ? "" : NULL;
    int id;
    PP_TRY(pp_graph_add_node(g, op_type, domain, name, n_in, in, n_out, names, &id));
    for (int i = 0; i < n_out && out; i++) out[i] = g->nodes[id].out[i];
    if (node) *node = id;
    return PP_OK;
}

pp_status pp_grad_op1(pp_grad_ctx *c, const char *op_type, const char *domain, int a, int b,
                      int *out) {
    int in[2] = {a, b};
    return pp_grad_emit(c, op_type, domain, b < -1 ? 1 : 2, in, 1, NULL, out, NULL);
}

static pp_status add_const(pp_grad_ctx *c, pp_tensor *t, int *out) {
    return pp_graph_add_initializer(c->g, pp_graph_unique_name(c->g, "autodiff/const"),
                                    PP_VALUE_CONST, t, out);
}

pp_status pp_grad_const_f32(pp_grad_ctx *c, float v, int *out) {
    pp_ad_state *st = c->priv;
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    for (int i = 0; st && i < st->n_consts; i++)
        if (st->const_bits[i] == bits) {
            *out = st->const_ids[i];
            return PP_OK;
        }
    pp_tensor *t;
    PP_TRY(pp_tensor_scalar_f32(v, &t));
    PP_TRY(add_const(c, t, out));
    if (st && st->n_consts < 16) {
        st->const_bits[st->n_consts] = bits;
        st->const_ids[st->n_consts++] = *out;
    }
    return PP_OK;
}

pp_status pp_grad_const_i64(pp_grad_ctx *c, int n, const int64_t *vals, int *out) {
    pp_tensor *t;
    int64_t shape[1] = {n};
    PP_TRY(pp_tensor_empty(PP_I64, 1, shape, &t));
    if (n) memcpy(t->data, vals, sizeof(int64_t) * (size_t)n);
    return add_const(c, t, out);
}

/* 1 when the value's static shape is fully known; fills ndim/shape. */
static int static_shape(const pp_graph *g, int v, int *ndim, const int64_t **shape) {
    const pp_value *val = &g->values[v];
    if (val->data) {
        *ndim = val->data->ndim;
        *shape = val->data->shape;
        return 1;
    }
    if (val->ndim < 0) return 0;
    for (int d = 0; d < val->ndim; d++)
        if (val->shape[d] < 0) return 0;
    *ndim = val->ndim;
    *shape = val->shape;
    return 1;
}

pp_status pp_grad_shape_of(pp_grad_ctx *c, int v, int *out) {
    pp_ad_state *st = c->priv;
    if (v < 0 || v >= c->g->n_values) /* an omitted optional input or output */
        return pp_node_error(&c->g->nodes[c->node], PP_ERR_UNSUPPORTED,
                             "gradient through an omitted input or output is not supported");
    int fwd = st && v < st->n_fwd_values;
    if (fwd && st->shape_of[v] >= 0) {
        *out = st->shape_of[v];
        return PP_OK;
    }
    int nd;
    const int64_t *sh;
    if (static_shape(c->g, v, &nd, &sh)) {
        int64_t copy[PP_MAX_DIMS];
        memcpy(copy, sh, sizeof(int64_t) * (size_t)nd);
        PP_TRY(pp_grad_const_i64(c, nd, copy, out));
    } else {
        int node;
        PP_TRY(pp_grad_emit(c, "Shape", "", 1, &v, 1, NULL, out, &node));
        /* A forward value's shape is taken with the forward, so the backward
         * keeps these few bytes rather than the activation. */
        if (fwd) PP_TRY(mark_side(st, node));
    }
    if (fwd) st->shape_of[v] = *out;
    return PP_OK;
}

pp_status pp_grad_sum_to(pp_grad_ctx *c, int grad, int like, int *out) {
    const pp_node *n = &c->g->nodes[c->node];
    int nl, ny;
    const int64_t *sl, *sy;
    if (n->n_out > 0 && n->out[0] >= 0 && static_shape(c->g, like, &nl, &sl) &&
        static_shape(c->g, n->out[0], &ny, &sy) && pp_shape_equal(nl, sl, ny, sy)) {
        *out = grad;
        return PP_OK;
    }
    int shape;
    PP_TRY(pp_grad_shape_of(c, like, &shape));
    return pp_grad_op1(c, "SumToShape", "pippin", grad, shape, out);
}
