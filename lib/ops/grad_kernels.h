/* Internal: kernels of the pippin-domain helper ops that autodiff emits
 * (table in grad.c). All take and give float32. */
#ifndef PIPPIN_OPS_GRAD_KERNELS_H
#define PIPPIN_OPS_GRAD_KERNELS_H

#include "op.h"
#include "vec.h"

/* Sums in PP_VEC_BLOCK float lanes, so the loops vectorise (the rounding
 * differs from a sequential sum; the results are still deterministic). */
PP_VINLINE float pp_grad_vsum(const float *restrict x, int64_t n) {
    float acc[PP_VEC_BLOCK] = {0}, s = 0;
    int64_t i = 0;
    for (; i + PP_VEC_BLOCK <= n; i += PP_VEC_BLOCK)
        for (int j = 0; j < PP_VEC_BLOCK; j++) acc[j] += x[i + j];
    for (int j = 0; j < PP_VEC_BLOCK; j++) s += acc[j];
    for (; i < n; i++) s += x[i];
    return s;
}

/* sum of a[i] * b[i] */
PP_VINLINE float pp_grad_vdot(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[PP_VEC_BLOCK] = {0}, s = 0;
    int64_t i = 0;
    for (; i + PP_VEC_BLOCK <= n; i += PP_VEC_BLOCK)
        for (int j = 0; j < PP_VEC_BLOCK; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; j < PP_VEC_BLOCK; j++) s += acc[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* sum of (x[i] - m)^2 */
PP_VINLINE float pp_grad_vsqdev(const float *restrict x, float m, int64_t n) {
    float acc[PP_VEC_BLOCK] = {0}, s = 0;
    int64_t i = 0;
    for (; i + PP_VEC_BLOCK <= n; i += PP_VEC_BLOCK)
        for (int j = 0; j < PP_VEC_BLOCK; j++) acc[j] += (x[i + j] - m) * (x[i + j] - m);
    for (int j = 0; j < PP_VEC_BLOCK; j++) s += acc[j];
    for (; i < n; i++) s += (x[i] - m) * (x[i] - m);
    return s;
}

/* Checks that input k is present and float32 ("what" names it in errors). */
pp_status pp_grad_k_f32(const pp_kernel_ctx *ctx, int k, const char *what);
/* Reads input k, a 1-D integer tensor of at most PP_MAX_DIMS entries, as a
 * shape (every entry >= 0). */
pp_status pp_grad_k_shape(const pp_kernel_ctx *ctx, int k, int *ndim, int64_t *shape);
/* The place the executor offers for output k (pp_exec_set_target_hook: a
 * parameter's part of the flat gradient buffer), if it is float32 with
 * numel elements; NULL otherwise. A non-NULL answer marks output k as
 * added: the kernel must then add the output into it and leave out[k]
 * unset, so call it once the inputs are checked. */
float *pp_grad_k_target(pp_kernel_ctx *ctx, int k, int64_t numel);

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
/* grad_bn.c: dy, x, scale, mean, var -> dx;  dy, x, mean, var -> dscale, dB */
pp_status pp_grad_batch_norm_input_run(pp_kernel_ctx *ctx);
pp_status pp_grad_batch_norm_weight_run(pp_kernel_ctx *ctx);
pp_status pp_grad_sce_loss_run(pp_kernel_ctx *ctx);

#endif
