/* Optimizers over flat float32 buffers (pippin/params.h), with the update
 * rules of torch.optim (PyTorch 1.13, single-tensor implementation):
 *
 * SGD:   g = grad + wd*p  (-grad if maximize)
 *        buf = g at the first step, else momentum*buf + (1-dampening)*g
 *        d = g + momentum*buf if nesterov, else buf (g when momentum is 0)
 *        p = p - lr*d
 * AdamW: p = p * (1 - lr*wd)
 *        m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
 *        p = p - lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps),  t = 1, 2, ...
 *
 * Thread safety: one thread uses an optimizer at a time; different optimizers are independent. */
#ifndef PIPPIN_OPTIM_H
#define PIPPIN_OPTIM_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_optim_kind { PP_OPTIM_SGD = 0, PP_OPTIM_ADAMW = 1 } pp_optim_kind;

typedef struct pp_optim_config {
    pp_optim_kind kind;
    double lr;
    double weight_decay;
    int maximize;
    double momentum, dampening; /* SGD */
    int nesterov;               /* SGD */
    double beta1, beta2, eps;   /* AdamW */
} pp_optim_config;

/* torch's defaults: SGD lr 1e-3 (torch has none), no momentum, no decay;
 * AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2. */
PP_API void pp_optim_config_init(pp_optim_config *c, pp_optim_kind kind);
/* "sgd" or "adamw" (any case). */
PP_API pp_status pp_optim_kind_parse(const char *name, pp_optim_kind *kind);
PP_API const char *pp_optim_kind_name(pp_optim_kind kind);

typedef struct pp_optim pp_optim;

/* An optimizer for n elements. Checks the hyperparameters as torch does
 * (negative lr, momentum, weight decay, eps, betas outside [0, 1); nesterov
 * without momentum or with dampening). */
PP_API pp_status pp_optim_new(const pp_optim_config *c, int64_t n, pp_optim **out);
PP_API void pp_optim_free(pp_optim *o);

/* One update of params (n elements) from grads. */
PP_API pp_status pp_optim_step(pp_optim *o, float *params, const float *grads, int64_t n);
/* The number of elements it was made for. */
PP_API int64_t pp_optim_size(const pp_optim *o);
/* Steps taken so far. */
PP_API int64_t pp_optim_steps(const pp_optim *o);
/* Changes the learning rate (for schedules). */
PP_API void pp_optim_set_lr(pp_optim *o, double lr);
PP_API const pp_optim_config *pp_optim_get_config(const pp_optim *o);

/* State buffers (n elements each) for checkpoints: SGD has "momentum_buffer"
 * (meaningful after the first step), AdamW "exp_avg" and "exp_avg_sq".
 * Returns the number of buffers; *name and *buf (may be NULL) get buffer i. */
PP_API int pp_optim_state(pp_optim *o, int i, const char **name, float **buf);
/* Restores the step count (with the buffers written through pp_optim_state). */
PP_API void pp_optim_set_steps(pp_optim *o, int64_t steps);

#ifdef __cplusplus
}
#endif
#endif
