/* pp_simulate: results around the shared execution engine. */
#include <stdlib.h>

#include "sched_internal.h"

#include "status_internal.h"
void pp_sim_result_free(pp_sim_result *r) {
    if (!r) return;
    free(r->busy);
    free(r->bubble);
    free(r->first_start);
    free(r->last_end);
    free(r->peak_act);
    free(r->peak_wpend);
    free(r->peak_bytes);
    free(r);
}

double pp_sim_result_span(const pp_sim_result *r) {
    double best = 0;
    for (int k = 0; k < r->nranks; k++) {
        double d = r->last_end[k] - r->first_start[k];
        if (d > best) best = d;
    }
    return best;
}

pp_status pp_simulate(const pp_schedule *s, const pp_cost_model *costs, pp_trace *trace,
                      pp_sim_result **out) {
    *out = NULL;
    pp_sim_result *r = calloc(1, sizeof *r);
    if (!r) return pp_error(PP_ERR_NOMEM, "simulate: out of memory");
    size_t p = (size_t)s->nranks;
    r->nranks = s->nranks;
    r->busy = calloc(p, sizeof(double));
    r->bubble = calloc(p, sizeof(double));
    r->first_start = calloc(p, sizeof(double));
    r->last_end = calloc(p, sizeof(double));
    r->peak_act = calloc(p, sizeof(int));
    r->peak_wpend = calloc(p, sizeof(int));
    r->peak_bytes = calloc(p, sizeof(double));
    if (!r->busy || !r->bubble || !r->first_start || !r->last_end || !r->peak_act ||
        !r->peak_wpend || !r->peak_bytes) {
        pp_sim_result_free(r);
        return pp_error(PP_ERR_NOMEM, "simulate: out of memory");
    }
    pp_status st = pp_sched_check_static(s, NULL, NULL);
    if (st == PP_OK) st = pp_sched_run(s, costs, trace, 1, r, NULL, NULL);
    if (st != PP_OK) {
        pp_sim_result_free(r);
        return st;
    }
    *out = r;
    return PP_OK;
}
