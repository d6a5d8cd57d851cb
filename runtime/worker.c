/* One rank of a pipeline from its config (pippin/worker.h). */
#include "pippin/worker.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agree.h"
#include "hash.h"
#include "checkpoint_sync.h"
#include "executor_internal.h"
#include "param_files.h"
#include "rank_threads.h"
#include "rejoin_policy.h"
#include "pippin/checkpoint.h"
#include "run_identity.h"
#include "serve.h"
#include "split_auto.h"
#include "pippin/exec.h"
#include "pippin/executor.h"
#include "pippin/microbatch.h"
#include "pippin/npy.h"
#include "pippin/onnx.h"
#include "pippin/trainer.h"
#include "log_internal.h"
#include "status_internal.h"
#include "text_data.h"
#include "timing.h"

struct pp_worker {
    const pp_config *c;
    pp_config *owned_config;  /* opened from a path */
    pp_worker_options opt;
    int rank;
    pp_graph *g;              /* the whole model (model:), else NULL */
    pp_onnx_deferred *weights; /* model:, until this rank's stages have their weights */
    pp_pipe *p;
    pp_schedule *sched;       /* one replica's */
    /* Data-parallel replicas (replicas:): this rank is rank `prank` of the
     * schedule in replica `replica`; the transport and the agreements see
     * every replica's stages (pp_executor_world_stage_ranks). */
    int replica, prank;
    int world_nstages;
    int *world_stage_rank;
    pp_transport *t;
    pp_executor *ex;
    int n_inputs;
    const char **names;       /* the model inputs (pipe edges from no stage) */
    pp_tensor **data;         /* per input: every row of its data */
    int loss_output;          /* among the model outputs, -1 if none */
    int64_t next_step;
    atomic_int stop;          /* asked locally (pp_worker_stop) */
    int stop_agreed;          /* some rank asked: every rank stops after this step */
    int stopped, failed, params_written;
    int start_pending;        /* the ranks agree how to start (and resume) before the first step */
    pp_ckpt_start_mode start_mode;
    pp_agree agree;
    pp_ckpt_sync ck;          /* ck.dir NULL: no checkpoints */
    pp_stage **stages;        /* this rank's, and their optimizers */
    pp_optim **optims;
    uint8_t *identity;        /* this rank's run identity, encoded (runtime/run_identity.h) */
    size_t identity_bytes;
    pp_run_identity *id;
    int identity_pending;     /* the ranks compare identities before the first step */
    /* Rejoin (pippin/worker.h): after a peer's failure this worker reopens
     * everything above from the config and rolls back with the others. */
    int rejoin_ms;            /* 0: off */
    int resume_mode;          /* what open_checkpoints does: opt.resume, then RESUME_IF_ANY */
    double rejoin_deadline;   /* monotonic ms while rejoining (until a step past the failed one completes), else 0 */
    int64_t failed_step;      /* the step whose failure started the rejoin */
    pp_run_identity *first_id; /* the identity at the first open: a rejoin must find the same files */
    int rejoins;
    uint64_t run_id;          /* rank 0 without a config run_id: the one its first transport drew, kept by the
                               * transports a rejoin opens (0 until then) */
    pp_serve_front *front;    /* serving, on the rank holding stage 0: the endpoint clients use (outlives rejoins) */
    int shares_cores;         /* joined the host's core sharing (runtime/rank_threads.h) */
    int counted_for_sharing;  /* pp_rank_share_cores ran: pp_rank_share_cores_done on close */
};

void pp_worker_options_init(pp_worker_options *o) {
    memset(o, 0, sizeof *o);
    o->rank = -1;
}

/* ---- opening ---- */

/* This rank's transport, with CURVE keys when the config has them. */
static pp_status open_transport(pp_worker *w) {
    const pp_config *c = w->c;
    pp_transport_options o;
    pp_transport_options_init(&o);
    o.rank = w->rank;
    o.nranks = c->n_ranks;
    o.endpoints = (const char *const *)c->ranks;
    o.bind_endpoint = c->bind;
    o.nstages = w->world_nstages;
    o.stage_ranks = w->world_stage_rank;
    o.timeout_ms = c->timeout_ms;
    if (c->serving) o.step_window = -1; /* batches run ahead on the front: serve.max_inflight bounds them */
    /* The config's run_id keeps other runs' messages out (0: the transport's default) */
    if (c->run_id) o.run_id = pp_hash64(PP_HASH64_SEED, c->run_id, strlen(c->run_id)) | 1;
    /* Rank 0 keeps the run id it drew first: the ranks that learned it from
     * one of its transports must be able to talk to the next one. A new id
     * at each rejoin split the run when rank 0 had to open its transport
     * again while the others, already waiting in their own rejoin, kept the
     * id of its previous one: each side dropped the other's hellos as
     * another run's until rejoin_timeout_ms. */
    else if (w->rank == 0) o.run_id = w->run_id;
    if (!c->shared_memory) o.shm_bytes = -1;
    if (!c->bulk_lanes) o.bulk_lanes = -1;
    /* the rank's own threads (the pool may have grown to take lent ones) */
    o.spin_us = pp_worker_spin_us(c, w->opt.threads >= 0 ? pp_worker_threads(c, w->opt.threads, 0) : pp_get_threads());
    char secret[PP_CURVE_KEY_CHARS + 1];
    char(*pub)[PP_CURVE_KEY_CHARS + 1] = NULL;
    const char **pubs = NULL;
    pp_status s = PP_OK;
    if (c->n_secret_keys) {
        pub = calloc((size_t)c->n_ranks, sizeof *pub);
        pubs = calloc((size_t)c->n_ranks, sizeof *pubs);
        if (!pub || !pubs) s = pp_error(PP_ERR_NOMEM, "out of memory");
        if (s == PP_OK) s = pp_curve_read_key(c->secret_keys[w->rank], secret);
        for (int r = 0; r < c->n_ranks && s == PP_OK; r++) {
            s = pp_curve_read_key(c->public_keys[r], pub[r]);
            pubs[r] = pub[r];
        }
        o.curve_secret_key = secret;
        o.curve_rank_keys = pubs;
    }
    if (s == PP_OK) s = pp_transport_create(&o, &w->t);
    /* A worker started again where its last process died may find the
     * port held a moment (a peer reconnecting to it can even take it, a
     * tcp self-connect, when it is in the ephemeral range): with rejoin on,
     * try for a while. */
    for (double until = pp_monotonic_ms() + (w->rejoin_ms < 10000 ? w->rejoin_ms : 10000);
         s == PP_ERR_IO && w->rejoin_ms > 0 && strstr(pp_last_error(), "in use") && pp_monotonic_ms() < until;) {
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
        s = pp_transport_create(&o, &w->t);
    }
    if (s == PP_OK && w->rank == 0 && !w->run_id) w->run_id = pp_transport_run_id(w->t);
    free(pub);
    free(pubs);
    return s;
}

