/* The executor: runs one rank's action list over its stages, moving
 * activations and gradients through a pp_transport. The actions themselves
 * are the execution core's (stage_core.h); this file is the transport route
 * and the rank's sequential loop. */
#include "pippin/executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "executor_internal.h"
#include "grad_ring.h"
#include "log_internal.h"
#include "optim_shard.h"
#include "stage_core.h"
#include "status_internal.h"

struct pp_executor {
    pp_core core;
    const pp_schedule *sched;
    int rank;             /* in the schedule (the pipeline) */
    int world_rank;       /* what errors name: replica * the schedule's ranks + rank */
    pp_transport *t;
    int timeout_ms;
    /* Data-parallel replicas (pp_executor_set_replicas): this replica's
     * stages are numbered from stage_offset on the transport. */
    pp_replica_options rep;
    int stage_offset;
    pp_grad_ring *ring;   /* NULL: one replica */
    pp_grad_ring_options ring_opt;
    uint8_t *ring_added;  /* [n_stages]: the stage's gradients joined the ring this step */
    uint8_t *has_shared;  /* [n_stages]: the stage holds a copy of a replicated parameter */
    pp_optim_shard **shards; /* [n_stages]: ZeRO-1, per local stage with parameters */
    int64_t last_step;    /* the step run last */
    /* Replicas: optimizer steps taken (-1: unknown, one failed part-way;
     * compared in every step's vote) and whether the last step failed. */
    int64_t updates;
    int step_failed;
    int no_vote;          /* pp_executor_set_step_vote(ex, 0): a worker's */
    int *world_stage_rank; /* [replicas * stages]: the transport's placement, for the vote */
    pp_dtype wire;        /* float32 edges to other ranks travel as this */
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
    ex->rank = ex->world_rank = rank;
    ex->t = t;
    ex->timeout_ms = -1;
    ex->wire = PP_F32;
    pp_replica_options_init(&ex->rep);
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
    pp_grad_ring_free(ex->ring);
    free(ex->ring_added);
    free(ex->has_shared);
    free(ex->world_stage_rank);
    for (int s = 0; ex->shards && s < ex->sched->nstages; s++) pp_optim_shard_free(ex->shards[s]);
    free(ex->shards);
    pp_core_free(&ex->core);
    free(ex);
}

void pp_executor_set_timeout(pp_executor *ex, int timeout_ms) { ex->timeout_ms = timeout_ms; }

void pp_executor_set_step_vote(pp_executor *ex, int on) { ex->no_vote = !on; }

double pp_executor_compute_ms(const pp_executor *ex) { return ex->core.compute_ms; }

void pp_executor_trace(pp_executor *ex, pp_trace *trace, double origin_ms) {
    ex->core.trace = trace;
    ex->core.trace_origin_ms = origin_ms;
}
int pp_executor_n_stages(const pp_executor *ex) { return ex->core.n_local; }
pp_stage *pp_executor_stage(pp_executor *ex, int i) { return ex->core.stages[ex->core.local[i]]; }
void pp_executor_zero_grad(pp_executor *ex) { pp_core_zero_grad(&ex->core); }

pp_status pp_executor_set_optimizer(pp_executor *ex, const pp_optim_config *c) {
    if (!ex->shards) return pp_core_set_optimizer(&ex->core, c);
    for (int i = 0; i < ex->core.n_local; i++) { /* ZeRO-1: this replica's shard only */
        int s = ex->core.local[i];
        pp_optim_shard_free(ex->shards[s]);
        ex->shards[s] = NULL;
        pp_flat_params *fp;
        PP_TRY(pp_stage_params_sync(ex->core.stages[s], &fp));
        PP_TRY(pp_optim_shard_new(c, &ex->ring_opt, ex->rep.replica, fp, &ex->shards[s]));
    }
    return PP_OK;
}

