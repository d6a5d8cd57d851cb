/* A GEMM by a weight packed once (pippin::PackWeight, made by the
 * optimizer's matmul pass for inference): C = A op(B) (+ C), with op(B)
 * [K, N] stored as panels of PP_PACK_NR columns, each K x 16 floats with
 * the columns past N zero.
 *
 * Why: OpenBLAS packs both operands on every call. With a serving batch's
 * few rows (64 tokens against a [768, 256] weight) packing the weight took
 * a quarter of the GEMM's time (perf: sgemm_incopy 23-27%), repeated for
 * every request. Here only the panels are read: 1.23-1.28x OpenBLAS's
 * sgemm at 60 rows, 1.0-1.09x at 126, 0.98-0.99x at 1020
 * (pippin-bench-gemm-packed, one thread).
 *
 * The kernel: 6 rows x 16 columns of C in 12 AVX2 registers (a remainder
 * of 1-5 rows in fewer), one FMA per element and k, k in order from 0,
 * then + the bias. Each element's sum is the same
 * whichever panel or thread computes it, so any thread count gives the
 * same bits; the pool splits between panels. Without AVX2 and FMA a plain
 * loop computes the same sums (with fmaf: the same bits). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gemm.h"
#include "thread_pool.h"

#define MR 6

int64_t pp_packed_b_floats(int K, int N) { return (int64_t)K * ((N + PP_PACK_NR - 1) / PP_PACK_NR) * PP_PACK_NR; }

void pp_pack_b_f32(int tb, int K, int N, const float *B, int ldb, float *out) {
    int panels = (N + PP_PACK_NR - 1) / PP_PACK_NR;
    for (int p = 0; p < panels; p++)
        for (int k = 0; k < K; k++) {
            float *dst = out + ((int64_t)p * K + k) * PP_PACK_NR;
            for (int c = 0; c < PP_PACK_NR; c++) {
                int n = p * PP_PACK_NR + c;
                dst[c] = n >= N ? 0.0f : (tb ? B[(int64_t)n * ldb + k] : B[(int64_t)k * ldb + n]);
            }
        }
}

/* acc (16 per row) into C's first `cols` columns. */
static void store_rows(int rows, int cols, const float *acc, float *C, int ldc) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) C[(int64_t)r * ldc + c] = acc[r * 16 + c];
}

/* R rows x 16 columns of C: 2R accumulators, one FMA per element and k
 * from 0, then + bias (16 floats; NULL: none). A whole panel (cols 16) is
 * stored from the registers, a narrower one through acc. */
#define PACKED_KERNEL(R)                                                                                      \
    __attribute__((target("avx2,fma"))) static void kernel##R##_avx2(int K, const float *A, int lda,          \
                                                                     const float *B, float *C, int ldc,     \
                                                                     int cols, const float *bias,           \
                                                                     float *acc) {                          \
        __m256 c0[R], c1[R];                                                                                  \
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) c0[r] = c1[r] = _mm256_setzero_ps();             \
        for (int k = 0; k < K; k++) {                                                                         \
            __m256 b0 = _mm256_loadu_ps(B + (int64_t)k * 16), b1 = _mm256_loadu_ps(B + (int64_t)k * 16 + 8); \
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                             \
                __m256 a = _mm256_broadcast_ss(A + (int64_t)r * lda + k);                                     \
                c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);                                                        \
                c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);                                                        \
            }                                                                                                 \
        }                                                                                                     \
        if (bias) {                                                                                           \
            __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);                                \
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                             \
                c0[r] = _mm256_add_ps(b0, c0[r]);                                                             \
                c1[r] = _mm256_add_ps(b1, c1[r]);                                                             \
            }                                                                                                 \
        }                                                                                                     \
        float *dst = cols == 16 ? C : acc;                                                                    \
        int ld = cols == 16 ? ldc : 16;                                                                       \
        _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                                 \
            _mm256_storeu_ps(dst + (int64_t)r * ld, c0[r]);                                                   \
            _mm256_storeu_ps(dst + (int64_t)r * ld + 8, c1[r]);                                               \
        }                                                                                                     \
        if (cols != 16) store_rows(R, cols, acc, C, ldc);                                                     \
    }
PACKED_KERNEL(1)
PACKED_KERNEL(2)
PACKED_KERNEL(3)
PACKED_KERNEL(4)
PACKED_KERNEL(5)
PACKED_KERNEL(6)