/* The model split here (model:), or this rank's files of a `pippin split`
 * directory (stages:); then the schedule. */
static pp_status open_pipe(pp_worker *w) {
    const pp_config *c = w->c;
    if (c->model) {
        /* The weights are read once the stages are cut and probed, and only
         * this rank's: params: writes them, split.auto times the nodes and
         * freeze: makes constants of them first, so those read the whole model. */
        if (c->params || c->split_auto || c->n_freeze) PP_TRY(pp_onnx_load(c->model, &w->g));
        else PP_TRY(pp_onnx_load_deferred(c->model, &w->g, &w->weights));
        if (c->params) {
            int loaded;
            pp_status ps = pp_load_params_dir(w->g, c->params, &loaded);
            if (ps != PP_OK) return pp_error_context(ps, "%s", c->path);
            pp_info("rank %d: %d parameters from %s", w->rank, loaded, c->params);
        }
        if (c->split_marker_identity && pp_graph_identity_markers(w->g, c->split_marker_identity) == 0)
            return pp_error(PP_ERR_NOT_FOUND, "%s: split.marker_identity '%s' matches no Identity node of %s", c->path,
                            c->split_marker_identity, c->model);
        for (int i = 0; i < c->n_freeze; i++)
            if (pp_graph_freeze(w->g, c->freeze[i]) == 0)
                return pp_error(PP_ERR_NOT_FOUND, "%s: freeze pattern '%s' matches no trainable initializer of %s",
                                c->path, c->freeze[i], c->model);
        pp_split_spec spec = {c->n_split_before, (const char *const *)c->split_before, c->n_split_after,
                              (const char *const *)c->split_after, c->transmit_shared, 0, c->loss};
        int *cut_at = NULL;
        if (c->split_auto) { /* the balanced cuts replace the markers */
            PP_TRY(pp_config_auto_cuts(c, w->g, &cut_at, &spec.n_cut_at));
            spec.cut_at = cut_at;
            spec.ignore_markers = 1;
        }
        /* The stages take the model's parameters: it is not held twice. */
        pp_status split_s = pp_pipe_split_take(w->g, &spec, &w->p);
        free(cut_at);
        pp_graph_free(w->g);
        w->g = NULL;
        PP_TRY(split_s);
        const char *dims[64];
        char buf[64][128];
        int nd = c->n_dims;
        if (nd > 64) return pp_error(PP_ERR_UNSUPPORTED, "%s: more than 64 dims", c->path);
        for (int i = 0; i < nd; i++) {
            if ((size_t)snprintf(buf[i], sizeof buf[i], "%s=%s", c->dims[i].key, c->dims[i].value) >= sizeof buf[i])
                return pp_error(PP_ERR_INVALID, "%s: dims entry '%s' is too long", c->path, c->dims[i].key);
            dims[i] = buf[i];
        }
        PP_TRY(pp_pipe_probe_shapes(w->p, nd, dims));
    } else {
        PP_TRY(pp_pipe_load_meta(c->stages, &w->p));
        if (c->loss && (!w->p->loss || strcmp(w->p->loss, c->loss) != 0))
            return pp_error(PP_ERR_INVALID, "%s: the split in %s has loss '%s', the config asks for '%s'", c->path,
                            c->stages, w->p->loss ? w->p->loss : "(none)", c->loss);
    }
    if (!c->schedule) return pp_error(PP_ERR_INVALID, "%s: no schedule", c->path ? c->path : "config");
    /* serving: each batch is one microbatch through the stages in order;
     * batches overlap across ranks instead */
    PP_TRY(pp_schedule_from_spec(c->serving ? "gpipe" : c->schedule, w->p->n_stages, c->serving ? 1 : c->microbatches,
                                 &w->sched));
    if (w->sched->nranks * c->replicas != c->n_ranks) {
        if (c->replicas == 1)
            return pp_error(PP_ERR_INVALID, "%s: schedule '%s' over %d stages needs %d ranks; the config lists %d",
                            c->path, c->schedule, w->p->n_stages, w->sched->nranks, c->n_ranks);
        return pp_error(PP_ERR_INVALID, "%s: schedule '%s' over %d stages needs %d ranks per replica, %d for %d "
                        "replicas; the config lists %d", c->path, c->schedule, w->p->n_stages, w->sched->nranks,
                        w->sched->nranks * c->replicas, c->replicas, c->n_ranks);
    }
    w->replica = w->rank / w->sched->nranks;
    w->prank = w->rank % w->sched->nranks;
    w->world_nstages = c->replicas * w->sched->nstages;
    if (!(w->world_stage_rank = calloc((size_t)w->world_nstages, sizeof *w->world_stage_rank)))
        return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_executor_world_stage_ranks(w->sched, c->replicas, w->world_stage_rank);
    for (int s = 0; !c->model && s < w->p->n_stages; s++)
        if (w->sched->stage_rank[s] == w->prank) PP_TRY(pp_pipe_load_graph(w->p, c->stages, s));
    /* Split here, every stage was needed for the probe; from now on only
     * this rank's are (as a `stages:` worker loads only those). */
    for (int s = 0; c->model && s < w->p->n_stages; s++)
        if (w->sched->stage_rank[s] != w->prank) {
            pp_graph_free(w->p->stages[s]);
            w->p->stages[s] = NULL;
        } else {
            PP_TRY(pp_onnx_deferred_fill(w->weights, w->p->stages[s]));
        }
    pp_onnx_deferred_free(w->weights);
    w->weights = NULL;
    if (c->training && !w->p->loss) return pp_error(PP_ERR_NOT_FOUND, "%s: the model has no loss output to train on", c->path);
    for (int i = 0; i < c->n_recompute_stages; i++)
        if (c->recompute_stages[i] >= w->p->n_stages)
            return pp_error(PP_ERR_INVALID, "%s:%d: key 'recompute[%d]': stage %d, but the pipeline has %d stage%s (0-%d)",
                            c->path ? c->path : "config",
                            c->recompute_lines ? c->recompute_lines[i] : c->recompute_line, i, c->recompute_stages[i],
                            w->p->n_stages, w->p->n_stages == 1 ? "" : "s", w->p->n_stages - 1);
    return PP_OK;
}

