/* split: {auto: N}: balanced cuts for a worker's model. Every rank splits
 * the model itself, so the costs must not depend on the machine: counted
 * operations (PP_COST_FLOPS), not time. `pippin split --auto` measures time
 * and writes stage files for `stages:` instead. */
#include "split_auto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log_internal.h"
#include "pippin/balance.h"
#include "status_internal.h"

pp_status pp_config_auto_cuts(const pp_config *c, const pp_graph *g, int **cut_at, int *n_cuts) {
    *cut_at = NULL;
    *n_cuts = 0;
    const char *dims[64];
    char buf[64][128];
    if (c->n_dims > 64) return pp_error(PP_ERR_UNSUPPORTED, "%s: more than 64 dims", c->path);
    for (int i = 0; i < c->n_dims; i++) {
        snprintf(buf[i], sizeof buf[i], "%s=%s", c->dims[i].key, c->dims[i].value);
        dims[i] = buf[i];
    }
    int m = c->microbatches > 0 ? c->microbatches : 1;
    pp_node_costs_options co;
    pp_node_costs_options_init(&co);
    co.batch = c->batch_size / m > 0 ? (int)(c->batch_size / m) : 1;
    co.n_dims = c->n_dims;
    co.dims = dims;
    co.loss = c->loss;
    co.source = PP_COST_FLOPS;
    pp_balance_options bo;
    pp_balance_options_init(&bo, c->split_auto);
    bo.microbatches = m;
    bo.memory_cap = (double)c->split_memory_cap;
    pp_node_costs *costs = NULL;
    pp_balance_plan *plan = NULL;
    pp_status s = pp_node_costs_measure(g, &co, &costs);
    if (s == PP_OK) s = pp_balance_plan_auto(costs, &bo, &plan);
    if (s == PP_OK && !(*cut_at = malloc(sizeof(int) * (size_t)c->split_auto)))
        s = pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK) {
        *n_cuts = c->split_auto - 1;
        memcpy(*cut_at, plan->cut_at, sizeof(int) * (size_t)*n_cuts);
        for (int k = 0; k < *n_cuts; k++)
            pp_info("split.auto: stage %d starts at node '%s'", k + 1, g->nodes[plan->cut_at[k]].name);
    }
    pp_balance_plan_free(plan);
    pp_node_costs_free(costs);
    return s == PP_OK ? PP_OK : pp_error_context(s, "%s: split.auto", c->path);
}
