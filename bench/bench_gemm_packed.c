/* pippin's GEMM by a packed weight (lib/ops/gemm_packed.c, what inference
 * MatMulAdd nodes run) against OpenBLAS's cblas_sgemm on the same product
 * in the same run: C = A W^T with W [N, K] as torch stores a Linear weight
 * (OpenBLAS: transB, packing W on every call; pippin: W packed once,
 * before timing). Shapes: a serving batch's rows (60-126) and a training
 * microbatch's (1020) against the GPTs' Linear weights. One thread each
 * (pippin's pool and OpenBLAS at 1); best of 7 timed loops; prints each
 * ratio (> 1: pippin faster) and the largest difference.
 *
 * With --train: the medium GPT's training GEMMs (d 384: K x N of
 * 384x1152, 384x384, 384x1536, 1536x384, 384x65) at a microbatch's rows
 * of batch 8 x T 128 as 8, 4, 2 and 1 microbatches (M 128-1024), each
 * product both ways a training step runs it: the forward C = A W^T and
 * dX = dY W; OpenBLAS as training called it (W read in place), OpenBLAS
 * on a copy of W transposed once (the other pack path: NN forward, NT
 * backward), and pippin's packed kernel with W packed once (the pack's
 * own time printed apart: once per step, shared by the microbatches).
 * Variants interleaved, thread CPU time, median of --rounds (9).
 *
 * With --large-steps: the large GPT's training products (forward, dX,
 * dW at 2048 rows) through pp_gemm_f32 against cblas_sgemm.
 *
 *   pippin-bench-gemm-packed [--train [--rounds N] | --large-steps] */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pippin/pippin.h"

#include "gemm.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *random_floats(size_t n, unsigned *seed) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; p && i < n; i++) p[i] = (float)(*seed = *seed * 1103515245u + 12345u) / 4294967296.0f - 0.5f;
    return p;
}

enum { FWD_BLAS, FWD_BLAS_T, FWD_PACKED, BWD_BLAS, BWD_BLAS_T, BWD_PACKED, PACK_FWD, PACK_BWD, N_VARIANTS };

/* One product of variant v, done reps times; thread CPU seconds per product. */
static double run_variant(int v, int reps, int M, int K, int N, const float *A, const float *W, const float *Wt,
                          const float *dY, float *P1, float *P2, float *C, float *dX) {
    double t0 = cpu_s();
    for (int q = 0; q < reps; q++) switch (v) {
        case FWD_BLAS: cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, A, K, W, K, 0, C, N); break;
        case FWD_BLAS_T: cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, A, K, Wt, N, 0, C, N); break;
        case FWD_PACKED: pp_gemm_packed_f32(M, N, K, A, K, P1, NULL, C, N); break;
        case BWD_BLAS: cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, dY, N, W, K, 0, dX, K); break;
        case BWD_BLAS_T: cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, K, N, 1, dY, N, Wt, N, 0, dX, K); break;
        case BWD_PACKED: pp_gemm_packed_f32(M, K, N, dY, N, P2, NULL, dX, K); break;
        case PACK_FWD: pp_pack_b_f32(1, K, N, W, K, P1); break;
        default: pp_pack_b_f32(0, N, K, W, K, P2); break;
        }
    return (cpu_s() - t0) / reps;
}

