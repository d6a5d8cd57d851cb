/* The execution core: a step's actions over a set of stages, routed through
 * a pp_route (stage_core.h). */
#include "stage_core.h"

#include <stdlib.h>
#include <string.h>

#include "pippin/device.h"
#include "pippin/microbatch.h"
#include "status_internal.h"
#include "timing.h"

static pp_status link_stage(pp_core *c, int s) {
    const pp_pipe *p = c->p;
    pp_stage *st = c->stages[s];
    pp_core_links *l = &c->links[s];
    int ni = pp_stage_n_inputs(st), no = pp_stage_n_outputs(st);
    int ng = pp_stage_n_grad_outputs(st), nw = pp_stage_n_grad_inputs(st);
    l->in_edge = calloc((size_t)ni + 1, sizeof(int));
    l->out_edge = calloc((size_t)no + 1, sizeof(int));
    l->out_model = calloc((size_t)no + 1, sizeof(int));
    l->gout_edge = calloc((size_t)ng + 1, sizeof(int));
    l->gin_edge = calloc((size_t)nw + 1, sizeof(int));
    if (!l->in_edge || !l->out_edge || !l->out_model || !l->gout_edge || !l->gin_edge)
        return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < ni; i++)
        if ((l->in_edge[i] = pp_pipe_find_edge(p, pp_stage_input_name(st, i))) < 0)
            return pp_error(PP_ERR_INTERNAL, "stage %d input '%s' has no edge", s, pp_stage_input_name(st, i));
    for (int o = 0; o < no; o++) {
        const char *name = pp_stage_output_name(st, o);
        int e = pp_pipe_find_edge(p, name);
        l->out_edge[o] = e >= 0 && p->edges[e].producer == s ? e : -1;
        l->out_model[o] = -1;
        for (int k = 0; k < p->n_outputs; k++)
            if (p->output_stage[k] == s && strcmp(p->outputs[k], name) == 0) l->out_model[o] = k;
    }
    for (int k = 0; k < ng; k++)
        if ((l->gout_edge[k] = pp_pipe_find_edge(p, pp_stage_grad_output_name(st, k))) < 0)
            return pp_error(PP_ERR_INTERNAL, "stage %d gradient of '%s' has no edge", s, pp_stage_grad_output_name(st, k));
    for (int k = 0; k < nw; k++) l->gin_edge[k] = pp_pipe_find_edge(p, pp_stage_grad_input_name(st, k));
    return PP_OK;
}

pp_status pp_core_init(pp_core *c, pp_pipe *p, const pp_schedule *sched, int rank, int training) {
    memset(c, 0, sizeof *c);
    c->p = p;
    c->training = training;
    c->replicas = 1;
    c->n_stages = p->n_stages;
    c->stages = calloc((size_t)p->n_stages + 1, sizeof *c->stages);
    c->optims = calloc((size_t)p->n_stages + 1, sizeof *c->optims);
    c->local = calloc((size_t)p->n_stages + 1, sizeof *c->local);
    c->links = calloc((size_t)p->n_stages + 1, sizeof *c->links);
    if (!c->stages || !c->optims || !c->local || !c->links) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < p->n_stages; i++) {
        if (rank >= 0 && sched->stage_rank[i] != rank) continue;
        PP_TRY(pp_stage_from_pipe(p, i, training, &c->stages[i]));
        c->local[c->n_local++] = i;
        PP_TRY(link_stage(c, i));
    }
    return PP_OK;
}

/* ---- sends held back while their downloads are in flight ---- */

static pp_status send_now(const pp_route *r, const pp_core_send *q) {
    return q->grad ? r->send_grad(r->ctx, q->e, q->mb, q->peer, q->t) : r->send_act(r->ctx, q->e, q->mb, q->peer, q->t);
}

/* Sends the first n held sends (each once its download is done), in order;
 * the rest move up. All n are dropped even when one fails. */
