/* The executor: one rank of a pipeline. It owns the stages the schedule
 * places on this rank and runs the rank's action list in order, receiving
 * activations and gradients from other ranks over a pp_transport and
 * sending its own (docs/architecture.md).
 *
 * F waits for its inputs (model inputs come from the caller, stage inputs
 * from the transport; a stage on the same rank is served from the local
 * mailbox without a copy), runs, and sends each output to every consuming
 * stage. I/B wait for the gradients of the stage's outputs from every
 * consumer, sum them in consumer order, run, and send input gradients to
 * every producing stage. W runs locally. SEND/RECV actions need no work:
 * sends leave right after the action that makes them and receives block
 * right before the action that needs them. At the end of a training step,
 * replicated parameters' gradients are summed across their stages (in stage
 * order, on every replica), so every copy gets the same update.
 *
 * With the same schedule, a run over the executor gives bit-for-bit the
 * numbers of the local runner (pippin/runner.h).
 *
 * Thread safety: one thread drives an executor, the thread that owns its transport. */
#ifndef PIPPIN_EXECUTOR_H
#define PIPPIN_EXECUTOR_H

#include "pippin/export.h"

#include "pippin/optim.h"
#include "pippin/pipe.h"
#include "pippin/schedule.h"
#include "pippin/stage.h"
#include "pippin/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_executor pp_executor;

/* Builds the stages of `rank` (sched->stage_rank says which) from p, whose
 * edges must be probed (pp_pipe_probe_shapes) and whose graphs for those
 * stages must be loaded; they move out of p. The transport (created for
 * this rank with the same stage placement) stays the caller's. */
PP_API pp_status pp_executor_new(pp_pipe *p, const pp_schedule *sched, int rank, int training, pp_transport *t,
                          pp_executor **out);
PP_API void pp_executor_free(pp_executor *ex);

/* Receive deadline for each activation or gradient (default: the
 * transport's timeout). */
PP_API void pp_executor_set_timeout(pp_executor *ex, int timeout_ms);

/* One step of m microbatches. inputs[i] is the model input names[i] (a
 * whole batch); only inputs read by this rank's stages are needed (others
 * may be missing). outputs[o] (may be NULL) receives model output o merged
 * over microbatches if one of this rank's stages computes it, else NULL.
 * Errors name rank, action and peer. */
PP_API pp_status pp_executor_step(pp_executor *ex, int64_t step, int m, int n_inputs, const char *const *names,
                           pp_tensor *const *inputs, pp_tensor **outputs);

/* This rank's stages. */
PP_API int pp_executor_n_stages(const pp_executor *ex);
PP_API pp_stage *pp_executor_stage(pp_executor *ex, int i);

/* Records each action the following steps run into trace (one event per
 * compute action: rank, stage, microbatch, kind, start and end in
 * microseconds since origin_ms on CLOCK_MONOTONIC), in the format the
 * simulator writes (pippin/sched_trace.h). NULL stops recording. */
struct pp_trace;
PP_API void pp_executor_trace(pp_executor *ex, struct pp_trace *trace, double origin_ms);

/* Activations and gradients of float32 edges that go to another rank
 * travel as dt: PP_BF16 halves the bytes (rounded to nearest even; the
 * receiver widens them back to float32), PP_F32 (the default) leaves them
 * as they are. Tensors between stages of this rank and the replicas'
 * gradient sums keep full precision. Every rank must use the same. */
PP_API pp_status pp_executor_set_wire_dtype(pp_executor *ex, pp_dtype dt);

/* Milliseconds this rank's stages have spent in their kernels (forward and
 * backward; not waiting for inputs) since the executor was made. */
PP_API double pp_executor_compute_ms(const pp_executor *ex);

PP_API void pp_executor_zero_grad(pp_executor *ex);
/* One optimizer per local stage. */
PP_API pp_status pp_executor_set_optimizer(pp_executor *ex, const pp_optim_config *c);
PP_API pp_status pp_executor_optimizer_step(pp_executor *ex);
/* The optimizer of this rank's i-th stage (NULL before one is set; with
 * shard_optimizer, the optimizer of this replica's shard). */
PP_API pp_optim *pp_executor_optimizer(pp_executor *ex, int i);

