/* The executor: runs one rank's action list over its stages, moving
 * activations and gradients through a pp_transport. */
#include "pippin/executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/microbatch.h"
#include "pippin/sched_trace.h"
#include "timing.h"

#include "status_internal.h"
struct pp_executor {
    pp_pipe *p;
    const pp_schedule *sched;
    int rank;
    int training;
    pp_transport *t;
    int timeout_ms;
    int n_local;
    int *local;         /* global indices of this rank's stages */
    pp_stage **stages;  /* [n_stages]: NULL where not on this rank */
    pp_optim **optims;  /* [n_stages] */
    pp_trace *trace;    /* NULL: not recording */
    double trace_origin_ms;
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
    ex->p = p;
    ex->sched = sched;
    ex->rank = rank;
    ex->training = training;
    ex->t = t;
    ex->timeout_ms = -1;
    ex->local = calloc((size_t)p->n_stages, sizeof *ex->local);
    ex->stages = calloc((size_t)p->n_stages, sizeof *ex->stages);
    ex->optims = calloc((size_t)p->n_stages, sizeof *ex->optims);
    pp_status s = ex->local && ex->stages && ex->optims ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < p->n_stages && s == PP_OK; i++) {
        if (sched->stage_rank[i] != rank) continue;
        s = pp_stage_from_pipe(p, i, training, &ex->stages[i]);
        if (s == PP_OK) ex->local[ex->n_local++] = i;
        else s = pp_error_context(s, "rank %d", rank);
    }
    if (s != PP_OK) {
        pp_executor_free(ex);
        return s;
    }
    *out = ex;
    return PP_OK;
}

void pp_executor_free(pp_executor *ex) {
    if (!ex) return;
    for (int i = 0; ex->p && i < ex->p->n_stages; i++) {
        if (ex->stages) pp_stage_free(ex->stages[i]);
        if (ex->optims) pp_optim_free(ex->optims[i]);
    }
    free(ex->local);
    free(ex->stages);
    free(ex->optims);
    free(ex);
}

void pp_executor_set_timeout(pp_executor *ex, int timeout_ms) { ex->timeout_ms = timeout_ms; }

void pp_executor_trace(pp_executor *ex, pp_trace *trace, double origin_ms) {
    ex->trace = trace;
    ex->trace_origin_ms = origin_ms;
}
int pp_executor_n_stages(const pp_executor *ex) { return ex->n_local; }
pp_stage *pp_executor_stage(pp_executor *ex, int i) { return ex->stages[ex->local[i]]; }

void pp_executor_zero_grad(pp_executor *ex) {
    for (int i = 0; i < ex->n_local; i++) pp_stage_zero_grad(ex->stages[ex->local[i]]);
}

pp_status pp_executor_set_optimizer(pp_executor *ex, const pp_optim_config *c) {
    for (int i = 0; i < ex->n_local; i++) {
        int s = ex->local[i];
        pp_optim_free(ex->optims[s]);
        ex->optims[s] = NULL;
        pp_flat_params *fp = pp_stage_params(ex->stages[s]);
        PP_TRY(pp_optim_new(c, fp ? fp->total : 0, &ex->optims[s]));
    }
    return PP_OK;
}

pp_status pp_executor_optimizer_step(pp_executor *ex) {
    for (int i = 0; i < ex->n_local; i++) {
        int s = ex->local[i];
        pp_flat_params *fp = pp_stage_params(ex->stages[s]);
        if (!ex->optims[s]) return pp_error(PP_ERR_STATE, "rank %d: no optimizer set", ex->rank);
        if (fp) PP_TRY(pp_optim_step(ex->optims[s], fp->data, fp->grad, fp->total));
    }
    return PP_OK;
}

/* ---- one step ---- */

typedef struct {
    int64_t step;
    int m;
    pp_tensor **chunks; /* [edge * m + mb]: model inputs */
    pp_tensor **outs;   /* [output * m + mb] */
} step_state;