pp_status pp_executor_optimizer_step(pp_executor *ex) {
    pp_status s = PP_OK;
    if (ex->ring && ex->step_failed) /* its gradients are not the replicas' sum */
        return pp_error(PP_ERR_STATE, "rank %d: step %lld failed on replica %d; run the next step", ex->world_rank,
                        (long long)ex->last_step, ex->rep.replica);
    if (ex->ring) /* a refusal here changes nothing: no unknown update */
        PP_TRY(pp_error_context(pp_core_check_grads(&ex->core), "rank %d", ex->world_rank));
    if (ex->shards) { /* each replica its shard, then the parameters go round (every stage's grads checked above) */
        for (int i = 0; i < ex->core.n_local && s == PP_OK; i++) {
            int st = ex->core.local[i];
            pp_flat_params *fp = NULL;
            if (!ex->shards[st]) s = pp_error(PP_ERR_STATE, "stage %d: no optimizer set", st);
            else if ((s = pp_stage_params_sync(ex->core.stages[st], &fp)) == PP_OK) s = pp_optim_shard_step(ex->shards[st], fp);
        }
        if (s == PP_OK) s = pp_grad_ring_gather(ex->ring, ex->timeout_ms);
    } else {
        s = pp_core_optimizer_step(&ex->core);
    }
    /* a failure here may have updated some parameters (sharded: some
     * replicas' shards, part of the gather): unknown from now on */
    if (ex->ring) ex->updates = s == PP_OK && ex->updates >= 0 ? ex->updates + 1 : -1;
    return s == PP_OK ? s : pp_error_context(s, "rank %d", ex->world_rank);
}

pp_optim *pp_executor_optimizer(pp_executor *ex, int i) {
    int s = ex->core.local[i];
    if (ex->shards) return ex->shards[s] ? ex->shards[s]->opt : NULL;
    return ex->core.optims[s];
}

int pp_executor_optimizer_sharded(const pp_executor *ex) { return ex->shards != NULL; }

int64_t pp_executor_optimizer_state_bytes(pp_executor *ex) {
    int64_t bytes = 0;
    for (int i = 0; i < ex->core.n_local; i++) {
        int s = ex->core.local[i];
        pp_optim *o = pp_executor_optimizer(ex, i);
        pp_flat_params *fp = pp_stage_params(ex->core.stages[s]);
        if (!o || !fp) continue;
        int64_t n = ex->shards ? ex->shards[s]->r.count : fp->total;
        bytes += (int64_t)pp_optim_state(o, -1, NULL, NULL) * n * (int64_t)sizeof(float);
    }
    return bytes;
}

/* The name of state buffer b's shard messages. */
#define SHARD_MSG "pippin:zero1:%d"

pp_status pp_executor_gather_optimizer(pp_executor *ex, int i, pp_optim **whole) {
    *whole = NULL;
    if (!ex->shards) return pp_error(PP_ERR_STATE, "rank %d: the optimizer is not sharded", ex->world_rank);
    if (i < 0 || i >= ex->core.n_local) return pp_error(PP_ERR_INVALID, "rank %d: no local stage %d", ex->world_rank, i);
    int st = ex->core.local[i], r = ex->rep.replicas, me = ex->rep.replica, ns = ex->sched->nstages;
    pp_optim_shard *sh = ex->shards[st];
    pp_flat_params *fp;
    PP_TRY(pp_stage_params_sync(ex->core.stages[st], &fp));
    if (!sh || !fp) return sh ? PP_OK : pp_error(PP_ERR_STATE, "stage %d: no optimizer set", st);
    int nb = pp_optim_state(sh->opt, -1, NULL, NULL);
    char name[64];
    if (me != 0) { /* send every state buffer of this shard to replica 0 */
        for (int b = 0; b < nb; b++) {
            float *buf;
            pp_optim_state(sh->opt, b, NULL, &buf);
            pp_tensor *t; /* a copy: the send may read it after the next update */
            PP_TRY(pp_tensor_empty(PP_F32, 1, (int64_t[]){sh->r.count}, &t));
            if (sh->r.count) memcpy(t->data, buf, sizeof(float) * (size_t)sh->r.count);
            snprintf(name, sizeof name, SHARD_MSG, b);
            pp_transport_key k = {PP_MSG_GRADIENT, ex->last_step, PP_GRAD_RING_MICROBATCH - 2, me * ns + st, st, name};
            pp_status s = pp_transport_send(ex->t, &k, t);
            pp_tensor_free(t);
            PP_TRY(s);
        }
        return PP_OK;
    }
    pp_optim *w;
    PP_TRY(pp_optim_new(pp_optim_get_config(sh->opt), fp->total, &w));
    pp_optim_set_steps(w, pp_optim_steps(sh->opt));
    pp_status s = PP_OK;
    for (int k = 0; k < r && s == PP_OK; k++) {
        pp_ring_ranges rr = sh->r;
        if (k != me) s = pp_grad_ring_shard(&ex->ring_opt, k, fp, &rr);
        for (int b = 0; b < nb && s == PP_OK; b++) {
            float *all, *part;
            pp_optim_state(w, b, NULL, &all);
            pp_optim_state(sh->opt, b, NULL, &part);
            if (k == me) {
                pp_ring_ranges_scatter(&rr, part, all);
                continue;
            }
            snprintf(name, sizeof name, SHARD_MSG, b);
            pp_transport_key key = {PP_MSG_GRADIENT, ex->last_step, PP_GRAD_RING_MICROBATCH - 2, k * ns + st, st, name};
            pp_tensor *in = NULL;
            s = pp_transport_recv(ex->t, &key, ex->timeout_ms, &in);
            if (s == PP_OK && (in->dtype != PP_F32 || in->ndim != 1 || in->shape[0] != rr.count))
                s = pp_error(PP_ERR_PEER, "replica %d sent stage %d's optimizer shard with %lld values, expected %lld",
                             k, st, (long long)pp_tensor_numel(in), (long long)rr.count);
            if (s == PP_OK) pp_ring_ranges_scatter(&rr, in->data, all);
            pp_tensor_free(in);
        }
        if (k != me) pp_ring_ranges_free(&rr);
    }
    if (s != PP_OK) {
        pp_optim_free(w);
        return pp_error_context(s, "rank %d: gathering stage %d's optimizer shards", ex->world_rank, st);
    }
    *whole = w;
    return PP_OK;
}

