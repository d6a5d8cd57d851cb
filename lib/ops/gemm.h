/* Internal: the float GEMMs every kernel calls (lib/ops/gemm.c), cut into
 * panels over pippin's pool; a fused node multiplies exactly as the MatMul
 * it replaces, and the bits do not depend on the thread count. Not
 * installed. */
#ifndef PIPPIN_OPS_GEMM_H
#define PIPPIN_OPS_GEMM_H

/* C[M,N] = alpha * op(A) op(B) + beta * C, row-major, leading dims given.
 * M, N, K > 0. Matrix-vector shapes go to gemv. */
void pp_gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);
void pp_gemm_f64(int ta, int tb, int M, int N, int K, double alpha, const double *A, int lda,
                 const double *B, int ldb, double beta, double *C, int ldc);

#endif