static pp_transport_key make_key(pp_msg_kind kind, const step_state *ss, int mb, int src, int dst,
                                 const char *name) {
    pp_transport_key k = {kind, ss->step, mb, src, dst, name};
    return k;
}

static pp_status run_forward(pp_executor *ex, step_state *ss, int s, int mb) {
    pp_stage *st = ex->stages[s];
    const pp_pipe *p = ex->p;
    int ni = pp_stage_n_inputs(st), no = pp_stage_n_outputs(st);
    pp_tensor **ins = calloc((size_t)ni + 1, sizeof *ins), **outs = calloc((size_t)no + 1, sizeof *outs);
    pp_status status = ins && outs ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ni && status == PP_OK; i++) {
        const char *name = pp_stage_input_name(st, i);
        int e = pp_pipe_find_edge(p, name);
        if (e < 0) {
            status = pp_error(PP_ERR_INTERNAL, "stage %d input '%s' has no edge", s, name);
        } else if (p->edges[e].producer < 0) {
            ins[i] = pp_tensor_retain(ss->chunks[e * ss->m + mb]);
        } else {
            pp_transport_key k = make_key(PP_MSG_ACTIVATION, ss, mb, p->edges[e].producer, s, name);
            status = pp_transport_recv(ex->t, &k, ex->timeout_ms, &ins[i]);
        }
    }
    if (status == PP_OK) status = pp_stage_forward(st, mb, ins, outs);
    for (int o = 0; o < no && status == PP_OK; o++) {
        const char *name = pp_stage_output_name(st, o);
        int e = pp_pipe_find_edge(p, name);
        for (int c = 0; e >= 0 && p->edges[e].producer == s && c < p->edges[e].n_consumers && status == PP_OK; c++) {
            pp_transport_key k = make_key(PP_MSG_ACTIVATION, ss, mb, s, p->edges[e].consumers[c], name);
            status = pp_transport_send(ex->t, &k, outs[o]);
        }
        for (int mo = 0; mo < p->n_outputs; mo++)
            if (p->output_stage[mo] == s && strcmp(p->outputs[mo], name) == 0)
                ss->outs[mo * ss->m + mb] = pp_tensor_retain(outs[o]);
    }
    for (int i = 0; ins && i < ni; i++) pp_tensor_free(ins[i]);
    for (int o = 0; outs && o < no; o++) pp_tensor_free(outs[o]);
    free(ins);
    free(outs);
    return status;
}

static pp_status run_backward_input(pp_executor *ex, step_state *ss, int s, int mb) {
    pp_stage *st = ex->stages[s];
    const pp_pipe *p = ex->p;
    int ng = pp_stage_n_grad_outputs(st), nw = pp_stage_n_grad_inputs(st);
    pp_tensor **gout = calloc((size_t)ng + 1, sizeof *gout), **gin = calloc((size_t)nw + 1, sizeof *gin);
    pp_status status = gout && gin ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < ng && status == PP_OK; k++) {
        const char *name = pp_stage_grad_output_name(st, k);
        const pp_pipe_edge *e = &p->edges[pp_pipe_find_edge(p, name)];
        pp_tensor **parts = calloc((size_t)e->n_consumers + 1, sizeof *parts);
        if (!parts) status = pp_error(PP_ERR_NOMEM, "out of memory");
        for (int c = 0; c < e->n_consumers && status == PP_OK; c++) {
            pp_transport_key key = make_key(PP_MSG_GRADIENT, ss, mb, e->consumers[c], s, name);
            status = pp_transport_recv(ex->t, &key, ex->timeout_ms, &parts[c]);
        }
        /* Consumer order, as the local runner adds them: the same bits. */
        if (status == PP_OK) status = pp_tensor_sum(parts, e->n_consumers, &gout[k]);
        for (int c = 0; parts && c < e->n_consumers; c++) pp_tensor_free(parts[c]);
        free(parts);
    }
    if (status == PP_OK) status = pp_stage_backward_input(st, mb, gout, gin);
    for (int k = 0; k < nw && status == PP_OK; k++) {
        const char *name = pp_stage_grad_input_name(st, k);
        int e = pp_pipe_find_edge(p, name);
        pp_transport_key key = make_key(PP_MSG_GRADIENT, ss, mb, s, p->edges[e].producer, name);
        status = pp_transport_send(ex->t, &key, gin[k]);
    }
    for (int k = 0; gout && k < ng; k++) pp_tensor_free(gout[k]);
    for (int k = 0; gin && k < nw; k++) pp_tensor_free(gin[k]);
    free(gout);
    free(gin);
    return status;
}

