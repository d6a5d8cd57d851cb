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
 * then + the bias; with AVX-512, 12 rows x 32 columns (two panels) in 24
 * registers, the same FMA chain (on an AMD Zen 5, whose FMA units are 512
 * bits wide, the medium GPT's forward took 0.56x the time of the AVX2
 * kernel's). Each element's sum is the same whichever kernel, panel or
 * thread computes it, so any thread count gives the same bits; the pool
 * splits between panels. Without AVX2 and FMA a plain loop computes the
 * same sums (with fmaf: the same bits). */
#if defined(__x86_64__) || defined(__i386__)
#define PACKED_X86 1 /* the AVX2 and AVX-512 kernels; elsewhere the plain one (fmaf is an instruction there) */
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/exec.h"

#include "gemm.h"
#include "thread_pool.h"

#define MR 6

enum { ISA_PLAIN, ISA_AVX2, ISA_AVX512 };

int64_t pp_packed_b_floats(int K, int N) { return (int64_t)K * ((N + PP_PACK_NR - 1) / PP_PACK_NR) * PP_PACK_NR; }

static int packed_isa(void);

#ifdef PACKED_X86
/* A transposed panel with AVX-512: 16 rows of B, 16 k's at a time, turned
 * in registers (4 rounds of shuffles), the k's past a multiple of 16 one
 * by one. Why: training packs op(B) per call (pp_gemm_packed_any), and
 * the plain loop's scattered stores were a quarter of a step at 8
 * microbatches (perf: pack_panels 23%). */
__attribute__((target("avx512f"))) static void pack_panel_t_avx512(int K, const float *B, int ldb,
                                                                   float *restrict dst) {
    int k0 = 0;
    for (; k0 + 16 <= K; k0 += 16) {
        __m512 r[16], t[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(B + (int64_t)i * ldb + k0);
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) {
            r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int i = 0; i < 16; i += 8)
            for (int q = 0; q < 4; q++) {
                t[i + q] = _mm512_shuffle_f32x4(r[i + q], r[i + q + 4], 0x88);
                t[i + q + 4] = _mm512_shuffle_f32x4(r[i + q], r[i + q + 4], 0xdd);
            }
        for (int q = 0; q < 8; q++) {
            r[q] = _mm512_shuffle_f32x4(t[q], t[q + 8], 0x88);
            r[q + 8] = _mm512_shuffle_f32x4(t[q], t[q + 8], 0xdd);
        }
        for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (int64_t)(k0 + i) * PP_PACK_NR, r[i]);
    }
    for (int c = 0; c < PP_PACK_NR && k0 < K; c++)
        for (int k = k0; k < K; k++) dst[(int64_t)k * PP_PACK_NR + c] = B[(int64_t)c * ldb + k];
}
#endif

/* A whole panel: rows of 16 copied, or (tb) 16 rows of B read along k
 * (the attention packs K this way once per head, so it is kept cheap). */
static void pack_panel_whole(int tb, int K, const float *B, int ldb, float *restrict dst) {
#ifdef PACKED_X86
    if (tb && packed_isa() == ISA_AVX512) {
        pack_panel_t_avx512(K, B, ldb, dst);
        return;
    }
#endif
    if (!tb)
        for (int k = 0; k < K; k++)
            memcpy(dst + (int64_t)k * PP_PACK_NR, B + (int64_t)k * ldb, sizeof(float) * PP_PACK_NR);
    else
        for (int c = 0; c < PP_PACK_NR; c++) {
            const float *restrict src = B + (int64_t)c * ldb;
            for (int k = 0; k < K; k++) dst[(int64_t)k * PP_PACK_NR + c] = src[k];
        }
}

/* Panels [lo, hi) of op(B), panel p at out + (p - lo) * K * 16. */
static void pack_panels(int tb, int K, int N, const float *B, int ldb, int lo, int hi, float *out) {
    for (int p = lo; p < hi; p++) {
        float *dst = out + (int64_t)(p - lo) * K * PP_PACK_NR;
        if ((p + 1) * PP_PACK_NR <= N) {
            pack_panel_whole(tb, K, tb ? B + (int64_t)p * PP_PACK_NR * ldb : B + p * PP_PACK_NR, ldb, dst);
            continue;
        }
        for (int k = 0; k < K; k++) /* the last, partial panel */
            for (int c = 0; c < PP_PACK_NR; c++) {
                int n = p * PP_PACK_NR + c;
                dst[(int64_t)k * PP_PACK_NR + c] = n >= N ? 0.0f : (tb ? B[(int64_t)n * ldb + k] : B[(int64_t)k * ldb + n]);
            }
    }
}