static int train_shapes(int rounds) {
    static const int ms[] = {128, 256, 512, 1024}, ws[][2] = {{384, 1152}, {384, 384}, {384, 1536}, {1536, 384}, {384, 65}};
    printf("medium GPT training GEMMs, W [N, K]; 1 thread; thread CPU ms, median of %d interleaved rounds\n"
           "%5s %5s %5s | fwd: %7s %7s %7s %6s | dX: %7s %7s %7s %6s | %6s %6s\n",
           rounds, "M", "K", "N", "blas", "blas^T", "packed", "ratio", "blas", "blas^T", "packed", "ratio", "pack", "pack");
    unsigned seed = 1;
    double *t = malloc(sizeof(double) * (size_t)rounds * N_VARIANTS);
    if (!t) return 1;
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
        for (size_t wi = 0; wi < sizeof ws / sizeof ws[0]; wi++) {
            int M = ms[mi], K = ws[wi][0], N = ws[wi][1];
            float *A = random_floats((size_t)M * K, &seed), *W = random_floats((size_t)N * K, &seed);
            float *dY = random_floats((size_t)M * N, &seed), *Wt = malloc(sizeof(float) * (size_t)N * K);
            float *C = malloc(sizeof(float) * (size_t)M * N), *dX = malloc(sizeof(float) * (size_t)M * K);
            float *P1 = malloc(sizeof(float) * (size_t)pp_packed_b_floats(K, N));
            float *P2 = malloc(sizeof(float) * (size_t)pp_packed_b_floats(N, K));
            if (!A || !W || !dY || !Wt || !C || !dX || !P1 || !P2) return 1;
            for (int n = 0; n < N; n++)
                for (int k = 0; k < K; k++) Wt[(size_t)k * N + n] = W[(size_t)n * K + k];
            pp_pack_b_f32(1, K, N, W, K, P1);
            pp_pack_b_f32(0, N, K, W, K, P2);
            int reps = (int)(5e7 / ((double)M * N * K)) + 1;
            for (int r = 0; r < rounds; r++)
                for (int v = 0; v < N_VARIANTS; v++)
                    t[v * rounds + r] = run_variant(v, v >= PACK_FWD ? 4 : reps, M, K, N, A, W, Wt, dY, P1, P2, C, dX);
            double med[N_VARIANTS];
            for (int v = 0; v < N_VARIANTS; v++) {
                qsort(t + v * rounds, (size_t)rounds, sizeof(double), cmp_double);
                med[v] = t[v * rounds + rounds / 2] * 1e3;
            }
            printf("%5d %5d %5d | %12.3f %7.3f %7.3f %5.2fx | %11.3f %7.3f %7.3f %5.2fx | %6.3f %6.3f\n", M, K, N,
                   med[FWD_BLAS], med[FWD_BLAS_T], med[FWD_PACKED], med[FWD_BLAS] / med[FWD_PACKED], med[BWD_BLAS],
                   med[BWD_BLAS_T], med[BWD_PACKED], med[BWD_BLAS] / med[BWD_PACKED], med[PACK_FWD], med[PACK_BWD]);
            free(A), free(W), free(dY), free(Wt), free(C), free(dX), free(P1), free(P2);
        }
    printf("ratio: OpenBLAS as training ran it / packed (> 1: packed faster; the pack is paid once per step)\n");
    free(t);
    return 0;
}

/* The large GPT's training products (d 768, T 256 x batch 8 = 2048 rows)
 * as pp_gemm_f32 runs them (its AVX-512 path where there is one: the
 * forward packing W^T per call, dX reading W in place, dW packing dY^T per
 * row block) against cblas_sgemm with the same transposes, in turn, best
 * of 5; prints GFLOPS and the ratio (> 1: pippin faster). */