/* recompute: the stages the config names (all with true) recompute their
 * forward before their backward-input. */
static pp_status open_recompute(pp_worker *w) {
    const pp_config *c = w->c;
    for (int i = 0; c->training && i < pp_executor_n_stages(w->ex); i++) {
        pp_stage *st = pp_executor_stage(w->ex, i);
        int on = c->recompute;
        for (int k = 0; k < c->n_recompute_stages; k++) on |= c->recompute_stages[k] == pp_stage_index(st);
        if (on) PP_TRY(pp_stage_set_recompute(st, 1));
    }
    return PP_OK;
}

/* Each of this rank's stages on its device from the config (device:,
 * stage_devices:); "no CUDA device: ..." here, before the first step. */
static pp_status open_devices(pp_worker *w) {
    const pp_config *c = w->c;
    if (c->n_stage_devices && c->n_stage_devices != w->p->n_stages)
        return pp_error(PP_ERR_INVALID, "stage_devices: %d entries for %d stages", c->n_stage_devices,
                        w->p->n_stages);
    for (int i = 0; i < pp_executor_n_stages(w->ex); i++) {
        pp_stage *st = pp_executor_stage(w->ex, i);
        const char *spec = pp_config_device(c, w->rank, pp_stage_index(st));
        if (strcmp(spec, "cpu") != 0) PP_TRY(pp_stage_use_device(st, spec));
    }
    return PP_OK;
}

/* data[i] for model input names[i]: the config's .npy files, or windows of
 * its text for the first two int64 inputs (tokens, next tokens). */
static pp_status open_data(pp_worker *w) {
    const pp_config *c = w->c;
    const pp_pipe *p = w->p;
    w->names = calloc((size_t)p->n_edges + 1, sizeof *w->names);
    w->data = calloc((size_t)p->n_edges + 1, sizeof *w->data);
    if (!w->names || !w->data) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int e = 0; e < p->n_edges; e++)
        if (p->edges[e].producer < 0) w->names[w->n_inputs++] = p->edges[e].value;
    if (c->text_file) {
        int tok[2], k = 0;
        for (int i = 0; i < w->n_inputs && k < 2; i++) {
            int e = pp_pipe_find_edge(p, w->names[i]);
            if (p->edges[e].dtype == PP_I64) tok[k++] = i;
        }
        if (k < 2)
            return pp_error(PP_ERR_INVALID, "%s: text data needs a model with two int64 inputs (tokens, targets)", c->path);
        const pp_pipe_edge *e0 = &p->edges[pp_pipe_find_edge(p, w->names[tok[0]])];
        int seq = c->text_seq;
        if (!seq) seq = e0->ndim == 2 && e0->dims[1] && atoi(e0->dims[1]) > 0 ? atoi(e0->dims[1]) : 64;
        PP_TRY(pp_text_windows(c->text_file, c->text_vocab, seq, &w->data[tok[0]], &w->data[tok[1]]));
    }
    for (int k = 0; k < c->n_data; k++) {
        int i = 0;
        while (i < w->n_inputs && strcmp(w->names[i], c->data[k].key) != 0) i++;
        if (i == w->n_inputs)
            return pp_error(PP_ERR_NOT_FOUND, "%s: data for '%s', which is no model input", c->path, c->data[k].key);
        PP_TRY(pp_npy_load(c->data[k].value, &w->data[i]));
    }
    for (int i = 0; i < w->n_inputs; i++)
        if (!w->data[i]) return pp_error(PP_ERR_INVALID, "%s: no data for model input '%s'", c->path, w->names[i]);
    return PP_OK;
}

