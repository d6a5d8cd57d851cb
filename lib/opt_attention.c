/* Optimizer pass "attention": causal self-attention as PyTorch 1.13 exports
 * it becomes one pippin::CausalAttention (lib/ops/attention.c):
 *
 *   S = MatMul(Q, KT)                     KT: K^T
 *   S = Mul(S, c) | Mul(c, S) | Div(S, c) c a scalar constant (optional)
 *   S = Where(cond, -inf, S) | Where(cond, S, -inf) | Add(S, M) | Add(M, S)
 *   Y = MatMul(Softmax(S, axis -1), V)
 *
 * The mask must be causal, checked on the constant it comes from: cond is
 * [Cast to bool] of [Equal(m, z) or Not(m) or m], M is m, and m is the
 * constant, or Slices of it starting at 0 with step 1 along its last two
 * axes (the ends may be dynamic: the kernel reads the sliced mask's shape).
 * With keys j and queries i of the constant, Where must pick -inf exactly
 * where j > i (Add: the constant is 0 where j <= i and -inf elsewhere);
 * any other mask leaves the graph alone. The constant has rank 2 to 4,
 * every dim before the last two 1.
 *
 * Each score value must have that one reader. Transposes around the
 * pattern, each read by it alone, are absorbed into the kernel's layouts:
 * Q = Transpose(X, 0,2,1,3), KT = Transpose(X, 0,2,3,1) or
 * Transpose(K, 0,1,3,2), V = Transpose(X, 0,2,1,3), and Y's one reader
 * Transpose(Y, 0,2,1,3) (the fused node then makes its output). The node
 * doing Softmax times V becomes the fused one, keeping its name. */
#include <math.h>
#include <string.h>

#include "opt_internal.h"

#include "status_internal.h"

/* The one element of a scalar-like (numel 1) constant as a double; 0 if v
 * is not one. */
static int scalar_of(const pp_graph *g, int v, double *out) {
    const pp_tensor *t = v >= 0 && g->values[v].kind == PP_VALUE_CONST ? g->values[v].data : NULL;
    if (!t || pp_tensor_numel(t) != 1) return 0;
    switch (t->dtype) {
    case PP_F32: *out = *(const float *)t->data; return 1;
    case PP_F64: *out = *(const double *)t->data; return 1;
    case PP_I64: *out = (double)*(const int64_t *)t->data; return 1;
    case PP_I32: *out = *(const int32_t *)t->data; return 1;
    case PP_BOOL:
    case PP_U8: *out = *(const uint8_t *)t->data; return 1;
    default: return 0;
    }
}

static int element(const pp_tensor *t, int64_t k, double *out) {
    switch (t->dtype) {
    case PP_F32: *out = ((const float *)t->data)[k]; return 1;
    case PP_F64: *out = ((const double *)t->data)[k]; return 1;
    case PP_I64: *out = (double)((const int64_t *)t->data)[k]; return 1;
    case PP_I32: *out = ((const int32_t *)t->data)[k]; return 1;
    case PP_BOOL:
    case PP_U8: *out = ((const uint8_t *)t->data)[k]; return 1;
    default: return 0;
    }
}

/* All elements of a constant int64 input equal to want (absent: ok when
 * want is allowed to be absent). */
static int ints_all(const pp_graph *g, int v, int64_t want) {
    const pp_tensor *t = v >= 0 && g->values[v].kind == PP_VALUE_CONST ? g->values[v].data : NULL;
    if (!t || (t->dtype != PP_I64 && t->dtype != PP_I32)) return 0;
    for (int64_t k = 0; k < pp_tensor_numel(t); k++) {
        int64_t x = t->dtype == PP_I64 ? ((const int64_t *)t->data)[k] : ((const int32_t *)t->data)[k];
        if (x != want) return 0;
    }
    return 1;
}

/* Walks Slices back from v to the constant they cut: each starts at 0
 * with step 1 along the constant's last two axes. The constant, or NULL. */
static const pp_tensor *sliced_constant(const pp_opt_ctx *c, int v) {
    const pp_graph *g = c->g;
    int slices[8], n = 0;
    while (g->values[v].kind == PP_VALUE_NODE) {
        int s = pp_opt_producer(c, v, "Slice");
        if (s < 0 || n == 8 || g->nodes[s].n_in < 4) return NULL;
        slices[n++] = s;
        v = g->nodes[s].in[0];
    }
    const pp_tensor *t = g->values[v].kind == PP_VALUE_CONST ? g->values[v].data : NULL;
    if (!t || t->ndim < 2 || t->ndim > 4) return NULL;
    for (int d = 0; d < t->ndim - 2; d++)
        if (t->shape[d] != 1) return NULL;
    for (int k = 0; k < n; k++) {
        const pp_node *s = &g->nodes[slices[k]];
        if (!ints_all(g, s->in[1], 0)) return NULL;
        if (s->n_in > 4 && s->in[4] >= 0 && !ints_all(g, s->in[4], 1)) return NULL;
        const pp_tensor *axes = g->values[s->in[3]].kind == PP_VALUE_CONST ? g->values[s->in[3]].data : NULL;
        if (!axes || axes->dtype != PP_I64) return NULL;
        for (int64_t a = 0; a < pp_tensor_numel(axes); a++) {
            int64_t ax = ((const int64_t *)axes->data)[a];
            if (ax < 0) ax += t->ndim;
            if (ax != t->ndim - 2 && ax != t->ndim - 1) return NULL;
        }
    }
    return t;
}

