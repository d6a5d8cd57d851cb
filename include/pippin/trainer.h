/* Single-process training of a whole model: autodiff, flat parameters and
 * one executor over the training graph. What `pippin grad` and `pippin
 * train` run; pipeline stages use the same pieces per stage.
 *
 * Thread safety: one thread drives a trainer; pp_data_batch is reentrant. */
#ifndef PIPPIN_TRAINER_H
#define PIPPIN_TRAINER_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/autodiff.h"
#include "pippin/exec.h"
#include "pippin/graph.h"
#include "pippin/params.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_trainer pp_trainer;

/* Adds the backward to g (pp_autodiff with the loss named loss_name, or
 * found as pp_autodiff_find_loss does) and moves its trainable parameters
 * into flat buffers. g must outlive the trainer and gain no nodes. */
PP_API pp_status pp_trainer_new(pp_graph *g, const char *loss_name, pp_trainer **out);
PP_API void pp_trainer_free(pp_trainer *t);

/* Forward and backward on one (micro)batch. inputs[i] feeds the model's
 * input i (the graph's inputs before autodiff). The loss gradient is seeded
 * with loss_scale (1/M for M microbatches, else 1); parameter gradients are
 * ADDED to the flat gradient buffer. *loss (may be NULL) gets the loss. A
 * loss that turns out not to be a scalar is an error. A failure after some
 * gradient went in sets the buffer's grads_incomplete (pippin/params.h):
 * later calls fail until pp_flat_params_zero_grad, and a caller that runs
 * the optimizer itself checks pp_flat_params_check_grads first. */
PP_API pp_status pp_trainer_backward(pp_trainer *t, pp_tensor *const *inputs, float loss_scale,
                              float *loss);

/* The flat buffers; the caller may write the parameters through them
 * (packed copies of the weights are then made again: see
 * pp_trainer_hold_params). */
PP_API pp_flat_params *pp_trainer_params(pp_trainer *t);
/* on != 0: the caller promises that the parameters do not change until it
 * calls this again with 0 (e.g. over the microbatches of one step, before
 * the optimizer runs), so the weights the GEMMs read packed
 * (pp_exec_set_pack_weights, the optimizer's "pack" bit) are packed once
 * and reused by every pp_trainer_backward in between. Off (the default):
 * each pp_trainer_backward packs afresh, as the caller may have written
 * the parameters since the last. pp_trainer_params and a new step in
 * pp_trainer_set_step also drop the packed copies. */
PP_API void pp_trainer_hold_params(pp_trainer *t, int on);
/* The trainer's executor (pp_exec_pack_stats, pp_exec_memory_plan). */
PP_API const pp_exec *pp_trainer_exec(const pp_trainer *t);
/* The step and microbatch the next pp_trainer_backward belongs to (default
 * 0, 0): training-mode Dropout draws its masks from them. */
PP_API void pp_trainer_set_step(pp_trainer *t, int64_t step, int64_t microbatch);
/* State each pp_trainer_backward updates (BatchNorm's running statistics,
 * as pp_stage_n_state); the tensors are the graph's own. */
PP_API int pp_trainer_n_state(const pp_trainer *t);
PP_API const char *pp_trainer_state_name(const pp_trainer *t, int i);
PP_API pp_tensor *pp_trainer_state_tensor(pp_trainer *t, int i);
PP_API const pp_backward *pp_trainer_autodiff(const pp_trainer *t);
/* The model's inputs (before autodiff): count, and value id of input i. */
PP_API int pp_trainer_n_inputs(const pp_trainer *t);

/* Rows (step*batch + j) mod N, j < batch, of data along dim 0: the batch
 * of training step `step` when a data set of N rows is read in order and
 * wraps around. */
PP_API pp_status pp_data_batch(const pp_tensor *data, int64_t step, int64_t batch, pp_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