void pp_pack_b_f32(int tb, int K, int N, const float *B, int ldb, float *out) {
    pack_panels(tb, K, N, B, ldb, 0, (N + PP_PACK_NR - 1) / PP_PACK_NR, out);
}

/* acc (16 per row) into C's first `cols` columns. */
static void store_rows(int rows, int cols, const float *acc, float *C, int ldc) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) C[(int64_t)r * ldc + c] = acc[r * 16 + c];
}

#ifdef PACKED_X86
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

/* With AVX-512 (a 16-column panel is one register): R rows x P panels
 * side by side (P 1 or 2; the second panel's floats bs after the first,
 * row k of a panel bk floats after row k - 1: 16 packed, or B's own row
 * length where op(B) is read in place,
 * its columns 16 after the first's in C), R * P accumulators. The same
 * FMA chain per element as the AVX2 kernel, so the same bits; columns
 * past cols[p] are not stored (a masked store). Why: on a core with full
 * 512-bit FMA units (AMD Zen 5) this does twice the AVX2 kernel's work
 * per instruction, and two panels per pass read each broadcast of A once
 * for 32 columns. */
#define PACKED_KERNEL512(R, P, TA, NAME)                                                                      \
    __attribute__((target("avx512f"))) static void NAME(                                                      \
        int K, const float *A, int lda, const float *B, int64_t bs, int64_t bk, float *C, int ldc, const int *cols, \
        const float *bias, const float *res) {                                                                \
        __m512 c[R][P];                                                                                       \
        if (res)                                                                                              \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                            \
                _mm_prefetch((const char *)(res + (int64_t)r * ldc), _MM_HINT_T0);                            \
                _mm_prefetch((const char *)(res + (int64_t)r * ldc + 16 * P - 1), _MM_HINT_T0);               \
            }                                                                                                 \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                  \
            _Pragma("GCC unroll 2") for (int p = 0; p < P; p++) c[r][p] = _mm512_setzero_ps();                \
        for (int k = 0; k < K; k++) {                                                                         \
            __m512 b[P];                                                                                      \
            _Pragma("GCC unroll 2") for (int p = 0; p < P; p++) b[p] = _mm512_loadu_ps(B + p * bs + (int64_t)k * bk); \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                            \
                __m512 a = _mm512_set1_ps(TA ? A[(int64_t)k * lda + r] : A[(int64_t)r * lda + k]);                                           \
                _Pragma("GCC unroll 2") for (int p = 0; p < P; p++) c[r][p] = _mm512_fmadd_ps(a, b[p], c[r][p]); \
            }                                                                                                 \
        }                                                                                                     \
        _Pragma("GCC unroll 2") for (int p = 0; p < P; p++) {                                                 \
            __m512 bb = bias ? _mm512_loadu_ps(bias + 16 * p) : _mm512_setzero_ps();                          \
            __mmask16 m = cols[p] >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols[p]) - 1);               \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                            \
                __m512 v = bias ? _mm512_add_ps(bb, c[r][p]) : c[r][p];                                       \
                if (res) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, res + (int64_t)r * ldc + 16 * p));     \
                _mm512_mask_storeu_ps(C + (int64_t)r * ldc + 16 * p, m, v);                                   \
            }                                                                                                 \
        }                                                                                                     \
    }
/* TA: A read transposed (op(A)'s row r, column k at A[k * lda + r]: the
 * weight gradient's dY^T, whose 12 rows at one k are side by side). */