static pp_status run_action(pp_executor *ex, step_state *ss, const pp_action *a) {
    int s = a->stage, mb = a->mb;
    int compute = a->kind == PP_ACT_F || a->kind == PP_ACT_I || a->kind == PP_ACT_B || a->kind == PP_ACT_W;
    if (!compute) return PP_OK; /* SEND/RECV happen with the compute; REDUCE_GRAD at the step's end */
    if (s < 0 || s >= ex->p->n_stages || !ex->stages[s] || mb < 0 || mb >= ss->m)
        return pp_error(PP_ERR_INVALID, "stage %d microbatch %d is not this rank's to run", s, mb);
    switch ((pp_act_kind)a->kind) {
    case PP_ACT_F: return run_forward(ex, ss, s, mb);
    case PP_ACT_I:
        return ex->training ? run_backward_input(ex, ss, s, mb) : PP_OK;
    case PP_ACT_B:
        if (!ex->training) return PP_OK;
        PP_TRY(run_backward_input(ex, ss, s, mb));
        return pp_stage_backward_weight(ex->stages[s], mb);
    case PP_ACT_W: return ex->training ? pp_stage_backward_weight(ex->stages[s], mb) : PP_OK;
    default: return PP_OK;
    }
}

/* The gradient of replicated parameter `name` in stage s as a new tensor
 * (zeros when no gradient reaches it there). */
static pp_status replica_grad(pp_executor *ex, int s, const char *name, pp_tensor **out) {
    pp_flat_params *fp = pp_stage_params(ex->stages[s]);
    int i = fp ? pp_flat_params_find(fp, name) : -1;
    if (i >= 0) {
        pp_tensor *view;
        PP_TRY(pp_flat_params_grad_view(fp, i, &view));
        pp_status st = pp_tensor_clone(view, out);
        pp_tensor_free(view);
        return st;
    }
    const pp_graph *g = pp_stage_graph(ex->stages[s]);
    int v = pp_graph_find_value(g, name);
    if (v < 0 || !g->values[v].data) return pp_error(PP_ERR_INTERNAL, "stage %d has no parameter '%s'", s, name);
    return pp_tensor_new(PP_F32, g->values[v].data->ndim, g->values[v].data->shape, out);
}

/* Before a step: each shared parameter's gradient on this rank (all copies
 * are equal then), so the step's own contribution can be sent. */
static pp_status shared_snapshot(pp_executor *ex, pp_tensor **snap) {
    const pp_pipe *p = ex->p;
    for (int i = 0; i < p->n_shared; i++) {
        snap[i] = NULL;
        for (int a = 0; a < p->shared[i].n_stages && !snap[i]; a++)
            if (ex->stages[p->shared[i].stages[a]])
                PP_TRY(replica_grad(ex, p->shared[i].stages[a], p->shared[i].name, &snap[i]));
    }
    return PP_OK;
}

/* Every replica sends what this step added (its gradient minus the
 * snapshot S) to the others; each then sets S + those deltas, added in
 * stage order: every copy gets the same total, as the local runner
 * computes it. */
