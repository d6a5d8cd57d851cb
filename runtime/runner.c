/* Local pipeline runner: executes a schedule's action lists for all ranks in
 * one process, moving activations and gradients between stages in memory. */
#include "pippin/runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stage_core.h"
#include "status_internal.h"

/* The memory route: activations and gradients wait in tables until the
 * consuming action takes them. */
typedef struct {
    const pp_pipe *p;
    int m;
    int maxc;           /* most consumers of any edge */
    pp_tensor **acts;   /* [edge * m + mb] */
    int *act_left;      /* consumers that have not taken it yet */
    pp_tensor **grads;  /* [(edge * m + mb) * maxc + c]: from the edge's c-th consumer */
    int *grad_count;    /* [edge * m + mb] */
} memory_route;

struct pp_runner {
    pp_core core;
    memory_route mem;
    int64_t next_step; /* pp_runner_set_step */
};

static int consumer_index(const pp_pipe_edge *ed, int s) {
    for (int c = 0; c < ed->n_consumers; c++)
        if (ed->consumers[c] == s) return c;
    return -1;
}

static int mem_act_ready(void *ctx, int e, int mb, int consumer) {
    const memory_route *mr = ctx;
    return mr->acts[e * mr->m + mb] != NULL;
}

static pp_status mem_send_act(void *ctx, int e, int mb, int consumer, pp_tensor *t) {
    memory_route *mr = ctx;
    int slot = e * mr->m + mb;
    if (!mr->acts[slot]) mr->acts[slot] = pp_tensor_retain(t);
    mr->act_left[slot]++;
    return PP_OK;
}

static pp_status mem_recv_act(void *ctx, int e, int mb, int consumer, pp_tensor **out) {
    memory_route *mr = ctx;
    int slot = e * mr->m + mb;
    *out = pp_tensor_retain(mr->acts[slot]);
    if (--mr->act_left[slot] == 0) { /* every consumer has it */
        pp_tensor_free(mr->acts[slot]);
        mr->acts[slot] = NULL;
    }
    return PP_OK;
}

static int mem_grads_ready(void *ctx, int e, int mb) {
    const memory_route *mr = ctx;
    return mr->grad_count[e * mr->m + mb] == mr->p->edges[e].n_consumers;
}

static pp_status mem_send_grad(void *ctx, int e, int mb, int consumer, pp_tensor *g) {
    memory_route *mr = ctx;
    int c = consumer_index(&mr->p->edges[e], consumer);
    if (c < 0) return pp_error(PP_ERR_INTERNAL, "stage %d is no consumer of '%s'", consumer, mr->p->edges[e].value);
    pp_tensor **slot = &mr->grads[(size_t)(e * mr->m + mb) * (size_t)mr->maxc + (size_t)c];
    if (*slot) return pp_error(PP_ERR_STATE, "stage %d: gradient of '%s' microbatch %d sent twice", consumer,
                               mr->p->edges[e].value, mb);
    *slot = pp_tensor_retain(g);
    mr->grad_count[e * mr->m + mb]++;
    return PP_OK;
}

static pp_status mem_recv_grad(void *ctx, int e, int mb, int consumer, pp_tensor **out) {
    memory_route *mr = ctx;
    int c = consumer_index(&mr->p->edges[e], consumer);
    pp_tensor **slot = c < 0 ? NULL : &mr->grads[(size_t)(e * mr->m + mb) * (size_t)mr->maxc + (size_t)c];
    if (!slot || !*slot) return pp_error(PP_ERR_INTERNAL, "no gradient of '%s' from stage %d", mr->p->edges[e].value, consumer);
    *out = *slot;
    *slot = NULL;
    mr->grad_count[e * mr->m + mb]--;
    return PP_OK;
}

/* Every stage is local: replicated parameters never need the route. */
static pp_status mem_send_delta(void *ctx, int shared, int from, int to, pp_tensor *d) {
    return pp_error(PP_ERR_INTERNAL, "stage %d is not local", to);
}
static pp_status mem_recv_delta(void *ctx, int shared, int from, int to, pp_tensor **out) {
    return pp_error(PP_ERR_INTERNAL, "stage %d is not local", from);
}

