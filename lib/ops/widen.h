/* Internal: runs a float kernel on float16 / bfloat16 tensors by widening
 * them to float32 and narrowing the results back (as PyTorch's CPU kernels
 * compute half types in float). */
#ifndef PIPPIN_OPS_WIDEN_H
#define PIPPIN_OPS_WIDEN_H

#include "op.h"

/* The half dtype (PP_F16 or PP_BF16) of the first such input, or
 * PP_DTYPE_UNDEFINED when there is none. */
pp_dtype pp_kernel_half_dtype(const pp_kernel_ctx *ctx);

/* Calls run with every f16/bf16 input cast to f32. Output k whose bit is set
 * in narrow (bit 0 = output 0) and that comes back as f32 is cast to the half
 * dtype, unless some input was f32 to begin with. */
pp_status pp_kernel_run_widened(pp_kernel_ctx *ctx, pp_status (*run)(pp_kernel_ctx *),
                                unsigned narrow);

#endif