static pp_status flush_first(pp_core *c, const pp_route *r, int n) {
    pp_status s = PP_OK;
    for (int i = 0; i < n; i++) {
        pp_core_send *q = &c->pending[i];
        if (s == PP_OK) s = pp_tensor_wait(q->t);
        if (s == PP_OK) s = send_now(r, q);
        pp_tensor_free(q->t);
    }
    if (n) memmove(c->pending, c->pending + n, sizeof *c->pending * (size_t)(c->n_pending - n));
    c->n_pending -= n;
    return s;
}

pp_status pp_core_flush_sends(pp_core *c, const pp_route *r) { return flush_first(c, r, c->n_pending); }

static void drop_sends(pp_core *c) {
    for (int i = 0; i < c->n_pending; i++) pp_tensor_free(c->pending[i].t); /* a copy in flight is waited for */
    c->n_pending = 0;
}

/* Sends t now, or holds it back: its download is in flight, or sends are
 * held before it (the order stays). */
static pp_status send_or_hold(pp_core *c, const pp_route *r, int grad, int e, int mb, int peer, pp_tensor *t) {
    pp_core_send q = {grad, e, mb, peer, t};
    if (!c->n_pending && !pp_tensor_pending(t)) return send_now(r, &q);
    if (c->n_pending == c->cap_pending) {
        int cap = c->cap_pending ? c->cap_pending * 2 : 16;
        pp_core_send *np = realloc(c->pending, sizeof *np * (size_t)cap);
        if (!np) return pp_error(PP_ERR_NOMEM, "out of memory");
        c->pending = np;
        c->cap_pending = cap;
    }
    q.t = pp_tensor_retain(t);
    c->pending[c->n_pending++] = q;
    return PP_OK;
}

static void step_clear(pp_core *c) {
    size_t ne = (size_t)c->p->n_edges * (size_t)c->m, no = (size_t)c->p->n_outputs * (size_t)c->m;
    for (size_t i = 0; c->chunks && i < ne; i++) pp_tensor_free(c->chunks[i]);
    for (size_t i = 0; c->outs && i < no; i++) pp_tensor_free(c->outs[i]);
    for (int i = 0; c->snap && i < c->p->n_shared; i++) pp_tensor_free(c->snap[i]);
    free(c->chunks);
    free(c->outs);
    free(c->done_f);
    free(c->done_i);
    free(c->done_w);
    free(c->snap);
    c->chunks = c->outs = c->snap = NULL;
    c->done_f = c->done_i = c->done_w = NULL;
    c->m = 0;
}

void pp_core_free(pp_core *c) {
    drop_sends(c);
    free(c->pending);
    step_clear(c);
    for (int i = 0; i < c->n_stages; i++) {
        if (c->stages) pp_stage_free(c->stages[i]);
        if (c->optims) pp_optim_free(c->optims[i]);
        if (c->links) {
            free(c->links[i].in_edge);
            free(c->links[i].out_edge);
            free(c->links[i].out_model);
            free(c->links[i].gout_edge);
            free(c->links[i].gin_edge);
        }
    }
    free(c->links);
    free(c->stages);
    free(c->optims);
    free(c->local);
    memset(c, 0, sizeof *c);
}

/* ---- replicated parameters ---- */

/* The gradient of replicated parameter `name` in local stage s as a new
 * tensor; zeros when no gradient reaches it there. */
static pp_status replica_grad(pp_core *c, int s, const char *name, pp_tensor **out) {
    int i = pp_stage_find_param(c->stages[s], name);
    if (i >= 0) return pp_stage_param_copy(c->stages[s], i, 1, out); /* from the device when it has it */
    const pp_graph *g = pp_stage_graph(c->stages[s]);
    int v = pp_graph_find_value(g, name);
    if (v < 0 || !g->values[v].data) return pp_error(PP_ERR_INTERNAL, "stage %d has no parameter '%s'", s, name);
    return pp_tensor_new(PP_F32, g->values[v].data->ndim, g->values[v].data->shape, out);
}

/* Before a step every copy of a replicated parameter has the same gradient
 * S (zero after zero_grad); the first local copy that has one gives it. */