pp_status pp_executor_load_optimizer(pp_executor *ex, int i, pp_optim *whole) {
    if (!ex->shards) return pp_error(PP_ERR_STATE, "rank %d: the optimizer is not sharded", ex->world_rank);
    if (i < 0 || i >= ex->core.n_local) return pp_error(PP_ERR_INVALID, "rank %d: no local stage %d", ex->world_rank, i);
    pp_optim_shard *sh = ex->shards[ex->core.local[i]];
    if (!sh || !whole) return PP_OK;
    return pp_optim_shard_take(sh, whole);
}

/* ---- data-parallel replicas ---- */

void pp_replica_options_init(pp_replica_options *o) {
    memset(o, 0, sizeof *o); /* every field not named below: off (shard_optimizer was left unset) */
    o->replicas = 1;
    o->replica = 0;
    o->first_bucket_bytes = 1 << 20;
    o->bucket_bytes = 25 << 20;
}

void pp_executor_world_stage_ranks(const pp_schedule *sched, int replicas, int *out) {
    for (int k = 0; k < replicas; k++)
        for (int s = 0; s < sched->nstages; s++)
            out[k * sched->nstages + s] = k * sched->nranks + sched->stage_rank[s];
}

/* Back to one replica: no ring, no shards. */
static void drop_replicas(pp_executor *ex) {
    pp_grad_ring_free(ex->ring);
    ex->ring = NULL;
    free(ex->ring_added);
    free(ex->has_shared);
    ex->ring_added = ex->has_shared = NULL;
    for (int s = 0; ex->shards && s < ex->sched->nstages; s++) pp_optim_shard_free(ex->shards[s]);
    free(ex->shards);
    ex->shards = NULL;
    pp_replica_options_init(&ex->rep);
    ex->world_rank = ex->rank;
    ex->stage_offset = 0;
    ex->updates = ex->step_failed = 0;
    free(ex->world_stage_rank);
    ex->world_stage_rank = NULL;
    ex->core.replicas = 1;
    ex->core.replica = 0;
}