/* What every rank must agree on (config values that affect numbers, the
 * model and data files, every copy of a tied parameter), from this rank's
 * stages before any step or resume changes them; compared in the first
 * step. */
static pp_status open_identity(pp_worker *w) {
    int n = pp_executor_n_stages(w->ex);
    if (w->c->n_ranks == 1) return PP_OK; /* no one to compare with */
    /* the checkpoint settings this worker uses (options override the config) */
    pp_config eff = *w->c;
    eff.checkpoint_dir = (char *)w->ck.dir;
    eff.checkpoint_every = w->ck.every;
    pp_status s = pp_run_identity_compute(&eff, w->p, n, w->stages, &w->id);
    if (s == PP_OK) s = pp_run_identity_encode(w->id, &w->identity, &w->identity_bytes);
    if (s == PP_OK && !w->first_id) { /* kept: a rejoin reloads the files, which must not have changed */
        pp_run_identity *copy;
        s = pp_run_identity_decode(w->identity, w->identity_bytes, &copy);
        if (s == PP_OK) w->first_id = copy;
    } else if (s == PP_OK && pp_run_identity_compare(w->first_id, w->rank, w->id, w->rank) != PP_OK) {
        s = pp_error(PP_ERR_INVALID, "rank %d: what this rank loaded again to rejoin differs from what the run "
                     "started with (a file changed on disk?): %s", w->rank, pp_last_error());
    }
    w->identity_pending = s == PP_OK;
    return s;
}

/* The collective checkpoint of step into ck. With a sharded optimizer
 * (ZeRO-1) the replicas first put the whole optimizer state together on
 * replica 0, which writes it: checkpoints stay unsharded. */
static pp_status save_checkpoint(pp_worker *w, pp_ckpt_sync *ck, int64_t step) {
    if (!pp_executor_optimizer_sharded(w->ex)) return pp_ckpt_save(ck, step);
    int n = pp_executor_n_stages(w->ex);
    pp_optim **whole = calloc((size_t)n + 1, sizeof *whole);
    pp_status s = whole ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && s == PP_OK; i++) s = pp_executor_gather_optimizer(w->ex, i, &whole[i]);
    pp_ckpt_sync c = *ck;
    c.optims = whole;
    if (s == PP_OK) s = pp_ckpt_save(&c, step);
    memcpy(ck->recent, c.recent, sizeof ck->recent); /* the pruning history */
    ck->n_recent = c.n_recent;
    for (int i = 0; whole && i < n; i++) pp_optim_free(whole[i]);
    free(whole);
    return s;
}

/* The collective start (resume) of ck. Sharded, each replica loads the
 * whole optimizer state and keeps its shard. */
static pp_status start_checkpoint(pp_worker *w, pp_ckpt_start_mode mode, int64_t *next_step) {
    pp_ckpt_sync *ck = &w->ck;
    if (!pp_executor_optimizer_sharded(w->ex)) return pp_ckpt_start(ck, mode, next_step);
    int n = pp_executor_n_stages(w->ex);
    pp_optim **whole = calloc((size_t)n + 1, sizeof *whole);
    pp_status s = whole ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && s == PP_OK && mode != PP_CKPT_FRESH; i++) { /* only to load into */
        pp_flat_params *fp;
        s = pp_stage_params_sync(w->stages[i], &fp);
        if (s == PP_OK && fp) s = pp_optim_new(&w->c->optim, fp->total, &whole[i]);
    }
    pp_optim *const *shards = ck->optims;
    ck->optims = whole;
    if (s == PP_OK) s = pp_ckpt_start(ck, mode, next_step);
    ck->optims = shards;
    for (int i = 0; i < n && s == PP_OK && *next_step > 0; i++) s = pp_executor_load_optimizer(w->ex, i, whole[i]);
    for (int i = 0; whole && i < n; i++) pp_optim_free(whole[i]);
    free(whole);
    return s;
}

/* Checkpoints from the options, else from the config; resume waits for
 * the first step (it needs the peers), except with no peers to ask. */
static pp_status open_checkpoints(pp_worker *w) {
    const pp_config *c = w->c;
    int n = pp_executor_n_stages(w->ex);
    w->stages = calloc((size_t)n + 1, sizeof *w->stages);
    w->optims = calloc((size_t)n + 1, sizeof *w->optims);
    if (!w->stages || !w->optims) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        w->stages[i] = pp_executor_stage(w->ex, i);
        w->optims[i] = pp_executor_optimizer(w->ex, i);
    }
    w->agree = (pp_agree){w->t, c->n_ranks, w->world_nstages, w->world_stage_rank, w->rank, c->timeout_ms,
                          pp_agree_long_timeout(c->timeout_ms)};
    pp_ckpt_sync *ck = &w->ck;
    ck->dir = w->opt.checkpoint_dir;
    ck->every = w->opt.checkpoint_every;
    ck->keep = w->opt.checkpoint_keep;
    if (!ck->dir && c->checkpoint_dir) { /* the config's checkpoint: block */
        ck->dir = c->checkpoint_dir;
        ck->every = c->checkpoint_every;
        if (!ck->keep) ck->keep = c->checkpoint_keep;
    }
    if (ck->keep <= 0) ck->keep = 2;
    ck->agree = w->agree;
    ck->n = n;
    ck->stages = w->stages;
    ck->optims = w->optims;
    ck->n_stages_total = w->p->n_stages;
    ck->write_files = w->replica == 0; /* the replicas' states are equal: replica 0's ranks write them */
    if (w->resume_mode && !c->training && !w->rejoins)
        return pp_error(PP_ERR_INVALID, "resume: an inference run has no checkpoint to resume");
    if (w->resume_mode == PP_WORKER_RESUME && !ck->dir)
        return pp_error(PP_ERR_INVALID, "resume needs a checkpoint directory");
    if (!c->training || !ck->dir) {
        ck->dir = NULL;
        return PP_OK;
    }
    w->start_mode = w->resume_mode == PP_WORKER_RESUME          ? PP_CKPT_RESUME
                    : w->resume_mode == PP_WORKER_RESUME_IF_ANY ? PP_CKPT_RESUME_IF_ANY
                                                                : PP_CKPT_FRESH;
    if (c->n_ranks == 1) return start_checkpoint(w, w->start_mode, &w->next_step);
    int64_t latest; /* refuse at once what the first step would refuse */
    if (w->rank == 0 && w->start_mode == PP_CKPT_RESUME) PP_TRY(pp_checkpoint_latest(ck->dir, &latest));
    w->start_pending = 1;
    return PP_OK;
}