static void mem_clear(memory_route *mr) {
    size_t ne = mr->p ? (size_t)mr->p->n_edges * (size_t)mr->m : 0;
    for (size_t i = 0; mr->acts && i < ne; i++) pp_tensor_free(mr->acts[i]);
    for (size_t i = 0; mr->grads && i < ne * (size_t)mr->maxc; i++) pp_tensor_free(mr->grads[i]);
    free(mr->acts);
    free(mr->act_left);
    free(mr->grads);
    free(mr->grad_count);
    mr->acts = mr->grads = NULL;
    mr->act_left = mr->grad_count = NULL;
}

static pp_status mem_begin(memory_route *mr, const pp_pipe *p, int m) {
    size_t ne = (size_t)p->n_edges * (size_t)m + 1;
    mr->p = p;
    mr->m = m;
    mr->maxc = 1;
    for (int e = 0; e < p->n_edges; e++)
        if (p->edges[e].n_consumers > mr->maxc) mr->maxc = p->edges[e].n_consumers;
    mr->acts = calloc(ne, sizeof *mr->acts);
    mr->act_left = calloc(ne, sizeof *mr->act_left);
    mr->grads = calloc(ne * (size_t)mr->maxc, sizeof *mr->grads);
    mr->grad_count = calloc(ne, sizeof *mr->grad_count);
    if (!mr->acts || !mr->act_left || !mr->grads || !mr->grad_count) return pp_error(PP_ERR_NOMEM, "out of memory");
    return PP_OK;
}

static pp_route memory_route_of(memory_route *mr) {
    pp_route r = {mr, mem_act_ready, mem_send_act, mem_recv_act, mem_grads_ready, mem_send_grad, mem_recv_grad,
                  mem_send_delta, mem_recv_delta};
    return r;
}

pp_status pp_runner_new(pp_pipe *p, int training, pp_runner **out) {
    *out = NULL;
    int probed = 1;
    for (int e = 0; e < p->n_edges; e++)
        if (p->edges[e].dtype == PP_DTYPE_UNDEFINED) probed = 0;
    if (!probed) PP_TRY(pp_pipe_probe_shapes(p, 0, NULL));
    pp_runner *r = calloc(1, sizeof *r);
    if (!r) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = pp_core_init(&r->core, p, NULL, -1, training);
    if (s != PP_OK) {
        pp_runner_free(r);
        return s;
    }
    *out = r;
    return PP_OK;
}

void pp_runner_free(pp_runner *r) {
    if (!r) return;
    mem_clear(&r->mem);
    pp_core_free(&r->core);
    free(r);
}

int pp_runner_n_stages(const pp_runner *r) { return r->core.n_stages; }
pp_stage *pp_runner_stage(pp_runner *r, int i) { return r->core.stages[i]; }
int pp_runner_n_outputs(const pp_runner *r) { return r->core.p->n_outputs; }
const char *pp_runner_output_name(const pp_runner *r, int o) { return r->core.p->outputs[o]; }

int pp_runner_loss_output(const pp_runner *r) {
    const pp_pipe *p = r->core.p;
    for (int o = 0; p->loss && o < p->n_outputs; o++)
        if (strcmp(p->outputs[o], p->loss) == 0) return o;
    return -1;
}

void pp_runner_trace(pp_runner *r, pp_trace *trace, double origin_ms) {
    r->core.trace = trace;
    r->core.trace_origin_ms = origin_ms;
}

void pp_runner_zero_grad(pp_runner *r) { pp_core_zero_grad(&r->core); }

/* ---- one step ---- */

static pp_status default_schedule(const pp_runner *r, int m, pp_schedule **out) {
    pp_sched_params sp = {0};
    sp.kind = PP_SCHED_GPIPE;
    sp.nranks = r->core.n_stages;
    sp.nmb = m;
    sp.stages_per_rank = 1;
    return pp_schedule_generate(&sp, out);
}

/* Interleaves the ranks' lists as concurrent ranks with blocking receives
 * would: each rank runs its next action once that action's inputs exist. */
