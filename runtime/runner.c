/* Local pipeline runner: executes a schedule's action lists for all ranks in
 * one process, moving activations and gradients between stages in memory. */
#include "pippin/runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/microbatch.h"
#include "pippin/sched_trace.h"
#include "timing.h"

#include "status_internal.h"
typedef struct {
    int *in_edge;      /* per forward input: edge index */
    int *out_edge;     /* per forward output: edge it feeds, or -1 */
    int *out_model;    /* per forward output: model output index, or -1 */
    int *gout_edge;    /* per gradient output (seed): edge */
    int *gin_edge;     /* per gradient input (wrt): edge */
} stage_links;

struct pp_runner {
    pp_pipe *p;
    int training;
    int n_stages;
    pp_stage **stages;
    stage_links *links;
    pp_optim **optims; /* per stage, once set */
    pp_trace *trace;   /* NULL: not recording */
    double trace_origin_ms;
};

/* Per-step state. */
typedef struct {
    int m;
    pp_tensor **acts;   /* [edge * m + mb] */
    int *act_left;      /* consumers whose F has not read it yet */
    pp_tensor **grads;  /* [(edge * m + mb) * maxc + c]: from the edge's c-th consumer */
    int *grad_count;    /* [edge * m + mb] */
    int maxc;           /* most consumers of any edge */
    uint8_t *done_f, *done_i, *done_w; /* [stage * m + mb] */
    pp_tensor **outs;   /* [output * m + mb] */
} step_state;

static pp_status link_stage(pp_runner *r, int s) {
    const pp_pipe *p = r->p;
    pp_stage *st = r->stages[s];
    stage_links *l = &r->links[s];
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
        l->out_edge[o] = (e >= 0 && p->edges[e].producer == s) ? e : -1;
        l->out_model[o] = -1;
        for (int k = 0; k < p->n_outputs; k++)
            if (p->output_stage[k] == s && strcmp(p->outputs[k], name) == 0) l->out_model[o] = k;
    }
    for (int k = 0; k < ng; k++) l->gout_edge[k] = pp_pipe_find_edge(p, pp_stage_grad_output_name(st, k));
    for (int k = 0; k < nw; k++) l->gin_edge[k] = pp_pipe_find_edge(p, pp_stage_grad_input_name(st, k));
    return PP_OK;
}

pp_status pp_runner_new(pp_pipe *p, int training, pp_runner **out) {
    *out = NULL;
    int probed = 1;
    for (int e = 0; e < p->n_edges; e++)
        if (p->edges[e].dtype == PP_DTYPE_UNDEFINED) probed = 0;
    if (!probed) PP_TRY(pp_pipe_probe_shapes(p, 0, NULL));
    pp_runner *r = calloc(1, sizeof *r);
    if (!r) return pp_error(PP_ERR_NOMEM, "out of memory");
    r->p = p;
    r->training = training;
    r->n_stages = p->n_stages;
    r->stages = calloc((size_t)p->n_stages, sizeof *r->stages);
    r->links = calloc((size_t)p->n_stages, sizeof *r->links);
    r->optims = calloc((size_t)p->n_stages, sizeof *r->optims);
    pp_status s = r->stages && r->links && r->optims ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < p->n_stages && s == PP_OK; i++) {
        s = pp_stage_from_pipe(p, i, training, &r->stages[i]);
        if (s == PP_OK) s = link_stage(r, i);
    }
    if (s != PP_OK) {
        pp_runner_free(r);
        return s;
    }
    *out = r;
    return PP_OK;
}

void pp_runner_free(pp_runner *r) {
    if (!r) return;
    for (int i = 0; i < r->n_stages; i++) {
        if (r->stages) pp_stage_free(r->stages[i]);
        if (r->optims) pp_optim_free(r->optims[i]);
        if (r->links) {
            free(r->links[i].in_edge);
            free(r->links[i].out_edge);
            free(r->links[i].out_model);
            free(r->links[i].gout_edge);
            free(r->links[i].gin_edge);
        }
    }
    free(r->stages);
    free(r->links);
    free(r->optims);
    free(r);
}

