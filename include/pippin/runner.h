/* The local pipeline runner: every stage of a pipe in one process, no
 * transport. It executes any schedule's per-rank action lists (ranks
 * interleaved as if they ran concurrently with blocking receives), routing
 * activations forward and gradients back in memory. Results do not depend on
 * the schedule.
 *
 * Thread safety: one thread drives a runner. */
#ifndef PIPPIN_RUNNER_H
#define PIPPIN_RUNNER_H

#include "pippin/export.h"

#include "pippin/optim.h"
#include "pippin/pipe.h"
#include "pippin/schedule.h"
#include "pippin/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_runner pp_runner;

/* Builds a stage object for every stage of p (probing edge shapes first if
 * needed). The stage graphs move out of p; p must outlive the runner. */
PP_API pp_status pp_runner_new(pp_pipe *p, int training, pp_runner **out);
PP_API void pp_runner_free(pp_runner *r);

PP_API int pp_runner_n_stages(const pp_runner *r);
PP_API pp_stage *pp_runner_stage(pp_runner *r, int i);

/* One step over a batch: inputs[i] is the model input named names[i] (a
 * whole batch, split along dim 0 into m microbatches). sched holds the
 * action lists (its stage count must equal the pipe's; NULL: GPipe order).
 * When training, parameter gradients accumulate into each stage's flat
 * gradient buffer (the loss is seeded with 1/m, so they equal the
 * full-batch gradient) and replicated parameters' gradients are summed
 * across their stages at the end. outputs[o] receives model output o merged
 * over microbatches (the loss: the mean of the microbatch losses); it may be
 * NULL. */
PP_API pp_status pp_runner_step(pp_runner *r, int m, const pp_schedule *sched, int n_inputs,
                         const char *const *names, pp_tensor *const *inputs, pp_tensor **outputs);
/* The step index the next pp_runner_step runs as (default 0, then one more
 * per step): training-mode Dropout's masks depend on it, so a resumed run
 * sets the step it resumes at. */
PP_API void pp_runner_set_step(pp_runner *r, int64_t step);
PP_API void pp_runner_zero_grad(pp_runner *r);
/* Records the actions of the following steps into trace (see
 * pp_executor_trace); NULL stops recording. */
struct pp_trace;
PP_API void pp_runner_trace(pp_runner *r, struct pp_trace *trace, double origin_ms);

/* Model outputs, in the model's order. */
PP_API int pp_runner_n_outputs(const pp_runner *r);
PP_API const char *pp_runner_output_name(const pp_runner *r, int o);
/* Index of the loss output, -1 if none. */
PP_API int pp_runner_loss_output(const pp_runner *r);

/* One optimizer per stage over its flat buffers (same settings for all). */
PP_API pp_status pp_runner_set_optimizer(pp_runner *r, const pp_optim_config *c);
/* Updates every stage's parameters from its gradients. */
PP_API pp_status pp_runner_optimizer_step(pp_runner *r);
/* Stage i's optimizer (NULL before pp_runner_set_optimizer). */
PP_API pp_optim *pp_runner_optimizer(pp_runner *r, int i);

/* The gradient of a parameter (a copy; from its first stage) or NULL if
 * no stage trains it. */
PP_API pp_status pp_runner_param_grad(pp_runner *r, const char *name, pp_tensor **out);
/* The value of a parameter (a copy, from its first stage). */
PP_API pp_status pp_runner_param(pp_runner *r, const char *name, pp_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
