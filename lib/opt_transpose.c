/* Optimizer pass "transpose": layout shuffles that cancel or chain.
 *   Transpose(Transpose(x, p1), p2)   the inner read by the outer alone:
 *                                     one Transpose(x, p) with p[k] =
 *                                     p1[p2[k]], or none when p is the
 *                                     identity (readers read x)
 *   Reshape(Reshape(x, s1), s2)       the inner read by the outer alone,
 *                                     s2 a constant without 0 (no dim
 *                                     copied from the inner's shape):
 *                                     Reshape(x, s2)
 * A node making a graph output keeps it (rewritten, never bypassed).
 * Exact: the same elements in the same places. Transposes feeding a MatMul
 * by a weight are the "matmul" pass's (read in place by the GEMM), and the
 * ones around attention the "attention" pass's. */
#include <string.h>

#include "opt_internal.h"

#include "status_internal.h"

static int sole_input(const pp_opt_ctx *c, int v, const char *op) {
    int p = pp_opt_producer(c, v, op);
    return p >= 0 && c->uses[v] == 1 && !pp_opt_is_output(c->g, v) ? p : -1;
}

static pp_status fold_transposes(pp_opt_ctx *c, int i, int *count) {
    pp_graph *g = c->g;
    const pp_node *outer = &g->nodes[i];
    if (outer->n_in != 1 || outer->n_out != 1) return PP_OK;
    int inner = sole_input(c, outer->in[0], "Transpose");
    if (inner < 0) return PP_OK;
    const int64_t *p1, *p2;
    int n1 = pp_node_attr_ints(&g->nodes[inner], "perm", &p1), n2 = pp_node_attr_ints(outer, "perm", &p2);
    if (n1 < 1 || n1 != n2 || n1 > PP_MAX_DIMS) return PP_OK; /* a default (reversing) perm: rank unknown */
    int64_t p[PP_MAX_DIMS];
    int identity = 1;
    for (int k = 0; k < n1; k++) {
        if (p2[k] < 0 || p2[k] >= n1) return PP_OK;
        p[k] = p1[p2[k]];
        identity &= p[k] == k;
    }
    int x = g->nodes[inner].in[0], y = outer->out[0];
    if (identity && !pp_opt_is_output(g, y)) {
        pp_opt_replace_uses(c, y, x);
        pp_opt_kill(c, i);
        pp_opt_drop(c, outer->in[0]);
    } else {
        PP_TRY(pp_opt_rewrite(c, i, "Transpose", "", 1, &x));
        PP_TRY(pp_node_set_ints(g, i, "perm", n1, p));
    }
    (*count)++;
    return PP_OK;
}

static pp_status fold_reshapes(pp_opt_ctx *c, int i, int *count) {
    pp_graph *g = c->g;
    const pp_node *outer = &g->nodes[i];
    if (outer->n_in != 2 || outer->n_out != 1 || pp_node_attr_int(outer, "allowzero", 0) != 0) return PP_OK;
    int inner = sole_input(c, outer->in[0], "Reshape");
    if (inner < 0 || g->nodes[inner].n_in != 2) return PP_OK;
    const pp_tensor *s2 = g->values[outer->in[1]].kind == PP_VALUE_CONST ? g->values[outer->in[1]].data : NULL;
    if (!s2 || s2->dtype != PP_I64) return PP_OK;
    for (int64_t k = 0; k < pp_tensor_numel(s2); k++)
        if (((const int64_t *)s2->data)[k] == 0) return PP_OK;
    int ins[2] = {g->nodes[inner].in[0], outer->in[1]};
    PP_TRY(pp_opt_rewrite(c, i, "Reshape", "", 2, ins));
    (*count)++;
    return PP_OK;
}

pp_status pp_opt_transpose(pp_opt_ctx *c, int *count) {
    *count = 0;
    for (int i = 0; i < c->g->n_nodes; i++) {
        if (c->dead[i]) continue;
        if (pp_opt_is_op(&c->g->nodes[i], "Transpose")) PP_TRY(fold_transposes(c, i, count));
        else if (pp_opt_is_op(&c->g->nodes[i], "Reshape")) PP_TRY(fold_reshapes(c, i, count));
    }
    return PP_OK;
}