int pp_runner_n_stages(const pp_runner *r) { return r->n_stages; }
pp_stage *pp_runner_stage(pp_runner *r, int i) { return r->stages[i]; }
int pp_runner_n_outputs(const pp_runner *r) { return r->p->n_outputs; }
const char *pp_runner_output_name(const pp_runner *r, int o) { return r->p->outputs[o]; }

int pp_runner_loss_output(const pp_runner *r) {
    for (int o = 0; r->p->loss && o < r->p->n_outputs; o++)
        if (strcmp(r->p->outputs[o], r->p->loss) == 0) return o;
    return -1;
}

void pp_runner_trace(pp_runner *r, pp_trace *trace, double origin_ms) {
    r->trace = trace;
    r->trace_origin_ms = origin_ms;
}

void pp_runner_zero_grad(pp_runner *r) {
    for (int i = 0; i < r->n_stages; i++) pp_stage_zero_grad(r->stages[i]);
}

/* ---- one step ---- */

static void step_free(const pp_runner *r, step_state *ss) {
    size_t ne = (size_t)r->p->n_edges * (size_t)ss->m, no = (size_t)r->p->n_outputs * (size_t)ss->m;
    for (size_t i = 0; ss->acts && i < ne; i++) pp_tensor_free(ss->acts[i]);
    for (size_t i = 0; ss->grads && i < ne * (size_t)ss->maxc; i++) pp_tensor_free(ss->grads[i]);
    for (size_t i = 0; ss->outs && i < no; i++) pp_tensor_free(ss->outs[i]);
    free(ss->acts);
    free(ss->act_left);
    free(ss->grads);
    free(ss->grad_count);
    free(ss->done_f);
    free(ss->done_i);
    free(ss->done_w);
    free(ss->outs);
}

static pp_status step_init(const pp_runner *r, int m, step_state *ss) {
    size_t ne = (size_t)r->p->n_edges * (size_t)m + 1, ns = (size_t)r->n_stages * (size_t)m + 1;
    memset(ss, 0, sizeof *ss);
    ss->m = m;
    ss->maxc = 1;
    for (int e = 0; e < r->p->n_edges; e++)
        if (r->p->edges[e].n_consumers > ss->maxc) ss->maxc = r->p->edges[e].n_consumers;
    ss->acts = calloc(ne, sizeof *ss->acts);
    ss->act_left = calloc(ne, sizeof *ss->act_left);
    ss->grads = calloc(ne * (size_t)ss->maxc, sizeof *ss->grads);
    ss->grad_count = calloc(ne, sizeof *ss->grad_count);
    ss->done_f = calloc(ns, 1);
    ss->done_i = calloc(ns, 1);
    ss->done_w = calloc(ns, 1);
    ss->outs = calloc((size_t)r->p->n_outputs * (size_t)m + 1, sizeof *ss->outs);
    if (!ss->acts || !ss->act_left || !ss->grads || !ss->grad_count || !ss->done_f || !ss->done_i ||
        !ss->done_w || !ss->outs)
        return pp_error(PP_ERR_NOMEM, "out of memory");
    return PP_OK;
}

static int forward_ready(const pp_runner *r, const step_state *ss, int s, int mb) {
    const stage_links *l = &r->links[s];
    if (ss->done_f[s * ss->m + mb]) return 1; /* reported as an error by run_forward */
    for (int i = 0; i < pp_stage_n_inputs(r->stages[s]); i++)
        if (!ss->acts[l->in_edge[i] * ss->m + mb]) return 0;
    return 1;
}

static int backward_ready(const pp_runner *r, const step_state *ss, int s, int mb) {
    const stage_links *l = &r->links[s];
    if (!ss->done_f[s * ss->m + mb]) return 0;
    for (int k = 0; k < pp_stage_n_grad_outputs(r->stages[s]); k++) {
        int e = l->gout_edge[k];
        if (ss->grad_count[e * ss->m + mb] < r->p->edges[e].n_consumers) return 0;
    }
    return 1;
}

