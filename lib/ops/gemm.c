/* The float GEMMs every kernel calls. On a CPU with AVX-512 a float
 * product with alpha 1 and beta 0 or 1 runs pippin's packed kernel
 * (pp_gemm_packed_any, lib/ops/gemm_packed.c: faster than OpenBLAS
 * 0.3.21's AVX2 kernels there, and its own bits-per-thread rules); the
 * rest are cut into panels over pippin's pool (lib/thread_pool.c), each
 * panel one OpenBLAS call on one thread, as below.
 *
 * Why not OpenBLAS's own threads: they spin in sched_yield after every
 * call, so on a host shared by several ranks (or by pippin's pool running
 * a softmax) the spinning threads take the cores the others need; the
 * pool's workers sleep between calls. OpenBLAS is kept at one thread.
 *
 * The cut, one panel per thread: panels of C's rows (each packs op(B)
 * again, which one call on one thread would pack once), starting at
 * multiples of ROW_ALIGN rows.
 * OpenBLAS computes a row of C with the same arithmetic in a panel as in
 * the whole call when the panel starts on its register tile (12 rows for
 * sgemm and dgemm on this x86, a divisor of ROW_ALIGN), so the bits do not
 * depend on the thread count. A cut through C's columns would change them
 * (OpenBLAS blocks columns differently in a narrower call, gemv too), so a
 * GEMM of fewer than 2 * ROW_ALIGN rows runs whole, as does one column by a
 * transposed A (gemv_t, which sums differently over a block of rows). test/core/test_threads.c
 * checks the bits at 1 and 4 threads. */
#include <cblas.h>
#include <stdint.h>

#include "pippin/exec.h"

#include "blas_threads.h"
#include "gemm.h"

#include "thread_pool.h"

#define ROW_ALIGN 12

/* gemv for a one-row or one-column product unless `matrix` (a panel of
 * a taller product must take the matrix kernel the whole call took). */
static void sgemm_whole(int matrix, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 1 && !matrix) { /* c = op(B)^T a: gemv is faster than a unit-dim sgemm in OpenBLAS 0.3.21 */
        int inca = ta ? lda : 1;
        if (tb) cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, inca, beta, C, 1);
        else cblas_sgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A, inca, beta, C, 1);
    } else if (N == 1) { /* c = op(A) b */
        int incb = tb ? 1 : ldb;
        if (ta) cblas_sgemv(CblasRowMajor, CblasTrans, K, M, alpha, A, lda, B, incb, beta, C, ldc);
        else cblas_sgemv(CblasRowMajor, CblasNoTrans, M, K, alpha, A, lda, B, incb, beta, C, ldc);
    } else {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                    N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

static void dgemm_whole(int matrix, int ta, int tb, int M, int N, int K, double alpha, const double *A,
                        int lda, const double *B, int ldb, double beta, double *C, int ldc) {
    if (M == 1 && !matrix) {
        int inca = ta ? lda : 1;
        if (tb) cblas_dgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, inca, beta, C, 1);
        else cblas_dgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A, inca, beta, C, 1);
    } else if (N == 1) {
        int incb = tb ? 1 : ldb;
        if (ta) cblas_dgemv(CblasRowMajor, CblasTrans, K, M, alpha, A, lda, B, incb, beta, C, ldc);
        else cblas_dgemv(CblasRowMajor, CblasNoTrans, M, K, alpha, A, lda, B, incb, beta, C, ldc);
    } else {
        cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
                    N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    }
}

typedef struct gemm_job {
    int f64, ta, tb, M, N, K, lda, ldb, ldc;
    int step; /* C's rows per panel */
    double alpha, beta;
    const void *A, *B;
    void *C;
} gemm_job;

static void panel_piece(void *arg, int64_t lo, int64_t hi) {
    const gemm_job *j = arg;
    for (int64_t p = lo; p < hi; p++) {
        int from = (int)p * j->step, rows = j->M - from < j->step ? j->M - from : j->step;
        if (rows <= 0) continue;
        /* op(A)'s rows [from, from + rows): a transposed A is walked along
         * its columns. */
        int64_t a_off = j->ta ? from : (int64_t)from * j->lda, c_off = (int64_t)from * j->ldc;
        if (j->f64)
            dgemm_whole(1, j->ta, j->tb, rows, j->N, j->K, j->alpha, (const double *)j->A + a_off, j->lda,
                        j->B, j->ldb, j->beta, (double *)j->C + c_off, j->ldc);
        else
            sgemm_whole(1, j->ta, j->tb, rows, j->N, j->K, (float)j->alpha, (const float *)j->A + a_off, j->lda,
                        j->B, j->ldb, (float)j->beta, (float *)j->C + c_off, j->ldc);
    }
}

/* Cuts the GEMM into one panel per thread when the pool has threads and
 * the work pays; returns 0 (nothing done) when it should run whole. */
static int gemm_in_panels(gemm_job *j) {
    pp_blas_default_once(); /* OpenBLAS starts on all CPUs or OPENBLAS_NUM_THREADS */
    int64_t macs = (int64_t)j->M * j->N * j->K;
    if (pp_get_threads() < 2 || macs < 2 * PP_PAR_MIN_MACS) return 0; /* a panel would not pay for its thread */
    if (j->M < 2 * ROW_ALIGN) return 0;
    /* A one-column product by a transposed A is OpenBLAS's gemv_t, whose
     * rounding on a block of A's columns differs from the whole: whole. */
    if (j->N == 1 && j->ta) return 0;
    int threads = pp_pool_threads_claim(); /* borrowed cores too (lib/core_share.c) */
    if (threads < 2) {
        pp_pool_threads_release(threads);
        return 0;
    }
    int use = macs / PP_PAR_MIN_MACS < threads ? (int)(macs / PP_PAR_MIN_MACS) : threads;
    int step = (j->M + use - 1) / use;
    j->step = (step + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    pp_parallel_for_threads((j->M + j->step - 1) / j->step, 1, panel_piece, j, use); /* all claimed are released */
    pp_pool_threads_release(threads);
    return 1;
}

void pp_gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc) {
    if (pp_gemm_packed_any(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    gemm_job j = {0, ta, tb, M, N, K, lda, ldb, ldc, 0, alpha, beta, A, B, C};
    if (!gemm_in_panels(&j)) sgemm_whole(0, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void pp_gemm_f64(int ta, int tb, int M, int N, int K, double alpha, const double *A, int lda,
                 const double *B, int ldb, double beta, double *C, int ldc) {
    gemm_job j = {1, ta, tb, M, N, K, lda, ldb, ldc, 0, alpha, beta, A, B, C};
    if (!gemm_in_panels(&j)) dgemm_whole(0, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
