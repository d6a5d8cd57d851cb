/* Internal: checkpoints that every rank commits together. Each rank writes
 * its stages' files for step N (durably), the ranks agree that all of them
 * did, then rank 0 writes N's manifest: the commit. Resume takes rank 0's
 * newest committed step, every rank loads it and they agree that all did,
 * before the first action. Used by the worker and by `pippin train`. */
#ifndef PIPPIN_RUNTIME_CHECKPOINT_SYNC_H
#define PIPPIN_RUNTIME_CHECKPOINT_SYNC_H

#include <stdint.h>

#include "agree.h"
#include "pippin/optim.h"
#include "pippin/stage.h"

#define PP_CKPT_RECENT 64

typedef struct pp_ckpt_sync {
    const char *dir;
    int64_t every;            /* steps between checkpoints; 0: only after the last */
    int keep;                 /* committed steps kept (>= 1) */
    pp_agree agree;           /* agree.t NULL: this process holds every stage */
    int n;                    /* this rank's stages */
    pp_stage *const *stages;
    pp_optim *const *optims;  /* may hold NULLs */
    int n_stages_total;       /* stages of the whole pipeline */
    /* 0: this rank loads its stages but writes nothing (a data-parallel
     * replica other than 0, whose state equals replica 0's); it still takes
     * part in every agreement. */
    int write_files;
    /* Steps every rank wrote, newest last (ranks other than 0 prune from it). */
    int64_t recent[PP_CKPT_RECENT];
    int n_recent;
} pp_ckpt_sync;

/* Whether step (0-based, of steps) ends with a checkpoint. */
int pp_ckpt_due(const pp_ckpt_sync *c, int64_t step, int64_t steps);
/* The collective save and commit of step (every rank calls it for the same
 * step); then steps older than the keep newest committed are removed. */
pp_status pp_ckpt_save(pp_ckpt_sync *c, int64_t step);
/* How a run with checkpoints starts. */
typedef enum pp_ckpt_start_mode {
    PP_CKPT_FRESH = 0,    /* at step 0; a directory that holds committed steps is refused (they
                           * belong to another run, and keep and resume would mix the two) */
    PP_CKPT_RESUME = 1,   /* after the newest committed step; none is an error */
    PP_CKPT_RESUME_IF_ANY = 2 /* the same, or at step 0 when there is none */
} pp_ckpt_start_mode;

/* The collective start (every rank calls it before its first step):
 * *next_step gets the step to run first, after the one restored. */
pp_status pp_ckpt_start(pp_ckpt_sync *c, pp_ckpt_start_mode mode, int64_t *next_step);

#endif