static pp_status run_forward(pp_runner *r, step_state *ss, int s, int mb) {
    pp_stage *st = r->stages[s];
    const stage_links *l = &r->links[s];
    int m = ss->m;
    if (ss->done_f[s * m + mb]) return pp_error(PP_ERR_STATE, "stage %d: forward of microbatch %d scheduled twice", s, mb);
    int ni = pp_stage_n_inputs(st), no = pp_stage_n_outputs(st);
    pp_tensor **ins = calloc((size_t)ni + 1, sizeof *ins), **outs = calloc((size_t)no + 1, sizeof *outs);
    if (!ins || !outs) {
        free(ins);
        free(outs);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < ni; i++) ins[i] = ss->acts[l->in_edge[i] * m + mb];
    pp_status status = pp_stage_forward(st, mb, ins, outs);
    if (status == PP_OK) {
        ss->done_f[s * m + mb] = 1;
        for (int i = 0; i < ni; i++) { /* drop activations every consumer has read */
            int slot = l->in_edge[i] * m + mb;
            if (--ss->act_left[slot] == 0) {
                pp_tensor_free(ss->acts[slot]);
                ss->acts[slot] = NULL;
            }
        }
        for (int o = 0; o < no; o++) {
            if (l->out_edge[o] >= 0) {
                int slot = l->out_edge[o] * m + mb;
                ss->acts[slot] = pp_tensor_retain(outs[o]);
                ss->act_left[slot] = r->p->edges[l->out_edge[o]].n_consumers;
            }
            if (l->out_model[o] >= 0) ss->outs[l->out_model[o] * m + mb] = pp_tensor_retain(outs[o]);
            pp_tensor_free(outs[o]);
        }
    }
    free(ins);
    free(outs);
    return status;
}

/* Files consumer stage s's gradient for edge e (takes ownership). */
static pp_status add_grad(const pp_runner *r, step_state *ss, int e, int mb, int s, pp_tensor *g) {
    const pp_pipe_edge *ed = &r->p->edges[e];
    int c = 0;
    while (c < ed->n_consumers && ed->consumers[c] != s) c++;
    if (c == ed->n_consumers) {
        pp_tensor_free(g);
        return pp_error(PP_ERR_INTERNAL, "stage %d is no consumer of '%s'", s, ed->value);
    }
    pp_tensor **slot = &ss->grads[(size_t)(e * ss->m + mb) * (size_t)ss->maxc + (size_t)c];
    pp_tensor_free(*slot);
    *slot = g;
    ss->grad_count[e * ss->m + mb]++;
    return PP_OK;
}