static pp_status sync_shared(pp_executor *ex, step_state *ss, pp_tensor *const *snap) {
    const pp_pipe *p = ex->p;
    for (int i = 0; i < p->n_shared; i++) {
        const pp_pipe_shared *sh = &p->shared[i];
        if (!snap[i]) continue;
        pp_tensor **delta = calloc((size_t)sh->n_stages, sizeof *delta);
        if (!delta) return pp_error(PP_ERR_NOMEM, "out of memory");
        pp_status st = PP_OK;
        for (int a = 0; a < sh->n_stages && st == PP_OK; a++) {
            int s = sh->stages[a];
            if (!ex->stages[s]) continue;
            st = replica_grad(ex, s, sh->name, &delta[a]);
            if (st != PP_OK) break;
            float *d = delta[a]->data;
            const float *s0 = snap[i]->data;
            for (int64_t j = 0; j < pp_tensor_numel(delta[a]); j++) d[j] -= s0[j];
            for (int b = 0; b < sh->n_stages && st == PP_OK; b++) {
                if (b == a || ex->stages[sh->stages[b]]) continue; /* a stage here uses delta[a] itself */
                pp_transport_key k = make_key(PP_MSG_GRADIENT, ss, ss->m, s, sh->stages[b], sh->name);
                st = pp_transport_send(ex->t, &k, delta[a]);
            }
        }
        for (int a = 0; a < sh->n_stages && st == PP_OK; a++) {
            int s = sh->stages[a];
            if (!ex->stages[s]) continue;
            pp_tensor **parts = calloc((size_t)sh->n_stages + 1, sizeof *parts), *total = NULL;
            if (!parts) {
                st = pp_error(PP_ERR_NOMEM, "out of memory");
                break;
            }
            parts[0] = pp_tensor_retain(snap[i]);
            for (int b = 0; b < sh->n_stages && st == PP_OK; b++) {
                if (delta[b]) {
                    parts[b + 1] = pp_tensor_retain(delta[b]);
                } else {
                    pp_transport_key k = make_key(PP_MSG_GRADIENT, ss, ss->m, sh->stages[b], s, sh->name);
                    st = pp_transport_recv(ex->t, &k, ex->timeout_ms, &parts[b + 1]);
                }
            }
            if (st == PP_OK) st = pp_tensor_sum(parts, sh->n_stages + 1, &total);
            pp_flat_params *fp = pp_stage_params(ex->stages[s]);
            int pi = fp ? pp_flat_params_find(fp, sh->name) : -1;
            if (st == PP_OK && pi >= 0) memcpy(fp->grad + fp->offset[pi], total->data, total->nbytes);
            pp_tensor_free(total);
            for (int b = 0; b <= sh->n_stages; b++) pp_tensor_free(parts[b]);
            free(parts);
        }
        for (int a = 0; a < sh->n_stages; a++) pp_tensor_free(delta[a]);
        free(delta);
        if (st != PP_OK) return pp_error_context(st, "syncing replicated parameter '%s'", sh->name);
    }
    return PP_OK;
}

static void step_free(const pp_executor *ex, step_state *ss) {
    for (int i = 0; ss->chunks && i < ex->p->n_edges * ss->m; i++) pp_tensor_free(ss->chunks[i]);
    for (int i = 0; ss->outs && i < ex->p->n_outputs * ss->m; i++) pp_tensor_free(ss->outs[i]);
    free(ss->chunks);
    free(ss->outs);
}

/* Splits the model inputs this rank's stages read into microbatches. */
static pp_status split_inputs(pp_executor *ex, step_state *ss, int n_inputs, const char *const *names,
                              pp_tensor *const *inputs) {
    const pp_pipe *p = ex->p;
    for (int e = 0; e < p->n_edges; e++) {
        const pp_pipe_edge *ed = &p->edges[e];
        int needed = 0;
        for (int c = 0; c < ed->n_consumers; c++) needed |= ed->producer < 0 && ex->stages[ed->consumers[c]] != NULL;
        if (!needed) continue;
        int k = 0;
        while (k < n_inputs && (!names[k] || strcmp(names[k], ed->value) != 0)) k++;
        if (k == n_inputs || !inputs[k])
            return pp_error(PP_ERR_INVALID, "rank %d: model input '%s' not given", ex->rank, ed->value);
        PP_TRY(pp_microbatch_split(inputs[k], ss->m, ed->value, &ss->chunks[e * ss->m]));
    }
    return PP_OK;
}

