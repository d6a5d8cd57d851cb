/* The thread pool (lib/thread_pool.c) and the row-parallel kernels on it:
 * every range covered once, concurrent callers, nested calls, resizing;
 * each parallel kernel run at 1 and at 4 threads on sizes above its
 * threshold gives the same bits. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "pippin/exec.h"

#include "broadcast.h"
#include "gemm.h"
#include "test_filter.h"
#include "thread_pool.h"

/* ------------------------------------------------------------ the pool */

typedef struct cover {
    _Atomic int *hits;
    int64_t grain, n;
    atomic_int small; /* pieces shorter than the grain while cut */
} cover;

static void cover_piece(void *arg, int64_t lo, int64_t hi) {
    cover *c = arg;
    if (hi - lo < c->grain && !(lo == 0 && hi == c->n)) atomic_fetch_add(&c->small, 1);
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_pool_covers_once(void **state) {
    (void)state;
    for (int threads = 1; threads <= 5; threads += 2) {
        pp_set_threads(threads);
        assert_int_equal(pp_get_threads(), threads);
        const int64_t ns[] = {0, 1, 7, 100, 1000, 4097, 100003};
        const int64_t grains[] = {1, 3, 64, 1000};
        for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
            for (size_t b = 0; b < sizeof grains / sizeof *grains; b++) {
                cover c = {calloc((size_t)ns[a] + 1, sizeof(int)), grains[b], ns[a], 0};
                pp_parallel_for(ns[a], grains[b], cover_piece, &c);
                for (int64_t i = 0; i < ns[a]; i++) assert_int_equal(c.hits[i], 1);
                assert_int_equal(atomic_load(&c.small), 0);
                free(c.hits);
            }
    }
    pp_set_threads(1);
}

static void elems_piece(void *arg, int64_t lo, int64_t hi) {
    cover *c = arg;
    if (lo % PP_PAR_ALIGN != 0 || (hi % PP_PAR_ALIGN != 0 && hi != c->n)) atomic_fetch_add(&c->small, 1);
    cover_piece(arg, lo, hi);
}

static void test_pool_elems_aligned(void **state) {
    (void)state;
    pp_set_threads(4);
    const int64_t ns[] = {5, 1000, 65537, 300001};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        cover c = {calloc((size_t)ns[a], sizeof(int)), 1, ns[a], 0};
        pp_parallel_elems(ns[a], 64, elems_piece, &c);
        for (int64_t i = 0; i < ns[a]; i++) assert_int_equal(c.hits[i], 1);
        assert_int_equal(atomic_load(&c.small), 0);
        free(c.hits);
    }
    pp_set_threads(1);
}

/* A piece that calls the pool again: the inner call runs on its thread. */
static void outer_piece(void *arg, int64_t lo, int64_t hi) {
    cover *c = arg;
    for (int64_t i = lo; i < hi; i++) {
        cover inner = {c->hits + i * 100, 1, 100, 0};
        pp_parallel_for(100, 1, cover_piece, &inner);
    }
}

static void test_pool_nested(void **state) {
    (void)state;
    pp_set_threads(3);
    cover c = {calloc(100 * 100, sizeof(int)), 1, 100, 0};
    pp_parallel_for(100, 1, outer_piece, &c);
    for (int i = 0; i < 100 * 100; i++) assert_int_equal(c.hits[i], 1);
    free(c.hits);
    pp_set_threads(1);
}

/* Several threads (ranks of one process) call the pool at once. */
static void *caller_main(void *arg) {
    cover *c = arg;
    for (int rep = 0; rep < 200; rep++) pp_parallel_for(c->n, 16, cover_piece, c);
    return NULL;
}

static void test_pool_concurrent_callers(void **state) {
    (void)state;
    pp_set_threads(3);
    enum { CALLERS = 4, N = 5000 };
    cover cs[CALLERS];
    pthread_t th[CALLERS];
    for (int k = 0; k < CALLERS; k++) {
        cs[k] = (cover){calloc(N, sizeof(int)), 16, N, 0};
        assert_int_equal(pthread_create(&th[k], NULL, caller_main, &cs[k]), 0);
    }
    for (int k = 0; k < CALLERS; k++) {
        pthread_join(th[k], NULL);
        for (int i = 0; i < N; i++) assert_int_equal(cs[k].hits[i], 200);
        free(cs[k].hits);
    }
    pp_set_threads(1);
}