#define PACKED_KERNELS512(R)                                                                                  \
    PACKED_KERNEL512(R, 1, 0, kernel##R##x1_avx512) PACKED_KERNEL512(R, 2, 0, kernel##R##x2_avx512)           \
    PACKED_KERNEL512(R, 1, 1, kernel##R##x1t_avx512) PACKED_KERNEL512(R, 2, 1, kernel##R##x2t_avx512)
PACKED_KERNELS512(1)
PACKED_KERNELS512(2)
PACKED_KERNELS512(3)
PACKED_KERNELS512(4)
PACKED_KERNELS512(5)
PACKED_KERNELS512(6)
PACKED_KERNELS512(7)
PACKED_KERNELS512(8)
PACKED_KERNELS512(9)
PACKED_KERNELS512(10)
PACKED_KERNELS512(11)
PACKED_KERNELS512(12)

#define MR512 12
typedef void (*packed_kernel512)(int K, const float *A, int lda, const float *B, int64_t bs, int64_t bk, float *C, int ldc,
                                 const int *cols, const float *bias, const float *res);
#define K512(R) {kernel##R##x1_avx512, kernel##R##x2_avx512}
static const packed_kernel512 kernels512[MR512 + 1][2] = {{NULL, NULL}, K512(1), K512(2),  K512(3),  K512(4),
                                                           K512(5),      K512(6), K512(7),  K512(8),  K512(9),
                                                           K512(10),     K512(11), K512(12)};
#define K512T(R) {kernel##R##x1t_avx512, kernel##R##x2t_avx512}
static const packed_kernel512 kernels512t[MR512 + 1][2] = {{NULL, NULL}, K512T(1), K512T(2),  K512T(3),  K512T(4),
                                                            K512T(5),     K512T(6), K512T(7),  K512T(8),  K512T(9),
                                                            K512T(10),    K512T(11), K512T(12)};
#else
#define MR512 MR
#endif

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
    int M, N, K, lda, ldc, isa;
    const float *A, *Bp, *bias;
    float *C;
    int64_t bs;         /* floats from one panel to the next (0: K * PP_PACK_NR) */
    const float *res;   /* [M, ldc] added after the bias, or NULL */
    int n_outs;         /* > 0: C's columns go to outs instead (pp_gemm_packed_split) */
    float *const *outs;
    const int *starts;
} packed_job;


/* The output holding column col0 (*out, its row length *ld, col0's column
 * there *at) and the column where that output ends. */
static int output_of(const packed_job *j, int col0, float **out, int *ld, int *at) {
    *out = j->C, *ld = j->ldc, *at = col0;
    if (!j->n_outs) return j->N;
    int o = 0;
    while (o + 1 < j->n_outs && j->starts[o + 1] <= col0) o++;
    *ld = j->starts[o + 1] - j->starts[o];
    *out = j->outs[o];
    *at = col0 - j->starts[o];
    return j->starts[o + 1];
}

/* Panels [lo, hi): each panel's columns for all rows, MR at a time (with
 * AVX-512, two panels of one output at a time). Cache blocking (k in
 * blocks continuing the chain from C, rows in L2-sized blocks, as BLIS
 * does) was tried: 0.78-0.85x OpenBLAS's at 1020-2048 rows against
 * 0.88-1.07x unblocked on a quiet machine (it won only under load, where
 * A's trips to L3 cost more), so it is not built. */
static void panels_piece(void *arg, int64_t lo, int64_t hi) {
    const packed_job *j = arg;
    float acc[MR * 16];
    for (int64_t p = lo; p < hi;) {
        int64_t bs = j->bs ? j->bs : (int64_t)j->K * PP_PACK_NR;
        const float *B = j->Bp + p * bs;
        int col0 = (int)p * PP_PACK_NR;
        float *out;
        int ld, at, end = output_of(j, col0, &out, &ld, &at);
        int np = j->isa == ISA_AVX512 && p + 1 < hi && col0 + PP_PACK_NR < end ? 2 : 1;
        int cols[2];
        for (int q = 0; q < np; q++) {
            int left = j->N - col0 - q * PP_PACK_NR;
            cols[q] = left < PP_PACK_NR ? left : PP_PACK_NR;
        }
        float bias32[32];
        const float *bias = NULL;
        if (j->bias) { /* the columns past N: 0 (their sums are not stored) */
            for (int c = 0; c < 16 * np; c++) bias32[c] = col0 + c < j->N ? j->bias[col0 + c] : 0.0f;
            bias = bias32;
        }
        int mr = j->isa == ISA_AVX512 ? MR512 : MR;
        for (int i = 0; i < j->M; i += mr) {
            int rows = j->M - i < mr ? j->M - i : mr;
            const float *A = j->A + (int64_t)i * j->lda;
            float *C = out + (int64_t)i * ld + at;
            const float *res = j->res ? j->res + (int64_t)i * ld + at : NULL;
#ifdef PACKED_X86
            if (j->isa == ISA_AVX512)
                kernels512[rows][np - 1](j->K, A, j->lda, B, bs, PP_PACK_NR, C, ld, cols, bias, res);
            else if (j->isa == ISA_AVX2) kernels[rows](j->K, A, j->lda, B, C, ld, cols[0], bias, acc);
            else
#endif
                kernel_plain(rows, j->K, A, j->lda, B, C, ld, cols[0], bias, acc);
            for (int r = 0; res && j->isa != ISA_AVX512 && r < rows; r++) /* Add's arithmetic: y + r */
                for (int c = 0; c < cols[0]; c++) C[(int64_t)r * ld + c] += res[(int64_t)r * ld + c];
        }
        p += np;
    }
}

void pp_gemm_packed_f32(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias, float *C,
                        int ldc) {
    pp_gemm_packed_residual(M, N, K, A, lda, Bp, bias, NULL, C, ldc);
}

static int isa_limit = ISA_AVX512; /* pp_gemm_packed_limit_isa, for tests */

/* The widest kernel this CPU runs, at most isa_limit. */
static int packed_isa(void) {
#ifdef PACKED_X86
    if (isa_limit >= ISA_AVX512 && __builtin_cpu_supports("avx512f")) return ISA_AVX512;
    if (isa_limit >= ISA_AVX2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
    return ISA_PLAIN;
#else
    return ISA_PLAIN;
#endif
}

int pp_gemm_packed_fast(void) {
#ifdef PACKED_X86
    return packed_isa() >= ISA_AVX2;
#else
    return isa_limit >= ISA_AVX2; /* the plain kernel, fmaf one instruction on these targets */
#endif
}

int pp_gemm_packed_wide(void) { return packed_isa() == ISA_AVX512; }

int pp_gemm_packed_limit_isa(int level) {
    int old = isa_limit;
    isa_limit = level;
    return old;
}

/* The panels of job j over the pool. */
static void run_panels(packed_job *j) {
    if (j->M <= 0 || j->N <= 0) return;
    j->isa = packed_isa();
    int64_t panels = (j->N + PP_PACK_NR - 1) / PP_PACK_NR, per = (int64_t)j->M * j->K * PP_PACK_NR;
    pp_parallel_for(panels, pp_grain_macs(per), panels_piece, j);
}

void pp_gemm_packed_residual(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias,
                             const float *R, float *C, int ldc) {
    packed_job j = {M, N, K, lda, ldc, 0, A, Bp, bias, C, 0, R, 0, NULL, NULL};
    run_panels(&j);
}

void pp_gemm_packed_strided(int M, int N, int K, const float *A, int lda, const float *Bp, int64_t panel_stride,
                            float *C, int ldc) {
    packed_job j = {M, N, K, lda, ldc, 0, A, Bp, NULL, C, panel_stride, NULL, 0, NULL, NULL};
    run_panels(&j);
}

void pp_gemm_packed_split(int M, int N, int K, const float *A, int lda, const float *Bp, const float *bias, int n,
                          float *const *outs, const int *starts) {
    packed_job j = {M, N, K, lda, N, 0, A, Bp, bias, NULL, 0, NULL, n, outs, starts};
    run_panels(&j);
}

/* ---- Any product on the AVX-512 kernel (pp_gemm_packed_any) ----
 *
 * Why: on an AVX-512 host OpenBLAS 0.3.21 still runs its Haswell (AVX2)
 * kernels, and a training step's GEMMs are about 80% of its time (perf,
 * medium GPT): the forward, dX = dY W and dW = dY^T X. Here op(B) = B
 * is read in place (16 columns of a row are a panel's row; only a last,
 * partial panel is copied), op(B) = B^T is packed per call into panels (a
 * thread's scratch, reused), a block of columns at a time so the scratch
 * stays small, and the AVX-512 kernel
 * runs over (panel pair, row block) tasks. Each element is the same sums
 * in the same order whatever the cut (FMA chains over blocks of ANY_KC k's,
 * each added to C in order; the first onto C when accumulating), so any
 * thread count gives the same bits. */
#ifdef PACKED_X86
/* k in blocks of ANY_KC, each block's sums added to C: a chain of 128
 * rounds less than one of K (on dW's K = a microbatch's rows, 1024-2048,
 * the one chain was 2x OpenBLAS's error against double sums; blocked it is
 * below OpenBLAS's on every shape measured), for 2-3% of the time. */
#define ANY_KC 128
#define ANY_A_BLOCK_FLOATS (INT64_C(1) << 19) /* 2 MiB of A per row block */
#define ANY_SCRATCH_FLOATS (INT64_C(1) << 20) /* 4 MiB of panels per block of columns */

typedef struct {
    float *p;
    int64_t cap;
    /* op(A) = A^T's row block, packed tile by tile (pack_a_block), and
     * which job's block it holds */
    float *a;
    int64_t acap;
    uint64_t a_gen;
    int a_rb, a_step;
} any_scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_ok;

static void scratch_release(void *v) {
    any_scratch *s = v;
    if (s) free(s->p), free(s->a);
    free(s);
}

static void scratch_init(void) { scratch_ok = pthread_key_create(&scratch_key, scratch_release) == 0; }

/* The calling thread's scratch record, or NULL. Per thread: two rank
 * threads multiply at once, and a pool worker inside a piece (attention
 * per head) runs its product on its own thread. */
static any_scratch *scratch_mine(void) {
    pthread_once(&scratch_once, scratch_init);
    if (!scratch_ok) return NULL;
    any_scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s)) {
            free(s);
            return NULL;
        }
    }
    return s;
}

