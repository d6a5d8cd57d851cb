/* Internal: the float32 GEMM call MatMul, Gemm and pippin::MatMulAdd
 * share (lib/ops/matmul.c), so a fused node multiplies exactly as the
 * MatMul it replaces. Not installed. */
#ifndef PIPPIN_OPS_GEMM_H
#define PIPPIN_OPS_GEMM_H

/* C[M,N] = alpha * op(A) op(B) + beta * C, row-major, leading dims given.
 * M, N, K > 0. Matrix-vector shapes go to gemv. */
void pp_gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);

#endif