static pp_status shared_snapshot(pp_core *c) {
    const pp_pipe *p = c->p;
    for (int i = 0; i < p->n_shared; i++) {
        const pp_pipe_shared *sh = &p->shared[i];
        int first = -1;
        for (int a = 0; a < sh->n_stages; a++) {
            int s = sh->stages[a];
            if (!c->stages[s]) continue;
            if (pp_stage_find_param(c->stages[s], sh->name) >= 0) {
                first = s;
                break;
            }
            if (first < 0) first = s;
        }
        if (first >= 0) PP_TRY(replica_grad(c, first, sh->name, &c->snap[i]));
    }
    return PP_OK;
}

/* Every copy gets S + the sum, in stage order, of what each copy added this
 * step (zero where no gradient reaches it): the same bits on every replica
 * and on every rank, and gradients accumulated over earlier steps counted
 * once. Deltas of copies in other cores travel through the route. */
static pp_status sync_one(pp_core *c, const pp_route *r, int i) {
    const pp_pipe_shared *sh = &c->p->shared[i];
    int n = sh->n_stages;
    pp_tensor **delta = calloc((size_t)n + 1, sizeof *delta);
    pp_tensor **parts = calloc((size_t)n + 2, sizeof *parts);
    pp_status st = delta && parts ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int a = 0; a < n && st == PP_OK; a++) {
        int s = sh->stages[a];
        if (!c->stages[s]) continue;
        st = replica_grad(c, s, sh->name, &delta[a]);
        if (st != PP_OK) break;
        if (pp_tensor_numel(delta[a]) != pp_tensor_numel(c->snap[i])) {
            st = pp_error(PP_ERR_INTERNAL, "replicas of '%s' differ in size", sh->name);
            break;
        }
        if (pp_stage_find_param(c->stages[s], sh->name) >= 0) {
            float *d = delta[a]->data;
            const float *s0 = c->snap[i]->data;
            for (int64_t j = 0; j < pp_tensor_numel(delta[a]); j++) d[j] -= s0[j];
        }
        for (int b = 0; b < n && st == PP_OK; b++)
            if (!c->stages[sh->stages[b]]) st = r->send_delta(r->ctx, i, s, sh->stages[b], delta[a]);
    }
    for (int a = 0; a < n && st == PP_OK; a++) {
        int s = sh->stages[a];
        if (!c->stages[s]) continue;
        int pi = pp_stage_find_param(c->stages[s], sh->name);
        pp_tensor *total = NULL;
        parts[0] = pp_tensor_retain(c->snap[i]);
        for (int b = 0; b < n && st == PP_OK; b++) {
            if (delta[b]) parts[b + 1] = pp_tensor_retain(delta[b]);
            else st = r->recv_delta(r->ctx, i, sh->stages[b], s, &parts[b + 1]);
        }
        if (st == PP_OK) st = pp_tensor_sum(parts, n + 1, &total);
        if (st == PP_OK && pi >= 0) st = pp_stage_set_param_grad(c->stages[s], pi, total); /* checks the size */
        pp_tensor_free(total);
        for (int b = 0; b <= n; b++) {
            pp_tensor_free(parts[b]);
            parts[b] = NULL;
        }
    }
    for (int a = 0; delta && a < n; a++) pp_tensor_free(delta[a]);
    free(delta);
    free(parts);
    return st == PP_OK ? PP_OK : pp_error_context(st, "syncing replicated parameter '%s'", sh->name);
}

/* ---- a step ---- */