static void test_default_threads(void **state) {
    (void)state;
    unsetenv("PIPPIN_THREADS");
    int all = pp_default_threads(1);
    assert_true(all >= 1);
    assert_int_equal(pp_default_threads(all * 4), 1);
    assert_int_equal(pp_default_threads(0), all);
    setenv("PIPPIN_THREADS", "3", 1);
    assert_int_equal(pp_default_threads(1), 3);
    assert_int_equal(pp_default_threads(64), 3);
    setenv("PIPPIN_THREADS", "x", 1);
    assert_int_equal(pp_default_threads(1), all);
    unsetenv("PIPPIN_THREADS");
    assert_int_equal(pp_set_threads(0), all);
    pp_set_threads(1);
}

/* --------------------------------------------------- kernels, same bits */

static uint64_t seed;

static pp_tensor *rand_t(pp_dtype dt, int nd, const int64_t *shape) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(dt, nd, shape, &t));
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) {
        double u = tu_urand(&seed) * 6 - 3;
        if (dt == PP_BOOL) ((uint8_t *)t->data)[i] = u > 0;
        else pp_tensor_set_f64(t, i, u);
    }
    return t;
}

typedef struct kcase {
    const char *op, *domain;
    int n_in, n_out;
    pp_dtype dt[4];
    int nd[4];
    int64_t shape[4][4];
    const char *attr;     /* NULL or "name=int" */
    int64_t attr_ints[4]; /* for perm / axes */
    int n_attr_ints;
} kcase;

/* Runs the case with fresh inputs from seed s at the given thread count. */
static void run_case(const kcase *k, uint64_t s, int threads, pp_tensor **outs) {
    pp_set_threads(threads);
    seed = s;
    pp_tensor *ins[4] = {NULL};
    for (int i = 0; i < k->n_in; i++) ins[i] = rand_t(k->dt[i], k->nd[i], k->shape[i]);
    tu_node t;
    tu_node_init_dom(&t, k->op, k->domain, k->n_in, ins, k->n_out, NULL);
    if (k->attr) {
        char name[32];
        long long v;
        assert_int_equal(sscanf(k->attr, "%31[^=]=%lld", name, &v), 2);
        if (k->n_attr_ints) TU_OK(pp_node_set_ints(t.g, t.node, name, k->n_attr_ints, k->attr_ints));
        else TU_OK(pp_node_set_int(t.g, t.node, name, v));
    }
    TU_OK(tu_node_run(&t, outs));
    tu_node_free(&t);
}

static void same_bits(const kcase *k) {
    pp_tensor *one[4] = {NULL}, *many[4] = {NULL};
    int64_t before = pp_pool_parallel_calls();
    run_case(k, 12345, 1, one);
    if (pp_pool_parallel_calls() != before) fail_msg("%s went parallel on 1 thread", k->op);
    run_case(k, 12345, 4, many);
    if (pp_pool_parallel_calls() == before) fail_msg("%s did not go parallel on 4 threads", k->op);
    for (int o = 0; o < k->n_out; o++) {
        assert_non_null(one[o]);
        assert_non_null(many[o]);
        assert_int_equal(one[o]->nbytes, many[o]->nbytes);
        if (memcmp(one[o]->data, many[o]->data, one[o]->nbytes) != 0)
            fail_msg("%s [%lld x %lld ...] output %d differs between 1 and 4 threads", k->op, (long long)k->shape[0][0], (long long)k->shape[0][1], o);
        pp_tensor_free(one[o]);
        pp_tensor_free(many[o]);
    }
    pp_set_threads(1);
}