/* Everything a run holds, from the config: dropped and opened again when
 * the worker rejoins. */
static pp_status open_run(pp_worker *w) {
    const pp_config *c = w->c;
    w->loss_output = -1;
    w->next_step = 0;
    w->failed = w->params_written = 0;
    pp_status s = open_pipe(w);
    if (s == PP_OK && !c->serving) s = open_data(w);
    if (s == PP_OK && c->output_dir) s = pp_mkdirs(c->output_dir);
    if (s == PP_OK) s = open_transport(w);
    if (s != PP_OK) s = pp_error_context(s, "rank %d", w->rank);
    if (s == PP_OK) s = pp_executor_new(w->p, w->sched, w->prank, c->training, w->t, &w->ex);
    if (s == PP_OK && c->wire_bf16) s = pp_executor_set_wire_dtype(w->ex, PP_BF16);
    if (s == PP_OK && c->replicas > 1) {
        pp_replica_options ro;
        pp_replica_options_init(&ro);
        ro.replicas = c->replicas;
        ro.replica = w->replica;
        ro.first_bucket_bytes = c->bucket_first_bytes;
        ro.bucket_bytes = c->bucket_bytes;
        ro.shard_optimizer = c->shard_optimizer;
        ro.direct_links = c->bucket_direct_links ? 0 : -1;
        s = pp_error_context(pp_executor_set_replicas(w->ex, &ro), "rank %d (replica %d)", w->rank, w->replica);
        pp_executor_set_step_vote(w->ex, 0); /* a failed step aborts the transport instead (fail()) */
    }
    if (s == PP_OK && c->training) s = pp_executor_set_optimizer(w->ex, &c->optim);
    if (s == PP_OK) s = open_recompute(w);
    if (s == PP_OK) s = pp_error_context(open_devices(w), "rank %d", w->rank);
    if (s == PP_OK) s = pp_error_context(open_checkpoints(w), "rank %d", w->rank);
    if (s == PP_OK) s = pp_error_context(open_identity(w), "rank %d", w->rank);
    for (int k = 0; s == PP_OK && w->p->loss && k < w->p->n_outputs; k++)
        if (strcmp(w->p->outputs[k], w->p->loss) == 0) w->loss_output = k;
    return s;
}

static void close_run(pp_worker *w) {
    pp_executor_free(w->ex);
    pp_transport_close(w->t);
    free(w->stages);
    free(w->optims);
    free(w->identity);
    pp_run_identity_free(w->id);
    for (int i = 0; w->data && i < w->n_inputs; i++) pp_tensor_free(w->data[i]);
    free(w->data);
    free(w->names);
    pp_schedule_free(w->sched);
    free(w->world_stage_rank);
    w->world_stage_rank = NULL;
    pp_pipe_free(w->p);
    pp_onnx_deferred_free(w->weights);
    pp_graph_free(w->g);
    w->ex = NULL, w->t = NULL, w->stages = NULL, w->optims = NULL, w->identity = NULL, w->id = NULL;
    w->data = NULL, w->names = NULL, w->n_inputs = 0, w->sched = NULL, w->p = NULL, w->g = NULL;
    w->identity_pending = w->start_pending = 0;
    memset(&w->ck, 0, sizeof w->ck);
}

pp_status pp_worker_open_config(const pp_config *c, const pp_worker_options *o, pp_worker **out) {
    *out = NULL;
    pp_worker *w = calloc(1, sizeof *w);
    if (!w) return pp_error(PP_ERR_NOMEM, "out of memory");
    w->c = c;
    if (o) w->opt = *o;
    else pp_worker_options_init(&w->opt);
    atomic_init(&w->stop, 0);
    w->resume_mode = w->opt.resume;
    w->rejoin_ms = w->opt.rejoin_timeout_ms ? w->opt.rejoin_timeout_ms : c->rejoin_timeout_ms;
    if (w->rejoin_ms < 0) w->rejoin_ms = 0;
    if (w->opt.threads >= 0) pp_set_threads(pp_worker_threads(c, w->opt.threads, 0));
    if (w->opt.blas_threads > 0) pp_set_blas_threads(w->opt.blas_threads);
    pp_status s = pp_config_rank(w->opt.rank, c->n_ranks, &w->rank);
    if (s == PP_OK && w->opt.threads >= 0) {
        pp_rank_share_cores(c, w->rank, &w->shares_cores);
        w->counted_for_sharing = 1;
    }
    if (s == PP_OK) s = open_run(w);
    if (s == PP_OK && c->serving) s = pp_serve_front_for(c, w->sched, w->rank, &w->front);
    if (s != PP_OK) {
        pp_worker_close(w);
        return s;
    }
    *out = w;
    return PP_OK;
}

