/* Optimizer pass "identity": nodes that pass their input through unchanged
 * in inference are bypassed, their readers reading the input instead:
 * Identity, pippin::PipeSplit markers (in a graph run whole), and Dropout
 * without a training_mode input (what inference makes of it,
 * stages/train_state.c) whose mask nothing reads. A node whose output is a
 * graph output stays (the output keeps its name). */
#include <string.h>

#include "opt_internal.h"

static int passes_through(const pp_opt_ctx *c, const pp_node *n) {
    if (n->n_in < 1 || n->in[0] < 0 || n->n_out < 1 || n->out[0] < 0) return 0;
    if (pp_opt_is_op(n, "Identity")) return n->n_in == 1 && n->n_out == 1;
    if (strcmp(n->op_type, "PipeSplit") == 0 && strcmp(n->domain, "pippin") == 0) return n->n_out == 1;
    if (pp_opt_is_op(n, "Dropout")) {
        if (n->n_in > 2 && n->in[2] >= 0) return 0; /* training_mode given: maybe random */
        for (int k = 1; k < n->n_out; k++)
            if (n->out[k] >= 0 && c->uses[n->out[k]] > 0) return 0;
        return 1;
    }
    return 0;
}

pp_status pp_opt_identity(pp_opt_ctx *c, int *count) {
    pp_graph *g = c->g;
    *count = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (c->dead[i]) continue;
        const pp_node *n = &g->nodes[i];
        if (!passes_through(c, n) || pp_opt_is_output(g, n->out[0])) continue;
        pp_opt_replace_uses(c, n->out[0], n->in[0]);
        pp_opt_kill(c, i);
        (*count)++;
    }
    return PP_OK;
}