pp_status pp_core_step_begin(pp_core *c, int64_t step, int m, int n_inputs, const char *const *names,
                             pp_tensor *const *inputs) {
    const pp_pipe *p = c->p;
    step_clear(c);
    /* a part sum left by a failed step: said now, not after the forwards */
    if (c->training) PP_TRY(pp_core_check_grads(c));
    c->step = step;
    c->m = m;
    c->shared_synced = 0;
    size_t ns = (size_t)p->n_stages * (size_t)m + 1;
    c->chunks = calloc((size_t)p->n_edges * (size_t)m + 1, sizeof *c->chunks);
    c->outs = calloc((size_t)p->n_outputs * (size_t)m + 1, sizeof *c->outs);
    c->done_f = calloc(ns, 1);
    c->done_i = calloc(ns, 1);
    c->done_w = calloc(ns, 1);
    c->snap = calloc((size_t)p->n_shared + 1, sizeof *c->snap);
    if (!c->chunks || !c->outs || !c->done_f || !c->done_i || !c->done_w || !c->snap)
        return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n_local; i++) {
        pp_stage_set_loss_scale(c->stages[c->local[i]], 1.0f / (float)(m * c->replicas));
        pp_stage_set_microbatch_offset(c->stages[c->local[i]], c->replica * m);
        PP_TRY(pp_stage_begin_step(c->stages[c->local[i]], step));
        pp_stage_discard_pending(c->stages[c->local[i]]); /* an inference step may leave none; a failed one is dropped */
    }
    if (c->training) PP_TRY(shared_snapshot(c));
    for (int e = 0; e < p->n_edges; e++) {
        const pp_pipe_edge *ed = &p->edges[e];
        int needed = 0;
        for (int k = 0; k < ed->n_consumers; k++) needed |= ed->producer < 0 && c->stages[ed->consumers[k]] != NULL;
        if (!needed) continue;
        int k = 0;
        while (k < n_inputs && (!names[k] || strcmp(names[k], ed->value) != 0)) k++;
        if (k == n_inputs || !inputs[k]) return pp_error(PP_ERR_INVALID, "model input '%s' not given", ed->value);
        PP_TRY(pp_microbatch_split(inputs[k], m, ed->value, &c->chunks[e * m]));
    }
    return PP_OK;
}

static int forward_ready(const pp_core *c, const pp_route *r, int s, int mb) {
    const pp_pipe *p = c->p;
    pp_stage *st = c->stages[s];
    if (!r->act_ready) return 1;
    for (int i = 0; i < pp_stage_n_inputs(st); i++) {
        int e = c->links[s].in_edge[i];
        if (p->edges[e].producer >= 0 && !r->act_ready(r->ctx, e, mb, s)) return 0;
    }
    return 1;
}

static pp_status run_forward(pp_core *c, const pp_route *r, int s, int mb) {
    pp_stage *st = c->stages[s];
    const pp_pipe *p = c->p;
    int m = c->m, ni = pp_stage_n_inputs(st), no = pp_stage_n_outputs(st);
    pp_tensor **ins = calloc((size_t)ni + 1, sizeof *ins), **outs = calloc((size_t)no + 1, sizeof *outs);
    pp_status status = ins && outs ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    const pp_core_links *l = &c->links[s];
    for (int i = 0; i < ni && status == PP_OK; i++) {
        int e = l->in_edge[i];
        if (p->edges[e].producer < 0) {
            ins[i] = pp_tensor_retain(c->chunks[e * m + mb]);
            continue;
        }
        /* a blocking receive may wait for what this rank holds back */
        if (!r->act_ready && c->n_pending) status = pp_core_flush_sends(c, r);
        if (status == PP_OK) status = r->recv_act(r->ctx, e, mb, s, &ins[i]);
    }
    int held = c->n_pending; /* earlier actions' sends: out once this compute is queued */
    pp_stage_set_async_outputs(st, 1);
    double t0 = pp_monotonic_ms();
    c->inputs_ms = t0;
    if (status == PP_OK) status = pp_stage_forward(st, mb, ins, outs);
    c->compute_ms += pp_monotonic_ms() - t0;
    if (status == PP_OK) c->done_f[s * m + mb] = 1;
    if (status == PP_OK && held) status = flush_first(c, r, held);
    /* earlier microbatches' model outputs: downloaded by now; waiting lets
     * their device buffers go (else each would stay to the step's end) */
    for (size_t i = 0; status == PP_OK && c->outs && i < (size_t)p->n_outputs * (size_t)m; i++)
        if (c->outs[i] && pp_tensor_pending(c->outs[i])) status = pp_tensor_wait(c->outs[i]);
    for (int o = 0; o < no && status == PP_OK; o++) {
        int e = l->out_edge[o];
        for (int k = 0; e >= 0 && k < p->edges[e].n_consumers && status == PP_OK; k++)
            status = send_or_hold(c, r, 0, e, mb, p->edges[e].consumers[k], outs[o]);
        if (l->out_model[o] >= 0) c->outs[l->out_model[o] * m + mb] = pp_tensor_retain(outs[o]);
    }
    for (int i = 0; ins && i < ni; i++) pp_tensor_free(ins[i]);
    for (int o = 0; outs && o < no; o++) pp_tensor_free(outs[o]);
    free(ins);
    free(outs);
    return status;
}