pp_status pp_worker_open(const char *config_path, const pp_worker_options *o, pp_worker **out) {
    *out = NULL;
    pp_config *c;
    PP_TRY(pp_config_load(config_path, &c));
    pp_status s = pp_worker_open_config(c, o, out);
    if (s != PP_OK) {
        pp_config_free(c);
        return s;
    }
    (*out)->owned_config = c;
    return PP_OK;
}

/* ---- running ---- */

/* Inference: the outputs this rank computes, as DIR/<name>.npy (step 0)
 * or DIR/step<N>_<name>.npy. */
static pp_status save_outputs(pp_worker *w, int64_t step, pp_tensor **outs) {
    for (int o = 0; o < w->p->n_outputs; o++) {
        if (!outs[o]) continue;
        char prefix[64] = "";
        if (step > 0) snprintf(prefix, sizeof prefix, "step%lld_", (long long)step);
        PP_TRY(pp_save_named_npy(w->c->output_dir, prefix, w->p->outputs[o], outs[o]));
    }
    return PP_OK;
}

static pp_status after_step(pp_worker *w, int64_t step, pp_tensor **outs) {
    const pp_config *c = w->c;
    if (c->training && pp_ckpt_due(&w->ck, step, c->steps)) PP_TRY(save_checkpoint(w, &w->ck, step));
    if (!c->training && c->output_dir) PP_TRY(save_outputs(w, step, outs));
    return PP_OK;
}

/* The trained parameters in output_dir once the run is over (also when it
 * resumed at its end, or has no steps). */
static pp_status finish(pp_worker *w) {
    const pp_config *c = w->c;
    if (!c->training || !c->output_dir || w->params_written || w->replica > 0) return PP_OK; /* replicas hold the same */
    pp_status s = pp_save_stage_params(w->p, pp_executor_n_stages(w->ex), w->stages, c->output_dir, "", 0, NULL);
    if (s == PP_OK) w->params_written = 1;
    return s;
}

/* This replica's rows of the step's batch of one input: with R replicas,
 * replica k takes rows [k*B/R, (k+1)*B/R) of the global batch of B. */
static pp_status replica_rows(pp_worker *w, pp_tensor *data, int64_t step, pp_tensor **out) {
    const pp_config *c = w->c;
    *out = NULL;
    pp_tensor *all;
    PP_TRY(pp_data_batch(data, step, c->batch_size, &all));
    if (c->replicas == 1) {
        *out = all;
        return PP_OK;
    }
    pp_tensor **parts = calloc((size_t)c->replicas, sizeof *parts);
    pp_status s = parts ? pp_microbatch_split(all, c->replicas, "batch", parts) : pp_error(PP_ERR_NOMEM, "out of memory");
    for (int k = 0; parts && k < c->replicas; k++) {
        if (k == w->replica && s == PP_OK) *out = parts[k];
        else pp_tensor_free(parts[k]);
    }
    free(parts);
    pp_tensor_free(all);
    return s;
}

/* Runs step `step`, reports it to the progress callback, then writes what
 * is due (a checkpoint, outputs): the report comes first, so a crash
 * between the two repeats the step's report rather than losing it. */
static pp_status one_step(pp_worker *w, int64_t step) {
    const pp_config *c = w->c;
    int n = w->n_inputs, n_out = w->p->n_outputs;
    pp_tensor **batch = calloc((size_t)n + 1, sizeof *batch), **outs = calloc((size_t)n_out + 1, sizeof *outs);
    pp_status s = batch && outs ? PP_OK : pp_error(PP_ERR_NOMEM, "out of memory");
    double t0 = pp_monotonic_ms();
    for (int i = 0; i < n && s == PP_OK; i++) s = replica_rows(w, w->data[i], step, &batch[i]);
    pp_executor_zero_grad(w->ex);
    if (s == PP_OK) s = pp_executor_step(w->ex, step, c->microbatches, n, w->names, batch, outs);
    if (s == PP_OK && c->training) s = pp_executor_optimizer_step(w->ex);
    if (s == PP_OK) {
        w->next_step = step + 1; /* the parameters are now those after `step` */
        if (step > w->failed_step) w->rejoin_deadline = 0; /* past the failure: a new one gets its own wait */
    }
    if (s == PP_OK && w->opt.progress) { /* before the vote: a stop asked here counts for this step */
        int has_loss = w->loss_output >= 0 && outs[w->loss_output];
        pp_worker_progress pr = {w->rank, step, c->steps, has_loss,
                                 has_loss ? (float)pp_tensor_get_f64(outs[w->loss_output], 0) : 0.0f,
                                 pp_monotonic_ms() - t0};
        w->opt.progress(&pr, w->opt.progress_user);
    }
    if (s == PP_OK) s = after_step(w, step, outs);
    for (int i = 0; batch && i < n; i++) pp_tensor_free(batch[i]);
    for (int o = 0; outs && o < n_out; o++) pp_tensor_free(outs[o]);
    free(batch);
    free(outs);
    return s;
}

/* Whether failure s can be recovered by rejoining (runtime/rejoin_policy.h):
 * a peer died, restarted, went silent or rolled back itself. A peer's
 * other aborts (its own error, a skewed config) and this rank's own errors
 * end the run. */