/* *buf grown to at least floats (64-byte aligned), or NULL. */
static float *grow(float **buf, int64_t *cap, int64_t floats) {
    if (*cap < floats) {
        void *p = NULL;
        if (posix_memalign(&p, 64, sizeof(float) * (size_t)floats)) return NULL;
        free(*buf);
        *buf = p, *cap = floats;
    }
    return *buf;
}

/* The calling thread's panel scratch of at least `floats`, or NULL. */
static float *scratch_get(int64_t floats) {
    any_scratch *s = scratch_mine();
    return s ? grow(&s->p, &s->cap, floats) : NULL;
}

typedef struct any_job {
    int ta, tb, M, N, K, lda, ldb, ldc, accumulate;
    const float *A, *B;
    float *C;
    float *panels; /* tb: the block's packed panels; else the last, partial panel packed */
    int p0, np;    /* tb: the block, panels [p0, p0 + np); else the whole panels, read in place */
    int units, n_rb, row_step;
    uint64_t gen;  /* this run's number (ta: which packed row block a thread holds) */
} any_job;

static _Atomic uint64_t any_gen;
static _Atomic int pack_a_off; /* pp_gemm_packed_test_pack_a */

int pp_gemm_packed_test_pack_a(int on) { return !atomic_exchange(&pack_a_off, !on); }

