/* MatMul and Gemm (lib/ops/matmul.c): hand-computed products, numpy
 * promotion and batch broadcasting, checks against a naive triple loop at
 * random sizes (gemv and gemm paths), integer and half dtypes, errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"
/* ------------------------------------------------------------- helpers */

static void expect(pp_tensor *got, pp_tensor *want, double rtol, double atol, const char *what) {
    tu_assert_close(got, want, rtol, atol, what);
    pp_tensor_free(want);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static pp_tensor *rand_tensor(pp_dtype dt, int nd, const int64_t *shape) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(dt, nd, shape, &t));
    int64_t n = pp_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        double v = tu_urand(&rng_state);
        if (!pp_dtype_is_float(dt)) v = floor(v * 10);
        pp_tensor_set_f64(t, i, v);
    }
    return t;
}

/* numpy matmul in double over broadcast batch dims, from the definition. */
static pp_tensor *naive_matmul(const pp_tensor *a, const pp_tensor *b, pp_dtype out_dt) {
    int ra = a->ndim, rb = b->ndim;
    int64_t M = ra == 1 ? 1 : a->shape[ra - 2], K = a->shape[ra - 1];
    int64_t N = rb == 1 ? 1 : b->shape[rb - 1];
    int nba = ra == 1 ? 0 : ra - 2, nbb = rb == 1 ? 0 : rb - 2, nb = nba > nbb ? nba : nbb;
    int64_t bs[PP_MAX_DIMS], os[PP_MAX_DIMS];
    int od = 0;
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - nba), ib = i - (nb - nbb);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        bs[i] = da > db ? da : db;
        os[od++] = bs[i];
    }
    if (ra != 1) os[od++] = M;
    if (rb != 1) os[od++] = N;
    pp_tensor *y;
    TU_OK(pp_tensor_new(out_dt, od, os, &y));
    int64_t nbatch = 1;
    for (int i = 0; i < nb; i++) nbatch *= bs[i];
    for (int64_t t = 0; t < nbatch; t++) {
        /* batch index -> offsets in a and b */
        int64_t rem = t, aoff = 0, boff = 0, astride = M * K, bstride = K * N;
        for (int i = nb - 1; i >= 0; i--) {
            int64_t idx = rem % bs[i];
            rem /= bs[i];
            int ia = i - (nb - nba), ib = i - (nb - nbb);
            int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
            if (da != 1) aoff += idx * astride;
            if (db != 1) boff += idx * bstride;
            astride *= da;
            bstride *= db;
        }
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += pp_tensor_get_f64(a, aoff + m * K + k) * pp_tensor_get_f64(b, boff + k * N + n);
                pp_tensor_set_f64(y, t * M * N + m * N + n, acc);
            }
    }
    return y;
}

static void check_matmul(pp_dtype dt, int na, const int64_t *sa, int nb, const int64_t *sb,
                         double rtol, double atol) {
    pp_tensor *ins[2] = {rand_tensor(dt, na, sa), rand_tensor(dt, nb, sb)};
    pp_tensor *want = naive_matmul(ins[0], ins[1], dt);
    tu_node t;
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    char what[256], a[64], b[64];
    snprintf(what, sizeof what, "%s %s x %s", pp_dtype_name(dt), pp_shape_str(na, sa, a, sizeof a),
             pp_shape_str(nb, sb, b, sizeof b));
    expect(y, want, rtol, atol, what);
    pp_tensor_free(y);
    tu_node_free(&t);
}

/* -------------------------------------------------------------- MatMul */

static void test_matmul_2d(void **state) {
    (void)state;
    pp_tensor *ins[2] = {F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), F32(2, SHAPE(3, 2), 7, 8, 9, 10, 11, 12)};
    tu_node t;
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 2), 58, 64, 139, 154), 0, 0, "2x3 * 3x2");
    pp_tensor_free(y);
    tu_node_free(&t);
}

