/* Where splitting a GEMM over a second thread starts to pay: the
 * serving-size products (64 rows) by packed Linear weights, run whole on
 * one thread and then cut in two halves of columns on two threads of
 * pippin's pool (a sleeping worker woken per call, as every parallel
 * kernel does). Prints per shape the multiply-adds per piece, both times
 * (best of 9 loops) and the ratio (> 1: splitting pays). lib/thread_pool.h's
 * PP_PAR_MIN_MACS, the least work a piece gets, comes from these figures.
 *
 *   pippin-bench-par-min */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pippin/pippin.h"

#include "gemm.h"
#include "thread_pool.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

typedef struct half_job {
    int M, N, K;
    const float *A, *Bp;
    float *C;
} half_job;

/* piece 0: the first half of the column panels, piece 1: the rest */
static void half_piece(void *arg, int64_t lo, int64_t hi) {
    const half_job *j = arg;
    int panels = (j->N + PP_PACK_NR - 1) / PP_PACK_NR, first = panels / 2;
    for (int64_t p = lo; p < hi; p++) {
        int p0 = p == 0 ? 0 : first, p1 = p == 0 ? first : panels;
        int c0 = p0 * PP_PACK_NR, c1 = p1 * PP_PACK_NR < j->N ? p1 * PP_PACK_NR : j->N;
        if (c1 > c0)
            pp_gemm_packed_f32(j->M, c1 - c0, j->K, j->A, j->K, j->Bp + (int64_t)p0 * j->K * PP_PACK_NR, NULL,
                               j->C + c0, j->N);
    }
}

int main(void) {
    static const int shapes[][3] = {{64, 64, 64},   {64, 64, 192},  {64, 64, 256},   {64, 256, 64},
                                    {64, 128, 384}, {64, 256, 256}, {64, 256, 768},  {64, 256, 1024},
                                    {64, 1024, 256}, {128, 256, 768}};
    printf("GEMM C[M,N] = A[M,K] W^T, W packed; whole on 1 thread vs two column halves on 2 threads\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
        float *A = malloc(sizeof(float) * (size_t)M * K), *W = malloc(sizeof(float) * (size_t)N * K);
        float *C = malloc(sizeof(float) * (size_t)M * N), *P = malloc(sizeof(float) * (size_t)pp_packed_b_floats(K, N));
        if (!A || !W || !C || !P) return 1;
        for (int64_t i = 0; i < (int64_t)M * K; i++) A[i] = (float)(i % 7) * 0.1f;
        for (int64_t i = 0; i < (int64_t)N * K; i++) W[i] = (float)(i % 5) * 0.1f;
        pp_pack_b_f32(1, K, N, W, K, P);
        half_job j = {M, N, K, A, P, C};
        double best[2] = {1e30, 1e30};
        int iters = 200;
        pp_set_threads(2);
        for (int rep = 0; rep < 9; rep++)
            for (int split = 0; split < 2; split++) {
                for (int w = 0; w < 10; w++)
                    if (split) pp_parallel_for_threads(2, 1, half_piece, &j, 2);
                    else half_piece(&j, 0, 2);
                double t0 = now_us();
                for (int i = 0; i < iters; i++)
                    if (split) pp_parallel_for_threads(2, 1, half_piece, &j, 2);
                    else half_piece(&j, 0, 2);
                double t = (now_us() - t0) / iters;
                if (t < best[split]) best[split] = t;
            }
        double macs = (double)M * K * N;
        printf("M %4d K %4d N %4d: %7.2fM MACs per piece, whole %8.2f us, split %8.2f us, ratio %.2fx%s\n", M, K, N,
               macs / 2e6, best[0], best[1], best[0] / best[1], macs / 2 >= (double)PP_PAR_MIN_MACS ? "  (splits)" : "");
        free(A), free(W), free(C), free(P);
    }
    return 0;
}