pp_status pp_executor_set_replicas(pp_executor *ex, const pp_replica_options *o) {
    if (o->replicas < 1 || o->replica < 0 || o->replica >= o->replicas)
        return pp_error(PP_ERR_INVALID, "rank %d: replica %d of %d", ex->world_rank, o->replica, o->replicas);
    if (o->replicas > 1 && !ex->core.training)
        return pp_error(PP_ERR_UNSUPPORTED, "rank %d: data-parallel replicas are for training", ex->world_rank);
    if (o->first_bucket_bytes <= 0 || o->bucket_bytes <= 0)
        return pp_error(PP_ERR_INVALID, "rank %d: gradient buckets of %lld and %lld bytes", ex->world_rank,
                        (long long)o->first_bucket_bytes, (long long)o->bucket_bytes);
    if (o->shard_optimizer && o->replicas > 1) {
        for (int i = 0; i < ex->core.n_local; i++)
            if (ex->core.optims[ex->core.local[i]])
                return pp_error(PP_ERR_STATE, "rank %d: shard the optimizer before setting it", ex->world_rank);
    }
    drop_replicas(ex);
    ex->rep = *o;
    ex->world_rank = o->replica * ex->sched->nranks + ex->rank;
    ex->stage_offset = o->replica * ex->sched->nstages;
    ex->core.replicas = o->replicas;
    ex->core.replica = o->replica;
    if (o->replicas == 1) return PP_OK;
    int ns = ex->sched->nstages;
    ex->ring_opt = (pp_grad_ring_options){ex->t, o->replicas, o->replica, ns, o->first_bucket_bytes, o->bucket_bytes,
                                          o->shard_optimizer};
    ex->ring_opt.sockets = o->direct_links < 0 ? -1 : 0;
    ex->ring_added = calloc((size_t)ns, 1);
    ex->has_shared = calloc((size_t)ns, 1);
    ex->world_stage_rank = malloc(sizeof *ex->world_stage_rank * (size_t)(o->replicas * ns));
    if (ex->world_stage_rank) pp_executor_world_stage_ranks(ex->sched, o->replicas, ex->world_stage_rank);
    if (o->shard_optimizer) ex->shards = calloc((size_t)ns, sizeof *ex->shards);
    pp_status s = !ex->ring_added || !ex->has_shared || !ex->world_stage_rank || (o->shard_optimizer && !ex->shards)
                      ? pp_error(PP_ERR_NOMEM, "out of memory")
                      : pp_error_context(pp_grad_ring_new(&ex->ring_opt, &ex->ring), "rank %d", ex->world_rank);
    for (int i = 0; s == PP_OK && i < ex->core.p->n_shared; i++)
        for (int a = 0; a < ex->core.p->shared[i].n_stages; a++) ex->has_shared[ex->core.p->shared[i].stages[a]] = 1;
    if (s != PP_OK) drop_replicas(ex); /* not half a replica */
    return s;
}

/* ---- the replicas' vote on a step ----
 *
 * Every rank of every replica tells every other whether its step succeeded
 * (and how many optimizer steps it has taken), and a step succeeds only
 * where it succeeded everywhere. Without it a rank whose step failed at
 * once went on to the next step while its peers still waited out the
 * failed one: that step's receives timed out in turn, and the steps
 * failed on one rank or another from then on; a rank whose own part
 * succeeded would also take an optimizer step its peers did not. The
 * wait is the long one of the checkpoint agreements: a peer may still be
 * waiting out its own failure, or end the step far later (the vote's
 * messages go first, so the last rank to arrive waits for none). After a
 * failed step every rank drops its shared-memory groups and direct links,
 * so all agree on them again in the next step (a group one replica kept
 * while its peer dropped it would wait for rounds that never come).
 * Ranks whose optimizer steps differ hold parameters that no later step
 * can mend (a step succeeded on some and failed on others, or an
 * optimizer step failed part-way): refused, naming them. */
#define VOTE_FAILED (-2)

/* "rank 4 (replica 1, stage 1)": a world rank and its first stage. */
static void name_rank(const pp_executor *ex, int w, char *out, size_t cap) {
    int nr = ex->sched->nranks, st = 0;
    while (st < ex->sched->nstages && ex->sched->stage_rank[st] != w % nr) st++;
    snprintf(out, cap, "rank %d (replica %d, stage %d)", w, w / nr, st);
}