pp_status pp_executor_step(pp_executor *ex, int64_t step, int m, int n_inputs, const char *const *names,
                           pp_tensor *const *inputs, pp_tensor **outputs) {
    const pp_schedule *sched = ex->sched;
    if (sched->nmb != m)
        return pp_error(PP_ERR_INVALID, "schedule is for %d microbatches, the step has %d", sched->nmb, m);
    step_state ss = {step, m, NULL, NULL};
    ss.chunks = calloc((size_t)ex->p->n_edges * (size_t)m + 1, sizeof *ss.chunks);
    ss.outs = calloc((size_t)ex->p->n_outputs * (size_t)m + 1, sizeof *ss.outs);
    pp_status s = ss.chunks && ss.outs ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK) s = pp_transport_set_step(ex->t, step);
    for (int i = 0; i < ex->n_local && s == PP_OK; i++)
        pp_stage_set_loss_scale(ex->stages[ex->local[i]], 1.0f / (float)m);
    pp_tensor **snap = calloc((size_t)ex->p->n_shared + 1, sizeof *snap);
    if (s == PP_OK && !snap) s = pp_error(PP_ERR_NOMEM, "out of memory");
    if (s == PP_OK && ex->training) s = shared_snapshot(ex, snap);
    if (s == PP_OK) s = split_inputs(ex, &ss, n_inputs, names, inputs);
    for (size_t k = 0; k < sched->len[ex->rank] && s == PP_OK; k++) {
        const pp_action *a = &sched->acts[ex->rank][k];
        const pp_action *subs = a->kind == PP_ACT_OVERLAP_F_B ? pp_schedule_subs(sched, a) : a;
        int n = a->kind == PP_ACT_OVERLAP_F_B ? a->nsub : 1;
        for (int j = 0; j < n && s == PP_OK; j++) {
            double t0 = pp_monotonic_ms();
            s = run_action(ex, &ss, &subs[j]);
            if (s == PP_OK && ex->trace && pp_act_is_compute((pp_act_kind)subs[j].kind))
                s = pp_trace_action(ex->trace, ex->rank, &subs[j], t0 - ex->trace_origin_ms,
                                    pp_monotonic_ms() - ex->trace_origin_ms);
        }
        if (s != PP_OK) {
            char text[PP_ACTION_STR_MAX];
            pp_action_format(sched, a, text, sizeof text);
            s = pp_error_context(s, "rank %d step %lld action %zu (%s)", ex->rank, (long long)step, k, text);
        }
    }
    for (int i = 0; i < ex->n_local && s == PP_OK; i++)
        if (pp_stage_pending(ex->stages[ex->local[i]]))
            s = pp_error(PP_ERR_INVALID, "rank %d: the schedule leaves stage %d's backward unfinished", ex->rank,
                         ex->local[i]);
    if (s == PP_OK && ex->training) s = sync_shared(ex, &ss, snap);
    for (int i = 0; snap && i < ex->p->n_shared; i++) pp_tensor_free(snap[i]);
    free(snap);
    for (int o = 0; outputs && o < ex->p->n_outputs; o++) {
        outputs[o] = NULL;
        if (s != PP_OK || !ex->stages[ex->p->output_stage[o]]) continue;
        for (int mb = 0; mb < m && s == PP_OK; mb++)
            if (!ss.outs[o * m + mb])
                s = pp_error(PP_ERR_INVALID, "rank %d: the schedule never runs the forward of stage %d microbatch %d",
                             ex->rank, ex->p->output_stage[o], mb);
        if (s == PP_OK) s = pp_microbatch_merge(&ss.outs[o * m], m, ex->p->outputs[o], &outputs[o]);
    }
    if (s != PP_OK) /* a failed step must not wedge the next one */
        for (int i = 0; i < ex->n_local; i++) pp_stage_discard_pending(ex->stages[ex->local[i]]);
    step_free(ex, &ss);
    return s;
}

pp_optim *pp_executor_optimizer(pp_executor *ex, int i) { return ex->optims[ex->local[i]]; }