static int recoverable(pp_worker *w, pp_status s) {
    if (!w->rejoin_ms || !w->t || w->c->n_ranks < 2) return 0;
    if (s != PP_ERR_PEER && s != PP_ERR_TIMEOUT) return 0;
    (void)pp_transport_poll(w->t, 0); /* a peer's abort may still wait in the socket */
    int by = -1, n = w->c->n_ranks;
    const char *why = pp_transport_abort_reason(w->t, &by);
    pp_peer_state *states = calloc((size_t)n, sizeof *states);
    if (!states) return 0;
    for (int r = 0; r < n; r++) states[r] = r == w->rank ? PP_PEER_UP : pp_transport_peer_state(w->t, r);
    int ok = pp_rejoin_recoverable(s, why, by, w->rank, states, n);
    free(states);
    return ok;
}

static double now_ms(void) { return pp_monotonic_ms(); }

/* Waits until every peer completed the hello handshake with this rank's
 * new transport, or the rejoin deadline passes. A peer that closed its
 * transport (it rejoins again) or was replaced by a new process after its
 * handshake with this one is PP_ERR_PEER: the new incarnation never accepts
 * this transport (it echoes the nonce of the one before), so only a new
 * transport here completes a handshake with it. */
static pp_status await_peers(pp_worker *w) {
    for (;;) {
        char missing[256] = "";
        size_t len = 0;
        for (int r = 0; r < w->c->n_ranks; r++)
            if (r != w->rank && pp_transport_peer_state(w->t, r) == PP_PEER_CLOSED)
                return pp_error(PP_ERR_PEER, "rank %d: rank %d closed or restarted while this rank waited for every "
                                "rank to rejoin", w->rank, r);
        for (int r = 0; r < w->c->n_ranks; r++)
            if (r != w->rank && !pp_transport_peer_ready(w->t, r) && len < sizeof missing - 1)
                len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d (%s)", len ? ", " : "", r,
                                        pp_peer_state_name(pp_transport_peer_state(w->t, r)));
        if (!len) return PP_OK;
        if (atomic_load(&w->stop)) return pp_error(PP_ERR_STATE, "rank %d: stopped while waiting for ranks %s to rejoin",
                                                   w->rank, missing);
        double left = w->rejoin_deadline - now_ms();
        if (left <= 0)
            return pp_error(PP_ERR_TIMEOUT, "rank %d: ranks %s did not come back within rejoin_timeout_ms %d", w->rank,
                            missing, w->rejoin_ms);
        PP_TRY(pp_transport_poll(w->t, left < 50 ? (int)left + 1 : 50));
    }
}

/* Drops the run and opens it again: the transport anew (a fresh handshake
 * with every rank, restarted ones included), the parameters and optimizer
 * state from the newest committed checkpoint (or the initial ones). The
 * first step then agrees, as at any start, on identity and step. */