static pp_status step_vote(pp_executor *ex, int64_t step, pp_status s) {
    char own[1024] = "";
    if (s != PP_OK) snprintf(own, sizeof own, "%s", pp_last_error());
    /* the long wait: ranks may end a step far apart (a heavy first stage
     * under GPipe ends its backward long after the last stage), and a
     * vote that timed out on one rank while the late ones found every
     * vote in would split the replicas for good; a dead peer still ends
     * it at the heartbeat timeout */
    int tmo = pp_agree_long_timeout(ex->timeout_ms < 0 ? pp_transport_timeout_ms(ex->t) : ex->timeout_ms);
    pp_agree a = {ex->t, ex->rep.replicas * ex->sched->nranks, ex->rep.replicas * ex->sched->nstages,
                  ex->world_stage_rank, ex->world_rank, tmo, tmo};
    pp_agree_result r;
    pp_status v = pp_agree_int(&a, step, PP_AGREE_STEP, s == PP_OK ? ex->updates : VOTE_FAILED, &r);
    if (s == PP_OK && (v != PP_OK || r.lo == VOTE_FAILED))
        /* this rank's part went through, the step did not: its forward's
         * state (BatchNorm's running statistics) goes back, as on the
         * rank that failed */
        for (int i = 0; i < ex->core.n_local; i++) pp_stage_abort_step(ex->core.stages[ex->core.local[i]]);
    char who[96], other[96];
    if (s != PP_OK || v != PP_OK || r.lo == VOTE_FAILED) pp_grad_ring_drop_groups(ex->ring);
    if (s != PP_OK) return pp_error(s, "%s", own); /* its own failure, whatever the peers said */
    if (v != PP_OK) return v;
    if (r.lo == VOTE_FAILED) {
        name_rank(ex, r.who_lo, who, sizeof who);
        return pp_error(PP_ERR_PEER, "%s failed the step, so it failed on every rank (run the next step)", who);
    }
    if (r.lo != r.hi || r.lo < 0) {
        name_rank(ex, r.who_lo, who, sizeof who);
        name_rank(ex, r.who_hi, other, sizeof other);
        return pp_error(PP_ERR_STATE, "%s has taken %lld optimizer steps%s, %s %lld: their parameters differ; load "
                        "the same parameters on every rank, call pp_executor_set_replicas and "
                        "pp_executor_set_optimizer again on each (and load the optimizer state)", who, (long long)r.lo,
                        r.lo < 0 ? " (-1: one failed part-way)" : "", other, (long long)r.hi);
    }
    return PP_OK;
}

/* Local stages whose last weight gradient of the step just ran join the
 * ring; then every bucket moves on as far as what arrived allows. Sharded,
 * a stage that holds a copy of a replicated (tied) parameter still has its
 * gradients summed whole: the copies' sum across stages comes after the
 * replicas' sum, in the unsharded order, so every copy gets the same bits. */
static pp_status ring_progress(pp_executor *ex) {
    pp_core *c = &ex->core;
    for (int i = 0; i < c->n_local; i++) {
        int s = c->local[i];
        if (ex->ring_added[s] || !pp_core_weights_done(c, s)) continue;
        ex->ring_added[s] = 1;
        /* unsharded, the ring sums gradients alone: a device stage's weights and optimizer state stay there */
        pp_flat_params *fp = ex->shards ? pp_stage_params(c->stages[s]) : pp_stage_grads(c->stages[s]);
        if (!fp) return pp_error_context(PP_ERR_IO, "rank %d", ex->world_rank);
        PP_TRY(pp_grad_ring_add(ex->ring, s, fp, ex->shards && ex->has_shared[s]));
    }
    return pp_grad_ring_progress(ex->ring);
}

/* Scalar model outputs (the loss) of this replica become the mean over the
 * replicas, summed in replica order so every replica gets the same bits. */