static int backward_ready(const pp_core *c, const pp_route *r, int s, int mb) {
    pp_stage *st = c->stages[s];
    if (!c->done_f[s * c->m + mb]) return 0;
    if (!r->grads_ready) return 1;
    for (int k = 0; k < pp_stage_n_grad_outputs(st); k++)
        if (!r->grads_ready(r->ctx, c->links[s].gout_edge[k], mb)) return 0;
    return 1;
}

static pp_status run_backward_input(pp_core *c, const pp_route *r, int s, int mb) {
    pp_stage *st = c->stages[s];
    const pp_pipe *p = c->p;
    int ng = pp_stage_n_grad_outputs(st), nw = pp_stage_n_grad_inputs(st);
    pp_tensor **gout = calloc((size_t)ng + 1, sizeof *gout), **gin = calloc((size_t)nw + 1, sizeof *gin);
    pp_status status = gout && gin ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < ng && status == PP_OK; k++) {
        int ei = c->links[s].gout_edge[k];
        const pp_pipe_edge *e = &p->edges[ei];
        pp_tensor **parts = calloc((size_t)e->n_consumers + 1, sizeof *parts);
        if (!parts) status = pp_error(PP_ERR_NOMEM, "out of memory");
        /* a blocking receive may wait for what this rank holds back */
        if (status == PP_OK && !r->grads_ready && c->n_pending) status = pp_core_flush_sends(c, r);
        for (int j = 0; j < e->n_consumers && status == PP_OK; j++)
            status = r->recv_grad(r->ctx, ei, mb, e->consumers[j], &parts[j]);
        /* summed in consumer order: the same bits wherever the consumers run */
        if (status == PP_OK) status = pp_tensor_sum(parts, e->n_consumers, &gout[k]);
        for (int j = 0; parts && j < e->n_consumers; j++) pp_tensor_free(parts[j]);
        free(parts);
    }
    int held = c->n_pending; /* earlier actions' sends: out once this compute is queued */
    pp_stage_set_async_outputs(st, 1);
    double t0 = pp_monotonic_ms();
    c->inputs_ms = t0;
    if (status == PP_OK) status = pp_stage_backward_input(st, mb, gout, gin);
    c->compute_ms += pp_monotonic_ms() - t0;
    if (status == PP_OK) c->done_i[s * c->m + mb] = 1;
    if (status == PP_OK && held) status = flush_first(c, r, held);
    for (int k = 0; k < nw && status == PP_OK; k++) {
        int e = c->links[s].gin_edge[k];
        if (e >= 0 && p->edges[e].producer >= 0) status = send_or_hold(c, r, 1, e, mb, s, gin[k]);
    }
    for (int k = 0; gout && k < ng; k++) pp_tensor_free(gout[k]);
    for (int k = 0; gin && k < nw; k++) pp_tensor_free(gin[k]);
    free(gout);
    free(gin);
    return status;
}

