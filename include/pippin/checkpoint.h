/* Checkpoints: every stage's parameters and optimizer state on disk, so
 * training can stop (or crash) and resume on exactly the same trajectory.
 *
 * Layout of a checkpoint directory DIR:
 *
 *   DIR/step_<N>/stage_<K>.safetensors   stage K after step N (its rank writes it)
 *   DIR/step_<N>/manifest.json           written last, by one rank: the commit
 *
 * A stage file is a safetensors file (pippin/safetensors.h): each trainable
 * parameter under its own name, each optimizer state buffer (flat, the
 * stage's layout) as "pippin.optim.<buffer>", and metadata strings
 * pippin.format ("checkpoint"), pippin.step, pippin.stage,
 * pippin.optimizer ("adamw", "sgd" or "none"), pippin.optimizer_steps and
 * pippin.hash (a hash of every tensor's bytes, checked on load).
 *
 * Crash consistency: every file is written beside its name, fsynced and
 * renamed, and its directory fsynced. Step N counts only once its manifest
 * exists, and the manifest is written only after every rank's stage files
 * for N are durable (runtime/checkpoint_sync.c runs that protocol across
 * ranks). A crash at any moment leaves the newest committed step whole;
 * step directories without a manifest are ignored.
 *
 * Thread safety: reentrant; ranks may write their own stage files into one
 * step directory at once. */
#ifndef PIPPIN_CHECKPOINT_H
#define PIPPIN_CHECKPOINT_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/optim.h"
#include "pippin/safetensors.h"
#include "pippin/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes DIR/step_<step>/stage_<K>.safetensors durably (not yet committed).
 * step: the last step whose update is in the parameters. opt may be NULL. */
PP_API pp_status pp_checkpoint_save_stage(const char *dir, int64_t step, pp_stage *st, pp_optim *opt);
/* Commits step: writes DIR/step_<step>/manifest.json durably, listing the
 * n_stages stage files. Call once every stage file of the step is durable. */
PP_API pp_status pp_checkpoint_commit(const char *dir, int64_t step, int n_stages);
/* The newest committed step in dir; PP_ERR_NOT_FOUND (with a message
 * naming dir) when there is none. */
PP_API pp_status pp_checkpoint_latest(const char *dir, int64_t *step);
/* Restores stage st (and opt, may be NULL) from step's file: the file's
 * step, stage, hash, parameter names, shapes and optimizer must match;
 * errors name the file and what differs. Each tensor is read once,
 * straight into the stage's parameters and optimizer state (the file is
 * never held in memory). A file refused for its header (another step,
 * stage, model or optimizer) leaves the stage as it was; one found damaged
 * or cut short while it is read (hash mismatch, a short read) leaves the
 * stage partly overwritten, and the error says so. */
PP_API pp_status pp_checkpoint_load_stage(const char *dir, int64_t step, pp_stage *st, pp_optim *opt);
/* Removes every step directory of dir whose step is below `before`
 * (manifest first, so a half-removed step is never taken for committed). */
PP_API pp_status pp_checkpoint_prune(const char *dir, int64_t before);

/* What a step directory holds, for listings. */
typedef struct pp_checkpoint_step {
    int64_t step;
    int committed;      /* its manifest exists and names this step */
    int n_stages;       /* stages the manifest lists (0 if uncommitted) */
    int n_files;        /* stage files present */
    int64_t bytes;      /* their total size */
} pp_checkpoint_step;

/* The step directories of dir, ascending by step (*steps malloc'd; free it). */
PP_API pp_status pp_checkpoint_list(const char *dir, pp_checkpoint_step **steps, int *n);
/* The step below which pp_checkpoint_prune may remove, keeping the `keep`
 * newest committed steps: the keep-th newest committed step, or INT64_MIN
 * when there are fewer. */
PP_API pp_status pp_checkpoint_keep_from(const char *dir, int keep, int64_t *before);
/* Reads a stage file and checks that it is a pippin checkpoint whose
 * tensors match their recorded hash (errors name the file). */
PP_API pp_status pp_checkpoint_read_file(const char *path, pp_safetensors **out);
/* The path of a stage file: DIR/step_<step>/stage_<stage>.safetensors. */
PP_API void pp_checkpoint_stage_path(const char *dir, int64_t step, int stage, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
