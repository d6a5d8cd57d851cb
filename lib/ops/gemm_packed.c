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

/* C's first `cols` columns of R rows into acc (16 per row, the rest 0). */
static void load_rows(int rows, int cols, float *acc, const float *C, int ldc) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < 16; c++) acc[r * 16 + c] = c < cols ? C[(int64_t)r * ldc + c] : 0.0f;
}

/* acc (16 per row) into C's first `cols` columns. */
static void store_rows(int rows, int cols, const float *acc, float *C, int ldc) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) C[(int64_t)r * ldc + c] = acc[r * 16 + c];
}

/* R rows x 16 columns of C: 2R accumulators, one FMA per element and k,
 * starting from C's values (from_c: the sum of the K block before) or 0;
 * then + bias (16 floats; NULL: none). A whole panel (cols 16) is loaded
 * and stored from the registers, a narrower one through acc. */
#define PACKED_KERNEL(R)                                                                                      \
    __attribute__((target("avx2,fma"))) static void kernel##R##_avx2(int K, const float *A, int lda,          \
                                                                     const float *B, float *C, int ldc,     \
                                                                     int cols, int from_c, const float *bias,\
                                                                     float *acc) {                          \
        __m256 c0[R], c1[R];                                                                                  \
        if (!from_c) {                                                                                        \
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) c0[r] = c1[r] = _mm256_setzero_ps();         \
        } else {                                                                                              \
            const float *src = C;                                                                             \
            int ld = ldc;                                                                                     \
            if (cols != 16) load_rows(R, cols, acc, C, ldc), src = acc, ld = 16;                              \
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                             \
                c0[r] = _mm256_loadu_ps(src + (int64_t)r * ld);                                               \
                c1[r] = _mm256_loadu_ps(src + (int64_t)r * ld + 8);                                           \
            }                                                                                                 \
        }                                                                                                     \
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

typedef void (*packed_kernel)(int K, const float *A, int lda, const float *B, float *C, int ldc, int cols, int from_c,
                              const float *bias, float *acc);
static const packed_kernel kernels[MR + 1] = {NULL,          kernel1_avx2, kernel2_avx2, kernel3_avx2,
                                              kernel4_avx2, kernel5_avx2, kernel6_avx2};

/* The same sums without AVX2: fmaf in the same order gives the same bits. */
static void kernel_plain(int rows, int K, const float *A, int lda, const float *B, float *C, int ldc, int cols,
                         int from_c, const float *bias, float *acc) {
    if (from_c) load_rows(rows, cols, acc, C, ldc);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < 16; c++) {
            float s = from_c ? acc[r * 16 + c] : 0.0f;
            for (int k = 0; k < K; k++) s = fmaf(A[(int64_t)r * lda + k], B[(int64_t)k * 16 + c], s);
            acc[r * 16 + c] = bias ? bias[c] + s : s;
        }
    store_rows(rows, cols, acc, C, ldc);
}

typedef struct packed_job {
    int M, N, K, lda, ldc, avx2;
    const float *A, *Bp, *bias;
    float *C;
} packed_job;

/* Cache blocking, as BLIS does, without packing A: K in blocks of at most
 * KC_MAX (a panel's block, KC x 16 floats, stays in L1 across a row block's
 * tiles), rows in blocks whose A block (rows x KC) stays in L2 while every
 * panel of the piece passes over it. Unblocked, A went through once per
 * 16 columns (at 2048 x 768, 6 MB from L3 each time) and the GEMM ran at
 * 0.6-0.7x OpenBLAS's on a loaded machine. Each element's chain of FMAs
 * runs k in order from 0 whatever the blocks (a block starts from the
 * last one's sum in C) and the bias comes last, so blocking changes no
 * bit, and any thread count gives the same bits. */
#define KC_MAX 384
#define A_BLOCK_BYTES (384 * 1024)

static int k_block(int K) {
    int blocks = (K + KC_MAX - 1) / KC_MAX;
    return blocks > 1 ? (K + blocks - 1) / blocks : K; /* even blocks: no short tail */
}

static int row_block(int kc) {
    int64_t rows = A_BLOCK_BYTES / ((int64_t)(kc > 0 ? kc : 1) * (int64_t)sizeof(float)) / MR * MR;
    return rows < MR ? MR : rows > (1 << 20) ? (1 << 20) : (int)rows;
}

static void panels_piece(void *arg, int64_t lo, int64_t hi) {
    const packed_job *j = arg;
    float acc[MR * 16];
    int kc = k_block(j->K), mc = row_block(kc);
    for (int k0 = 0; k0 < j->K || k0 == 0; k0 += kc) {
        int kn = j->K - k0 < kc ? j->K - k0 : kc, from_c = k0 > 0, last = k0 + kn >= j->K;
        for (int i0 = 0; i0 < j->M; i0 += mc) {
            int i1 = j->M - i0 < mc ? j->M : i0 + mc;
            for (int64_t p = lo; p < hi; p++) {
                const float *B = j->Bp + (p * j->K + k0) * PP_PACK_NR;
                int col0 = (int)p * PP_PACK_NR, cols = j->N - col0 < PP_PACK_NR ? j->N - col0 : PP_PACK_NR;
                float bias16[16];
                const float *bias = NULL;
                if (last && j->bias) { /* the columns past N: 0 (their sums are not stored) */
                    for (int c = 0; c < 16; c++) bias16[c] = c < cols ? j->bias[col0 + c] : 0.0f;
                    bias = bias16;
                }
                for (int i = i0; i < i1; i += MR) {
                    int rows = i1 - i < MR ? i1 - i : MR;
                    const float *A = j->A + (int64_t)i * j->lda + k0;
                    float *C = j->C + (int64_t)i * j->ldc + col0;
                    if (j->avx2) kernels[rows](kn, A, j->lda, B, C, j->ldc, cols, from_c, bias, acc);
                    else kernel_plain(rows, kn, A, j->lda, B, C, j->ldc, cols, from_c, bias, acc);
                }
            }
        }
        if (j->K == 0) break;
    }
}

void pp_gemm_packed_f32(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias, float *C,
                        int ldc) {
    if (M <= 0 || N <= 0) return;
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    packed_job j = {M, N, K, lda, ldc, avx2, A, Bp, bias, C};
    int64_t panels = (N + PP_PACK_NR - 1) / PP_PACK_NR, per = (int64_t)M * K * PP_PACK_NR;
    pp_parallel_for(panels, pp_grain_macs(per), panels_piece, &j);
}