static void test_matmul_vectors(void **state) {
    (void)state;
    tu_node t;
    /* 1-D x 2-D: row vector, result drops M */
    pp_tensor *ins[2] = {F32(1, SHAPE(3), 1, 2, 3), F32(2, SHAPE(3, 2), 7, 8, 9, 10, 11, 12)};
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(2), 58, 64), 0, 0, "vec x mat");
    pp_tensor_free(y);
    tu_node_free(&t);
    /* 2-D x 1-D: column vector, result drops N */
    ins[0] = F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    ins[1] = F32(1, SHAPE(3), 1, 0, -1);
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(2), -2, -2), 0, 0, "mat x vec");
    pp_tensor_free(y);
    tu_node_free(&t);
    /* 1-D x 1-D: scalar */
    ins[0] = F32(1, SHAPE(3), 1, 2, 3);
    ins[1] = F32(1, SHAPE(3), 4, 5, 6);
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, tu_f32(0, NULL, (const float[]){32}), 0, 0, "dot");
    pp_tensor_free(y);
    tu_node_free(&t);
    /* batched x 1-D */
    ins[0] = F32(3, SHAPE(2, 1, 2), 1, 2, 3, 4);
    ins[1] = F32(1, SHAPE(2), 1, 1);
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 1), 3, 7), 0, 0, "batch x vec");
    pp_tensor_free(y);
    tu_node_free(&t);
    /* 1-D x batched */
    ins[0] = F32(1, SHAPE(2), 1, -1);
    ins[1] = F32(3, SHAPE(2, 2, 1), 5, 3, 4, 9);
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 1), 2, -5), 0, 0, "vec x batch");
    pp_tensor_free(y);
    tu_node_free(&t);
}

static void test_matmul_batched(void **state) {
    (void)state;
    /* [2,2,3] x [3,2]: batch folded into M */
    pp_tensor *ins[2] = {F32(3, SHAPE(2, 2, 3), 1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 1, 0),
                         F32(2, SHAPE(3, 2), 7, 8, 9, 10, 11, 12)};
    tu_node t;
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(3, SHAPE(2, 2, 2), 58, 64, 139, 154, 7, 8, 9, 10), 0, 0, "folded");
    pp_tensor_free(y);
    tu_node_free(&t);

    check_matmul(PP_F32, 3, SHAPE(4, 5, 6), 2, SHAPE(6, 7), 1e-5, 1e-5);       /* fold */
    check_matmul(PP_F32, 3, SHAPE(4, 5, 6), 3, SHAPE(1, 6, 7), 1e-5, 1e-5);    /* B batch 1 */
    check_matmul(PP_F32, 2, SHAPE(4, 5), 4, SHAPE(1, 1, 5, 3), 1e-5, 1e-5);    /* B rank up */
    check_matmul(PP_F32, 4, SHAPE(2, 3, 8, 5), 4, SHAPE(2, 3, 5, 8), 1e-5, 1e-5); /* attention */
    check_matmul(PP_F32, 4, SHAPE(2, 1, 3, 4), 3, SHAPE(5, 4, 2), 1e-5, 1e-5); /* broadcast */
    check_matmul(PP_F32, 2, SHAPE(3, 4), 3, SHAPE(5, 4, 2), 1e-5, 1e-5);       /* A shared */
    check_matmul(PP_F32, 3, SHAPE(3, 1, 4), 3, SHAPE(3, 4, 1), 1e-5, 1e-5);    /* gemv paths */
    check_matmul(PP_F64, 4, SHAPE(3, 1, 6, 5), 3, SHAPE(4, 5, 2), 1e-12, 1e-12);
    check_matmul(PP_I64, 3, SHAPE(2, 3, 4), 3, SHAPE(1, 4, 5), 0, 0);
    check_matmul(PP_I32, 2, SHAPE(3, 4), 3, SHAPE(2, 4, 5), 0, 0);
}

/* Random sizes against the naive triple loop, both BLAS paths (gemv when a
 * side is 1) and f32/f64. */
static void test_matmul_random(void **state) {
    (void)state;
    for (int it = 0; it < 40; it++) {
        int64_t M = 1 + (int64_t)((tu_urand(&rng_state) + 1) * 40),
                K = 1 + (int64_t)((tu_urand(&rng_state) + 1) * 40),
                N = 1 + (int64_t)((tu_urand(&rng_state) + 1) * 40);
        if (it % 5 == 1) M = 1;
        if (it % 5 == 2) N = 1;
        pp_dtype dt = it % 2 ? PP_F64 : PP_F32;
        double tol = dt == PP_F32 ? 1e-4 : 1e-12;
        check_matmul(dt, 2, SHAPE(M, K), 2, SHAPE(K, N), tol, tol);
        int64_t B = 1 + it % 3;
        check_matmul(dt, 3, SHAPE(B, M, K), 2, SHAPE(K, N), tol, tol);
        check_matmul(dt, 3, SHAPE(B, M, K), 3, SHAPE(B, K, N), tol, tol);
    }
}