#define F PP_F32
static void test_kernels_elementwise(void **state) {
    (void)state;
    const kcase cases[] = {
        {"Add", "", 2, 1, {F, F}, {3, 1}, {{64, 128, 67}, {67}}, NULL, {0}, 0},
        {"Mul", "", 2, 1, {F, F}, {2, 2}, {{1001, 257}, {1001, 257}}, NULL, {0}, 0},
        {"Sub", "", 2, 1, {F, F}, {0, 2}, {{0}, {999, 301}}, NULL, {0}, 0},
        {"Div", "", 2, 1, {F, F}, {3, 3}, {{64, 1, 67}, {1, 130, 67}}, NULL, {0}, 0},
        {"Pow", "", 2, 1, {F, F}, {2, 1}, {{700, 130}, {130}}, NULL, {0}, 0},
        {"Add", "", 2, 1, {PP_F64, PP_F64}, {2, 2}, {{640, 1}, {1, 150}}, NULL, {0}, 0},
        {"Where", "", 3, 1, {PP_BOOL, F, F}, {2, 2, 1}, {{300, 333}, {300, 333}, {333}}, NULL, {0}, 0},
        {"Gelu", "", 1, 1, {F}, {1}, {{300001}}, NULL, {0}, 0},
        {"Exp", "", 1, 1, {F}, {2}, {{999, 131}}, NULL, {0}, 0},
        {"Tanh", "", 1, 1, {F}, {1}, {{200003}}, NULL, {0}, 0},
        {"Sigmoid", "", 1, 1, {PP_F64}, {1}, {{150001}}, NULL, {0}, 0},
        {"Relu", "", 1, 1, {F}, {1}, {{150001}}, NULL, {0}, 0},
        {"Clip", "", 1, 1, {F}, {1}, {{150001}}, NULL, {0}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        same_bits(&cases[i]);
}

static void test_kernels_rows(void **state) {
    (void)state;
    const kcase cases[] = {
        {"Softmax", "", 1, 1, {F}, {3}, {{8, 130, 131}}, NULL, {0}, 0},
        {"LogSoftmax", "", 1, 1, {F}, {2}, {{1000, 257}}, NULL, {0}, 0},
        {"Softmax", "", 1, 1, {PP_F64}, {2}, {{1000, 100}}, NULL, {0}, 0},
        {"LayerNormalization", "", 3, 3, {F, F, F}, {3, 1, 1}, {{8, 128, 385}, {385}, {385}}, NULL, {0}, 0},
        {"LayerNormalization", "", 2, 1, {PP_F64, PP_F64}, {2, 1}, {{1000, 100}, {100}}, NULL, {0}, 0},
        {"LayerNormalization", "", 3, 3, {F, F, F}, {2, 1, 1}, {{1000, 99}, {99}, {99}}, "stash_type=11", {0}, 0},
        {"ReduceSum", "", 1, 1, {F}, {3}, {{10, 100, 301}}, "axes=-1", {-1}, 1},
        {"ReduceMean", "", 1, 1, {F}, {2}, {{2000, 77}}, "axes=1", {1}, 1},
        {"ReduceMax", "", 1, 1, {PP_F64}, {2}, {{2000, 77}}, "axes=1", {1}, 1},
        {"ReduceSumSquare", "", 1, 1, {F}, {3}, {{30, 40, 301}}, "axes=-1", {2}, 1},
        {"Transpose", "", 1, 1, {F}, {3}, {{64, 128, 97}}, "perm=0", {0, 2, 1}, 3},
        {"Transpose", "", 1, 1, {PP_F64}, {3}, {{64, 128, 33}}, "perm=0", {2, 0, 1}, 3},
        {"Transpose", "", 1, 1, {F}, {4}, {{4, 64, 6, 64}}, "perm=0", {0, 2, 1, 3}, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) same_bits(&cases[i]);
}

static void test_kernels_grads(void **state) {
    (void)state;
    const kcase cases[] = {
        {"SoftmaxGrad", "pippin", 2, 1, {F, F}, {3, 3}, {{8, 128, 129}, {8, 128, 129}}, NULL, {0}, 0},
        {"LogSoftmaxGrad", "pippin", 2, 1, {F, F}, {2, 2}, {{1000, 65}, {1000, 65}}, NULL, {0}, 0},
        {"LayerNormGradInput", "pippin", 3, 1, {F, F, F}, {3, 3, 1}, {{8, 128, 385}, {8, 128, 385}, {385}}, NULL,
         {0}, 0},
        {"LayerNormGradWeight", "pippin", 2, 2, {F, F}, {3, 3}, {{8, 128, 385}, {8, 128, 385}}, NULL, {0}, 0},
        {"LayerNormGradWeight", "pippin", 2, 2, {F, F}, {2, 2}, {{5000, 20}, {5000, 20}}, NULL, {0}, 0},
        {"GeluGrad", "pippin", 2, 1, {F, F}, {2, 2}, {{1000, 301}, {1000, 301}}, NULL, {0}, 0},
        {"TanhGrad", "pippin", 2, 1, {F, F}, {1, 1}, {{100003}, {100003}}, NULL, {0}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) same_bits(&cases[i]);
}

/* GEMMs cut into panels over the pool (lib/ops/gemm.c): row and column
 * cuts, odd sizes, transposed operands, gemv shapes, f64 and a batch of
 * small products spread over the pool. */
static void test_kernels_gemm(void **state) {
    (void)state;
    const kcase cases[] = {
        {"MatMul", "", 2, 1, {F, F}, {2, 2}, {{64, 256}, {256, 768}}, NULL, {0}, 0},
        {"MatMul", "", 2, 1, {F, F}, {2, 2}, {{1000, 64}, {64, 100}}, NULL, {0}, 0},
        {"MatMul", "", 2, 1, {F, F}, {3, 2}, {{3, 197, 129}, {129, 301}}, NULL, {0}, 0},
        {"MatMul", "", 2, 1, {F, F}, {3, 2}, {{1, 37, 4096}, {4096, 600}}, NULL, {0}, 0},
        {"MatMul", "", 2, 1, {F, F}, {2, 2}, {{600, 4096}, {4096, 1}}, NULL, {0}, 0},
        {"MatMul", "", 2, 1, {F, F}, {2, 2}, {{25, 512}, {512, 192}}, NULL, {0}, 0},
        {"MatMul", "", 2, 1, {F, F}, {3, 3}, {{16, 64, 32}, {16, 32, 64}}, NULL, {0}, 0},
        {"MatMul", "", 2, 1, {F, F}, {4, 4}, {{2, 8, 100, 48}, {1, 8, 48, 100}}, NULL, {0}, 0},
        {"MatMul", "", 2, 1, {PP_F64, PP_F64}, {2, 2}, {{300, 200}, {200, 301}}, NULL, {0}, 0},
        {"Gemm", "", 2, 1, {F, F}, {2, 2}, {{200, 300}, {500, 300}}, "transB=1", {0}, 0},
        {"Gemm", "", 2, 1, {F, F}, {2, 2}, {{300, 200}, {300, 500}}, "transA=1", {0}, 0},
        {"Gemm", "", 2, 1, {F, F}, {2, 2}, {{300, 96}, {300, 5000}}, "transA=1", {0}, 0},
        {"Gemm", "", 3, 1, {F, F, F}, {2, 2, 1}, {{250, 130}, {130, 700}, {700}}, NULL, {0}, 0},
    };
    /* on an AVX-512 host the float products go to the packed kernel; at
     * level 1 to OpenBLAS's row panels (lib/ops/gemm.c), checked too */
    for (int isa = 2; isa >= 1; isa--) {
        pp_gemm_packed_limit_isa(isa);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) same_bits(&cases[i]);
    }
    pp_gemm_packed_limit_isa(2);
}

/* One case of test_gemm_packed: C = A op(W) (+ bias) by each kernel level
 * at 1 and 4 threads, against the sum in double and the fmaf chain. */
static void gemm_packed_case(int M, int N, int K, int tb, int with_bias, uint64_t *s) {
    float *A = malloc(sizeof(float) * (size_t)(M * K + 1)), *W = malloc(sizeof(float) * (size_t)(K * N + 1));
    float *P = malloc(sizeof(float) * (size_t)(pp_packed_b_floats(K, N) + 1));
    float *C1 = malloc(sizeof(float) * (size_t)(M * N)), *C4 = malloc(sizeof(float) * (size_t)(M * N));
    float *bias = malloc(sizeof(float) * (size_t)N), *chain = malloc(sizeof(float) * (size_t)(M * N));
    double *want = malloc(sizeof(double) * (size_t)(M * N)), *mag = malloc(sizeof(double) * (size_t)(M * N));
    for (int i = 0; i < M * K; i++) A[i] = (float)(tu_urand(s) * 2 - 1);
    for (int i = 0; i < K * N; i++) W[i] = (float)(tu_urand(s) * 2 - 1);
    for (int j = 0; j < N; j++) bias[j] = (float)j * 0.25f - 3.0f;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double w_sum = with_bias ? bias[j] : 0.0, m = fabs(w_sum);
            float c = 0.0f;
            for (int k = 0; k < K; k++) {
                float w = tb ? W[j * K + k] : W[k * N + j];
                double p = (double)A[i * K + k] * w;
                w_sum += p;
                m += fabs(p);
                c = fmaf(A[i * K + k], w, c);
            }
            want[i * N + j] = w_sum, mag[i * N + j] = m;
            chain[i * N + j] = with_bias ? bias[j] + c : c;
        }
    const float *bp = with_bias ? bias : NULL;
    pp_pack_b_f32(tb, K, N, W, tb ? K : N, P);
    for (int isa = 2; isa >= 0; isa--) {
        pp_gemm_packed_limit_isa(isa);
        for (int i = 0; i < M * N; i++) C1[i] = C4[i] = NAN; /* written, never read */
        pp_set_threads(1);
        pp_gemm_packed_f32(M, N, K, A, K, P, bp, C1, N);
        pp_set_threads(4);
        pp_gemm_packed_f32(M, N, K, A, K, P, bp, C4, N);
        pp_set_threads(1);
        if (memcmp(C1, C4, sizeof(float) * (size_t)(M * N)))
            fail_msg("packed GEMM %dx%dx%d tb %d bias %d isa %d differs between 1 and 4 threads", M, N, K, tb,
                     with_bias, isa);
        for (int i = 0; i < M * N; i++) {
            /* float's rounding bound for a chain of K: K u sum |p| */
            if (fabs(C1[i] - want[i]) > (K + 1) * 6e-8 * mag[i] + 1e-6)
                fail_msg("packed GEMM %dx%dx%d tb %d bias %d isa %d: C[%d,%d] = %g, want %g", M, N, K, tb, with_bias,
                         isa, i / N, i % N, (double)C1[i], want[i]);
            if (memcmp(&C1[i], &chain[i], sizeof(float)))
                fail_msg("packed GEMM %dx%dx%d tb %d bias %d isa %d: C[%d,%d] = %a, the fmaf chain gives %a", M, N,
                         K, tb, with_bias, isa, i / N, i % N, (double)C1[i], (double)chain[i]);
        }
    }
    pp_gemm_packed_limit_isa(2);
    free(A), free(W), free(P), free(C1), free(C4), free(bias), free(chain), free(want), free(mag);
}

/* The GEMM by a packed weight (lib/ops/gemm_packed.c): against sums in
 * double for row and column remainders (rows 1-25 against the 6-row AVX2
 * and 12-row AVX-512 kernels, columns against the 16-wide panels and the
 * AVX-512 kernel's pairs of them), K 0/1/odd and past one K block (1000),
 * with and without a bias, W given as [K, N] and as [N, K] (transposed);
 * bit for bit the plain chain of fmaf over k in order then + the bias, at
 * 1 and 4 threads, with each kernel the CPU has (plain C, AVX2, AVX-512). */
static void test_gemm_packed(void **state) {
    (void)state;
    const int Ms[] = {1, 5, 6, 11, 13, 25, 64, 203}, Ns[] = {1, 5, 16, 17, 48, 100, 200}, Ks[] = {0, 1, 7, 300, 1000};
    uint64_t s = 3;
    int64_t par = pp_pool_parallel_calls();
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
        for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
            for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++)
                for (int tb = 0; tb < 2; tb++)
                    for (int with_bias = 0; with_bias < 2; with_bias++)
                        gemm_packed_case(Ms[a], Ns[b], Ks[c], tb, with_bias, &s);
    assert_true(pp_pool_parallel_calls() > par); /* 64 x 200 x 300 went in pieces at 4 threads */
}

/* pp_gemm_packed_strided (the attention's P V): the first K rows of a
 * matrix packed with more give the bits of those rows packed alone. */
static void test_gemm_packed_strided(void **state) {
    (void)state;
    enum { M = 13, N = 40, KBIG = 50, K = 37 };
    uint64_t s = 5;
    float A[M * K], W[KBIG * N], Pbig[3 * KBIG * 16], P[3 * K * 16], C1[M * N], C2[M * N];
    for (int i = 0; i < M * K; i++) A[i] = (float)(tu_urand(&s) * 2 - 1);
    for (int i = 0; i < KBIG * N; i++) W[i] = (float)(tu_urand(&s) * 2 - 1);
    pp_pack_b_f32(0, KBIG, N, W, N, Pbig);
    pp_pack_b_f32(0, K, N, W, N, P);
    for (int isa = 2; isa >= 0; isa--) {
        pp_gemm_packed_limit_isa(isa);
        pp_gemm_packed_f32(M, N, K, A, K, P, NULL, C1, N);
        pp_gemm_packed_strided(M, N, K, A, K, Pbig, (int64_t)KBIG * 16, C2, N);
        assert_memory_equal(C1, C2, sizeof C1);
    }
    pp_gemm_packed_limit_isa(2);
}

/* pp_gemm_packed_residual (a fused Linear's residual Add): R added after
 * the bias in the tile's registers gives the bits of the product stored
 * first and then Add's y + r, at every kernel level and at 1 and 4
 * threads, for row and column remainders. */
static void test_gemm_packed_residual(void **state) {
    (void)state;
    enum { M = 25, N = 53, K = 70 };
    uint64_t s = 7;
    float A[M * K], W[K * N], P[4 * K * 16], bias[N], R[M * N], want[M * N], got[M * N];
    for (int i = 0; i < M * K; i++) A[i] = (float)(tu_urand(&s) * 2 - 1);
    for (int i = 0; i < K * N; i++) W[i] = (float)(tu_urand(&s) * 2 - 1);
    for (int i = 0; i < N; i++) bias[i] = (float)(tu_urand(&s) * 2 - 1);
    for (int i = 0; i < M * N; i++) R[i] = (float)(tu_urand(&s) * 8 - 4);
    pp_pack_b_f32(0, K, N, W, N, P);
    for (int isa = 2; isa >= 0; isa--)
        for (int t = 1; t <= 4; t += 3) {
            pp_gemm_packed_limit_isa(isa);
            pp_set_threads(t);
            pp_gemm_packed_f32(M, N, K, A, K, P, bias, want, N);
            for (int i = 0; i < M * N; i++) want[i] += R[i];
            pp_gemm_packed_residual(M, N, K, A, K, P, bias, R, got, N);
            assert_memory_equal(want, got, sizeof got);
        }
    pp_set_threads(1);
    pp_gemm_packed_limit_isa(2);
}

/* One case of test_gemm_any: pp_gemm_f32 (AVX-512 packed kernel on an
 * AVX-512 host, the BLAS elsewhere) with transposes, padded leading dims
 * and beta 0 or 1, at 1 and 4 threads. */
static void gemm_any_case(int ta, int tb, int M, int N, int K, float beta, uint64_t *s) {
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    int64_t na = (int64_t)(ta ? K : M) * lda, nb = (int64_t)(tb ? N : K) * ldb, nc = (int64_t)M * ldc;
    float *A = malloc(sizeof(float) * (size_t)na), *B = malloc(sizeof(float) * (size_t)nb);
    float *C0 = malloc(sizeof(float) * (size_t)nc), *C1 = malloc(sizeof(float) * (size_t)nc);
    float *C4 = malloc(sizeof(float) * (size_t)nc);
    for (int64_t i = 0; i < na; i++) A[i] = (float)(tu_urand(s) * 2 - 1);
    for (int64_t i = 0; i < nb; i++) B[i] = (float)(tu_urand(s) * 2 - 1);
    /* beta 0 must not read C: NaN there would show */
    for (int64_t i = 0; i < nc; i++) C0[i] = beta == 0.0f && i % ldc < N ? NAN : (float)(tu_urand(s) * 4 - 2);
    memcpy(C1, C0, sizeof(float) * (size_t)nc);
    memcpy(C4, C0, sizeof(float) * (size_t)nc);
    pp_set_threads(1);
    pp_gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C1, ldc);
    pp_set_threads(4);
    pp_gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C4, ldc);
    pp_set_threads(1);
    if (memcmp(C1, C4, sizeof(float) * (size_t)nc))
        fail_msg("GEMM ta %d tb %d %dx%dx%d beta %g differs between 1 and 4 threads", ta, tb, M, N, K, (double)beta);
    if (ta) { /* A^T packed per row block or read in place: the same bits */
        float *Cin = malloc(sizeof(float) * (size_t)nc);
        memcpy(Cin, C0, sizeof(float) * (size_t)nc);
        int was = pp_gemm_packed_test_pack_a(0);
        pp_gemm_f32(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, Cin, ldc);
        pp_gemm_packed_test_pack_a(was);
        if (memcmp(C1, Cin, sizeof(float) * (size_t)nc))
            fail_msg("GEMM ta 1 tb %d %dx%dx%d beta %g: A^T packed and read in place differ", tb, M, N, K, (double)beta);
        free(Cin);
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            int64_t at = (int64_t)i * ldc + j;
            if (j >= N) { /* the padding is not written */
                if (memcmp(&C1[at], &C0[at], sizeof(float))) fail_msg("GEMM wrote C's padding at [%d,%d]", i, j);
                continue;
            }
            double want = beta == 0.0f ? 0.0 : C0[at], mag = fabs(want);
            for (int k = 0; k < K; k++) {
                double p = (double)(ta ? A[(int64_t)k * lda + i] : A[(int64_t)i * lda + k]) *
                           (tb ? B[(int64_t)j * ldb + k] : B[(int64_t)k * ldb + j]);
                want += p, mag += fabs(p);
            }
            if (fabs(C1[at] - want) > (K + 2) * 6e-8 * mag + 1e-6)
                fail_msg("GEMM ta %d tb %d %dx%dx%d beta %g: C[%d,%d] = %g, want %g", ta, tb, M, N, K, (double)beta,
                         i, j, (double)C1[at], want);
        }
    free(A), free(B), free(C0), free(C1), free(C4);
}

