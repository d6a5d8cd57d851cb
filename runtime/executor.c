/* The executor: runs one rank's action list over its stages, moving
 * activations and gradients through a pp_transport. The actions themselves
 * are the execution core's (stage_core.h); this file is the transport route
 * and the rank's sequential loop. */
#include "pippin/executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stage_core.h"
#include "status_internal.h"

struct pp_executor {
    pp_core core;
    const pp_schedule *sched;
    int rank;
    pp_transport *t;
    int timeout_ms;
};

pp_status pp_executor_new(pp_pipe *p, const pp_schedule *sched, int rank, int training, pp_transport *t,
                          pp_executor **out) {
    *out = NULL;
    if (sched->nstages != p->n_stages)
        return pp_error(PP_ERR_INVALID, "schedule has %d stages, the pipe %d", sched->nstages, p->n_stages);
    if (rank < 0 || rank >= sched->nranks)
        return pp_error(PP_ERR_INVALID, "rank %d: the schedule has %d ranks", rank, sched->nranks);
    pp_executor *ex = calloc(1, sizeof *ex);
    if (!ex) return pp_error(PP_ERR_NOMEM, "out of memory");
    ex->sched = sched;
    ex->rank = rank;
    ex->t = t;
    ex->timeout_ms = -1;
    pp_status s = pp_core_init(&ex->core, p, sched, rank, training);
    if (s != PP_OK) {
        pp_executor_free(ex);
        return pp_error_context(s, "rank %d", rank);
    }
    *out = ex;
    return PP_OK;
}

void pp_executor_free(pp_executor *ex) {
    if (!ex) return;
    pp_core_free(&ex->core);
    free(ex);
}

void pp_executor_set_timeout(pp_executor *ex, int timeout_ms) { ex->timeout_ms = timeout_ms; }

double pp_executor_compute_ms(const pp_executor *ex) { return ex->core.compute_ms; }

void pp_executor_trace(pp_executor *ex, pp_trace *trace, double origin_ms) {
    ex->core.trace = trace;
    ex->core.trace_origin_ms = origin_ms;
}
int pp_executor_n_stages(const pp_executor *ex) { return ex->core.n_local; }
pp_stage *pp_executor_stage(pp_executor *ex, int i) { return ex->core.stages[ex->core.local[i]]; }
void pp_executor_zero_grad(pp_executor *ex) { pp_core_zero_grad(&ex->core); }

pp_status pp_executor_set_optimizer(pp_executor *ex, const pp_optim_config *c) {
    return pp_core_set_optimizer(&ex->core, c);
}

pp_status pp_executor_optimizer_step(pp_executor *ex) {
    pp_status s = pp_core_optimizer_step(&ex->core);
    return s == PP_OK ? s : pp_error_context(s, "rank %d", ex->rank);
}

pp_optim *pp_executor_optimizer(pp_executor *ex, int i) { return ex->core.optims[ex->core.local[i]]; }

/* ---- the transport route: receives block until the tensor arrives ---- */

static pp_status tr_send(pp_executor *ex, pp_msg_kind kind, int mb, int src, int dst, const char *name,
                         pp_tensor *t) {
    pp_transport_key k = {kind, ex->core.step, mb, src, dst, name};
    return pp_transport_send(ex->t, &k, t);
}

static pp_status tr_recv(pp_executor *ex, pp_msg_kind kind, int mb, int src, int dst, const char *name,
                         pp_tensor **out) {
    pp_transport_key k = {kind, ex->core.step, mb, src, dst, name};
    return pp_transport_recv(ex->t, &k, ex->timeout_ms, out);
}

static pp_status tr_send_act(void *ctx, int e, int mb, int consumer, pp_tensor *t) {
    pp_executor *ex = ctx;
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    return tr_send(ex, PP_MSG_ACTIVATION, mb, ed->producer, consumer, ed->value, t);
}

static pp_status tr_recv_act(void *ctx, int e, int mb, int consumer, pp_tensor **out) {
    pp_executor *ex = ctx;
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    return tr_recv(ex, PP_MSG_ACTIVATION, mb, ed->producer, consumer, ed->value, out);
}

static pp_status tr_send_grad(void *ctx, int e, int mb, int consumer, pp_tensor *g) {
    pp_executor *ex = ctx;
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    return tr_send(ex, PP_MSG_GRADIENT, mb, consumer, ed->producer, ed->value, g);
}

static pp_status tr_recv_grad(void *ctx, int e, int mb, int consumer, pp_tensor **out) {
    pp_executor *ex = ctx;
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    return tr_recv(ex, PP_MSG_GRADIENT, mb, consumer, ed->producer, ed->value, out);
}

/* Replicated-parameter deltas travel as gradients of microbatch m (one past
 * the step's last). */
static pp_status tr_send_delta(void *ctx, int shared, int from, int to, pp_tensor *d) {
    pp_executor *ex = ctx;
    return tr_send(ex, PP_MSG_GRADIENT, ex->core.m, from, to, ex->core.p->shared[shared].name, d);
}

static pp_status tr_recv_delta(void *ctx, int shared, int from, int to, pp_tensor **out) {
    pp_executor *ex = ctx;
    return tr_recv(ex, PP_MSG_GRADIENT, ex->core.m, from, to, ex->core.p->shared[shared].name, out);
}

/* ---- one step ---- */

static pp_status run_actions(pp_executor *ex, const pp_route *route) {
    const pp_schedule *sched = ex->sched;
    for (size_t k = 0; k < sched->len[ex->rank]; k++) {
        const pp_action *a = &sched->acts[ex->rank][k];
        const pp_action *subs = a->kind == PP_ACT_OVERLAP_F_B ? pp_schedule_subs(sched, a) : a;
        int n = a->kind == PP_ACT_OVERLAP_F_B ? a->nsub : 1;
        pp_status s = PP_OK;
        for (int j = 0; j < n && s == PP_OK; j++) {
            int ran = 0;
            s = pp_core_run_action(&ex->core, route, ex->rank, &subs[j], &ran);
            if (s == PP_OK && !ran) /* receives block, so only an earlier action of this rank is missing */
                s = pp_error(PP_ERR_INVALID, "its forward or input gradient has not run on this rank before it");
        }
        if (s != PP_OK) {
            char text[PP_ACTION_STR_MAX];
            pp_action_format(sched, a, text, sizeof text);
            return pp_error_context(s, "rank %d step %lld action %zu (%s)", ex->rank, (long long)ex->core.step,
                                    k, text);
        }
    }
    return PP_OK;
}

pp_status pp_executor_step(pp_executor *ex, int64_t step, int m, int n_inputs, const char *const *names,
                           pp_tensor *const *inputs, pp_tensor **outputs) {
    if (ex->sched->nmb != m)
        return pp_error(PP_ERR_INVALID, "schedule is for %d microbatches, the step has %d", ex->sched->nmb, m);
    pp_route route = {ex, NULL, tr_send_act, tr_recv_act, NULL, tr_send_grad, tr_recv_grad, tr_send_delta,
                      tr_recv_delta};
    pp_status s = pp_transport_set_step(ex->t, step);
    if (s == PP_OK) s = pp_core_step_begin(&ex->core, step, m, n_inputs, names, inputs);
    if (s != PP_OK) s = pp_error_context(s, "rank %d", ex->rank);
    else s = run_actions(ex, &route); /* names rank, step and action */
    int failed = s != PP_OK;
    s = pp_core_step_end(&ex->core, &route, s, outputs);
    return s == PP_OK || failed ? s : pp_error_context(s, "rank %d step %lld", ex->rank, (long long)step);
}