/* ---- data-parallel replicas ----
 *
 * R copies (replicas) of the pipeline train together: replica k's ranks are
 * k * sched->nranks + r, and the transport numbers its stages as replica *
 * nstages + stage (pp_executor_world_stage_ranks gives the placement to
 * create it with). Each replica feeds its own rows of the global batch (the
 * caller's job: replica k takes rows [k*B/R, (k+1)*B/R)). In a step, the
 * loss is seeded with 1/(M*R); as soon as a stage's last weight gradient of
 * the step exists, its gradients are summed over the stage's replicas in
 * buckets (reverse parameter order) by a ring reduce-scatter + all-gather
 * over the transport, overlapping the backward work still to run; the step
 * ends once every sum is in. Scalar model outputs (the loss) become the
 * mean over the replicas. Random ops key replica k's microbatch mb as k*M +
 * mb. R replicas of batch B then compute what one pipeline of batch R*B
 * with R*M microbatches computes, the same up to the order of the sums
 * (bit-identical with one microbatch per replica and R = 2).
 *
 * A step succeeds on every rank of every replica or on none: at its end
 * the ranks vote (a few bytes from each to every other), and where one
 * rank's step failed pp_executor_step fails on all of them, naming that
 * rank, its replica and stage (and a rank whose own part went through
 * takes back its forward's state, BatchNorm's running statistics). The
 * vote waits up to 5 minutes (or the receive timeout if longer), since
 * ranks may end a step far apart; a dead peer ends it at the heartbeat
 * timeout. A vote that still times out on one rank while the others find
 * every vote in splits the replicas (the next step says so). Its cost is
 * one small message from every rank to every other per step (quadratic in
 * the ranks) and a barrier at the step's end. After a failed step skip the optimizer
 * step (pp_executor_optimizer_step refuses) and call the next step on
 * every rank, as before: nothing of the failed step reaches the
 * parameters, so the following steps give the bits of a run where it
 * never happened. Every rank must call the same step numbers: a replica
 * that skips one runs a step apart from its peers, and steps fail (their
 * messages never mix) until the timeouts happen to align them; never reuse
 * a step number (what a failed attempt left may be taken for the retry's).
 * Ranks that have taken different numbers of optimizer
 * steps (one skipped by its caller, or one that failed part-way, as
 * ZeRO-1's parameter all-gather can) hold different parameters: every
 * later step fails on every rank, naming the two: load the same
 * parameters on every rank and call pp_executor_set_replicas and
 * pp_executor_set_optimizer again on each (then load the optimizer state,
 * pp_executor_load_optimizer when sharded); the count starts again there.
 * (The workers, pippin/worker.h, abort the transport on a failed step
 * instead, and roll back together.) */
typedef struct pp_replica_options {
    int replicas;                 /* R >= 1 (1: no replicas) */
    int replica;                  /* this executor's, 0 <= replica < R */
    int64_t first_bucket_bytes;   /* the first bucket of each stage; default 1 MiB */
    int64_t bucket_bytes;         /* the others; default 25 MiB */
    /* ZeRO-1: each replica keeps and updates the optimizer state of only
     * its shard of every stage's parameters (the elements whose sum the
     * ring's reduce-scatter leaves with it), then the updated parameters
     * are all-gathered: optimizer memory / R, the unsharded results bit
     * for bit. After a step the gradient buffer then holds complete sums
     * only in this replica's shard (and in stages that hold a copy of a
     * replicated parameter, whose gradients are summed whole). Default 0. */
    int shard_optimizer;
    /* Replicas that cannot share memory sum over direct TCP links beside
     * the transport (plain tcp, no CURVE; every replica must offer them,
     * else all sum through the transport, with the same bits either way):
     * 0 (the default) when they can, < 0 never, e.g. where a firewall lets
     * only the transport's ports through. */
    int direct_links;
} pp_replica_options;

/* One replica of one (no replicas) and the default buckets. */
PP_API void pp_replica_options_init(pp_replica_options *o);

/* out[replica * sched->nstages + s] = replica * sched->nranks +
 * sched->stage_rank[s], for replicas * sched->nstages entries. */
PP_API void pp_executor_world_stage_ranks(const pp_schedule *sched, int replicas, int *out);

/* Makes ex replica o->replica of o->replicas (before its first step and,
 * with shard_optimizer, before pp_executor_set_optimizer; the executor's
 * rank stays its rank within the pipeline). Training only. With replicas
 * each step starts from zero gradients (the ring sums the whole buffer):
 * accumulate over more microbatches instead of over steps. */
PP_API pp_status pp_executor_set_replicas(pp_executor *ex, const pp_replica_options *o);

/* ZeRO-1 checkpoints (shard_optimizer). Every replica calls it for the
 * same local stage i after the same step: replica 0 gets in *whole a new
 * optimizer over the stage's whole flat buffer holding every replica's
 * shard (the caller frees it; NULL for a stage without parameters); the
 * other replicas send their shards and get NULL. */
PP_API pp_status pp_executor_gather_optimizer(pp_executor *ex, int i, pp_optim **whole);
/* Takes this replica's shard of local stage i's optimizer state and step
 * count from whole (an optimizer over the whole flat buffer, e.g. loaded
 * from a checkpoint). */
PP_API pp_status pp_executor_load_optimizer(pp_executor *ex, int i, pp_optim *whole);
/* 1 when the optimizer state is sharded over the replicas. */
PP_API int pp_executor_optimizer_sharded(const pp_executor *ex);
/* Bytes of optimizer state (momentum, AdamW's moments) this rank holds. */
PP_API int64_t pp_executor_optimizer_state_bytes(pp_executor *ex);

#ifdef __cplusplus
}
#endif
#endif