/* op(A) = A^T's rows [r0, r1) (A's columns) packed for the TA kernel: per
 * tile of 12 rows, per k, its 12 floats side by side ([tile][k][12]). Why:
 * read in place, each k of a tile is another row of A, lda apart, and
 * every panel pair of the row block read it so again; the large GPT's dW
 * ran at 146-200 GFLOPS against 230-240 for the other products. Packed
 * once per row block and thread, the kernel reads it in order. The same
 * FMAs in the same order: the same bits. */
__attribute__((target("avx512f"))) static void pack_a_block(const any_job *j, int r0, int r1, float *restrict dst) {
    for (int i = r0; i < r1; i += MR512) {
        int rows = r1 - i < MR512 ? r1 - i : MR512;
        __mmask16 m = (__mmask16)((1u << rows) - 1);
        float *t = dst + (int64_t)(i - r0) * j->K;
        const float *a = j->A + i;
        for (int k = 0; k < j->K; k++)
            _mm512_mask_storeu_ps(t + (int64_t)k * MR512, m, _mm512_maskz_loadu_ps(m, a + (int64_t)k * j->lda));
    }
}

/* The calling thread's packed row block rb of job j (packed now if it
 * holds another), or NULL: A is then read in place (no memory, or a block
 * against one panel pair, read once either way). Keyed by the call
 * (gen: one per pp_gemm_packed_any, whose column blocks share A) and the
 * block's rows (rb and row_step: a column block may cut rows otherwise). */
