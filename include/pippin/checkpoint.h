/* Checkpoints: a stage's parameters and optimizer state on disk, so
 * training can stop and resume with exactly the same trajectory.
 *
 * DIR/stage_<index>/ holds <parameter name>.npy for every trainable
 * parameter ('/' and ':' in names become '_'), optim_<buffer>.npy for each
 * optimizer state buffer (flat, the stage's layout) and state.json
 * {"step": s, "optimizer": "adamw", "optimizer_steps": n, "parameters":
 * [names]}. A stage's directory is replaced as a whole (written beside it,
 * then renamed), so a crash mid-save leaves the previous checkpoint.
 *
 * Thread safety: reentrant; ranks may save their own stages into one directory at once. */
#ifndef PIPPIN_CHECKPOINT_H
#define PIPPIN_CHECKPOINT_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/optim.h"
#include "pippin/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* step: the last step whose update is in the parameters. opt may be NULL. */
PP_API pp_status pp_checkpoint_save(const char *dir, pp_stage *st, pp_optim *opt, int64_t step);
/* Restores what pp_checkpoint_save wrote for this stage; *step (may be
 * NULL) gets the saved step. Parameters missing from the checkpoint, a
 * shape or optimizer that differs: errors naming the file. */
PP_API pp_status pp_checkpoint_load(const char *dir, pp_stage *st, pp_optim *opt, int64_t *step);

#ifdef __cplusplus
}
#endif
#endif
