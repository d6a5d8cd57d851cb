/* Launchers of the CUDA kernels (lib/cuda/kernels.cu), callable from C:
 * each queues its kernel on the stream and returns the launch's
 * cudaError_t (0: queued). The math of every kernel is kernel_math.h. */
#ifndef PIPPIN_CUDA_KERNELS_H
#define PIPPIN_CUDA_KERNELS_H

#include <stdint.h>

#include "kernel_math.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *pp_cu_stream; /* cudaStream_t */

int pp_cu_binary(pp_cu_stream s, pp_km_binop op, const float *a, pp_km_strides sa, const float *b,
                 pp_km_strides sb, float *out, int64_t n);
int pp_cu_unary(pp_cu_stream s, pp_km_unop op, const float *x, float *y, int64_t n);
int pp_cu_unary_grad(pp_cu_stream s, pp_km_gradop op, const float *dy, const float *t, float *dx, int64_t n);
int pp_cu_softmax(pp_cu_stream s, const float *x, float *y, int64_t rows, int64_t n);
int pp_cu_softmax_grad(pp_cu_stream s, const float *dy, const float *y, float *dx, int64_t rows, int64_t n);
/* b, mean, rstd may be NULL. */
int pp_cu_layernorm(pp_cu_stream s, const float *x, const float *w, const float *b, float eps, float *y,
                    float *mean, float *rstd, int64_t rows, int64_t n);
int pp_cu_ln_grad_input(pp_cu_stream s, const float *dy, const float *x, const float *w, float eps, float *dx,
                        int64_t rows, int64_t n);
/* stats: 2 * rows floats of scratch; dscale, dbias of n. */
int pp_cu_ln_grad_weight(pp_cu_stream s, const float *dy, const float *x, float eps, float *stats, int64_t rows,
                         int64_t n, float *dscale, float *dbias);
int pp_cu_reduce_sum(pp_cu_stream s, const float *x, float *y, int64_t outer, int64_t len, int64_t inner);
/* Any element type by its size in bytes (1, 2, 4 or 8). */
int pp_cu_gather(pp_cu_stream s, const void *src, int elem, const int64_t *idx, int64_t n_idx, int64_t axis_len,
                 int64_t inner, void *out, int64_t n_out);
/* out (outer x axis_len x inner) is zeroed first. */
int pp_cu_gather_grad(pp_cu_stream s, const float *dy, const int64_t *idx, int64_t n_idx, int64_t axis_len,
                      int64_t inner, float *out, int64_t n_out, int64_t n_dy);
/* Mean over the rows not ignored: loss (1 float); work: rows floats. */
int pp_cu_sce_loss(pp_cu_stream s, const float *scores, const int64_t *labels, int64_t rows, int64_t C,
                   int64_t ignore_index, float *work, float *loss);
/* dloss: 1 float on the device; the coefficient is dloss / count. */
int pp_cu_sce_grad(pp_cu_stream s, const float *dloss, const float *scores, const int64_t *labels, int64_t rows,
                   int64_t C, int64_t ignore_index, int64_t count, float *dx);
/* out[i] = src[base + offset(i)] for elements of elem bytes. */
int pp_cu_strided_copy(pp_cu_stream s, const void *src, int elem, int64_t base, pp_km_strides st, void *out,
                       int64_t n);
int pp_cu_concat_part(pp_cu_stream s, const void *src, int elem, int64_t len, int64_t inner, int64_t total,
                      int64_t axis_off, void *out, int64_t n);
/* One part of a Split: the inverse of pp_cu_concat_part. */
int pp_cu_split_part(pp_cu_stream s, const void *src, int elem, int64_t len, int64_t inner, int64_t total,
                     int64_t axis_off, void *out, int64_t n);
/* pippin::CausalAttention over n_bh batch-heads: one thread per query row. */
int pp_cu_attention(pp_cu_stream s, pp_km_attn a, const float *q, const float *k, const float *v, float *y,
                    int64_t n_bh);
/* Its gradient: query rows (stats: 3 * n_bh * tq floats of scratch; dQ),
 * then key rows (dK, dV); dq, dk, dv may be NULL. a.y describes dY. */
int pp_cu_attention_grad(pp_cu_stream s, pp_km_attn a, const float *q, const float *k, const float *v,
                         const float *dy, float c, float *stats, float *dq, float *dk, float *dv, int64_t n_bh);
int pp_cu_sgd(pp_cu_stream s, pp_km_sgd c, float *p, const float *grad, float *buf, int64_t n);
int pp_cu_adamw(pp_cu_stream s, pp_km_adamw c, float *p, const float *grad, float *m, float *v, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
