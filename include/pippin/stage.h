/* Stage objects: one pipeline stage that runs one microbatch at a time.
 *
 * forward(mb) stashes what the backward needs; backward_input(mb) takes the
 * gradients of the stage's outputs and returns those of its inputs (region
 * I); backward_weight(mb) computes the parameter gradients (region W) and
 * adds them into the stage's flat gradient buffer, then frees the
 * microbatch's stash. backward(mb) is both. Trainable parameters live in one
 * contiguous float32 buffer, their gradients in another (views per tensor,
 * like FSDP's flat parameter).
 *
 * Thread safety: one thread drives a stage; different stages may run on different threads. */
#ifndef PIPPIN_STAGE_H
#define PIPPIN_STAGE_H

#include "pippin/export.h"

#include <stddef.h>

#include "pippin/device.h"
#include "pippin/graph.h"
#include "pippin/optim.h"
#include "pippin/params.h"
#include "pippin/pipe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_stage pp_stage;

typedef struct pp_stage_spec {
    int index;                /* stage number, for messages */
    int training;             /* build the backward */
    const char *loss;         /* the loss output of this stage, or NULL */
    int n_seeds;              /* outputs whose gradients come from later stages */
    const char *const *seeds;
    int n_wrt;                /* inputs whose gradients go back to earlier stages */
    const char *const *wrt;
} pp_stage_spec;

/* Stage `index`: inference, no loss, no seeds, no input gradients. */
PP_API void pp_stage_spec_init(pp_stage_spec *s, int index);

/* Takes ownership of g (also on failure). */
PP_API pp_status pp_stage_new(pp_graph *g, const pp_stage_spec *spec, pp_stage **out);
/* Stage `index` of a pipe whose edges have been probed: seeds are the float
 * values it sends on, wrt the float values it receives from other stages,
 * loss the pipe's loss if computed here. Moves the stage graph out of the
 * pipe (p->stages[index] becomes NULL). */
PP_API pp_status pp_stage_from_pipe(pp_pipe *p, int index, int training, pp_stage **out);
PP_API void pp_stage_free(pp_stage *st);

PP_API const pp_graph *pp_stage_graph(const pp_stage *st);
PP_API int pp_stage_index(const pp_stage *st);
/* Forward inputs/outputs (the stage graph's, before the backward was added). */
PP_API int pp_stage_n_inputs(const pp_stage *st);
PP_API const char *pp_stage_input_name(const pp_stage *st, int i);
PP_API int pp_stage_n_outputs(const pp_stage *st);
PP_API const char *pp_stage_output_name(const pp_stage *st, int i);
/* Seeds (output gradients expected by backward_input, loss excluded) and
 * wrt (input gradients it returns), by name. */
PP_API int pp_stage_n_grad_outputs(const pp_stage *st);
PP_API const char *pp_stage_grad_output_name(const pp_stage *st, int i);
PP_API int pp_stage_n_grad_inputs(const pp_stage *st);
PP_API const char *pp_stage_grad_input_name(const pp_stage *st, int i);
/* 1 if this stage computes the loss. */
PP_API int pp_stage_has_loss(const pp_stage *st);

/* The backward of the loss is seeded with scale (1/M for M microbatches). */
PP_API void pp_stage_set_loss_scale(pp_stage *st, float scale);

/* Random ops (training Dropout) key microbatch mb's stream as offset + mb
 * (default 0): data-parallel replica k of M microbatches uses k * M, so R
 * replicas draw the masks one pipeline of R * M microbatches would. */
PP_API void pp_stage_set_microbatch_offset(pp_stage *st, int offset);

/* inputs[i] feeds forward input i (borrowed); outputs[o] gets a new
 * reference to forward output o. When training, the stash for mb is kept
 * until its backward. */
PP_API pp_status pp_stage_forward(pp_stage *st, int mb, pp_tensor *const *inputs, pp_tensor **outputs);
/* out_grads[k]: gradient of grad output k (borrowed; NULL = zero);
 * in_grads[k] gets a new reference to the gradient of grad input k. */
PP_API pp_status pp_stage_backward_input(pp_stage *st, int mb, pp_tensor *const *out_grads,
                                  pp_tensor **in_grads);
/* Adds each parameter's gradient into the flat buffer as soon as W has made
 * it (not all at W's end; the same bits), then frees the microbatch's stash.
 * On failure the gradients added before it stay. */
PP_API pp_status pp_stage_backward_weight(pp_stage *st, int mb);
PP_API pp_status pp_stage_backward(pp_stage *st, int mb, pp_tensor *const *out_grads, pp_tensor **in_grads);
/* Drops every stashed microbatch (after a failed step, so the stage can run
 * the next one). Gradients already accumulated stay. */