/* How the mask's elements become "masked": for element x of the
 * constant, masked = ((eq ? x == z : x != 0) != invert). */
typedef struct {
    int eq, invert;
    double z;
} mask_rule;

/* 1 if the rule masks exactly keys j > i of the constant's [rows, cols]. */
static int rule_is_causal(const pp_tensor *t, const mask_rule *r) {
    int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            double x;
            if (!element(t, i * cols + j, &x)) return 0;
            int masked = (r->eq ? x == r->z : x != 0) != r->invert;
            if (masked != (j > i)) return 0;
        }
    return 1;
}

/* Where(cond, a, b), one of a and b the scalar -inf: the scores (the other
 * one) and the mask's sliced value, 1 if the mask is causal. */
static int where_mask(const pp_opt_ctx *c, const pp_node *w, int *scores, int *mask_ref) {
    const pp_graph *g = c->g;
    double x;
    int inf_first;
    if (w->n_in != 3) return 0;
    if (scalar_of(g, w->in[1], &x) && isinf(x) && x < 0) inf_first = 1, *scores = w->in[2];
    else if (scalar_of(g, w->in[2], &x) && isinf(x) && x < 0) inf_first = 0, *scores = w->in[1];
    else return 0;
    mask_rule r = {0, !inf_first, 0}; /* Where picks -inf where cond holds */
    int v = w->in[0], n;
    if ((n = pp_opt_producer(c, v, "Cast")) >= 0) {
        if (pp_node_attr_int(&g->nodes[n], "to", 0) != PP_BOOL) return 0;
        v = g->nodes[n].in[0];
    }
    if ((n = pp_opt_producer(c, v, "Not")) >= 0) {
        r.invert = !r.invert;
        v = g->nodes[n].in[0];
    }
    if ((n = pp_opt_producer(c, v, "Equal")) >= 0) {
        const pp_node *e = &g->nodes[n];
        r.eq = 1;
        if (scalar_of(g, e->in[1], &r.z)) v = e->in[0];
        else if (scalar_of(g, e->in[0], &r.z)) v = e->in[1];
        else return 0;
    }
    const pp_tensor *t = sliced_constant(c, v);
    if (!t || !rule_is_causal(t, &r)) return 0;
    *mask_ref = v;
    return 1;
}

/* Add(S, M): M 0 where keys j <= i, -inf elsewhere. */
static int add_mask(const pp_opt_ctx *c, const pp_node *a, int *scores, int *mask_ref) {
    if (a->n_in != 2) return 0;
    for (int k = 0; k < 2; k++) {
        const pp_tensor *t = sliced_constant(c, a->in[k]);
        if (!t || pp_dtype_is_float(t->dtype) == 0) continue;
        int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
        int ok = 1;
        for (int64_t i = 0; i < rows && ok; i++)
            for (int64_t j = 0; j < cols && ok; j++) {
                double x;
                ok = element(t, i * cols + j, &x) && (j > i ? isinf(x) && x < 0 : x == 0);
            }
        if (!ok) continue;
        *mask_ref = a->in[k];
        *scores = a->in[1 - k];
        return 1;
    }
    return 0;
}

/* The input of Transpose node producing v with permutation perm, if v has
 * that one reader; else -1. */
static int through_transpose(const pp_opt_ctx *c, int v, const int64_t *want) {
    int t = pp_opt_producer(c, v, "Transpose");
    if (t < 0 || c->uses[v] != 1 || pp_opt_is_output(c->g, v)) return -1;
    const int64_t *perm;
    if (pp_node_attr_ints(&c->g->nodes[t], "perm", &perm) != 4) return -1;
    for (int k = 0; k < 4; k++)
        if (perm[k] != want[k]) return -1;
    return c->g->nodes[t].in[0];
}

static const int64_t SWAP_TH[4] = {0, 2, 1, 3}, TO_KT[4] = {0, 2, 3, 1}, SWAP_LAST[4] = {0, 1, 3, 2};

/* The node producing v if it is op (default domain) and v is read by it
 * alone, else -1. */