static pp_status run_weight(pp_core *c, const pp_route *r, int s, int mb, int *ran) {
    int i = s * c->m + mb;
    if (!c->done_i[i]) return PP_OK; /* its I has not run yet */
    if (c->done_w[i]) return pp_error(PP_ERR_STATE, "stage %d: weight gradient of microbatch %d scheduled twice", s, mb);
    *ran = 1;
    c->done_w[i] = 1;
    int held = c->n_pending;
    double t0 = pp_monotonic_ms();
    pp_status st = pp_stage_backward_weight(c->stages[s], mb);
    c->compute_ms += pp_monotonic_ms() - t0;
    if (st == PP_OK && held) st = flush_first(c, r, held); /* W's compute is queued: earlier sends go out */
    return st;
}

static pp_status run_compute(pp_core *c, const pp_route *r, const pp_action *a, int *ran) {
    int s = a->stage, mb = a->mb, m = c->m;
    if (s < 0 || s >= c->n_stages || !c->stages[s] || mb < 0 || mb >= m)
        return pp_error(PP_ERR_INVALID, "stage %d microbatch %d is not on this rank (%d stages, %d microbatches)",
                        s, mb, c->n_stages, m);
    switch ((pp_act_kind)a->kind) {
    case PP_ACT_F:
        if (c->done_f[s * m + mb])
            return pp_error(PP_ERR_STATE, "stage %d: forward of microbatch %d scheduled twice", s, mb);
        if (!forward_ready(c, r, s, mb)) return PP_OK;
        *ran = 1;
        return run_forward(c, r, s, mb);
    case PP_ACT_I:
    case PP_ACT_B:
        if (!c->training) { /* inference runs only a schedule's forwards */
            *ran = 1;
            return PP_OK;
        }
        if (c->done_i[s * m + mb])
            return pp_error(PP_ERR_STATE, "stage %d: backward of microbatch %d scheduled twice", s, mb);
        if (!backward_ready(c, r, s, mb)) return PP_OK;
        *ran = 1;
        PP_TRY(run_backward_input(c, r, s, mb));
        if (a->kind == PP_ACT_I) return PP_OK;
        *ran = 0;
        return run_weight(c, r, s, mb, ran); /* B is I then W */
    case PP_ACT_W:
        if (!c->training) {
            *ran = 1;
            return PP_OK;
        }
        return run_weight(c, r, s, mb, ran);
    default: return PP_OK;
    }
}

pp_status pp_core_run_action(pp_core *c, const pp_route *r, int rank, const pp_action *a, int *ran) {
    *ran = 0;
    if (!pp_act_is_compute((pp_act_kind)a->kind)) { /* SEND/RECV go with the compute; REDUCE_GRAD at the end */
        *ran = 1;
        return PP_OK;
    }
    double t0 = c->trace ? pp_monotonic_ms() : 0;
    c->inputs_ms = 0;
    PP_TRY(run_compute(c, r, a, ran));
    if (!*ran && c->n_pending) { /* what it waits for may be held here: out, and look again */
        PP_TRY(pp_core_flush_sends(c, r));
        PP_TRY(run_compute(c, r, a, ran));
    }
    if (c->trace && *ran) {
        double t1 = pp_monotonic_ms(), ready = c->inputs_ms > t0 ? c->inputs_ms : t0;
        /* a route with ready hooks (the local runner) had the inputs at hand */
        if (r->act_ready || ready - t0 < 0.005) ready = t0;
        if (ready > t0) { /* waited for (and decoded) what another rank sends */
            pp_action w = *a;
            w.kind = a->kind == PP_ACT_F ? PP_ACT_RECV_F : PP_ACT_RECV_B;
            PP_TRY(pp_trace_wait(c->trace, rank, &w, t0 - c->trace_origin_ms, ready - c->trace_origin_ms));
        }
        PP_TRY(pp_trace_action(c->trace, rank, a, ready - c->trace_origin_ms, t1 - c->trace_origin_ms));
    }
    return PP_OK;
}

int pp_core_weights_done(const pp_core *c, int s) {
    if (!c->training || !c->done_w || !c->stages[s]) return 0;
    for (int mb = 0; mb < c->m; mb++)
        if (!c->done_w[s * c->m + mb]) return 0;
    return 1;
}