static int large_steps(void) {
    static const int ws[][2] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
    static const char *names[] = {"qkv", "proj", "fc", "fc2"}, *what[] = {"fwd X W^T", "dX = dY W", "dW = dY^T X"};
    enum { M = 2048 };
    printf("large GPT training GEMMs (M %d rows), 1 thread; best of 5 each, taken in turn\n"
           "%-5s %-12s %6s %6s %6s %10s %10s %7s\n", M, "W", "product", "rows", "cols", "inner", "blas GF/s",
           "pippin", "ratio");
    unsigned seed = 3;
    for (int w = 0; w < 4; w++) {
        int K = ws[w][0], N = ws[w][1];
        float *X = random_floats((size_t)M * K, &seed), *W = random_floats((size_t)N * K, &seed);
        float *dY = random_floats((size_t)M * N, &seed), *C = malloc(sizeof(float) * (size_t)M * (N > K ? N : K) * 2);
        if (!X || !W || !dY || !C) return 1;
        for (int v = 0; v < 3; v++) {
            /* (ta, tb, rows, cols, inner, A, lda, B, ldb) of C = op(A) op(B) */
            int ta = v == 2, tb = v == 0, r = v == 2 ? N : M, c = v == 1 ? K : v == 2 ? K : N, in = v == 1 ? N : v == 2 ? M : K;
            const float *A = v == 0 ? X : dY, *B = v == 0 ? W : v == 1 ? W : X;
            int lda = v == 0 ? K : N, ldb = K;
            double best[2] = {1e9, 1e9};
            for (int rep = 0; rep < 5; rep++)
                for (int who = 0; who < 2; who++) {
                    double t0 = now_s();
                    if (who)
                        pp_gemm_f32(ta, tb, r, c, in, 1.0f, A, lda, B, ldb, 0.0f, C, c);
                    else
                        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, r, c,
                                    in, 1.0f, A, lda, B, ldb, 0.0f, C, c);
                    double t = now_s() - t0;
                    if (t < best[who]) best[who] = t;
                }
            double flop = 2.0 * r * c * in;
            printf("%-5s %-12s %6d %6d %6d %10.1f %10.1f %6.2fx\n", names[w], what[v], r, c, in, flop / best[0] / 1e9,
                   flop / best[1] / 1e9, best[0] / best[1]);
        }
        free(X), free(W), free(dY), free(C);
    }
    return 0;
}

int main(int argc, char **argv) {
    pp_set_threads(1);
    if (argc > 1 && strcmp(argv[1], "--train") == 0)
        return train_shapes(argc > 3 && strcmp(argv[2], "--rounds") == 0 ? atoi(argv[3]) : 9);
    if (argc > 1 && strcmp(argv[1], "--large-steps") == 0) return large_steps();
    static const int shapes[][3] = {{60, 256, 768},  {60, 256, 256},   {60, 256, 1024}, {60, 1024, 256},
                                    {126, 384, 1152}, {126, 768, 2304}, {1020, 384, 1152}, {1020, 1536, 384},
                                    {2048, 768, 3072}, {2048, 3072, 768}};
    printf("C = A W^T, W [N, K]; 1 thread; best of 7 loops\n%6s %6s %6s %12s %12s %7s %10s\n", "M", "K", "N",
           "OpenBLAS ms", "packed ms", "ratio", "max diff");
    unsigned seed = 1;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        float *A = malloc(sizeof(float) * (size_t)M * K), *W = malloc(sizeof(float) * (size_t)K * N);
        float *C = malloc(sizeof(float) * (size_t)M * N), *D = malloc(sizeof(float) * (size_t)M * N);
        float *P = malloc(sizeof(float) * (size_t)pp_packed_b_floats(K, N));
        if (!A || !W || !C || !D || !P) return 1;
        for (int i = 0; i < M * K; i++) A[i] = (float)(seed = seed * 1103515245u + 12345u) / 4294967296.0f - 0.5f;
        for (int i = 0; i < K * N; i++) W[i] = (float)(seed = seed * 1103515245u + 12345u) / 4294967296.0f - 0.5f;
        pp_pack_b_f32(1, K, N, W, K, P);
        int reps = (int)(2e8 / ((double)M * N * K)) + 1;
        double tb = 1e9, tp = 1e9;
        for (int r = 0; r < 7; r++) {
            double t0 = now_s();
            for (int q = 0; q < reps; q++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N);
            double t = (now_s() - t0) / reps;
            if (t < tb) tb = t;
            t0 = now_s();
            for (int q = 0; q < reps; q++) pp_gemm_packed_f32(M, N, K, A, K, P, NULL, D, N);
            t = (now_s() - t0) / reps;
            if (t < tp) tp = t;
        }
        double md = 0;
        for (int i = 0; i < M * N; i++) md = fmax(md, fabs((double)C[i] - D[i]));
        printf("%6d %6d %6d %12.3f %12.3f %6.2fx %10.2g\n", M, K, N, tb * 1e3, tp * 1e3, tb / tp, md);
        free(A);
        free(W);
        free(C);
        free(D);
        free(P);
    }
    return 0;
}