static const float *packed_a(const any_job *j, int rb, int r0, int r1) {
    if (j->units < 2 || atomic_load_explicit(&pack_a_off, memory_order_relaxed)) return NULL;
    any_scratch *s = scratch_mine();
    int64_t floats = (int64_t)((r1 - r0 + MR512 - 1) / MR512) * MR512 * j->K;
    if (!s || !grow(&s->a, &s->acap, floats)) return NULL;
    if (s->a_gen != j->gen || s->a_rb != rb || s->a_step != j->row_step) {
        pack_a_block(j, r0, r1, s->a);
        s->a_gen = j->gen, s->a_rb = rb, s->a_step = j->row_step;
    }
    return s->a;
}

static void any_pack_piece(void *arg, int64_t lo, int64_t hi) {
    const any_job *j = arg;
    pack_panels(j->tb, j->K, j->N, j->B, j->ldb, j->p0 + (int)lo, j->p0 + (int)hi,
                j->panels + lo * (int64_t)j->K * PP_PACK_NR);
}

/* Tasks [lo, hi): task t is row block t / units over unit t % units (a
 * pair of panels, or one): a thread's consecutive tasks read one block of
 * A against every panel. */
__attribute__((target("avx512f"))) static void any_piece(void *arg, int64_t lo, int64_t hi) {
    const any_job *j = arg;
    for (int64_t t = lo; t < hi; t++) {
        int rb = (int)(t / j->units), u = (int)(t % j->units);
        int q = 2 * u, np, col0;
        const float *B;
        int64_t bs, bk;
        if (j->tb) { /* packed panels */
            np = j->np - q < 2 ? 1 : 2, col0 = (j->p0 + q) * PP_PACK_NR;
            bs = (int64_t)j->K * PP_PACK_NR, bk = PP_PACK_NR, B = j->panels + q * bs;
        } else if (q < j->np) { /* whole panels of B [K, N], read where they are */
            np = j->np - q < 2 ? 1 : 2, col0 = q * PP_PACK_NR;
            bs = PP_PACK_NR, bk = j->ldb, B = j->B + col0;
        } else { /* the partial panel, packed */
            np = 1, col0 = j->np * PP_PACK_NR;
            bs = (int64_t)j->K * PP_PACK_NR, bk = PP_PACK_NR, B = j->panels;
        }
        int cols[2];
        for (int c = 0; c < np; c++) {
            int left = j->N - col0 - c * PP_PACK_NR;
            cols[c] = left < PP_PACK_NR ? left : PP_PACK_NR;
        }
        int r0 = rb * j->row_step, r1 = r0 + j->row_step < j->M ? r0 + j->row_step : j->M;
        const float *pa = j->ta ? packed_a(j, rb, r0, r1) : NULL;
        for (int i = r0; i < r1; i += MR512) {
            int rows = r1 - i < MR512 ? r1 - i : MR512;
            float *C = j->C + (int64_t)i * j->ldc + col0;
            for (int k0 = 0; k0 < j->K; k0 += ANY_KC) {
                int kc = j->K - k0 < ANY_KC ? j->K - k0 : ANY_KC;
                const float *A;
                int lda = j->lda;
                if (pa) A = pa + (int64_t)(i - r0) * j->K + (int64_t)k0 * MR512, lda = MR512;
                else A = j->ta ? j->A + i + (int64_t)k0 * j->lda : j->A + (int64_t)i * j->lda + k0;
                (j->ta ? kernels512t : kernels512)[rows][np - 1](kc, A, lda, B + (int64_t)k0 * bk, bs, bk, C,
                                                                 j->ldc, cols, NULL, k0 || j->accumulate ? C : NULL);
            }
        }
    }
}

/* The tasks of job j over the pool: rows in blocks of A that stay in the
 * cache while every panel passes (ANY_A_BLOCK_FLOATS), and more blocks
 * where the units are too few to share out. Why: a task over all of A's
 * rows read A again for every panel pair, from memory once A outgrew the
 * cache: the large GPT's dW (A^T of 2048 x 3072) ran at 0.59x
 * OpenBLAS's speed, 1.4x with the blocks. */
static void any_run(any_job *j, int units) {
    int threads = pp_get_threads();
    int n_rb = units >= 2 * threads ? 1 : (2 * threads + units - 1) / units;
    int64_t a_floats = (int64_t)j->M * j->K;
    if (a_floats > ANY_A_BLOCK_FLOATS * n_rb) n_rb = (int)((a_floats + ANY_A_BLOCK_FLOATS - 1) / ANY_A_BLOCK_FLOATS);
    int row_step = (j->M + n_rb - 1) / n_rb;
    row_step = (row_step + MR512 - 1) / MR512 * MR512;
    j->units = units, j->row_step = row_step, j->n_rb = (j->M + row_step - 1) / row_step;
    if (!j->gen) j->gen = ++any_gen;
    pp_parallel_for((int64_t)units * j->n_rb, pp_grain_macs((int64_t)row_step * j->K * 2 * PP_PACK_NR), any_piece, j);
}