/* pp_gemm_f32 through the packed kernel (pp_gemm_packed_any, on hosts with
 * AVX-512: the training GEMMs' forward, dX and dW): every transpose, beta 0
 * and 1 (a gradient accumulated across microbatches), padded leading dims,
 * row and column remainders, K past one block of scratch (40000: the
 * BLAS), A in several row blocks, against double sums and the same bits at
 * 1 and 4 threads. */
static void test_gemm_any(void **state) {
    (void)state;
    const int Ms[] = {2, 13, 37, 130}, Ns[] = {16, 17, 65, 300}, Ks[] = {8, 16, 33, 700};
    uint64_t s = 11;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
                for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
                    for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++)
                        for (int beta = 0; beta < 2; beta++) gemm_any_case(ta, tb, Ms[a], Ns[b], Ks[c], (float)beta, &s);
    gemm_any_case(1, 0, 40, 20, 40000, 1.0f, &s);
    /* a block of columns at a time: K 20000 packs 3 panels (2 per block) */
    gemm_any_case(0, 1, 30, 48, 20000, 0.0f, &s);
    /* A of 300 x 2000 floats: two row blocks (2 MiB of A each at most) */
    gemm_any_case(1, 0, 300, 40, 2000, 1.0f, &s);
    gemm_any_case(0, 1, 300, 40, 2000, 0.0f, &s);
    /* A^T and B^T: 3 blocks of columns (6, 6, 1 panels) over 2 row blocks;
     * each thread's packed A^T is reused across the blocks where the rows
     * are cut alike (the last block, one panel, cuts them otherwise) */
    gemm_any_case(1, 1, 100, 200, 10000, 1.0f, &s);
}

