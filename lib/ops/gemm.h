/* Internal: the float GEMMs every kernel calls (lib/ops/gemm.c), cut into
 * panels over pippin's pool; a fused node multiplies exactly as the MatMul
 * it replaces, and the bits do not depend on the thread count. Not
 * installed. */
#ifndef PIPPIN_OPS_GEMM_H
#define PIPPIN_OPS_GEMM_H

#include <stdint.h>

/* C[M,N] = alpha * op(A) op(B) + beta * C, row-major, leading dims given.
 * M, N, K > 0. Matrix-vector shapes go to gemv. */
void pp_gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);
void pp_gemm_f64(int ta, int tb, int M, int N, int K, double alpha, const double *A, int lda,
                 const double *B, int ldb, double beta, double *C, int ldc);

/* A weight packed once for pp_gemm_packed_f32 (lib/ops/gemm_packed.c):
 * op(B) [K, N] (B [N, K] when tb) as panels of PP_PACK_NR columns, each
 * K x PP_PACK_NR floats, columns past N zero; pp_packed_b_floats floats. */
#define PP_PACK_NR 16
int64_t pp_packed_b_floats(int K, int N);
void pp_pack_b_f32(int tb, int K, int N, const float *B, int ldb, float *out);
/* C[M,N] = A op(B) (+ bias[N] on every row; bias may be NULL), Bp packed
 * as above. The same bits at any thread count. */
void pp_gemm_packed_f32(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias, float *C,
                        int ldc);
/* The same with R [M, N] (leading dim ldc; NULL: none) added after the
 * bias, as the residual Add did: (A op(B) + bias) + R, to each tile as it
 * is made (in the AVX-512 kernel's registers before the store; the AVX2
 * and plain kernels add it right after storing the tile): a fused node's
 * residual, without another pass over C. */
void pp_gemm_packed_residual(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias,
                             const float *R, float *C, int ldc);
/* The same product with C's columns cut among n outputs, as a Split along
 * the last axis would: columns [starts[o], starts[o + 1]) go to outs[o]
 * (rows of starts[o + 1] - starts[o] floats); starts[0] = 0, starts[n] =
 * N, each start a multiple of PP_PACK_NR so no tile straddles two. */
void pp_gemm_packed_split(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias, int n,
                          float *const *outs, const int *starts);
/* C[M,N] = A B with B's panels panel_stride floats apart (at least K *
 * PP_PACK_NR): the first K rows of a matrix packed with more (the
 * attention's V, packed once for every block of queries). */
void pp_gemm_packed_strided(int M, int N, int K, const float *A, int lda, const float *Bp, int64_t panel_stride,
                            float *C, int ldc);

/* C[M,N] = op(A) op(B) (beta 0) or op(A) op(B) + C (beta 1) on the
 * AVX-512 packed kernel, op(B) packed per call: pp_gemm_f32's path on a
 * host with AVX-512. Returns 0, doing nothing, where it does not take the
 * product (no AVX-512, alpha not 1, another beta, M under 2, N under 16,
 * K under 16 or over 32768): the caller runs the BLAS. */
int pp_gemm_packed_any(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc);
/* 1 when pp_gemm_packed_any takes a product of these dims and scales. */
int pp_gemm_packed_any_takes(int M, int N, int K, float alpha, float beta);
/* The same product with op(B) = B^T already packed (Bp, as
 * pp_pack_b_f32(1, ...) packs it: training's held weights), the same
 * tasks and so the same bits as pp_gemm_packed_any packing it per call.
 * Returns 0, doing nothing, where that would not take it. */
int pp_gemm_packed_any_panels(int M, int N, int K, const float *A, int lda, const float *Bp, float beta, float *C,
                              int ldc);

/* For tests: the packed GEMM's kernels limited to level (0 plain C, 1
 * AVX2, 2 AVX-512, the default: the widest the CPU has); returns the
 * previous limit. Every level gives the same bits. */
int pp_gemm_packed_limit_isa(int level);
/* For tests: op(A) = A^T packed per row block (on, the default) or read
 * in place; returns the previous setting. Either gives the same bits. */
int pp_gemm_packed_test_pack_a(int on);
/* 1 when the packed GEMM runs a vector kernel here (x86 with AVX2 and
 * FMA, or a target whose fmaf is an instruction): without, its plain
 * kernel calls a software fmaf per product, 10-100x slower than the
 * BLAS, and callers that have a BLAS path take it. */
int pp_gemm_packed_fast(void);
/* 1 when it runs its AVX-512 kernel here, where pp_gemm_f32 runs every
 * product it can on it (pp_gemm_packed_any). */
int pp_gemm_packed_wide(void);

#endif