static pp_status run_backward_input(pp_runner *r, step_state *ss, int s, int mb) {
    pp_stage *st = r->stages[s];
    const stage_links *l = &r->links[s];
    int m = ss->m, ng = pp_stage_n_grad_outputs(st), nw = pp_stage_n_grad_inputs(st);
    pp_tensor **gout = calloc((size_t)ng + 1, sizeof *gout), **gin = calloc((size_t)nw + 1, sizeof *gin);
    if (!gout || !gin) {
        free(gout);
        free(gin);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    pp_status status = PP_OK;
    for (int k = 0; k < ng && status == PP_OK; k++) { /* summed in consumer order: deterministic */
        int e = l->gout_edge[k];
        status = pp_tensor_sum(&ss->grads[(size_t)(e * m + mb) * (size_t)ss->maxc], r->p->edges[e].n_consumers, &gout[k]);
    }
    if (status == PP_OK) status = pp_stage_backward_input(st, mb, gout, gin);
    for (int k = 0; k < ng; k++) pp_tensor_free(gout[k]);
    if (status == PP_OK) {
        ss->done_i[s * m + mb] = 1;
        for (int k = 0; k < ng; k++) /* the stage has used them */
            for (int c = 0; c < r->p->edges[l->gout_edge[k]].n_consumers; c++) {
                pp_tensor **slot = &ss->grads[(size_t)(l->gout_edge[k] * m + mb) * (size_t)ss->maxc + (size_t)c];
                pp_tensor_free(*slot);
                *slot = NULL;
            }
        for (int k = 0; k < nw; k++) { /* add_grad takes ownership */
            if (status == PP_OK) status = add_grad(r, ss, l->gin_edge[k], mb, s, gin[k]);
            else pp_tensor_free(gin[k]);
        }
    }
    free(gout);
    free(gin);
    return status;
}

/* Runs one plain compute action; *ran is 0 when its inputs are not there
 * yet (another rank must act first). */
static pp_status run_action(pp_runner *r, step_state *ss, const pp_action *a, int *ran) {
    int s = a->stage, mb = a->mb, m = ss->m;
    *ran = 0;
    if (a->kind == PP_ACT_F || a->kind == PP_ACT_I || a->kind == PP_ACT_B || a->kind == PP_ACT_W) {
        if (s < 0 || s >= r->n_stages || mb < 0 || mb >= m)
            return pp_error(PP_ERR_INVALID, "action names stage %d microbatch %d (pipe has %d stages, step %d microbatches)",
                            s, mb, r->n_stages, m);
    }
    switch ((pp_act_kind)a->kind) {
    case PP_ACT_F:
        if (!forward_ready(r, ss, s, mb)) return PP_OK;
        *ran = 1;
        return run_forward(r, ss, s, mb);
    case PP_ACT_I:
    case PP_ACT_B:
        if (!r->training) { /* inference runs only a schedule's forwards */
            *ran = 1;
            return PP_OK;
        }
        if (ss->done_i[s * m + mb]) return pp_error(PP_ERR_STATE, "stage %d: backward of microbatch %d scheduled twice", s, mb);
        if (!backward_ready(r, ss, s, mb)) return PP_OK;
        *ran = 1;
        PP_TRY(run_backward_input(r, ss, s, mb));
        if (a->kind == PP_ACT_I) return PP_OK;
        /* fall through: B is I then W */
        /* FALLTHROUGH */
    case PP_ACT_W:
        if (!r->training) {
            *ran = 1;
            return PP_OK;
        }
        if (!ss->done_i[s * m + mb]) return PP_OK;
        if (ss->done_w[s * m + mb]) return pp_error(PP_ERR_STATE, "stage %d: weight gradient of microbatch %d scheduled twice", s, mb);
        *ran = 1;
        ss->done_w[s * m + mb] = 1;
        return pp_stage_backward_weight(r->stages[s], mb);
    default: /* SEND/RECV, REDUCE_GRAD, UNSHARD, RESHARD: nothing to do in one process */
        *ran = 1;
        return PP_OK;
    }
}

/* The first replica's gradient of each shared parameter before a step (all
 * copies are equal then), so the step's own contributions can be told from
 * what earlier steps accumulated. */
static pp_status shared_snapshot(pp_runner *r, float ***out) {
    const pp_pipe *p = r->p;
    float **snap = calloc((size_t)p->n_shared + 1, sizeof *snap);
    if (!snap) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < p->n_shared; i++)
        for (int k = 0; k < p->shared[i].n_stages && !snap[i]; k++) {
            pp_flat_params *fp = pp_stage_params(r->stages[p->shared[i].stages[k]]);
            int pi = fp ? pp_flat_params_find(fp, p->shared[i].name) : -1;
            if (pi < 0) continue;
            snap[i] = malloc(sizeof(float) * (size_t)(fp->numel[pi] ? fp->numel[pi] : 1));
            if (!snap[i]) {
                *out = snap;
                return pp_error(PP_ERR_NOMEM, "out of memory");
            }
            memcpy(snap[i], fp->grad + fp->offset[pi], sizeof(float) * (size_t)fp->numel[pi]);
        }
    *out = snap;
    return PP_OK;
}

static void free_snapshot(const pp_runner *r, float **snap) {
    for (int i = 0; snap && i < r->p->n_shared; i++) free(snap[i]);
    free(snap);
}

/* Replicated parameters: every copy gets S + the sum over copies (in stage
 * order) of what this step added to it, S being the common value before
 * the step. Identical updates then keep the copies identical, and
 * gradients accumulated over several steps are counted once. */
