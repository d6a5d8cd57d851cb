/* Internal: the geometry of a 1-D/2-D convolution and its three GEMM cores
 * (conv.c), shared by Conv and ConvTranspose (conv_transpose.c), whose
 * forward is Conv's input gradient and whose gradients are a Conv forward
 * (input) and Conv's weight gradient with the roles of x and dy swapped. */
#ifndef PIPPIN_OPS_CONV_INTERNAL_H
#define PIPPIN_OPS_CONV_INTERNAL_H

#include "op.h"

#define PP_CONV_ATTR_MAX (1 << 20) /* kernel, stride, dilation, pad, group bound */

/* A convolution x [N, C, ih, iw] * W [M, C/G, kh, kw] -> y [N, M, oh, ow]
 * (1-D: ih = kh = oh = 1). Pads may be negative (ConvTranspose's
 * output_shape can ask for more output than the kernel covers). */
typedef struct pp_conv_plan {
    int nsp;                          /* spatial rank of the node (1 or 2) */
    int64_t N, C, M, G, Cg, Mg;       /* batch, in/out channels, groups, per group */
    int64_t ih, iw, kh, kw, oh, ow;   /* 2-D view (1-D: ih = kh = oh = 1) */
    int64_t sh, sw, dh, dw, ph, pw;   /* strides, dilations, head pads */
    int64_t K, L, IL;                 /* Cg*kh*kw, oh*ow, ih*iw */
    int direct;                       /* 1x1, unit stride, no pad: col = x */
    int im2col;                       /* set by tests: never the depthwise cores */
} pp_conv_plan;

/* Fills K, L, IL and direct from the other fields and checks that the GEMM
 * sizes fit BLAS's int. */
pp_status pp_conv_plan_finish(const pp_kernel_ctx *ctx, pp_conv_plan *p);

/* y = conv(x, W) over the whole batch (no bias). */
pp_status pp_conv_forward(const pp_kernel_ctx *ctx, const pp_conv_plan *p, const float *x,
                          const float *w, float *y);
/* dx = the adjoint of conv in x: col2im(W^T dy); dx is overwritten. */
pp_status pp_conv_backward_data(const pp_kernel_ctx *ctx, const pp_conv_plan *p, const float *dy,
                                const float *w, float *dx);
/* dW = sum over the batch of dy im2col(x)^T; dw is overwritten. */
pp_status pp_conv_backward_filter(const pp_kernel_ctx *ctx, const pp_conv_plan *p,
                                  const float *dy, const float *x, float *dw);

/* The direct depthwise cores (conv_depthwise.c): one input channel per group
 * (Cg == 1), channel multiplier Mg up to 16, any kernel, stride, dilation and
 * pad; no im2col, no BLAS. The three cores above use them when
 * pp_conv_dw_usable says so and the plan's im2col flag is clear; they take the same arguments, and backward_data expects dx zeroed. */
int pp_conv_dw_usable(const pp_conv_plan *p);
pp_status pp_conv_dw_forward(const pp_kernel_ctx *ctx, const pp_conv_plan *p, const float *x,
                             const float *w, float *y);
pp_status pp_conv_dw_backward_data(const pp_kernel_ctx *ctx, const pp_conv_plan *p,
                                   const float *dy, const float *w, float *dx);
pp_status pp_conv_dw_backward_filter(const pp_kernel_ctx *ctx, const pp_conv_plan *p,
                                     const float *dy, const float *x, float *dw);

/* y[n, c, :] += bias[c] over an [n_batch, channels, len] float tensor
 * (Conv's and ConvTranspose's bias). */
static inline void pp_conv_add_bias(float *y, const float *bias, int64_t n_batch, int64_t channels, int64_t len) {
    for (int64_t n = 0; n < n_batch; n++)
        for (int64_t c = 0; c < channels; c++) {
            float *r = y + (n * channels + c) * len, b = bias[c];
            for (int64_t l = 0; l < len; l++) r[l] += b;
        }
}

#endif
