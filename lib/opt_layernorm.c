/* Optimizer pass "layernorm": LayerNorm as PyTorch exports it below opset
 * 17 (and other exporters write it) becomes one LayerNormalization:
 *
 *   m = ReduceMean(x, axes)        axes: the last k dims, keepdims 1
 *   d = Sub(x, m)
 *   p = Pow(d, 2) | Mul(d, d)
 *   v = ReduceMean(p, axes)
 *   s = Sqrt(Add(v, eps))          eps a scalar float constant
 *   y = Add(Mul(Div(d, s), gamma), beta)   (or gamma first; beta optional)
 *
 * gamma and beta float32 initializers of rank <= k (LayerNormalization
 * broadcasts them over the normalised dims as Mul and Add did). axes come
 * from the attribute (opset < 18) or a constant input (18): negative,
 * -k..-1, or non-negative when x's rank is known. Every intermediate is
 * read by the next piece alone (d by p and the Div). The Add of beta (or
 * the Mul of gamma) becomes the LayerNormalization, axis -k, keeping its
 * name and output. Within float rounding: the kernel sums in double. */
#include <string.h>

#include "opt_internal.h"

#include "status_internal.h"

static int sole(const pp_opt_ctx *c, int v, const char *op) {
    int p = pp_opt_producer(c, v, op);
    return p >= 0 && c->uses[v] == 1 && !pp_opt_is_output(c->g, v) ? p : -1;
}

/* A float32 scalar-like constant's value. */
static int f32_scalar(const pp_graph *g, int v, float *out) {
    const pp_tensor *t = v >= 0 && g->values[v].kind == PP_VALUE_CONST ? g->values[v].data : NULL;
    if (!t || t->dtype != PP_F32 || pp_tensor_numel(t) != 1) return 0;
    *out = *(const float *)t->data;
    return 1;
}

/* k if ReduceMean node r averages the last k dims of its input, of rank
 * `rank` (-1: not known), with keepdims 1; else 0. */
static int trailing_axes(const pp_graph *g, const pp_node *r, int rank) {
    if (pp_node_attr_int(r, "keepdims", 1) != 1 || r->n_out != 1) return 0;
    const int64_t *axes = NULL;
    int n = pp_node_attr_ints(r, "axes", &axes);
    if (n < 0 && r->n_in > 1 && r->in[1] >= 0) {
        const pp_tensor *t = g->values[r->in[1]].kind == PP_VALUE_CONST ? g->values[r->in[1]].data : NULL;
        if (!t || t->dtype != PP_I64 || t->ndim != 1) return 0;
        axes = t->data;
        n = (int)t->shape[0];
    } else if (r->n_in > 1) {
        return 0;
    }
    if (n < 1 || n > PP_MAX_DIMS) return 0;
    int seen[PP_MAX_DIMS] = {0};
    for (int k = 0; k < n; k++) {
        int64_t a = axes[k];
        if (a >= 0) {
            if (rank < 0) return 0;
            a -= rank;
        }
        if (a < -n || a >= 0 || seen[-a - 1]++) return 0;
    }
    return n;
}

/* gamma / beta: a float32 initializer of rank <= k. */
static int affine(const pp_graph *g, int v, int k) {
    const pp_tensor *t = pp_opt_initializer(g, v);
    return t && t->dtype == PP_F32 && t->ndim <= k;
}

/* The other input of binary node n than v (-1 if both or neither). */
static int other_input(const pp_node *n, int v) {
    if (n->n_in != 2 || n->in[0] == n->in[1]) return -1;
    return n->in[0] == v ? n->in[1] : n->in[1] == v ? n->in[0] : -1;
}

static pp_status fuse(pp_opt_ctx *c, int div, int *count) {
    pp_graph *g = c->g;
    const pp_node *dv = &g->nodes[div];
    if (dv->n_in != 2 || dv->n_out != 1) return PP_OK;
    int d = dv->in[0];
    int sub = pp_opt_producer(c, d, "Sub"), sq = sole(c, dv->in[1], "Sqrt");
    if (sub < 0 || sq < 0 || pp_opt_is_output(g, d)) return PP_OK;
    int add_eps = sole(c, g->nodes[sq].in[0], "Add");
    if (add_eps < 0) return PP_OK;
    const pp_node *ae = &g->nodes[add_eps];
    float eps;
    int var;
    if (ae->n_in != 2) return PP_OK;
    if (f32_scalar(g, ae->in[1], &eps)) var = ae->in[0];
    else if (f32_scalar(g, ae->in[0], &eps)) var = ae->in[1];
    else return PP_OK;
    int rm2 = sole(c, var, "ReduceMean");
    if (rm2 < 0) return PP_OK;
    int p = g->nodes[rm2].in[0], pw;
    float two;
    if ((pw = sole(c, p, "Pow")) >= 0) {
        if (g->nodes[pw].in[0] != d || !f32_scalar(g, g->nodes[pw].in[1], &two) || two != 2.0f || c->uses[d] != 2)
            return PP_OK;
    } else if ((pw = sole(c, p, "Mul")) >= 0) { /* d read twice by it */
        if (g->nodes[pw].n_in != 2 || g->nodes[pw].in[0] != d || g->nodes[pw].in[1] != d || c->uses[d] != 3)
            return PP_OK;
    } else {
        return PP_OK;
    }
    const pp_node *sb = &g->nodes[sub];
    if (sb->n_in != 2) return PP_OK;
    int x = sb->in[0], rm1 = sole(c, sb->in[1], "ReduceMean");
    if (rm1 < 0 || g->nodes[rm1].in[0] != x) return PP_OK;
    int k = trailing_axes(g, &g->nodes[rm1], g->values[x].ndim); /* (x - mean)^2 has x's rank */
    if (!k || trailing_axes(g, &g->nodes[rm2], g->values[x].ndim) != k) return PP_OK;
    /* the affine part: Mul by gamma, then Add of beta (optional) */
    int mul = pp_opt_sole_reader(c, dv->out[0]);
    if (mul < 0 || !pp_opt_is_op(&g->nodes[mul], "Mul")) return PP_OK;
    int gamma = other_input(&g->nodes[mul], dv->out[0]);
    if (gamma < 0 || !affine(g, gamma, k)) return PP_OK;
    int last = mul, beta = -1;
    int add = pp_opt_sole_reader(c, g->nodes[mul].out[0]);
    if (add >= 0 && pp_opt_is_op(&g->nodes[add], "Add")) {
        int b = other_input(&g->nodes[add], g->nodes[mul].out[0]);
        if (b >= 0 && affine(g, b, k)) last = add, beta = b;
    }
    int ins[3] = {x, gamma, beta};
    PP_TRY(pp_opt_rewrite(c, last, "LayerNormalization", "", beta >= 0 ? 3 : 2, ins));
    PP_TRY(pp_node_set_int(g, last, "axis", -k));
    PP_TRY(pp_node_set_float(g, last, "epsilon", eps));
    (*count)++;
    return PP_OK;
}

pp_status pp_opt_layernorm(pp_opt_ctx *c, int *count) {
    *count = 0;
    for (int i = 0; i < c->g->n_nodes; i++)
        if (!c->dead[i] && pp_opt_is_op(&c->g->nodes[i], "Div")) PP_TRY(fuse(c, i, count));
    return PP_OK;
}