static pp_status sync_shared_grads(pp_runner *r, float *const *snap) {
    const pp_pipe *p = r->p;
    for (int i = 0; i < p->n_shared; i++) {
        const pp_pipe_shared *sh = &p->shared[i];
        if (!snap[i]) continue;
        float *total = NULL;
        int64_t n0 = 0;
        for (int pass = 0; pass < 2; pass++) /* 0: add up, 1: hand the total out */
            for (int k = 0; k < sh->n_stages; k++) {
                pp_flat_params *fp = pp_stage_params(r->stages[sh->stages[k]]);
                int pi = fp ? pp_flat_params_find(fp, sh->name) : -1;
                if (pi < 0) continue; /* no gradient reaches it in this stage */
                float *g = fp->grad + fp->offset[pi];
                if (pass == 1) {
                    memcpy(g, total, sizeof(float) * (size_t)n0);
                    continue;
                }
                if (!total) {
                    n0 = fp->numel[pi];
                    total = malloc(sizeof(float) * (size_t)(n0 ? n0 : 1));
                    if (!total) return pp_error(PP_ERR_NOMEM, "out of memory");
                    memcpy(total, snap[i], sizeof(float) * (size_t)n0);
                } else if (fp->numel[pi] != n0) {
                    free(total);
                    return pp_error(PP_ERR_INTERNAL, "replicas of '%s' differ in size", sh->name);
                }
                for (int64_t j = 0; j < n0; j++) total[j] += g[j] - snap[i][j];
            }
        free(total);
    }
    return PP_OK;
}

static pp_status default_schedule(const pp_runner *r, int m, pp_schedule **out) {
    pp_sched_params sp = {0};
    sp.kind = PP_SCHED_GPIPE;
    sp.nranks = r->n_stages;
    sp.nmb = m;
    sp.stages_per_rank = 1;
    return pp_schedule_generate(&sp, out);
}

/* Interleaves the ranks' lists as concurrent ranks with blocking receives
 * would: each rank runs its next action once that action's inputs exist. */