size_t pp_gemm_scratch_bytes(void) {
    if (packed_isa() != ISA_AVX512) return 0;
    /* the panels, and a row block of A^T: ANY_A_BLOCK_FLOATS rounded up to
     * whole tiles, at most a tile of the largest K taken more */
    int64_t a = ANY_A_BLOCK_FLOATS + (int64_t)MR512 * (ANY_SCRATCH_FLOATS / (2 * PP_PACK_NR));
    return sizeof(float) * (size_t)(ANY_SCRATCH_FLOATS + a);
}

int pp_gemm_packed_any_takes(int M, int N, int K, float alpha, float beta) {
    /* vector shapes stay on gemv; a product too thin to fill a panel, or
     * with a scale, on the BLAS */
    if (M < 2 || N < PP_PACK_NR || K < 16 || alpha != 1.0f || (beta != 0.0f && beta != 1.0f)) return 0;
    return (int64_t)K * 2 * PP_PACK_NR <= ANY_SCRATCH_FLOATS && packed_isa() == ISA_AVX512;
}

int pp_gemm_packed_any_panels(int M, int N, int K, const float *A, int lda, const float *Bp, float beta, float *C,
                              int ldc) {
    if (!pp_gemm_packed_any_takes(M, N, K, 1.0f, beta)) return 0;
    int panels = (N + PP_PACK_NR - 1) / PP_PACK_NR;
    any_job j = {0, 1, M, N, K, lda, 0, ldc, beta != 0.0f, A, NULL, C, (float *)Bp, 0, panels, 0, 0, 0};
    any_run(&j, (panels + 1) / 2);
    return 1;
}

int pp_gemm_packed_any(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    if (!pp_gemm_packed_any_takes(M, N, K, alpha, beta)) return 0;
    any_job j = {ta, tb, M, N, K, lda, ldb, ldc, beta != 0.0f, A, B, C, NULL, 0, 0, 0, 0, 0};
    if (!tb) { /* op(B) = B: its rows of 16 columns are a panel's rows already */
        int whole = N / PP_PACK_NR, part = N % PP_PACK_NR != 0;
        if (part && !(j.panels = scratch_get((int64_t)K * PP_PACK_NR))) return 0;
        if (part) pack_panels(0, K, N, B, ldb, whole, whole + 1, j.panels);
        j.np = whole;
        any_run(&j, (whole + 1) / 2 + part);
        return 1;
    }
    /* B^T: packed, a block of columns at a time */
    int panels = (N + PP_PACK_NR - 1) / PP_PACK_NR;
    int block = (int)(ANY_SCRATCH_FLOATS / ((int64_t)K * PP_PACK_NR)) / 2 * 2; /* panels per block, even */
    if (block > panels) block = panels;
    if (!(j.panels = scratch_get((int64_t)block * K * PP_PACK_NR))) return 0;
    for (int p0 = 0; p0 < panels; p0 += block) {
        j.p0 = p0, j.np = panels - p0 < block ? panels - p0 : block;
        pp_parallel_for(j.np, pp_grain_macs((int64_t)K * PP_PACK_NR * 8), any_pack_piece, &j);
        any_run(&j, (j.np + 1) / 2);
    }
    return 1;
}
#else
size_t pp_gemm_scratch_bytes(void) { return 0; }

int pp_gemm_packed_test_pack_a(int on) {
    (void)on;
    return 1;
}

int pp_gemm_packed_any_takes(int M, int N, int K, float alpha, float beta) {
    (void)M, (void)N, (void)K, (void)alpha, (void)beta;
    return 0;
}

int pp_gemm_packed_any_panels(int M, int N, int K, const float *A, int lda, const float *Bp, float beta, float *C,
                              int ldc) {
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)Bp, (void)beta, (void)C, (void)ldc;
    return 0;
}

int pp_gemm_packed_any(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb, (void)beta;
    (void)C, (void)ldc;
    return 0;
}
#endif