static pp_status rejoin(pp_worker *w, const char *why) {
    if (!w->rejoin_deadline) {
        w->rejoin_deadline = now_ms() + w->rejoin_ms;
        w->failed_step = w->next_step;
        pp_warn("rank %d: %s; %s, waiting up to %d ms for every rank", w->rank, why,
                w->c->serving ? "serving again once they are back" : "rolling back to the newest committed checkpoint",
                w->rejoin_ms);
    } else {
        pp_info("rank %d: rejoining again: %s", w->rank, why);
    }
    w->rejoins++;
    w->resume_mode = PP_WORKER_RESUME_IF_ANY;
    pp_status s;
    for (;;) {
        close_run(w);
        s = open_run(w);
        if (s == PP_OK) s = await_peers(w);
        if (s == PP_OK || s == PP_ERR_TIMEOUT || atomic_load(&w->stop) || now_ms() >= w->rejoin_deadline) break;
        if (s == PP_ERR_PEER && recoverable(w, s)) { /* a peer rolled back or restarted again meanwhile */
            pp_info("rank %d: rejoin: %s; opening again", w->rank, pp_last_error());
            continue;
        }
        if (s != PP_ERR_IO) break; /* only the endpoint can be busy a moment (its old socket closing) */
        pp_debug("rank %d: rejoin: %s; trying again", w->rank, pp_last_error());
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    if (s != PP_OK) {
        w->failed = 1;
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", pp_last_error());
        if (w->t) pp_transport_abort(w->t, reason);
        return pp_error(s, "%s (rejoining after: %s)", reason, why);
    }
    return PP_OK;
}

/* A failed step: the peers are told at once (instead of at their
 * deadlines). With rejoin on and a peer's failure to blame, every rank
 * rolls back together; otherwise this worker refuses further steps. */
static pp_status fail(pp_worker *w, pp_status s) {
    char reason[1024];
    snprintf(reason, sizeof reason, "%s", pp_last_error());
    if (recoverable(w, s) && now_ms() < (w->rejoin_deadline ? w->rejoin_deadline : now_ms() + 1)) {
        char tell[1100];
        snprintf(tell, sizeof tell, PP_REJOIN_PREFIX "rank %d rolls back: %s", w->rank, reason);
        pp_transport_abort(w->t, tell);
        return rejoin(w, reason);
    }
    w->failed = 1;
    pp_transport_abort(w->t, reason);
    return pp_error(s, "%s", reason);
}

/* fail() for pp_worker_step: after a rejoin the run goes on. */
static pp_status fail_step(pp_worker *w, pp_status s, int *done) {
    s = fail(w, s);
    if (s == PP_OK && done) *done = 0;
    return s;
}

pp_status pp_worker_step(pp_worker *w, int *done) {
    if (w->c->serving) return pp_error(PP_ERR_STATE, "rank %d: a serving worker has no steps: pp_worker_run serves", w->rank);
    if (done) *done = w->next_step >= w->c->steps || w->stop_agreed;
    if (w->failed) return pp_error(PP_ERR_STATE, "rank %d: an earlier step failed", w->rank);
    if (w->stop_agreed) return PP_OK;
    pp_status s = PP_OK;
    if (w->identity_pending) { /* a skewed rank is refused before anything runs */
        pp_run_identity_peer me = {w->id, w->rank};
        s = pp_agree_bytes(&w->agree, 0, PP_AGREE_IDENTITY, w->identity, w->identity_bytes,
                           pp_run_identity_check_peer, &me);
        w->identity_pending = 0;
    }
    if (s == PP_OK && w->start_pending) {
        s = start_checkpoint(w, w->start_mode, &w->next_step);
        w->start_pending = 0;
        if (s == PP_OK && w->next_step > w->c->steps)
            pp_warn("rank %d: the checkpoint is of step %lld, past the run's %lld steps: nothing to do", w->rank,
                    (long long)w->next_step - 1, (long long)w->c->steps);
    }
    if (s == PP_OK && w->next_step >= w->c->steps) s = finish(w);
    if (s != PP_OK) return fail_step(w, s, done);
    if (w->next_step >= w->c->steps) {
        if (done) *done = 1;
        return PP_OK;
    }
    int64_t step = w->next_step;
    s = one_step(w, step);
    /* Every rank learns whether any rank was asked to stop, so all stop
     * after the same step and their checkpoints agree. */
    pp_agree_result vote = {0};
    if (s == PP_OK) s = pp_agree_int(&w->agree, step, PP_AGREE_STOP, atomic_load(&w->stop), &vote);
    if (s == PP_OK && vote.hi) w->stop_agreed = 1;
    if (s == PP_OK && w->next_step >= w->c->steps) s = finish(w);
    if (s != PP_OK) return fail_step(w, s, done);
    if (done) *done = w->next_step >= w->c->steps || w->stop_agreed;
    return PP_OK;
}

pp_status pp_worker_run(pp_worker *w) {
    if (w->c->serving) { /* after a peer's failure, rejoin (when on) and serve again */
        for (;;) {
            pp_serve_ctx x = {w->c, w->p, w->sched, w->ex, w->t, w->rank, &w->stop, w->front};
            pp_status s = pp_serve_run(&x);
            if (s == PP_OK) return PP_OK;
            if (atomic_load(&w->stop)) return s;
            PP_TRY(fail(w, s));
            w->rejoin_deadline = 0; /* every rank is back: a later failure gets its own wait */
            if (w->front) atomic_fetch_add(&w->front->st.rejoins, 1);
            pp_info("rank %d: every rank is back; serving again", w->rank);
        }
    }
    int done = 0;
    while (!done) PP_TRY(pp_worker_step(w, &done));
    if (w->stop_agreed && w->next_step < w->c->steps) {
        w->stopped = 1;
        if (w->c->training && w->ck.dir && w->next_step > 0 && !pp_ckpt_due(&w->ck, w->next_step - 1, w->c->steps))
            PP_TRY(save_checkpoint(w, &w->ck, w->next_step - 1)); /* not saved yet */
    }
    return PP_OK;
}

void pp_worker_stop(pp_worker *w) { atomic_store(&w->stop, 1); }
int pp_worker_stopped(const pp_worker *w) { return w->stopped; }

pp_status pp_worker_checkpoint(pp_worker *w, const char *dir) {
    if (w->failed) return pp_error(PP_ERR_STATE, "rank %d: a step failed; its state is not a step's end", w->rank);
    if (!w->c->training) return pp_error(PP_ERR_STATE, "rank %d: an inference run has nothing to checkpoint", w->rank);
    if (w->next_step == 0) return pp_error(PP_ERR_STATE, "rank %d: no step has finished yet", w->rank);
    pp_ckpt_sync ck = w->ck; /* the same protocol, into dir; its pruning history stays apart */
    ck.dir = dir;
    ck.n_recent = 0;
    return save_checkpoint(w, &ck, w->next_step - 1);
}

int pp_worker_rank(const pp_worker *w) { return w->rank; }
int64_t pp_worker_next_step(const pp_worker *w) { return w->next_step; }
int64_t pp_worker_steps(const pp_worker *w) { return w->c->steps; }
/* After a rejoin that failed there is no run: no stages, no endpoint. */
int pp_worker_n_stages(const pp_worker *w) { return w->ex ? pp_executor_n_stages(w->ex) : 0; }
int pp_worker_stage_index(const pp_worker *w, int i) {
    return w->ex ? pp_stage_index(pp_executor_stage(((pp_worker *)w)->ex, i)) : -1;
}
const char *pp_worker_endpoint(const pp_worker *w) { return w->t ? pp_transport_endpoint(w->t) : ""; }

int pp_worker_rejoins(const pp_worker *w) { return w->rejoins; }
int64_t pp_worker_optimizer_state_bytes(const pp_worker *w) {
    return w->ex ? pp_executor_optimizer_state_bytes(w->ex) : 0;
}

void pp_worker_close(pp_worker *w) {
    if (!w) return;
    pp_serve_front_close(w->front);
    close_run(w);
    if (w->counted_for_sharing) pp_rank_share_cores_done(w->shares_cores);
    pp_run_identity_free(w->first_id);
    pp_config_free(w->owned_config);
    free(w);
}