static pp_status run_schedule(pp_runner *r, step_state *ss, const pp_schedule *sched) {
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
                double t0 = pp_monotonic_ms();
                const pp_action *done = a;
                if (a->kind == PP_ACT_OVERLAP_F_B) {
                    const pp_action *subs = pp_schedule_subs(sched, a);
                    done = &subs[sub[rk]];
                    status = run_action(r, ss, &subs[sub[rk]], &ran);
                    if (ran && ++sub[rk] == a->nsub) {
                        sub[rk] = 0;
                        pos[rk]++;
                    }
                } else if (a->kind == PP_ACT_IDLE) {
                    ran = 1;
                    pos[rk]++;
                } else {
                    status = run_action(r, ss, a, &ran);
                    if (ran) pos[rk]++;
                }
                if (status != PP_OK) {
                    char text[PP_ACTION_STR_MAX];
                    pp_action_format(sched, a, text, sizeof text);
                    status = pp_error_context(status, "rank %d action %zu (%s)", rk, at, text);
                }
                if (!ran) break;
                if (r->trace && status == PP_OK && pp_act_is_compute((pp_act_kind)done->kind))
                    status = pp_trace_action(r->trace, rk, done, t0 - r->trace_origin_ms,
                                             pp_monotonic_ms() - r->trace_origin_ms);
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

static pp_status check_complete(const pp_runner *r, const step_state *ss) {
    for (int s = 0; s < r->n_stages; s++)
        for (int mb = 0; mb < ss->m; mb++) {
            int i = s * ss->m + mb;
            if (!ss->done_f[i]) return pp_error(PP_ERR_INVALID, "schedule never runs the forward of stage %d microbatch %d", s, mb);
            if (r->training && (!ss->done_i[i] || !ss->done_w[i]))
                return pp_error(PP_ERR_INVALID, "schedule never finishes the backward of stage %d microbatch %d", s, mb);
        }
    return PP_OK;
}

static pp_status feed_inputs(pp_runner *r, step_state *ss, int n_inputs, const char *const *names,
                             pp_tensor *const *inputs) {
    const pp_pipe *p = r->p;
    for (int e = 0; e < p->n_edges; e++) {
        const pp_pipe_edge *ed = &p->edges[e];
        if (ed->producer >= 0) continue;
        int k = 0;
        while (k < n_inputs && strcmp(names[k], ed->value) != 0) k++;
        if (k == n_inputs) return pp_error(PP_ERR_INVALID, "model input '%s' not given", ed->value);
        pp_tensor **chunks = calloc((size_t)ss->m, sizeof *chunks);
        if (!chunks) return pp_error(PP_ERR_NOMEM, "out of memory");
        pp_status s = pp_microbatch_split(inputs[k], ss->m, ed->value, chunks);
        for (int mb = 0; s == PP_OK && mb < ss->m; mb++) {
            ss->acts[e * ss->m + mb] = chunks[mb];
            ss->act_left[e * ss->m + mb] = ed->n_consumers;
        }
        free(chunks);
        PP_TRY(s);
    }
    return PP_OK;
}

pp_status pp_runner_step(pp_runner *r, int m, const pp_schedule *sched, int n_inputs,
                         const char *const *names, pp_tensor *const *inputs, pp_tensor **outputs) {
    if (sched && sched->nstages != r->n_stages)
        return pp_error(PP_ERR_INVALID, "schedule has %d stages, the pipe %d", sched->nstages, r->n_stages);
    if (sched && sched->nmb != m)
        return pp_error(PP_ERR_INVALID, "schedule is for %d microbatches, the step has %d", sched->nmb, m);
    pp_schedule *own = NULL;
    if (!sched) {
        PP_TRY(default_schedule(r, m, &own));
        sched = own;
    }
    step_state ss;
    pp_status s = step_init(r, m, &ss);
    for (int i = 0; i < r->n_stages && s == PP_OK; i++) {
        pp_stage_set_loss_scale(r->stages[i], 1.0f / (float)m);
        pp_stage_discard_pending(r->stages[i]); /* an inference step may leave none; a failed one is dropped */
    }
    float **snap = NULL;
    if (s == PP_OK && r->training) s = shared_snapshot(r, &snap);
    if (s == PP_OK) s = feed_inputs(r, &ss, n_inputs, names, inputs);
    if (s == PP_OK) s = run_schedule(r, &ss, sched);
    if (s == PP_OK) s = check_complete(r, &ss);
    if (s == PP_OK && r->training) s = sync_shared_grads(r, snap);
    free_snapshot(r, snap);
    for (int o = 0; s == PP_OK && outputs && o < r->p->n_outputs; o++)
        s = pp_microbatch_merge(&ss.outs[o * m], m, r->p->outputs[o], &outputs[o]);
    if (s != PP_OK) /* a failed step must not wedge the next one */
        for (int i = 0; i < r->n_stages; i++) pp_stage_discard_pending(r->stages[i]);
    step_free(r, &ss);
    pp_schedule_free(own);
    return s;
}

static pp_status param_copy(pp_runner *r, const char *name, int grads, pp_tensor **out) {
    *out = NULL;
    for (int i = 0; i < r->n_stages; i++) {
        pp_flat_params *fp = pp_stage_params(r->stages[i]);
        int pi = fp ? pp_flat_params_find(fp, name) : -1;
        if (pi < 0) continue;
        pp_tensor *view;
        PP_TRY(grads ? pp_flat_params_grad_view(fp, pi, &view) : pp_flat_params_data_view(fp, pi, &view));
        pp_status s = pp_tensor_clone(view, out);
        pp_tensor_free(view);
        return s;
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
    if (!r->training) return pp_error(PP_ERR_STATE, "the runner was not built for training");
    for (int i = 0; i < r->n_stages; i++) {
        pp_optim_free(r->optims[i]);
        r->optims[i] = NULL;
        pp_flat_params *fp = pp_stage_params(r->stages[i]);
        PP_TRY(pp_optim_new(c, fp ? fp->total : 0, &r->optims[i]));
    }
    return PP_OK;
}

pp_status pp_runner_optimizer_step(pp_runner *r) {
    for (int i = 0; i < r->n_stages; i++) {
        if (!r->optims[i]) return pp_error(PP_ERR_STATE, "no optimizer set (pp_runner_set_optimizer)");
        pp_flat_params *fp = pp_stage_params(r->stages[i]);
        if (fp) PP_TRY(pp_optim_step(r->optims[i], fp->data, fp->grad, fp->total));
    }
    return PP_OK;
}

pp_optim *pp_runner_optimizer(pp_runner *r, int i) { return r->optims[i]; }
