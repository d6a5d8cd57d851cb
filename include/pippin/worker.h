/* The worker API: one rank of a pipeline as library calls, for services
 * that embed pippin. Everything `pippin worker CONFIG --rank R` does: config
 * -> model or stage files -> this rank's stages -> transport to the other
 * ranks -> executor and optimizer -> steps over the configured data ->
 * checkpoints -> trained parameters (or outputs) in output_dir. `pippin
 * worker` and `pippin run` are thin wrappers around it.
 *
 *     pp_worker_options o;
 *     pp_worker_options_init(&o);
 *     o.rank = 1;
 *     o.progress = on_step;               // step, loss, time
 *     pp_worker *w;
 *     if (pp_worker_open("pipeline.yaml", &o, &w) != PP_OK) fail(pp_last_error());
 *     pp_status s = pp_worker_run(w);     // all steps; pp_worker_step for one
 *     pp_worker_close(w);
 *
 * Every rank of the config runs one worker (a process each, or a thread
 * each); they find each other through the config's endpoints.
 *
 * Stopping is collective: after each step the ranks tell each other whether
 * one was asked to stop (a few bytes per peer), so every rank stops after
 * the same step and their checkpoints agree. Checkpoints are committed
 * together: each rank writes its stages' files for a step durably, and
 * rank 0 commits the step once every rank has (pippin/checkpoint.h), so a
 * crash at any moment leaves the newest committed step whole. A resume
 * takes rank 0's newest committed step; every rank loads it, and they agree
 * that all did before the first action (with more than one rank this
 * happens in the first pp_worker_step).
 *
 * Thread safety: one thread drives a worker (open, step/run, checkpoint,
 * close); pp_worker_stop may be called from any thread or a signal handler,
 * but not after (or while) pp_worker_close runs. Different workers may run
 * on different threads of one process. */
#ifndef PIPPIN_WORKER_H
#define PIPPIN_WORKER_H

#include <stdint.h>

#include "pippin/config.h"
#include "pippin/export.h"
#include "pippin/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_worker pp_worker;

/* What the progress callback gets after each step. */
typedef struct pp_worker_progress {
    int rank;
    int64_t step;    /* the step just finished (0-based) */
    int64_t steps;   /* steps in the run */
    int has_loss;    /* 1 on the rank whose stage computes the loss */
    float loss;      /* that step's loss (training), when has_loss */
    double step_ms;  /* wall time of the step */
} pp_worker_progress;

typedef void (*pp_worker_progress_fn)(const pp_worker_progress *p, void *user);

typedef struct pp_worker_options {
    int rank;                   /* -1 (default): PIPPIN_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK */
    pp_worker_progress_fn progress; /* NULL: none */
    void *progress_user;
    const char *checkpoint_dir; /* NULL: no checkpoints (borrowed: must outlive the worker) */
    int64_t checkpoint_every;   /* steps between checkpoints; 0: only after the last step */
    /* 1 (PP_WORKER_RESUME): continue after the newest committed checkpoint
     * in checkpoint_dir, failing if there is none; PP_WORKER_RESUME_IF_ANY:
     * the same, or start at step 0 when there is none. Training runs. */
    int resume;
    int blas_threads;           /* > 0: the BLAS's thread count (pp_set_blas_threads); 0: leave it */
    int checkpoint_keep;        /* committed checkpoints kept; 0: 2 */
    /* > 0: when a peer fails (dies, restarts, goes silent), wait this long
     * for every rank to come back and roll back together (below); < 0:
     * off; 0: the config's rejoin_timeout_ms (default off). */
    int rejoin_timeout_ms;
    /* Compute threads (pippin's pool and the BLAS, pp_set_threads), set
     * when the worker opens: > 0: this many; 0 (default):
     * pp_worker_threads(config, 0, 0); < 0: leave them as they are.
     * blas_threads > 0 then overrides the BLAS's count. */
    int threads;
} pp_worker_options;

#define PP_WORKER_RESUME 1
#define PP_WORKER_RESUME_IF_ANY 2

/* The compute threads a rank of config c uses: given when > 0 (a
 * --threads flag), else PIPPIN_THREADS, else the config's `threads`, else
 * the CPUs this process may use (sched_getaffinity) divided by
 * ranks_on_host; ranks_on_host 0: the config's ranks whose endpoints can
 * only be on this host (ipc://, loopback tcp), at least 1. c may be NULL. */