static pp_status run_schedule(pp_runner *r, const pp_route *route, const pp_schedule *sched) {
    int nr = sched->nranks;
    size_t *pos = calloc((size_t)nr + 1, sizeof *pos), *sub = calloc((size_t)nr + 1, sizeof *sub);
    if (!pos || !sub) {
        free(pos);
        free(sub);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    pp_status status = PP_OK;
    for (;;) {
        int progressed = 0, remaining = 0;
        for (int rk = 0; rk < nr && status == PP_OK; rk++) {
            while (pos[rk] < sched->len[rk] && status == PP_OK) {
                const pp_action *a = &sched->acts[rk][pos[rk]];
                int ran = 0;
                size_t at = pos[rk]; /* for messages: pos moves on when the action ran */
                if (a->kind == PP_ACT_OVERLAP_F_B) {
                    const pp_action *subs = pp_schedule_subs(sched, a);
                    status = pp_core_run_action(&r->core, route, rk, &subs[sub[rk]], &ran);
                    if (ran && ++sub[rk] == a->nsub) {
                        sub[rk] = 0;
                        pos[rk]++;
                    }
                } else {
                    status = pp_core_run_action(&r->core, route, rk, a, &ran);
                    if (ran) pos[rk]++;
                }
                if (status != PP_OK) {
                    char text[PP_ACTION_STR_MAX];
                    pp_action_format(sched, a, text, sizeof text);
                    status = pp_error_context(status, "rank %d action %zu (%s)", rk, at, text);
                }
                if (!ran) break;
                progressed = 1;
            }
            if (pos[rk] < sched->len[rk]) remaining = 1;
        }
        if (status != PP_OK || !remaining) break;
        if (!progressed) {
            char msg[1024];
            size_t n = 0;
            for (int rk = 0; rk < nr && n < sizeof msg; rk++) {
                if (pos[rk] >= sched->len[rk]) continue;
                char text[PP_ACTION_STR_MAX];
                pp_action_format(sched, &sched->acts[rk][pos[rk]], text, sizeof text);
                n += (size_t)snprintf(msg + n, sizeof msg - n, "%srank %d waits at %s", n ? ", " : "", rk, text);
            }
            status = pp_error(PP_ERR_STATE, "schedule deadlocks: %s", msg);
        }
    }
    free(pos);
    free(sub);
    return status;
}

pp_status pp_runner_step(pp_runner *r, int m, const pp_schedule *sched, int n_inputs,
                         const char *const *names, pp_tensor *const *inputs, pp_tensor **outputs) {
    if (sched && sched->nstages != r->core.n_stages)
        return pp_error(PP_ERR_INVALID, "schedule has %d stages, the pipe %d", sched->nstages, r->core.n_stages);
    if (sched && sched->nmb != m)
        return pp_error(PP_ERR_INVALID, "schedule is for %d microbatches, the step has %d", sched->nmb, m);
    pp_schedule *own = NULL;
    if (!sched) {
        PP_TRY(default_schedule(r, m, &own));
        sched = own;
    }
    pp_route route = memory_route_of(&r->mem);
    mem_clear(&r->mem);
    pp_status s = mem_begin(&r->mem, r->core.p, m);
    if (s == PP_OK) s = pp_core_step_begin(&r->core, r->next_step++, m, n_inputs, names, inputs);
    if (s == PP_OK) s = run_schedule(r, &route, sched);
    s = pp_core_step_end(&r->core, &route, s, outputs);
    mem_clear(&r->mem);
    pp_schedule_free(own);
    return s;
}

static pp_status param_copy(pp_runner *r, const char *name, int grads, pp_tensor **out) {
    *out = NULL;
    for (int i = 0; i < r->core.n_stages; i++) {
        int pi = r->core.stages[i] ? pp_stage_find_param(r->core.stages[i], name) : -1;
        if (pi >= 0) return pp_stage_param_copy(r->core.stages[i], pi, grads, out); /* only its part crosses */
    }
    return pp_error(PP_ERR_NOT_FOUND, "no stage trains a parameter '%s'", name);
}

pp_status pp_runner_param_grad(pp_runner *r, const char *name, pp_tensor **out) {
    return param_copy(r, name, 1, out);
}

pp_status pp_runner_param(pp_runner *r, const char *name, pp_tensor **out) {
    return param_copy(r, name, 0, out);
}

pp_status pp_runner_set_optimizer(pp_runner *r, const pp_optim_config *c) {
    if (!r->core.training) return pp_error(PP_ERR_STATE, "the runner was not built for training");
    return pp_core_set_optimizer(&r->core, c);
}

void pp_runner_set_step(pp_runner *r, int64_t step) { r->next_step = step; }

pp_status pp_runner_optimizer_step(pp_runner *r) { return pp_core_optimizer_step(&r->core); }

pp_optim *pp_runner_optimizer(pp_runner *r, int i) { return r->core.optims[i]; }