static void test_matmul_half_int_empty(void **state) {
    (void)state;
    check_matmul(PP_F16, 3, SHAPE(2, 3, 4), 2, SHAPE(4, 5), 1e-2, 1e-2);
    check_matmul(PP_BF16, 2, SHAPE(3, 4), 2, SHAPE(4, 5), 2e-2, 2e-2);
    /* integer wrap-around is defined */
    pp_tensor *ins[2] = {I64(2, SHAPE(1, 2), INT64_MAX, 1), I64(2, SHAPE(2, 1), 2, 2)};
    tu_node t;
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    assert_int_equal(((int64_t *)y->data)[0], 0);
    pp_tensor_free(y);
    tu_node_free(&t);
    /* K = 0: zeros; M = 0: empty */
    ins[0] = tu_f32(2, SHAPE(2, 0), NULL);
    ins[1] = tu_f32(2, SHAPE(0, 3), NULL);
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 3), 0, 0, 0, 0, 0, 0), 0, 0, "K=0");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = tu_f32(3, SHAPE(2, 0, 4), NULL);
    ins[1] = F32(2, SHAPE(4, 1), 1, 2, 3, 4);
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    assert_int_equal(y->ndim, 3);
    assert_int_equal(pp_tensor_numel(y), 0);
    pp_tensor_free(y);
    tu_node_free(&t);
}

static void test_matmul_errors(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[2] = {F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), F32(2, SHAPE(2, 2), 1, 2, 3, 4)};
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    assert_non_null(strstr(pp_last_error(), "[2,3]"));
    tu_node_free(&t);
    ins[0] = F32(2, SHAPE(1, 1), 1);
    ins[1] = I64(2, SHAPE(1, 1), 1);
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = tu_f32(0, NULL, (const float[]){1});
    ins[1] = F32(1, SHAPE(1), 1);
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = tu_f32(3, SHAPE(2, 1, 1), (const float[]){1, 2});
    ins[1] = tu_f32(3, SHAPE(3, 1, 1), (const float[]){1, 2, 3});
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    TU_OK(pp_tensor_new(PP_BOOL, 2, SHAPE(1, 1), &ins[0]));
    TU_OK(pp_tensor_new(PP_BOOL, 2, SHAPE(1, 1), &ins[1]));
    tu_node_init(&t, "MatMul", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, NULL);
    tu_node_free(&t);
}

/* ---------------------------------------------------------------- Gemm */

/* alpha * op(A) op(B) + beta * C in double. */
static pp_tensor *naive_gemm(const pp_tensor *a, const pp_tensor *b, const pp_tensor *c, int ta,
                             int tb, double alpha, double beta) {
    int64_t M = ta ? a->shape[1] : a->shape[0], K = ta ? a->shape[0] : a->shape[1];
    int64_t N = tb ? b->shape[0] : b->shape[1];
    pp_tensor *y;
    TU_OK(pp_tensor_new(a->dtype, 2, SHAPE(M, N), &y));
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += pp_tensor_get_f64(a, ta ? k * M + m : m * K + k) *
                       pp_tensor_get_f64(b, tb ? n * K + k : k * N + n);
            double cv = 0;
            if (c) {
                int64_t cm = c->ndim == 2 ? c->shape[0] : 1, cn = c->ndim ? c->shape[c->ndim - 1] : 1;
                cv = pp_tensor_get_f64(c, (cm == 1 ? 0 : m) * cn + (cn == 1 ? 0 : n));
            }
            pp_tensor_set_f64(y, m * N + n, alpha * acc + beta * cv);
        }
    return y;
}

static void check_gemm(pp_dtype dt, int64_t M, int64_t N, int64_t K, int ta, int tb, double alpha,
                       double beta, int cnd, const int64_t *cshape) {
    pp_tensor *ins[3] = {rand_tensor(dt, 2, ta ? SHAPE(K, M) : SHAPE(M, K)),
                         rand_tensor(dt, 2, tb ? SHAPE(N, K) : SHAPE(K, N)),
                         cnd >= 0 ? rand_tensor(dt, cnd, cshape) : NULL};
    pp_tensor *want = naive_gemm(ins[0], ins[1], ins[2], ta, tb, alpha, beta);
    tu_node t;
    tu_node_init(&t, "Gemm", cnd >= 0 ? 3 : 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "transA", ta));
    TU_OK(pp_node_set_int(t.g, t.node, "transB", tb));
    TU_OK(pp_node_set_float(t.g, t.node, "alpha", (float)alpha));
    TU_OK(pp_node_set_float(t.g, t.node, "beta", (float)beta));
    pp_tensor *y = tu_node_run_one(&t);
    char what[256];
    snprintf(what, sizeof what, "gemm %s M%lld N%lld K%lld tA%d tB%d alpha %g beta %g C rank %d",
             pp_dtype_name(dt), (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta, cnd);
    double tol = dt == PP_F32 ? 1e-4 : dt == PP_F64 ? 1e-12 : 0;
    expect(y, want, tol, tol, what);
    pp_tensor_free(y);
    tu_node_free(&t);
}

