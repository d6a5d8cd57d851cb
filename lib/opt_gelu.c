/* Optimizer pass "gelu": GELU as exporters decompose it becomes one Gelu
 * node (approximate "tanh" for the tanh form). PyTorch 1.13 exports F.gelu
 * (opset 17 has no Gelu) as
 *   erf form:  0.5 * (x * (1 + erf(x / 1.4142135)))   (or x * 0.70710678)
 *   tanh form: 0.5 * (x * (1 + tanh(0.7978846 * (x + 0.044715 * x^3))))
 * The pattern is the one autodiff fuses for its backward
 * (pp_ad_match_gelu, lib/grad_fuse.c): every intermediate must feed only
 * the next piece. The root node becomes the Gelu (it keeps its name and
 * output); the pieces it no longer reads are removed. */
#include "autodiff_internal.h"
#include "opt_internal.h"

#include "status_internal.h"

pp_status pp_opt_gelu(pp_opt_ctx *c, int *count) {
    pp_graph *g = c->g;
    *count = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (c->dead[i] || !pp_opt_is_op(&g->nodes[i], "Mul")) continue;
        int x = -1;
        int kind = pp_ad_match_gelu(g, i, c->uses, &x);
        if (!kind || x < 0) continue;
        PP_TRY(pp_opt_rewrite(c, i, "Gelu", "", 1, &x));
        if (kind == 1) PP_TRY(pp_node_set_string(g, i, "approximate", "tanh"));
        (*count)++;
    }
    return PP_OK;
}