typedef void (*packed_kernel)(int K, const float *A, int lda, const float *B, float *C, int ldc, int cols,
                              const float *bias, float *acc);
static const packed_kernel kernels[MR + 1] = {NULL,          kernel1_avx2, kernel2_avx2, kernel3_avx2,
                                              kernel4_avx2, kernel5_avx2, kernel6_avx2};

/* The same sums without AVX2: fmaf in the same order gives the same bits. */
static void kernel_plain(int rows, int K, const float *A, int lda, const float *B, float *C, int ldc, int cols,
                         const float *bias, float *acc) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < 16; c++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) s = fmaf(A[(int64_t)r * lda + k], B[(int64_t)k * 16 + c], s);
            acc[r * 16 + c] = bias ? bias[c] + s : s;
        }
    store_rows(rows, cols, acc, C, ldc);
}

typedef struct packed_job {
    int M, N, K, lda, ldc, avx2;
    const float *A, *Bp, *bias;
    float *C;
    pp_tile_fn tile_fn; /* NULL: none */
    const void *tile_arg;
    int n_outs;         /* > 0: C's columns go to outs instead (pp_gemm_packed_split) */
    float *const *outs;
    const int *starts;
} packed_job;

/* Panels [lo, hi): each panel's columns for all rows, 6 at a time. Cache
 * blocking (k in blocks continuing the chain from C, rows in L2-sized
 * blocks, as BLIS does) was tried: 0.78-0.85x OpenBLAS's at 1020-2048
 * rows against 0.88-1.07x unblocked on a quiet machine (it won only under
 * load, where A's trips to L3 cost more), so it is not built. */
static void panels_piece(void *arg, int64_t lo, int64_t hi) {
    const packed_job *j = arg;
    float acc[MR * 16];
    for (int64_t p = lo; p < hi; p++) {
        const float *B = j->Bp + p * j->K * PP_PACK_NR;
        int col0 = (int)p * PP_PACK_NR, cols = j->N - col0 < PP_PACK_NR ? j->N - col0 : PP_PACK_NR;
        float *out = j->C; /* the output holding column col0, its row length, col0's column there */
        int ld = j->ldc, at = col0;
        if (j->n_outs) {
            int o = 0;
            while (o + 1 < j->n_outs && j->starts[o + 1] <= col0) o++;
            ld = j->starts[o + 1] - j->starts[o];
            out = j->outs[o];
            at = col0 - j->starts[o];
        }
        float bias16[16];
        const float *bias = NULL;
        if (j->bias) { /* the columns past N: 0 (their sums are not stored) */
            for (int c = 0; c < 16; c++) bias16[c] = c < cols ? j->bias[col0 + c] : 0.0f;
            bias = bias16;
        }
        for (int i = 0; i < j->M; i += MR) {
            int rows = j->M - i < MR ? j->M - i : MR;
            const float *A = j->A + (int64_t)i * j->lda;
            float *C = out + (int64_t)i * ld + at;
            if (j->avx2) kernels[rows](j->K, A, j->lda, B, C, ld, cols, bias, acc);
            else kernel_plain(rows, j->K, A, j->lda, B, C, ld, cols, bias, acc);
            if (j->tile_fn) j->tile_fn(j->tile_arg, C, ld, i, rows, col0, cols); /* while it is in L1 */
        }
    }
}

void pp_gemm_packed_f32(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias, float *C,
                        int ldc) {
    pp_gemm_packed_tiles(M, N, K, A, lda, Bp, bias, C, ldc, NULL, NULL);
}

/* The panels of job j over the pool. */
static void run_panels(packed_job *j) {
    if (j->M <= 0 || j->N <= 0) return;
    j->avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int64_t panels = (j->N + PP_PACK_NR - 1) / PP_PACK_NR, per = (int64_t)j->M * j->K * PP_PACK_NR;
    pp_parallel_for(panels, pp_grain_macs(per), panels_piece, j);
}

void pp_gemm_packed_tiles(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias, float *C,
                          int ldc, pp_tile_fn tile_fn, const void *tile_arg) {
    packed_job j = {M, N, K, lda, ldc, 0, A, Bp, bias, C, tile_fn, tile_arg, 0, NULL, NULL};
    run_panels(&j);
}

void pp_gemm_packed_split(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias, int n,
                          float *const *outs, const int *starts) {
    packed_job j = {M, N, K, lda, N, 0, A, Bp, bias, NULL, NULL, NULL, n, outs, starts};
    run_panels(&j);
}