static void test_gemm(void **state) {
    (void)state;
    /* hand: [[1,2],[3,4]]^T * [[1,0],[0,1]] * 2 + [10,20] */
    pp_tensor *ins[3] = {F32(2, SHAPE(2, 2), 1, 2, 3, 4), F32(2, SHAPE(2, 2), 1, 0, 0, 1),
                         F32(1, SHAPE(2), 10, 20)};
    tu_node t;
    tu_node_init(&t, "Gemm", 3, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "transA", 1));
    TU_OK(pp_node_set_float(t.g, t.node, "alpha", 2));
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 2), 12, 26, 14, 28), 0, 0, "hand");
    pp_tensor_free(y);
    tu_node_free(&t);

    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(PP_F32, 7, 5, 3, ta, tb, 1, 1, -1, NULL);
            check_gemm(PP_F32, 7, 5, 3, ta, tb, 0.5, 2, 0, NULL);
            check_gemm(PP_F32, 7, 5, 3, ta, tb, 1, 1, 1, SHAPE(5));
            check_gemm(PP_F32, 7, 5, 3, ta, tb, 1, -1, 1, SHAPE(1));
            check_gemm(PP_F32, 7, 5, 3, ta, tb, 1, 1, 2, SHAPE(7, 1));
            check_gemm(PP_F32, 7, 5, 3, ta, tb, 1, 1, 2, SHAPE(1, 5));
            check_gemm(PP_F32, 7, 5, 3, ta, tb, 1.5, 0.25, 2, SHAPE(7, 5));
            check_gemm(PP_F32, 1, 5, 3, ta, tb, 1, 1, 1, SHAPE(5));  /* gemv, M = 1 */
            check_gemm(PP_F32, 7, 1, 3, ta, tb, 1, 1, 2, SHAPE(7, 1)); /* gemv, N = 1 */
            check_gemm(PP_F64, 6, 4, 9, ta, tb, 2, 3, 2, SHAPE(6, 4));
            check_gemm(PP_I64, 6, 4, 9, ta, tb, 1, 1, 1, SHAPE(4));
            check_gemm(PP_I32, 6, 4, 9, ta, tb, 2, 3, 2, SHAPE(6, 4));
        }
    check_gemm(PP_F32, 64, 48, 80, 0, 1, 1, 1, 1, SHAPE(48)); /* a Linear layer */
}

static void test_gemm_errors(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[3] = {F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), F32(2, SHAPE(3, 2), 1, 2, 3, 4, 5, 6),
                         F32(1, SHAPE(3), 1, 2, 3)};
    tu_node_init(&t, "Gemm", 3, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL); /* C [3] vs [2,2] */
    tu_node_free(&t);
    ins[0] = F32(1, SHAPE(3), 1, 2, 3);
    ins[1] = F32(2, SHAPE(3, 2), 1, 2, 3, 4, 5, 6);
    tu_node_init(&t, "Gemm", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL); /* A not 2-D */
    tu_node_free(&t);
    ins[0] = F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    ins[1] = F32(2, SHAPE(3, 2), 1, 2, 3, 4, 5, 6);
    tu_node_init(&t, "Gemm", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "transB", 1)); /* [2,3] x [2,3] */
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    ins[1] = F32(2, SHAPE(3, 2), 1, 2, 3, 4, 5, 6);
    tu_node_init(&t, "Gemm", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "transA", 2));
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "'n0'"));
    tu_node_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_2d),
        cmocka_unit_test(test_matmul_vectors),
        cmocka_unit_test(test_matmul_batched),
        cmocka_unit_test(test_matmul_random),
        cmocka_unit_test(test_matmul_half_int_empty),
        cmocka_unit_test(test_matmul_errors),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_errors),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