PP_API void pp_stage_discard_pending(pp_stage *st);
/* Microbatches whose forward ran and whose backward has not finished. */
PP_API int pp_stage_pending(const pp_stage *st);
/* Bytes held in stashes right now. */
PP_API size_t pp_stage_stash_bytes(const pp_stage *st);

/* Bytes the forward stashes for the backward, per sample (from runs at
 * batch 1 and 2; other dynamic input dims set to other_dims). Training
 * stages only. */
PP_API pp_status pp_stage_stash_per_sample(pp_stage *st, int64_t other_dims, int64_t *per_sample);
/* The same with dynamic dims sized by name ("name=N", e.g. a probed pipe's
 * p->dims; batch_name runs at 1 and 2): pp_backward_stash_per_sample_dims. */
PP_API pp_status pp_stage_stash_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                         const char *const *dims, int64_t *per_sample);

/* A bound on the stage's memory plans (pippin/exec.h) of F, I and W:
 * per_sample * B + fixed (may be NULL) covers each phase's plan at batch B
 * (pp_backward_plan_per_sample_dims; W's holds the parameter gradients),
 * sized as pp_stage_stash_per_sample_dims sizes the stash. Training stages
 * only. */
PP_API pp_status pp_stage_plan_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                               const char *const *dims, int64_t *per_sample, int64_t *fixed);
/* Each phase's plan apart (pp_backward_plan_phases_per_sample_dims),
 * indexed by PP_PHASE_F, _I, _W (pippin/autodiff.h). */
PP_API pp_status pp_stage_plan_phases_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                                      const char *const *dims, int64_t *per_sample,
                                                      int64_t *fixed);
/* The same for the bytes in-place elementwise ops do not allocate in F, I
 * and W (pp_backward_inplace_per_sample_dims). */
PP_API pp_status pp_stage_inplace_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                                  const char *const *dims, int64_t *per_sample, int64_t *fixed);

/* Activation recomputation (on != 0; training stages only): the forward
 * keeps only the stage's inputs for each microbatch, and runs again right
 * before the microbatch's backward-input, which then proceeds as without.
 * The re-run uses the random stream of the forward's step and microbatch
 * (the same Dropout masks) and leaves the state (below) alone, so the
 * results are the same bits; W still finds what I keeps for it. Costs one
 * more forward per microbatch; saves the stash between F and I. Each
 * microbatch remembers how its forward ran, so this may change between
 * steps. Off by default. */
PP_API pp_status pp_stage_set_recompute(pp_stage *st, int on);

/* Runs the stage's nodes on a device (pippin/device.h): "cpu" (or NULL, the
 * default), "cuda:N", "fake[:ops]". The stage opens and owns the device
 * (its own compute and copy streams); nodes the device does not claim run
 * on the CPU. Errors name the stage: "stage 1: device 'cuda:0': no CUDA
 * device: ...". */
PP_API pp_status pp_stage_use_device(pp_stage *st, const char *spec);
/* on = 1: on a device, pp_stage_forward's outputs and
 * pp_stage_backward_input's gradients may come back while their downloads
 * are still in flight on the device's copy stream (pp_tensor_pending,
 * pippin/device.h): the caller waits for each (pp_tensor_wait) before
 * reading or sending it, and meanwhile may start the next microbatch's
 * compute (the execution core does: a send of microbatch k overlaps the
 * compute of k + 1). 0, the default: they are complete on return. No
 * effect on the CPU. The execution core (runner, executor) turns it on
 * for its stages, and it stays on: a caller that takes such a stage
 * (pp_runner_stage) and runs it directly waits for its outputs. */
PP_API void pp_stage_set_async_outputs(pp_stage *st, int on);
/* The stage's device; NULL on the CPU. */
PP_API pp_device *pp_stage_device(const pp_stage *st);
/* The stage's executor (where each node runs: pp_exec_node_device). */
PP_API const pp_exec *pp_stage_exec(const pp_stage *st);
PP_API int pp_stage_recompute(const pp_stage *st);
/* What the forward keeps per sample under recompute (the inputs' bytes),
 * sized as pp_stage_stash_per_sample_dims sizes the stash. */
PP_API pp_status pp_stage_recompute_stash_per_sample_dims(pp_stage *st, const char *batch_name, int n_dims,
                                                          const char *const *dims, int64_t *per_sample);

/* Trainable parameters: one flat float32 buffer and one of gradients
 * (pippin/params.h); NULL for a stage not built for training. On a device
 * that keeps them (cuda, fake: pp_stage_use_device) the weights, their
 * gradients and the optimizer's state live in device memory across runs
 * and steps; this call brings the host's buffers up to date (downloads)
 * and, as the caller may write them, has the device take them again
 * before it next uses them. The graph's parameter values are views of the
 * host's buffers: read them after this call. Write them between steps, or
 * call this again after a write inside a step: what was derived from the
 * old values (a device's copies, packed weights) is dropped when it is
 * called, not when the buffer is written. */