PP_API int pp_worker_threads(const pp_config *c, int given, int ranks_on_host);
/* The transport's spin_us for a rank of config c computing on `threads`
 * threads: the config's spin_us when given; else, serving, 2000 us when
 * the ranks on this host times their threads fit its CPUs (a waiting rank
 * keeps its core awake between requests), 0 otherwise. */
PP_API int pp_worker_spin_us(const pp_config *c, int threads);

/* Defaults: rank -1, no progress callback, no checkpoints, compute threads
 * from pp_worker_threads. */
PP_API void pp_worker_options_init(pp_worker_options *o);

/* Opens this rank's worker from a config file (docs/config.md). Loads the
 * model (or this rank's stage files) and the data, builds the stages the
 * schedule puts on the rank, connects its transport and, with o->resume,
 * restores the checkpoint. Errors name the file, key, rank or peer. */
PP_API pp_status pp_worker_open(const char *config_path, const pp_worker_options *o, pp_worker **out);
/* The same from a parsed config, which must outlive the worker. */
PP_API pp_status pp_worker_open_config(const pp_config *c, const pp_worker_options *o, pp_worker **out);

/* Runs the next step (every rank runs the same step together). *done (may
 * be NULL) is 1 when the run's last step has been run, or the ranks agreed
 * to stop; at the end the trained parameters (training) are in the
 * config's output_dir. On failure the peers are told at once, and the
 * worker refuses further steps. */
PP_API pp_status pp_worker_step(pp_worker *w, int *done);
/* Runs the remaining steps, or until some rank's pp_worker_stop: then every
 * rank writes a checkpoint (when configured) of the same last finished step
 * and returns PP_OK with pp_worker_stopped 1. */
PP_API pp_status pp_worker_run(pp_worker *w);
/* Rejoin. With rejoin_timeout_ms, a step that fails because of a peer (it
 * died, went silent, restarted, or rolled back itself) does not end the
 * run: this worker tells the others, drops its transport, executor and
 * parameters, opens them again from the config, and waits for every rank
 * to complete a fresh handshake (a dead rank started again, by `pippin run
 * --restart` or by hand with --resume-if-any, joins this way); then, as at
 * any start, the ranks agree on their identity and resume from rank 0's
 * newest committed checkpoint (from step 0 without one). The losses after
 * that are those of an uninterrupted run. pp_worker_step returns PP_OK
 * and pp_worker_next_step goes back. A rank that is not back in time, or
 * a failure that is not a peer's (this rank's own error, a peer's abort
 * for its own error, a skewed config), ends the run with an error naming
 * it. Rejoin needs tcp or ipc endpoints (an inproc link to a rank that
 * binds again is not re-made). The number of rejoins so far: */
PP_API int pp_worker_rejoins(const pp_worker *w);
/* Bytes of optimizer state this rank holds (with shard_optimizer: its
 * shard's); 0 before the run is open or after a failed rejoin. */
PP_API int64_t pp_worker_optimizer_state_bytes(const pp_worker *w);

/* Asks a running worker to stop after the step in progress. */
PP_API void pp_worker_stop(pp_worker *w);
PP_API int pp_worker_stopped(const pp_worker *w);

/* Writes a checkpoint of the last finished step to dir (pippin/checkpoint.h):
 * collective, like a step: every rank calls it, each writes its own stages,
 * and rank 0 commits the step once all have. */
PP_API pp_status pp_worker_checkpoint(pp_worker *w, const char *dir);

PP_API int pp_worker_rank(const pp_worker *w);
/* The step pp_worker_step runs next (after a resume: the one after the
 * checkpoint's, known at open with one rank and after the first
 * pp_worker_step with several), and the run's total. */
PP_API int64_t pp_worker_next_step(const pp_worker *w);
PP_API int64_t pp_worker_steps(const pp_worker *w);
/* The global indices of this rank's stages: n, and index i. */
PP_API int pp_worker_n_stages(const pp_worker *w);
PP_API int pp_worker_stage_index(const pp_worker *w, int i);
/* The endpoint this rank's transport listens on. */
PP_API const char *pp_worker_endpoint(const pp_worker *w);

/* Closes the transport (peers see a goodbye) and frees everything. */
PP_API void pp_worker_close(pp_worker *w);

#ifdef __cplusplus
}
#endif
#endif