/* pp_broadcast_to (Expand and the gradient helpers use it). */
static void test_broadcast_to_same_bits(void **state) {
    (void)state;
    seed = 7;
    pp_tensor *src = rand_t(PP_F32, 3, SHAPE(64, 1, 97)), *a, *b;
    pp_set_threads(1);
    TU_OK(pp_broadcast_to(src, 3, SHAPE(64, 130, 97), &a));
    pp_set_threads(4);
    int64_t before = pp_pool_parallel_calls();
    TU_OK(pp_broadcast_to(src, 3, SHAPE(64, 130, 97), &b));
    assert_true(pp_pool_parallel_calls() > before);
    pp_set_threads(1);
    assert_memory_equal(a->data, b->data, a->nbytes);
    const float *s = src->data, *d = a->data;
    for (int64_t i = 0; i < 64; i++)
        for (int64_t j = 0; j < 130; j++)
            for (int64_t k = 0; k < 97; k++) assert_true(d[(i * 130 + j) * 97 + k] == s[i * 97 + k]);
    pp_tensor_free(src);
    pp_tensor_free(a);
    pp_tensor_free(b);
}

/* Two threads (ranks of one process) run kernels while both use the pool:
 * the one that finds it busy runs alone, with the same bits. */
typedef struct rank_job {
    const kcase *k;
    pp_tensor *want;
    int ok;
} rank_job;