PP_API pp_flat_params *pp_stage_params(pp_stage *st);
/* pp_stage_params that fails when the device's buffers could not be
 * brought back (pp_stage_params then only logs it and hands out the
 * host's stale ones): for whatever writes or updates the values (a
 * checkpoint, parameter files, an update on the host). *out NULL: no
 * parameters. */
PP_API pp_status pp_stage_params_sync(pp_stage *st, pp_flat_params **out);
/* The same buffers with only the gradients brought up to date and
 * writable (the device takes them again before it next uses them); on a
 * device the weights and the optimizer's state stay there and the host's
 * weights may be stale: for reading and writing gradients alone (the
 * data-parallel replicas' gradient sum). pp_stage_params otherwise. NULL
 * (pp_last_error says why) when the device's gradients could not be
 * brought back. */
PP_API pp_flat_params *pp_stage_grads(pp_stage *st);
/* Parameter i's weights (grad 0) or gradient (grad 1) as a new host
 * tensor; on a device, only its part crosses, and only when the device's
 * copy is newer. */
PP_API pp_status pp_stage_param_copy(pp_stage *st, int i, int grad, pp_tensor **out);
/* Sets parameter i's gradient (float32, its element count), on the device
 * too when the stage keeps its gradients there. */
PP_API pp_status pp_stage_set_param_grad(pp_stage *st, int i, const pp_tensor *g);
/* One update of the parameters by o (made for their element count): on the
 * stage's device when it keeps them there, with o's state uploaded at o's
 * first step there and kept there after (o must then stay alive until
 * pp_stage_params brings it back, or the stage ends); else on the host. */
PP_API pp_status pp_stage_optimizer_step(pp_stage *st, pp_optim *o);
/* PP_ERR_STATE naming the stage when its gradients are incomplete (a
 * failed W that had added part of them, or a failed step whose W had added
 * any: see pp_stage_abort_step); W and pp_stage_optimizer_step check it. */
PP_API pp_status pp_stage_check_grads(const pp_stage *st);
/* Writes new bytes (t: the same dtype and shape, host memory) into the
 * stage's parameter or constant `name` in place, between runs: a model's
 * weights replaced on a running service (an inference stage's are
 * constants). What the stage derived from the old bytes goes: its
 * executor's constant cache and the copies its device keeps across runs
 * (pp_exec_constants_written); a training stage's device takes its
 * parameters again. PP_ERR_NOT_FOUND for a name that is neither. */
PP_API pp_status pp_stage_set_constant(pp_stage *st, const char *name, const pp_tensor *t);
PP_API int pp_stage_n_params(const pp_stage *st);
PP_API const char *pp_stage_param_name(const pp_stage *st, int i);
/* Index of a parameter by name, -1 if absent. */
PP_API int pp_stage_find_param(const pp_stage *st, const char *name);
PP_API void pp_stage_zero_grad(pp_stage *st);
/* A step begins: the following forwards belong to it (training-mode
 * Dropout draws its masks from (step, microbatch, node); default step 0),
 * and the state (below) is remembered. */
PP_API pp_status pp_stage_begin_step(pp_stage *st, int64_t step);
/* The step failed: the state goes back to what it was when it began, so a
 * retried step does not apply its microbatches twice. Gradients cannot go
 * back: if the step's W had added any, they are marked incomplete
 * (pippin/params.h, grads_incomplete), and W and pp_stage_optimizer_step
 * fail until pp_stage_zero_grad. */
PP_API void pp_stage_abort_step(pp_stage *st);
/* State the training forward updates: BatchNormalization's running mean and
 * variance (initializers, never trained), replaced after each microbatch's
 * forward in microbatch order. The tensor is the graph's own (borrowed);
 * writing it (a checkpoint load) sets the state. */
PP_API int pp_stage_n_state(const pp_stage *st);
PP_API const char *pp_stage_state_name(const pp_stage *st, int i);
PP_API pp_tensor *pp_stage_state_tensor(pp_stage *st, int i);
/* Rewrites a graph exported in training mode for inference (pp_stage_new
 * does it for stages built without training): BatchNormalization with
 * training_mode=1 uses its running statistics, training-mode Dropout passes
 * values through. Then runs the optimizer's default passes
 * (pp_optimize_default, pippin/optimize.h: none with PIPPIN_OPTIMIZE=0). */
PP_API pp_status pp_graph_prepare_inference(pp_graph *g);
/* Float initializers no gradient reaches (buffers such as a causal mask):
 * not trained. */
PP_API int pp_stage_n_frozen(const pp_stage *st);
PP_API const char *pp_stage_frozen_name(const pp_stage *st, int i);

#ifdef __cplusplus
}
#endif
#endif
