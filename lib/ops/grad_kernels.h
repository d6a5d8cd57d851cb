/* Internal: kernels of the pippin-domain helper ops that autodiff emits
 * (table in grad.c). All take and give float32. */
#ifndef PIPPIN_OPS_GRAD_KERNELS_H
#define PIPPIN_OPS_GRAD_KERNELS_H

#include "pippin/op.h"

/* Checks that input k is present and float32 ("what" names it in errors). */
pp_status pp_grad_k_f32(const pp_kernel_ctx *ctx, int k, const char *what);
/* Reads input k, a 1-D integer tensor of at most PP_MAX_DIMS entries, as a
 * shape (every entry >= 0). */
pp_status pp_grad_k_shape(const pp_kernel_ctx *ctx, int k, int *ndim, int64_t *shape);

/* grad_shape.c */
pp_status pp_grad_sum_to_shape_run(pp_kernel_ctx *ctx);
pp_status pp_grad_expand_reduced_run(pp_kernel_ctx *ctx);
pp_status pp_grad_slice_run(pp_kernel_ctx *ctx);
pp_status pp_grad_gather_run(pp_kernel_ctx *ctx);
pp_status pp_grad_split_like_run(pp_kernel_ctx *ctx);

/* grad_nn.c */
pp_status pp_grad_matmul_a_run(pp_kernel_ctx *ctx);
pp_status pp_grad_matmul_b_run(pp_kernel_ctx *ctx);
pp_status pp_grad_softmax_run(pp_kernel_ctx *ctx);
pp_status pp_grad_log_softmax_run(pp_kernel_ctx *ctx);
pp_status pp_grad_layer_norm_input_run(pp_kernel_ctx *ctx);
pp_status pp_grad_layer_norm_weight_run(pp_kernel_ctx *ctx);
pp_status pp_grad_sce_loss_run(pp_kernel_ctx *ctx);

#endif