static void *rank_main(void *arg) {
    rank_job *r = arg;
    r->ok = 1;
    for (int rep = 0; rep < 5; rep++) {
        pp_tensor *ins[4] = {NULL}, *out = NULL;
        uint64_t s = 99;
        for (int i = 0; i < r->k->n_in; i++) {
            pp_tensor *t;
            if (pp_tensor_empty(PP_F32, r->k->nd[i], r->k->shape[i], &t) != PP_OK) return NULL;
            for (int64_t e = 0; e < pp_tensor_numel(t); e++) ((float *)t->data)[e] = (float)(tu_urand(&s) * 6 - 3);
            ins[i] = t;
        }
        tu_node t;
        tu_node_init_dom(&t, r->k->op, r->k->domain, r->k->n_in, ins, 1, NULL);
        if (tu_node_run(&t, &out) != PP_OK || out->nbytes != r->want->nbytes ||
            memcmp(out->data, r->want->data, out->nbytes) != 0)
            r->ok = 0;
        pp_tensor_free(out);
        tu_node_free(&t);
    }
    return NULL;
}

static void test_kernels_from_rank_threads(void **state) {
    (void)state;
    const kcase k = {"Softmax", "", 1, 1, {F}, {2}, {{2000, 129}}, NULL, {0}, 0};
    pp_tensor *want = NULL;
    /* the serial result, from the same inputs rank_main makes */
    pp_set_threads(1);
    uint64_t s = 99;
    pp_tensor *x;
    TU_OK(pp_tensor_empty(PP_F32, 2, k.shape[0], &x));
    for (int64_t e = 0; e < pp_tensor_numel(x); e++) ((float *)x->data)[e] = (float)(tu_urand(&s) * 6 - 3);
    tu_node t;
    tu_node_init(&t, "Softmax", 1, (pp_tensor *[]){x}, 1, NULL);
    want = tu_node_run_one(&t);
    tu_node_free(&t);
    pp_set_threads(2);
    rank_job jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (rank_job){&k, want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &jobs[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        assert_true(jobs[i].ok);
    }
    pp_tensor_free(want);
    pp_set_threads(1);
}

/* Work too small to pay for a second thread stays on the caller's thread
 * however many the pool has (a wake-up costs more than the half it saves:
 * the example GPT's 64-token request got slower with a lent thread); at
 * PP_PAR_MIN_MACS a piece, it splits. */
static void test_small_work_stays_on_one_thread(void **state) {
    (void)state;
    enum { M = 64, K = 64, N = 192, BIG_N = 1024 };
    float *A = calloc((size_t)M * K, sizeof(float)), *W = calloc((size_t)K * BIG_N, sizeof(float));
    float *P = calloc((size_t)pp_packed_b_floats(K, BIG_N), sizeof(float)), *C = calloc((size_t)4 * M * BIG_N, sizeof(float));
    assert_true(A && W && P && C);
    pp_set_threads(4);
    for (int isa = 2; isa >= 1; isa--) { /* the packed kernel (AVX-512 hosts), then OpenBLAS's panels */
        pp_gemm_packed_limit_isa(isa);
        int64_t before = pp_pool_parallel_calls();
        pp_gemm_f32(0, 0, M, N, K, 1.0f, A, K, W, N, 0.0f, C, N); /* 0.79M multiply-adds */
        pp_gemm_f32(0, 1, M, N, K, 1.0f, A, K, W, K, 0.0f, C, N);
        pp_pack_b_f32(1, K, N, W, K, P);
        pp_gemm_packed_f32(M, N, K, A, K, P, NULL, C, N);
        assert_int_equal(pp_pool_parallel_calls(), before);
        pp_gemm_f32(0, 0, 4 * M, BIG_N, K, 1.0f, W, K, W, BIG_N, 0.0f, C, BIG_N); /* 16.8M: four pieces */
        assert_true(pp_pool_parallel_calls() > before);
    }
    pp_gemm_packed_limit_isa(2);
    pp_set_threads(1);
    assert_int_equal(pp_grain_macs(PP_PAR_MIN_MACS), 1);
    assert_int_equal(pp_grain_macs(PP_PAR_MIN_MACS / 4), 4);
    assert_int_equal(pp_grain_macs(PP_PAR_MIN_MACS / 4 + 1), 4);
    assert_int_equal(pp_grain_macs(0), 1);
    free(A), free(W), free(P), free(C);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_covers_once),
        cmocka_unit_test(test_pool_elems_aligned),
        cmocka_unit_test(test_pool_nested),
        cmocka_unit_test(test_pool_concurrent_callers),
        cmocka_unit_test(test_default_threads),
        cmocka_unit_test(test_kernels_elementwise),
        cmocka_unit_test(test_kernels_rows),
        cmocka_unit_test(test_kernels_grads),
        cmocka_unit_test(test_kernels_gemm),
        cmocka_unit_test(test_gemm_packed),
        cmocka_unit_test(test_gemm_packed_strided),
        cmocka_unit_test(test_gemm_packed_residual),
        cmocka_unit_test(test_gemm_any),
        cmocka_unit_test(test_small_work_stays_on_one_thread),
        cmocka_unit_test(test_broadcast_to_same_bits),
        cmocka_unit_test(test_kernels_from_rank_threads),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
