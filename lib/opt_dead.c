/* Optimizer pass "dead": removes the nodes whose outputs no live node and
 * no graph output reads (pippin's ops have no side effects, and an
 * inference graph carries no training state). */
#include "opt_internal.h"

pp_status pp_opt_dead(pp_opt_ctx *c, int *count) {
    pp_graph *g = c->g;
    int before = c->n_dead;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        if (c->dead[i]) continue;
        const pp_node *n = &g->nodes[i];
        int read = 0;
        for (int k = 0; k < n->n_out && !read; k++) read = n->out[k] >= 0 && c->uses[n->out[k]] > 0;
        if (!read) pp_opt_kill(c, i);
    }
    *count = c->n_dead - before;
    return PP_OK;
}