static pp_status replica_mean(pp_executor *ex, pp_tensor **outputs) {
    const pp_pipe *p = ex->core.p;
    int r = ex->rep.replicas, me = ex->rep.replica, ns = ex->sched->nstages;
    for (int o = 0; o < p->n_outputs; o++) {
        if (!outputs[o] || outputs[o]->ndim != 0 || !pp_dtype_is_float(outputs[o]->dtype)) continue;
        int st = p->output_stage[o];
        pp_tensor *mine; /* a copy: outputs[o] changes below, maybe before the send reads it */
        PP_TRY(pp_tensor_clone(outputs[o], &mine));
        pp_status s = PP_OK;
        for (int k = 0; k < r && s == PP_OK; k++) {
            pp_transport_key key = {PP_MSG_GRADIENT, ex->core.step, PP_GRAD_RING_MICROBATCH - 1, me * ns + st,
                                    k * ns + st, p->outputs[o]};
            if (k != me) s = pp_transport_send(ex->t, &key, mine);
        }
        pp_tensor_free(mine);
        PP_TRY(s);
        double sum = 0;
        for (int k = 0; k < r; k++) {
            if (k == me) {
                sum += pp_tensor_get_f64(outputs[o], 0);
                continue;
            }
            pp_transport_key key = {PP_MSG_GRADIENT, ex->core.step, PP_GRAD_RING_MICROBATCH - 1, k * ns + st,
                                    me * ns + st, p->outputs[o]};
            pp_tensor *in;
            PP_TRY(pp_error_context(pp_transport_recv(ex->t, &key, ex->timeout_ms, &in),
                                    "the mean of output '%s' over the replicas", p->outputs[o]));
            int ok = in->ndim == 0 && in->dtype == outputs[o]->dtype;
            if (ok) sum += pp_tensor_get_f64(in, 0);
            pp_tensor_free(in);
            if (!ok)
                return pp_error(PP_ERR_PEER, "replica %d sent output '%s' with another shape or dtype", k,
                                p->outputs[o]);
        }
        pp_tensor_set_f64(outputs[o], 0, sum / r);
    }
    return PP_OK;
}

pp_status pp_executor_set_wire_dtype(pp_executor *ex, pp_dtype dt) {
    if (dt != PP_F32 && dt != PP_BF16)
        return pp_error(PP_ERR_UNSUPPORTED, "rank %d: wire dtype %s (float32 or bfloat16)", ex->world_rank, pp_dtype_name(dt));
    ex->wire = dt;
    return PP_OK;
}

/* ---- the transport route: receives block until the tensor arrives ---- */

static pp_status tr_send(pp_executor *ex, pp_msg_kind kind, int mb, int src, int dst, const char *name,
                         pp_tensor *t) {
    pp_transport_key k = {kind, ex->core.step, mb, ex->stage_offset + src, ex->stage_offset + dst, name};
    return pp_transport_send(ex->t, &k, t);
}

static pp_status tr_recv(pp_executor *ex, pp_msg_kind kind, int mb, int src, int dst, const char *name,
                         pp_tensor **out) {
    pp_transport_key k = {kind, ex->core.step, mb, ex->stage_offset + src, ex->stage_offset + dst, name};
    return pp_transport_recv(ex->t, &k, ex->timeout_ms, out);
}

/* With a narrower wire dtype, a float32 edge's tensor to another rank goes
 * narrowed, and comes back widened. */
static int narrowed(const pp_executor *ex, int e, int other_stage) {
    return ex->wire != PP_F32 && ex->core.p->edges[e].dtype == PP_F32 &&
           ex->sched->stage_rank[other_stage] != ex->rank;
}

static pp_status wire_send(pp_executor *ex, pp_msg_kind kind, int e, int mb, int src, int dst, int other, pp_tensor *t) {
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    if (!narrowed(ex, e, other) || t->dtype != PP_F32) return tr_send(ex, kind, mb, src, dst, ed->value, t);
    pp_tensor *n;
    PP_TRY(pp_tensor_cast(t, ex->wire, &n));
    pp_status s = tr_send(ex, kind, mb, src, dst, ed->value, n);
    pp_tensor_free(n);
    return s;
}

static pp_status wire_recv(pp_executor *ex, pp_msg_kind kind, int e, int mb, int src, int dst, int other,
                           pp_tensor **out) {
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    PP_TRY(tr_recv(ex, kind, mb, src, dst, ed->value, out));
    if (!narrowed(ex, e, other) || (*out)->dtype != ex->wire) return PP_OK;
    pp_tensor *w;
    pp_status s = pp_tensor_cast(*out, PP_F32, &w);
    pp_tensor_free(*out);
    *out = s == PP_OK ? w : NULL;
    return s;
}

static pp_status tr_send_act(void *ctx, int e, int mb, int consumer, pp_tensor *t) {
    pp_executor *ex = ctx;
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    return wire_send(ex, PP_MSG_ACTIVATION, e, mb, ed->producer, consumer, consumer, t);
}

static pp_status tr_recv_act(void *ctx, int e, int mb, int consumer, pp_tensor **out) {
    pp_executor *ex = ctx;
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    return wire_recv(ex, PP_MSG_ACTIVATION, e, mb, ed->producer, consumer, ed->producer, out);
}

