/* pippin's GEMM by a packed weight (lib/ops/gemm_packed.c, what inference
 * MatMulAdd nodes run) against OpenBLAS's cblas_sgemm on the same product
 * in the same run: C = A W^T with W [N, K] as torch stores a Linear weight
 * (OpenBLAS: transB, packing W on every call; pippin: W packed once,
 * before timing). Shapes: a serving batch's rows (60-126) and a training
 * microbatch's (1020) against the GPTs' Linear weights. One thread each
 * (pippin's pool and OpenBLAS at 1); best of 7 timed loops; prints each
 * ratio (> 1: pippin faster) and the largest difference.
 *
 *   pippin-bench-gemm-packed */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pippin/pippin.h"

#include "gemm.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void) {
    pp_set_threads(1);
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