static pp_status check_complete(const pp_core *c) {
    for (int k = 0; k < c->n_local; k++) {
        int s = c->local[k];
        for (int mb = 0; mb < c->m; mb++) {
            int i = s * c->m + mb;
            if (!c->done_f[i])
                return pp_error(PP_ERR_INVALID, "schedule never runs the forward of stage %d microbatch %d", s, mb);
            if (c->training && (!c->done_i[i] || !c->done_w[i]))
                return pp_error(PP_ERR_INVALID, "schedule never finishes the backward of stage %d microbatch %d", s, mb);
        }
    }
    return PP_OK;
}

pp_status pp_core_sync_shared(pp_core *c, const pp_route *r) {
    if (c->shared_synced || !c->training) return PP_OK;
    PP_TRY(pp_core_flush_sends(c, r));
    c->shared_synced = 1;
    for (int i = 0; i < c->p->n_shared; i++)
        if (c->snap[i]) PP_TRY(sync_one(c, r, i));
    return PP_OK;
}

pp_status pp_core_step_end(pp_core *c, const pp_route *r, pp_status s, pp_tensor **outputs) {
    const pp_pipe *p = c->p;
    for (int o = 0; outputs && o < p->n_outputs; o++) outputs[o] = NULL;
    if (s == PP_OK) s = pp_core_flush_sends(c, r);
    else drop_sends(c);
    for (size_t i = 0; s == PP_OK && c->outs && i < (size_t)p->n_outputs * (size_t)c->m; i++)
        s = pp_tensor_wait(c->outs[i]); /* a device stage's model outputs, downloaded meanwhile */
    if (s == PP_OK) s = check_complete(c);
    if (s == PP_OK) s = pp_core_sync_shared(c, r);
    for (int o = 0; s == PP_OK && outputs && o < p->n_outputs; o++)
        if (c->stages[p->output_stage[o]]) s = pp_microbatch_merge(&c->outs[o * c->m], c->m, p->outputs[o], &outputs[o]);
    if (s != PP_OK) { /* a failed step must not wedge the next one */
        for (int i = 0; i < c->n_local; i++) {
            pp_stage_discard_pending(c->stages[c->local[i]]);
            pp_stage_abort_step(c->stages[c->local[i]]);
        }
        for (int o = 0; outputs && o < p->n_outputs; o++) {
            pp_tensor_free(outputs[o]);
            outputs[o] = NULL;
        }
    }
    step_clear(c);
    return s;
}

/* ---- gradients and optimizers ---- */

void pp_core_zero_grad(pp_core *c) {
    for (int i = 0; i < c->n_local; i++) pp_stage_zero_grad(c->stages[c->local[i]]);
}

pp_status pp_core_set_optimizer(pp_core *c, const pp_optim_config *cfg) {
    for (int i = 0; i < c->n_local; i++) {
        int s = c->local[i];
        pp_flat_params *fp; /* a device's copy of the old one's state comes back first */
        PP_TRY(pp_stage_params_sync(c->stages[s], &fp));
        pp_optim_free(c->optims[s]);
        c->optims[s] = NULL;
        PP_TRY(pp_optim_new(cfg, fp ? fp->total : 0, &c->optims[s]));
    }
    return PP_OK;
}

pp_status pp_core_check_grads(const pp_core *c) {
    for (int i = 0; i < c->n_local; i++) PP_TRY(pp_stage_check_grads(c->stages[c->local[i]]));
    return PP_OK;
}

pp_status pp_core_optimizer_step(pp_core *c) {
    PP_TRY(pp_core_check_grads(c)); /* every stage's, before any steps: all or none */
    for (int i = 0; i < c->n_local; i++) {
        int s = c->local[i];
        if (!c->optims[s]) return pp_error(PP_ERR_STATE, "stage %d: no optimizer set", s);
        PP_TRY(pp_stage_optimizer_step(c->stages[s], c->optims[s]));
    }
    return PP_OK;
}