static pp_status tr_send_grad(void *ctx, int e, int mb, int consumer, pp_tensor *g) {
    pp_executor *ex = ctx;
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    return wire_send(ex, PP_MSG_GRADIENT, e, mb, consumer, ed->producer, ed->producer, g);
}

static pp_status tr_recv_grad(void *ctx, int e, int mb, int consumer, pp_tensor **out) {
    pp_executor *ex = ctx;
    const pp_pipe_edge *ed = &ex->core.p->edges[e];
    return wire_recv(ex, PP_MSG_GRADIENT, e, mb, consumer, ed->producer, consumer, out);
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
        if (s == PP_OK && ex->ring) s = ring_progress(ex);
        if (s != PP_OK) {
            char text[PP_ACTION_STR_MAX];
            pp_action_format(sched, a, text, sizeof text);
            return pp_error_context(s, "rank %d step %lld action %zu (%s)", ex->world_rank, (long long)ex->core.step,
                                    k, text);
        }
    }
    return PP_OK;
}

pp_status pp_executor_step(pp_executor *ex, int64_t step, int m, int n_inputs, const char *const *names,
                           pp_tensor *const *inputs, pp_tensor **outputs) {
    if (ex->sched->nmb != m) {
        pp_status s = pp_error(PP_ERR_INVALID, "schedule is for %d microbatches, the step has %d", ex->sched->nmb, m);
        if (ex->ring && !ex->no_vote) { /* the peers are voting on this step: it failed here */
            pp_transport_set_step(ex->t, step);
            s = step_vote(ex, step, s);
        }
        if (ex->ring) ex->step_failed = 1;
        return s;
    }
    pp_route route = {ex, NULL, tr_send_act, tr_recv_act, NULL, tr_send_grad, tr_recv_grad, tr_send_delta,
                      tr_recv_delta};
    pp_status s = pp_transport_set_step(ex->t, step);
    ex->last_step = step;
    if (ex->ring) pp_core_zero_grad(&ex->core); /* the ring sums the whole buffer: this step's gradients only */
    if (s == PP_OK) s = pp_core_step_begin(&ex->core, step, m, n_inputs, names, inputs);
    if (ex->ring) {
        pp_grad_ring_begin(ex->ring, step);
        memset(ex->ring_added, 0, (size_t)ex->sched->nstages);
    }
    if (s != PP_OK) s = pp_error_context(s, "rank %d", ex->world_rank);
    else s = run_actions(ex, &route); /* names rank, step and action */
    if (s == PP_OK && ex->ring) { /* every stage's sum is in before the replicated parameters' */
        s = ring_progress(ex);
        if (s == PP_OK) s = pp_grad_ring_finish(ex->ring, ex->timeout_ms);
        if (s == PP_OK)
            pp_debug("rank %d step %lld: %d of %d gradient buckets summed while computing", ex->world_rank,
                     (long long)step, pp_grad_ring_overlapped(ex->ring), pp_grad_ring_buckets(ex->ring));
        if (s != PP_OK) s = pp_error_context(s, "rank %d step %lld", ex->world_rank, (long long)step);
    }
    int failed = s != PP_OK;
    /* with replicas the outputs are always merged: every replica takes part in their mean */
    pp_tensor **outs = outputs;
    if (!outs && ex->ring && !(outs = calloc((size_t)ex->core.p->n_outputs + 1, sizeof *outs)))
        s = pp_error(PP_ERR_NOMEM, "out of memory");
    s = pp_core_step_end(&ex->core, &route, s, outs);
    if (s == PP_OK && ex->ring) s = replica_mean(ex, outs);
    if (s != PP_OK && !failed) s = pp_error_context(s, "rank %d step %lld", ex->world_rank, (long long)step);
    if (ex->ring) {
        if (!ex->no_vote) s = step_vote(ex, step, s);
        ex->step_failed = s != PP_OK;
    }
    if (outs != outputs) {
        for (int o = 0; outs && o < ex->core.p->n_outputs; o++) pp_tensor_free(outs[o]);
        free(outs);
    } else if (s != PP_OK && outs) {
        for (int o = 0; o < ex->core.p->n_outputs; o++) {
            pp_tensor_free(outs[o]);
            outs[o] = NULL;
        }
    }
    return s;
}