static int sole_producer(const pp_opt_ctx *c, int v, const char *op) {
    int p = pp_opt_producer(c, v, op);
    return p >= 0 && c->uses[v] == 1 && !pp_opt_is_output(c->g, v) ? p : -1;
}

static pp_status fuse(pp_opt_ctx *c, int sm, int *count) {
    pp_graph *g = c->g;
    const pp_node *s = &g->nodes[sm];
    const pp_attr *axis = pp_node_attr(s, "axis");
    if (s->n_in != 1 || s->n_out != 1 || !axis || pp_node_attr_int(s, "axis", 0) != -1) return PP_OK;
    int pv = pp_opt_sole_reader(c, s->out[0]);
    if (pv < 0 || !pp_opt_is_op(&g->nodes[pv], "MatMul") || g->nodes[pv].in[0] != s->out[0]) return PP_OK;
    int scores = -1, mask_ref = -1, m;
    if ((m = sole_producer(c, s->in[0], "Where")) >= 0) {
        if (!where_mask(c, &g->nodes[m], &scores, &mask_ref)) return PP_OK;
    } else if ((m = sole_producer(c, s->in[0], "Add")) >= 0) {
        if (!add_mask(c, &g->nodes[m], &scores, &mask_ref)) return PP_OK;
    } else {
        return PP_OK;
    }
    double scale = 1;
    int scale_div = 0, sc;
    if ((sc = sole_producer(c, scores, "Mul")) >= 0 || (sc = sole_producer(c, scores, "Div")) >= 0) {
        const pp_node *n = &g->nodes[sc];
        int is_div = pp_opt_is_op(n, "Div");
        const pp_value *in0 = &g->values[n->in[0]], *in1 = &g->values[n->in[1]];
        if (scalar_of(g, n->in[1], &scale) && in1->data->dtype == PP_F32) scores = n->in[0];
        else if (!is_div && scalar_of(g, n->in[0], &scale) && in0->data->dtype == PP_F32) scores = n->in[1];
        else return PP_OK;
        scale_div = is_div;
    }
    int qk = sole_producer(c, scores, "MatMul");
    if (qk < 0 || g->nodes[qk].n_in != 2) return PP_OK;
    int q = g->nodes[qk].in[0], kt = g->nodes[qk].in[1], v = g->nodes[pv].in[1], x;
    const char *ql = "bhtd", *kl = "bhdt", *vl = "bhtd", *ol = "bhtd";
    if ((x = through_transpose(c, q, SWAP_TH)) >= 0) q = x, ql = "bthd";
    if ((x = through_transpose(c, kt, TO_KT)) >= 0) kt = x, kl = "bthd";
    else if ((x = through_transpose(c, kt, SWAP_LAST)) >= 0) kt = x, kl = "bhtd";
    if ((x = through_transpose(c, v, SWAP_TH)) >= 0) v = x, vl = "bthd";
    /* Y transposed back to [B, T, H, Dv] by its one reader (Q was [B, T, H, D]) */
    int out_t = strcmp(ql, "bthd") == 0 ? pp_opt_sole_reader(c, g->nodes[pv].out[0]) : -1;
    if (out_t >= 0) {
        const int64_t *perm;
        if (!pp_opt_is_op(&g->nodes[out_t], "Transpose") || g->nodes[out_t].n_out != 1 ||
            pp_node_attr_ints(&g->nodes[out_t], "perm", &perm) != 4 || memcmp(perm, SWAP_TH, sizeof SWAP_TH))
            out_t = -1;
        else
            ol = "bthd";
    }
    int ins[4] = {q, kt, v, mask_ref};
    PP_TRY(pp_opt_rewrite(c, pv, "CausalAttention", "pippin", 4, ins));
    PP_TRY(pp_node_set_float(g, pv, "scale", (float)scale));
    if (scale_div) PP_TRY(pp_node_set_int(g, pv, "scale_div", 1));
    PP_TRY(pp_node_set_string(g, pv, "q_layout", ql));
    PP_TRY(pp_node_set_string(g, pv, "k_layout", kl));
    PP_TRY(pp_node_set_string(g, pv, "v_layout", vl));
    PP_TRY(pp_node_set_string(g, pv, "out_layout", ol));
    if (out_t >= 0) {
        int y = g->nodes[out_t].out[0];
        pp_opt_kill(c, out_t);
        pp_opt_take_output(c, pv, y);
    }
    (*count)++;
    return PP_OK;
}

pp_status pp_opt_attention(pp_opt_ctx *c, int *count) {
    *count = 0;
    for (int i = 0; i < c->g->n_nodes; i++)
        if (!c->dead[i] && pp_opt_is_op(&c->g->nodes[i], "Softmax")) PP_TRY(fuse(c, i, count));
    return PP_OK;
}
