/* Checkpoints committed by every rank together (checkpoint_sync.h). */
#include "checkpoint_sync.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log_internal.h"
#include "pippin/checkpoint.h"
#include "status_internal.h"

int pp_ckpt_due(const pp_ckpt_sync *c, int64_t step, int64_t steps) {
    return c->dir && (step == steps - 1 || (c->every > 0 && (step + 1) % c->every == 0));
}

/* Ranks other than 0 see no manifests when their disk is not rank 0's, so
 * they prune from what they know: a step is committed once a later
 * checkpoint was agreed on (rank 0 commits before it goes on). The bound
 * is never above rank 0's, so nothing rank 0 keeps is removed. */
static pp_status prune_known(pp_ckpt_sync *c, int64_t step) {
    if (c->n_recent == PP_CKPT_RECENT) {
        memmove(c->recent, c->recent + 1, sizeof c->recent[0] * (PP_CKPT_RECENT - 1));
        c->n_recent--;
    }
    c->recent[c->n_recent++] = step;
    int committed = c->n_recent - 1, keep = c->keep < PP_CKPT_RECENT - 1 ? c->keep : PP_CKPT_RECENT - 1;
    if (committed < keep) return PP_OK;
    return pp_checkpoint_prune(c->dir, c->recent[committed - keep]);
}

/* Removing old steps can fail (a file system gone read-only, another
 * rank removing the same directory); the step just committed is safe, so
 * that is worth a warning, not the run. */
static void prune(pp_ckpt_sync *c, int64_t step) {
    pp_status s = PP_OK;
    if (c->agree.rank == 0) {
        int64_t before;
        s = pp_checkpoint_keep_from(c->dir, c->keep, &before);
        if (s == PP_OK && before > INT64_MIN) s = pp_checkpoint_prune(c->dir, before);
    } else {
        s = prune_known(c, step);
    }
    if (s != PP_OK)
        pp_warn("rank %d: removing checkpoints older than the %d newest: %s", c->agree.rank, c->keep, pp_last_error());
}

pp_status pp_ckpt_save(pp_ckpt_sync *c, int64_t step) {
    pp_status mine = PP_OK;
    char why[1024] = "";
    for (int i = 0; c->write_files && i < c->n && mine == PP_OK; i++)
        mine = pp_checkpoint_save_stage(c->dir, step, c->stages[i], c->optims[i]);
    if (mine != PP_OK) snprintf(why, sizeof why, "%s", pp_last_error());
    pp_agree_result r;
    pp_status agreed = pp_agree_int(&c->agree, step, PP_AGREE_CHECKPOINT, mine == PP_OK, &r);
    if (mine != PP_OK) /* this rank's own reason first: a peer's abort may have ended the agreement */
        return pp_error(mine, "rank %d: checkpoint of step %" PRId64 ": %s", c->agree.rank, step, why);
    PP_TRY(agreed);
    if (r.lo == 0)
        return pp_error(PP_ERR_IO, "rank %d: checkpoint of step %" PRId64 ": rank %d could not write its stage files "
                        "(its log says why); the previous checkpoint stays", c->agree.rank, step, r.who_lo);
    if (c->agree.rank == 0)
        PP_TRY(pp_error_context(pp_checkpoint_commit(c->dir, step, c->n_stages_total), "rank 0: checkpoint of step %" PRId64, step));
    if (c->write_files) prune(c, step); /* a rank that writes nothing has nothing to remove */
    return PP_OK;
}

pp_status pp_ckpt_start(pp_ckpt_sync *c, pp_ckpt_start_mode mode, int64_t *next_step) {
    int rank = c->agree.rank;
    int64_t proposal = INT64_MIN; /* only rank 0's counts */
    pp_status s = PP_OK;
    if (rank == 0 && mode == PP_CKPT_FRESH) {
        int64_t latest;
        if (pp_checkpoint_latest(c->dir, &latest) == PP_OK)
            s = pp_error(PP_ERR_INVALID, "%s holds committed checkpoints up to step %" PRId64 " of an earlier run: "
                         "resume it (--resume; a restarted worker: --resume-if-any) or use another directory", c->dir, latest);
        else
            proposal = -1;
    } else if (rank == 0) {
        s = pp_checkpoint_latest(c->dir, &proposal);
        if (s == PP_ERR_NOT_FOUND && mode == PP_CKPT_RESUME_IF_ANY) {
            pp_info("rank 0: %s; starting at step 0", pp_last_error());
            proposal = -1, s = PP_OK;
        }
    }
    if (s != PP_OK) proposal = INT64_MIN + 1; /* everyone's failure: the others learn it from the agreement */
    char why[1024] = "";
    if (s != PP_OK) snprintf(why, sizeof why, "%s", pp_last_error());
    pp_agree_result r;
    pp_status agreed = pp_agree_int(&c->agree, 0, PP_AGREE_RESUME, proposal, &r);
    if (s != PP_OK) return pp_error(s, "rank 0: %s", why);
    PP_TRY(agreed);
    if (r.hi == INT64_MIN + 1)
        return pp_error(PP_ERR_INVALID, "rank %d: rank 0 refused the checkpoint directory (its log says why)", rank);
    int64_t step = r.hi;
    if (step < 0) { /* from the start: nothing to load */
        *next_step = 0;
        return PP_OK;
    }
    pp_status mine = PP_OK;
    for (int i = 0; i < c->n && mine == PP_OK; i++)
        mine = pp_checkpoint_load_stage(c->dir, step, c->stages[i], c->optims[i]);
    if (mine != PP_OK) snprintf(why, sizeof why, "%s", pp_last_error());
    agreed = pp_agree_int(&c->agree, 0, PP_AGREE_RESUME_OK, mine == PP_OK, &r);
    if (mine != PP_OK)
        return pp_error(mine, "rank %d: resume from step %" PRId64 " (rank 0's newest committed checkpoint): %s", rank,
                        step, why);
    PP_TRY(agreed);
    if (r.lo == 0)
        return pp_error(PP_ERR_IO, "rank %d: resume from step %" PRId64 ": rank %d could not load its stages (its log "
                        "says why)", rank, step, r.who_lo);
    c->n_recent = 0;
    c->recent[c->n_recent++] = step;
    *next_step = step + 1;
    return PP_OK;
}
