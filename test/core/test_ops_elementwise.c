/* Elementwise ops (lib/ops/elementwise.c) and the broadcasting plans
 * (lib/ops/broadcast.c): hand-computed values, every broadcast row form,
 * random shapes against a naive reference, integer wrap and division,
 * 0-sized and 0-d tensors, errors that name the node. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"
#include "broadcast.h"
#include "op.h"
/* ------------------------------------------------------------- helpers */

static pp_tensor *bools(int nd, const int64_t *shape, const uint8_t *vals) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_BOOL, nd, shape, &t));
    if (t->nbytes) memcpy(t->data, vals, t->nbytes);
    return t;
}
#define B(nd, shape, ...) bools(nd, shape, (const uint8_t[]){__VA_ARGS__})

/* Runs op on the inputs (owned) and returns its only output. */
static pp_tensor *run_op(const char *op, int n_in, pp_tensor *const *ins) {
    tu_node t;
    tu_node_init(&t, op, n_in, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    tu_node_free(&t);
    return y;
}
#define RUN(op, ...) run_op(op, sizeof((pp_tensor *[]){__VA_ARGS__}) / sizeof(pp_tensor *), \
                            (pp_tensor *[]){__VA_ARGS__})

/* Bit-exact comparison (integers, bools). */
static void expect_exact(pp_tensor *got, pp_tensor *want, const char *what) {
    tu_expect(got, want, 0, 0, what);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static pp_tensor *rand_f32(int nd, const int64_t *shape) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    float *d = t->data;
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) d[i] = (float)(tu_urand(&rng_state) * 4);
    return t;
}

/* ------------------------------------------------------ broadcast plans */

static void test_bcast_plan(void **state) {
    (void)state;
    pp_bcast b;
    const int64_t *s1[2] = {SHAPE(2, 3, 4), SHAPE(4)};
    TU_OK(pp_bcast_init_shapes(&b, 2, (const int[]){3, 1}, s1));
    assert_int_equal(b.ndim, 3);
    assert_int_equal(b.numel, 24);
    assert_int_equal(b.cdim, 2); /* [6, 4]: the bias case is one loop per row */
    assert_int_equal(b.inner, 4);
    assert_int_equal(b.rows, 6);
    assert_int_equal(b.inner_stride[0], 1);
    assert_int_equal(b.inner_stride[1], 1);
    assert_int_equal(b.cstride[1][0], 0);

    const int64_t *s2[2] = {SHAPE(5, 6), SHAPE(5, 6)};
    TU_OK(pp_bcast_init_shapes(&b, 2, (const int[]){2, 2}, s2));
    assert_int_equal(b.cdim, 1);
    assert_int_equal(b.rows, 1);
    assert_int_equal(b.inner, 30);

    const int64_t *s3[2] = {SHAPE(5, 6), SHAPE(1)};
    TU_OK(pp_bcast_init_shapes(&b, 2, (const int[]){2, 0}, s3));
    assert_int_equal(b.cdim, 1);
    assert_int_equal(b.inner, 30);
    assert_int_equal(b.inner_stride[1], 0);

    /* [2,3,1] x [3,4]: inner row of 4, operand 0 broadcast along it. */
    const int64_t *s4[2] = {SHAPE(2, 3, 1), SHAPE(3, 4)};
    TU_OK(pp_bcast_init_shapes(&b, 2, (const int[]){3, 2}, s4));
    assert_int_equal(b.ndim, 3);
    assert_int_equal(b.shape[2], 4);
    assert_int_equal(b.inner, 4);
    assert_int_equal(b.inner_stride[0], 0);
    assert_int_equal(b.inner_stride[1], 1);

    int nd;
    int64_t out[PP_MAX_DIMS];
    assert_int_equal(pp_broadcast_shape(2, SHAPE(2, 3), 1, SHAPE(4), &nd, out), PP_ERR_SHAPE);
    assert_non_null(strstr(pp_last_error(), "shapes [2,3] and [4] do not broadcast"));
    TU_OK(pp_broadcast_shape(2, SHAPE(0, 1), 1, SHAPE(3), &nd, out));
    assert_int_equal(nd, 2);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 3);
    assert_int_equal(pp_broadcast_shape(1, SHAPE(0), 1, SHAPE(3), &nd, out), PP_ERR_SHAPE);
}

static void test_broadcast_to(void **state) {
    (void)state;
    pp_tensor *src = F32(2, SHAPE(2, 1), 1, 2), *y;
    TU_OK(pp_broadcast_to(src, 3, SHAPE(2, 2, 3), &y));
    tu_expect(y, F32(3, SHAPE(2, 2, 3), 1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2), 0, 0, "broadcast_to");
    assert_int_equal(pp_broadcast_to(src, 1, SHAPE(2), &y), PP_ERR_SHAPE);
    pp_tensor_free(src);
}

/* ---------------------------------------------------- binary arithmetic */

static void test_add_same_shape(void **state) {
    (void)state;
    /* 37 elements: two full vector blocks and a tail. */
    float a[37], b[37], want[37];
    for (int i = 0; i < 37; i++) {
        a[i] = (float)i * 0.5f;
        b[i] = 3.0f - (float)i;
        want[i] = a[i] + b[i];
    }
    pp_tensor *y = RUN("Add", tu_f32(1, SHAPE(37), a), tu_f32(1, SHAPE(37), b));
    tu_expect(y, tu_f32(1, SHAPE(37), want), 0, 0, "Add");
}

static void test_arith_hand(void **state) {
    (void)state;
    const int64_t *s = SHAPE(2, 2);
    tu_expect(RUN("Sub", F32(2, s, 1, 2, 3, 4), F32(2, s, 4, 3, 2, 1)), F32(2, s, -3, -1, 1, 3), 0, 0,
              "Sub");
    tu_expect(RUN("Mul", F32(2, s, 1, 2, 3, 4), F32(2, s, 4, 3, 2, 1)), F32(2, s, 4, 6, 6, 4), 0, 0,
              "Mul");
    tu_expect(RUN("Div", F32(2, s, 1, 2, 3, 4), F32(2, s, 4, 4, 2, 1)),
              F32(2, s, 0.25f, 0.5f, 1.5f, 4), 0, 0, "Div");
    tu_expect(RUN("Add", T(PP_F64, 2, s, 1, 2, 3, 4), T(PP_F64, 1, SHAPE(2), 0.5, 0.25)),
              T(PP_F64, 2, s, 1.5, 2.25, 3.5, 4.25), 0, 0, "Add f64");
}

static void test_add_broadcast_forms(void **state) {
    (void)state;
    /* bias add [2,3] + [3] */
    tu_expect(RUN("Add", F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), F32(1, SHAPE(3), 10, 20, 30)),
              F32(2, SHAPE(2, 3), 11, 22, 33, 14, 25, 36), 0, 0, "bias");
    /* tensor - scalar and scalar - tensor (vs and sv forms, order matters) */
    tu_expect(RUN("Sub", F32(1, SHAPE(3), 1, 2, 3), F32(0, NULL, 10)), F32(1, SHAPE(3), -9, -8, -7),
              0, 0, "x - s");
    tu_expect(RUN("Sub", F32(0, NULL, 10), F32(1, SHAPE(3), 1, 2, 3)), F32(1, SHAPE(3), 9, 8, 7), 0,
              0, "s - x");
    tu_expect(RUN("Div", F32(1, SHAPE(1), 12), F32(2, SHAPE(2, 2), 1, 2, 3, 4)),
              F32(2, SHAPE(2, 2), 12, 6, 4, 3), 0, 0, "[1] / [2,2]");
    /* outer-product style [3,1] - [1,2] */
    tu_expect(RUN("Sub", F32(2, SHAPE(3, 1), 1, 2, 3), F32(2, SHAPE(1, 2), 10, 20)),
              F32(2, SHAPE(3, 2), -9, -19, -8, -18, -7, -17), 0, 0, "[3,1] - [1,2]");
    /* [2,1,2] * [3,1]: middle dim from the second operand */
    tu_expect(RUN("Mul", F32(3, SHAPE(2, 1, 2), 1, 2, 3, 4), F32(2, SHAPE(3, 1), 1, 10, 100)),
              F32(3, SHAPE(2, 3, 2), 1, 2, 10, 20, 100, 200, 3, 4, 30, 40, 300, 400), 0, 0,
              "[2,1,2] * [3,1]");
    /* scalars: 0-d + 0-d stays 0-d */
    pp_tensor *y = RUN("Add", F32(0, NULL, 1.5f), F32(0, NULL, 2));
    assert_int_equal(y->ndim, 0);
    tu_expect(y, F32(0, NULL, 3.5f), 0, 0, "scalar");
}

/* Naive broadcasting reference: index arithmetic per element. */
static float ref_at(const pp_tensor *t, int ond, const int64_t *oshape, int64_t oi) {
    int64_t idx[PP_MAX_DIMS];
    for (int d = ond - 1; d >= 0; d--) {
        idx[d] = oi % oshape[d];
        oi /= oshape[d];
    }
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++) {
        int64_t c = idx[d + ond - t->ndim];
        off = off * t->shape[d] + (t->shape[d] == 1 ? 0 : c);
    }
    return ((const float *)t->data)[off];
}

static void test_broadcast_random(void **state) {
    (void)state;
    static const int64_t shapes[][2][5] = {
        /* ndim a, dims...; ndim b in [1][0] */
        {{4, 2, 3, 4, 5}, {2, 4, 5}},     {{4, 2, 1, 4, 1}, {4, 1, 3, 1, 5}},
        {{3, 7, 1, 33}, {3, 1, 9, 33}},   {{2, 1, 40}, {3, 3, 1, 1}},
        {{4, 3, 1, 1, 17}, {1, 17}},      {{1, 1}, {4, 2, 3, 4, 5}},
        {{4, 2, 3, 4, 5}, {4, 2, 3, 4, 5}}, {{3, 1, 1, 1}, {3, 2, 2, 2}},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int na = (int)shapes[k][0][0], nb = (int)shapes[k][1][0];
        pp_tensor *a = rand_f32(na, shapes[k][0] + 1), *b = rand_f32(nb, shapes[k][1] + 1);
        pp_tensor *ra = pp_tensor_retain(a), *rb = pp_tensor_retain(b);
        pp_tensor *y = RUN("Sub", a, b);
        int64_t n = pp_tensor_numel(y);
        float *want = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            want[i] = ref_at(ra, y->ndim, y->shape, i) - ref_at(rb, y->ndim, y->shape, i);
        char what[64];
        snprintf(what, sizeof what, "random broadcast case %zu", k);
        tu_expect(y, tu_f32(y->ndim, y->shape, want), 0, 0, what);
        free(want);
        pp_tensor_free(ra);
        pp_tensor_free(rb);
    }
}

static void test_integer_arith(void **state) {
    (void)state;
    const int64_t *s = SHAPE(4);
    expect_exact(RUN("Div", I64(1, s, 7, -7, 7, 5), I64(1, s, 2, 2, -2, 0)),
                 I64(1, s, 3, -3, -3, 0), "Div i64 truncates, x/0 = 0");
    expect_exact(RUN("Add", T(PP_I32, 1, SHAPE(2), 2147483647, -5), T(PP_I32, 1, SHAPE(2), 1, 3)),
                 T(PP_I32, 1, SHAPE(2), -2147483648.0, -2), "Add i32 wraps");
    expect_exact(RUN("Div", T(PP_I32, 1, SHAPE(1), -2147483648.0), T(PP_I32, 1, SHAPE(1), -1)),
                 T(PP_I32, 1, SHAPE(1), -2147483648.0), "INT_MIN / -1 wraps");
    expect_exact(RUN("Mul", I64(1, SHAPE(2), 3, -4), I64(0, NULL, 5)), I64(1, SHAPE(2), 15, -20),
                 "Mul i64 by scalar");
    expect_exact(RUN("Sub", T(PP_U8, 1, SHAPE(2), 1, 200), T(PP_U8, 1, SHAPE(2), 2, 100)),
                 T(PP_U8, 1, SHAPE(2), 255, 100), "Sub u8 wraps");
    expect_exact(RUN("Mul", T(PP_I8, 1, SHAPE(2), 100, -3), T(PP_I8, 1, SHAPE(2), 2, 5)),
                 T(PP_I8, 1, SHAPE(2), -56, -15), "Mul i8 wraps");
}

/* ------------------------------------------------------------------ Pow */

static void test_pow(void **state) {
    (void)state;
    const int64_t *s = SHAPE(4);
    tu_expect(RUN("Pow", F32(1, s, 1, 2, -3, 0.5f), F32(0, NULL, 2)), F32(1, s, 1, 4, 9, 0.25f), 0,
              0, "x^2");
    tu_expect(RUN("Pow", F32(1, s, 1, 2, -3, 0.5f), F32(1, SHAPE(1), 3)),
              F32(1, s, 1, 8, -27, 0.125f), 0, 0, "x^3");
    tu_expect(RUN("Pow", F32(1, s, 1, 4, 9, 0.25f), F32(0, NULL, 0.5f)), F32(1, s, 1, 2, 3, 0.5f),
              1e-7, 0, "x^0.5");
    tu_expect(RUN("Pow", F32(1, s, 2, 2, 2, 2), F32(1, s, 0, 1, -1, 1.5f)),
              F32(1, s, 1, 2, 0.5f, 2.8284271f), 1e-6, 0, "x^y");
    /* exponent broadcast to a larger rank: output takes the broadcast shape */
    pp_tensor *y = RUN("Pow", F32(1, SHAPE(2), 2, 3), F32(2, SHAPE(1, 1), 2));
    assert_int_equal(y->ndim, 2);
    tu_expect(y, F32(2, SHAPE(1, 2), 4, 9), 0, 0, "x^[[2]]");
    tu_expect(RUN("Pow", F32(1, SHAPE(2), 2, 3), I64(1, SHAPE(2), 3, 2)), F32(1, SHAPE(2), 8, 9), 0,
              0, "float ^ int64");
    expect_exact(RUN("Pow", T(PP_I32, 1, SHAPE(3), 2, 3, 5), F32(1, SHAPE(3), 0.5f, 2, 1.5f)),
                 T(PP_I32, 1, SHAPE(3), 1, 9, 11), "int32 ^ float truncates");
    expect_exact(RUN("Pow", I64(1, s, 2, -3, 2, 1), I64(1, s, 10, 3, -1, -5)),
                 I64(1, s, 1024, -27, 0, 1), "int64 ^ int64");
    tu_expect(RUN("Pow", T(PP_F64, 1, SHAPE(2), 2, 9), T(PP_F64, 1, SHAPE(2), 3, 0.5)),
              T(PP_F64, 1, SHAPE(2), 8, 3), 1e-15, 0, "f64");
}

/* -------------------------------------------------------------- unaries */

typedef double (*ref_fn)(double);
static double ref_neg(double x) { return -x; }
static double ref_relu(double x) { return x < 0 ? 0 : x; }
static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double ref_recip(double x) { return 1 / x; }
static double ref_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double ref_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double ref_leaky(double x) { return x < 0 ? (double)0.01f * x : x; }

/* Runs op over n points spread over [lo, hi] in f32 and f64 against ref. */
static void check_unary(const char *op, ref_fn ref, double lo, double hi, double rtol,
                        double atol) {
    enum { N = 203 };
    double xs[N], ys[N];
    for (int i = 0; i < N; i++) {
        /* Exactly representable in f32, so both dtypes see the same x. */
        xs[i] = (float)(lo + (hi - lo) * i / (N - 1));
        ys[i] = ref(xs[i]);
    }
    char what[64];
    snprintf(what, sizeof what, "%s f32", op);
    tu_expect(RUN(op, tu_typed(PP_F32, 1, SHAPE(N), xs)), tu_typed(PP_F32, 1, SHAPE(N), ys), rtol,
              atol, what);
    snprintf(what, sizeof what, "%s f64", op);
    tu_expect(RUN(op, tu_typed(PP_F64, 1, SHAPE(N), xs)), tu_typed(PP_F64, 1, SHAPE(N), ys), 1e-12,
              1e-300, what);
}

static void test_unary_math(void **state) {
    (void)state;
    check_unary("Neg", ref_neg, -5, 5, 0, 0);
    check_unary("Abs", fabs, -5, 5, 0, 0);
    check_unary("Sqrt", sqrt, 0, 100, 1e-7, 0);
    check_unary("Exp", exp, -100, 88, 3e-7, 3e-45);
    check_unary("Exp", exp, -2, 2, 3e-7, 0);
    check_unary("Log", log, 1e-6, 1e6, 2.5e-7, 0);
    check_unary("Erf", erf, -6, 6, 1e-6, 1e-6);
    check_unary("Erf", erf, -0.01, 0.01, 1e-6, 0);
    check_unary("Tanh", tanh, -12, 12, 1e-6, 1e-6);
    check_unary("Tanh", tanh, -0.01, 0.01, 1e-6, 0);
    check_unary("Sigmoid", ref_sigmoid, -100, 100, 1e-6, 1e-30);
    check_unary("Reciprocal", ref_recip, 0.125, 8, 1e-7, 0);
    check_unary("Relu", ref_relu, -3, 3, 0, 0);
    check_unary("LeakyRelu", ref_leaky, -3, 3, 1e-7, 0);
    check_unary("Gelu", ref_gelu, -6, 6, 1e-6, 1e-6);
}

static void test_unary_special_values(void **state) {
    (void)state;
    const int64_t *s = SHAPE(4);
    pp_tensor *y = RUN("Exp", F32(1, s, NAN, INFINITY, -INFINITY, 0));
    const float *d = y->data;
    assert_true(isnan(d[0]));
    assert_true(isinf(d[1]) && d[1] > 0);
    assert_true(d[2] == 0.0f);
    assert_true(d[3] == 1.0f);
    pp_tensor_free(y);
    y = RUN("Tanh", F32(1, s, NAN, INFINITY, -INFINITY, -0.0f));
    d = y->data;
    assert_true(isnan(d[0]));
    assert_true(d[1] == 1.0f && d[2] == -1.0f);
    assert_true(d[3] == 0.0f && signbit(d[3]));
    pp_tensor_free(y);
    y = RUN("Relu", F32(1, s, NAN, -1, 2, -INFINITY));
    d = y->data;
    assert_true(isnan(d[0]));
    assert_true(d[1] == 0 && d[2] == 2 && d[3] == 0);
    pp_tensor_free(y);
    /* exp of denormal results: relative accuracy holds down to ~1e-45 */
    y = RUN("Exp", F32(1, SHAPE(2), -100, -103));
    d = y->data;
    assert_true(fabs(d[0] - exp(-100.0)) <= 1e-6 * exp(-100.0) + 1.5e-45);
    assert_true(fabs(d[1] - exp(-103.0)) <= 1.5e-45);
    pp_tensor_free(y);
}

static void test_unary_int(void **state) {
    (void)state;
    expect_exact(RUN("Neg", I64(1, SHAPE(3), 1, -2, INT64_MIN)), I64(1, SHAPE(3), -1, 2, INT64_MIN),
                 "Neg i64");
    expect_exact(RUN("Abs", T(PP_I32, 1, SHAPE(2), -7, 3)), T(PP_I32, 1, SHAPE(2), 7, 3), "Abs i32");
    expect_exact(RUN("Relu", T(PP_I8, 1, SHAPE(2), -7, 3)), T(PP_I8, 1, SHAPE(2), 0, 3), "Relu i8");
}

static void test_leaky_relu_alpha(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "LeakyRelu", 1, (pp_tensor *[]){F32(1, SHAPE(3), -2, 0, 3)}, 1, NULL);
    TU_OK(pp_node_set_float(t.g, t.node, "alpha", 0.5f));
    pp_tensor *y;
    TU_OK(tu_node_run(&t, &y));
    tu_expect(y, F32(1, SHAPE(3), -1, 0, 3), 0, 0, "LeakyRelu alpha");
    tu_node_free(&t);
    tu_node_init(&t, "LeakyRelu", 1, (pp_tensor *[]){F32(1, SHAPE(3), -2, 0, 3)}, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "alpha", "big"));
    tu_node_expect_error(&t, PP_ERR_INVALID, "alpha");
    tu_node_free(&t);
}

static void test_gelu(void **state) {
    (void)state;
    enum { N = 101 };
    double xs[N], ye[N], yt[N];
    for (int i = 0; i < N; i++) {
        xs[i] = -5 + 10.0 * i / (N - 1);
        ye[i] = ref_gelu(xs[i]);
        yt[i] = ref_gelu_tanh(xs[i]);
    }
    tu_node t;
    pp_tensor *y;
    tu_node_init(&t, "Gelu", 1, (pp_tensor *[]){tu_typed(PP_F32, 1, SHAPE(N), xs)}, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "approximate", "tanh"));
    TU_OK(tu_node_run(&t, &y));
    tu_expect(y, tu_typed(PP_F32, 1, SHAPE(N), yt), 1e-6, 1e-6, "Gelu tanh");
    tu_node_free(&t);
    tu_node_init_dom(&t, "Gelu", "com.microsoft", 1,
                     (pp_tensor *[]){tu_typed(PP_F64, 1, SHAPE(N), xs)}, 1, NULL);
    TU_OK(tu_node_run(&t, &y));
    tu_expect(y, tu_typed(PP_F64, 1, SHAPE(N), ye), 1e-12, 1e-15, "com.microsoft Gelu");
    tu_node_free(&t);
    tu_node_init(&t, "Gelu", 1, (pp_tensor *[]){F32(1, SHAPE(1), 1)}, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "approximate", "fast"));
    tu_node_expect_error(&t, PP_ERR_INVALID, "approximate");
    tu_node_free(&t);
}

/* ------------------------------------------------- comparisons, logic */

static void test_compare(void **state) {
    (void)state;
    const int64_t *s = SHAPE(4);
    expect_exact(RUN("Equal", F32(1, s, 1, 2, NAN, 4), F32(1, s, 1, 3, NAN, 4)),
                 B(1, s, 1, 0, 0, 1), "Equal f32");
    expect_exact(RUN("Less", I64(1, s, 1, 2, 3, 4), I64(0, NULL, 3)), B(1, s, 1, 1, 0, 0),
                 "Less i64 vs scalar");
    expect_exact(RUN("Greater", I64(0, NULL, 3), I64(1, s, 1, 2, 3, 4)), B(1, s, 1, 1, 0, 0),
                 "Greater scalar vs i64");
    expect_exact(RUN("LessOrEqual", F32(1, s, 1, 2, 3, 4), F32(0, NULL, 3)), B(1, s, 1, 1, 1, 0),
                 "LessOrEqual");
    expect_exact(RUN("GreaterOrEqual", F32(1, s, 1, 2, 3, 4), F32(0, NULL, 3)),
                 B(1, s, 0, 0, 1, 1), "GreaterOrEqual");
    expect_exact(RUN("Equal", B(1, s, 1, 0, 1, 0), B(1, s, 1, 1, 0, 0)), B(1, s, 1, 0, 0, 1),
                 "Equal bool");
    expect_exact(RUN("And", B(1, s, 1, 0, 1, 0), B(1, s, 1, 1, 0, 0)), B(1, s, 1, 0, 0, 0), "And");
    expect_exact(RUN("Or", B(1, s, 1, 0, 1, 0), B(1, s, 1, 1, 0, 0)), B(1, s, 1, 1, 1, 0), "Or");
    expect_exact(RUN("Xor", B(1, s, 1, 0, 1, 0), B(1, s, 1, 1, 0, 0)), B(1, s, 0, 1, 1, 0), "Xor");
    expect_exact(RUN("And", B(2, SHAPE(2, 2), 1, 0, 1, 1), B(1, SHAPE(2), 1, 0)),
                 B(2, SHAPE(2, 2), 1, 0, 1, 0), "And broadcast");
    expect_exact(RUN("Not", B(1, SHAPE(3), 1, 0, 1)), B(1, SHAPE(3), 0, 1, 0), "Not");
}

static void test_where(void **state) {
    (void)state;
    tu_expect(RUN("Where", B(2, SHAPE(2, 2), 1, 0, 0, 1), F32(2, SHAPE(2, 2), 1, 2, 3, 4),
                  F32(2, SHAPE(2, 2), 9, 8, 7, 6)),
              F32(2, SHAPE(2, 2), 1, 8, 7, 4), 0, 0, "Where same shape");
    /* attention-mask style: cond [1,1,2,2], x scalar, y [2,1,2,2] */
    tu_expect(RUN("Where", B(4, SHAPE(1, 1, 2, 2), 1, 0, 1, 1), F32(0, NULL, -1e9f),
                  F32(4, SHAPE(2, 1, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8)),
              F32(4, SHAPE(2, 1, 2, 2), -1e9f, 2, -1e9f, -1e9f, -1e9f, 6, -1e9f, -1e9f), 0, 0,
              "Where 3-way broadcast");
    expect_exact(RUN("Where", B(1, SHAPE(3), 1, 0, 1), I64(1, SHAPE(1), 5), I64(1, SHAPE(3), 1, 2, 3)),
                 I64(1, SHAPE(3), 5, 2, 5), "Where i64");
    /* broadcast condition (strided row form), every other row-form too */
    tu_expect(RUN("Where", B(2, SHAPE(2, 1), 1, 0), F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6),
                  F32(1, SHAPE(3), 7, 8, 9)),
              F32(2, SHAPE(2, 3), 1, 2, 3, 7, 8, 9), 0, 0, "Where broadcast condition");
    tu_expect(RUN("Where", B(1, SHAPE(3), 1, 0, 1), F32(1, SHAPE(3), 1, 2, 3), F32(0, NULL, 0)),
              F32(1, SHAPE(3), 1, 0, 3), 0, 0, "Where scalar y");
    tu_expect(RUN("Where", B(1, SHAPE(3), 1, 0, 1), F32(0, NULL, 1), F32(0, NULL, 0)),
              F32(1, SHAPE(3), 1, 0, 1), 0, 0, "Where scalar x and y");
    expect_exact(RUN("Where", B(1, SHAPE(2), 0, 1), B(1, SHAPE(2), 1, 1), B(1, SHAPE(2), 0, 0)),
                 B(1, SHAPE(2), 0, 1), "Where bool");
    tu_node t;
    tu_node_init(&t, "Where", 3,
                 (pp_tensor *[]){F32(1, SHAPE(2), 1, 0), F32(1, SHAPE(2), 1, 2), F32(1, SHAPE(2), 3, 4)},
                 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "bool");
    tu_node_free(&t);
    tu_node_init(&t, "Where", 3,
                 (pp_tensor *[]){B(1, SHAPE(2), 1, 0), F32(1, SHAPE(3), 1, 2, 3), F32(1, SHAPE(2), 3, 4)},
                 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "shapes [2], [3] and [2] do not broadcast");
    tu_node_free(&t);
}

/* ------------------------------------------------------- Clip, Max, Min */

static void test_clip(void **state) {
    (void)state;
    const int64_t *s = SHAPE(5);
    tu_expect(RUN("Clip", F32(1, s, -3, -1, 0, 1, 3), F32(0, NULL, -1), F32(0, NULL, 2)),
              F32(1, s, -1, -1, 0, 1, 2), 0, 0, "Clip min max");
    tu_expect(run_op("Clip", 3, (pp_tensor *[]){F32(1, s, -3, -1, 0, 1, 3), NULL, F32(0, NULL, 0.5f)}),
              F32(1, s, -3, -1, 0, 0.5f, 0.5f), 0, 0, "Clip max only");
    tu_expect(run_op("Clip", 1, (pp_tensor *[]){F32(1, s, -3, -1, NAN, 1, 3)}),
              F32(1, s, -3, -1, NAN, 1, 3), 0, 0, "Clip no bounds keeps NaN");
    expect_exact(RUN("Clip", I64(1, SHAPE(3), -5, 5, 50), I64(0, NULL, 0), I64(0, NULL, 10)),
                 I64(1, SHAPE(3), 0, 5, 10), "Clip i64");
    expect_exact(run_op("Clip", 2, (pp_tensor *[]){T(PP_I8, 1, SHAPE(3), -128, 5, 127),
                                                   T(PP_I8, 0, NULL, 0)}),
                 T(PP_I8, 1, SHAPE(3), 0, 5, 127), "Clip i8 min only");
    tu_node t;
    tu_node_init(&t, "Clip", 3,
                 (pp_tensor *[]){F32(1, s, 1, 2, 3, 4, 5), F32(1, SHAPE(2), 0, 1), NULL}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "scalar");
    tu_node_free(&t);
    tu_node_init(&t, "Clip", 2,
                 (pp_tensor *[]){F32(1, s, 1, 2, 3, 4, 5), I64(0, NULL, 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "int64");
    tu_node_free(&t);
}

static void test_max_min_sum_mean(void **state) {
    (void)state;
    tu_expect(RUN("Max", F32(1, SHAPE(3), 1, 5, 3), F32(1, SHAPE(3), 4, 2, NAN), F32(0, NULL, 2)),
              F32(1, SHAPE(3), 4, 5, NAN), 0, 0, "Max 3 inputs");
    tu_expect(RUN("Min", F32(2, SHAPE(2, 1), 1, 5), F32(1, SHAPE(2), 3, 0)),
              F32(2, SHAPE(2, 2), 1, 0, 3, 0), 0, 0, "Min broadcast");
    tu_expect(RUN("Max", F32(1, SHAPE(2), 1, 2)), F32(1, SHAPE(2), 1, 2), 0, 0, "Max 1 input");
    expect_exact(RUN("Max", T(PP_I32, 1, SHAPE(2), 1, -5), T(PP_I32, 1, SHAPE(2), 0, -4)),
                 T(PP_I32, 1, SHAPE(2), 1, -4), "Max i32");
    expect_exact(RUN("Min", T(PP_U8, 1, SHAPE(2), 1, 200), T(PP_U8, 1, SHAPE(2), 0, 100)),
                 T(PP_U8, 1, SHAPE(2), 0, 100), "Min u8");
    tu_expect(RUN("Sum", F32(1, SHAPE(2), 1, 2), F32(1, SHAPE(2), 3, 4), F32(0, NULL, 10)),
              F32(1, SHAPE(2), 14, 16), 0, 0, "Sum");
    tu_expect(RUN("Mean", F32(1, SHAPE(2), 1, 2), F32(1, SHAPE(2), 3, 4)), F32(1, SHAPE(2), 2, 3), 0,
              0, "Mean");
    tu_node t;
    tu_node_init(&t, "Max", 2,
                 (pp_tensor *[]){F32(1, SHAPE(2), 1, 2), F32(1, SHAPE(3), 1, 2, 3)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "do not broadcast");
    tu_node_free(&t);
}

static double ref_hard_sigmoid(double x) { return fmax(0, fmin(1, (double)0.2f * x + 0.5)); }
static double ref_hard_swish(double x) { return x * fmax(0, fmin(1, x / 6 + 0.5)); }
static double ref_softplus(double x) { return log1p(exp(x)); }
static double ref_softsign(double x) { return x / (1 + fabs(x)); }
static double ref_elu(double x) { return x < 0 ? expm1(x) : x; }
static double ref_selu(double x) {
    const double a = 1.67326319217681884765625f, g = 1.05070102214813232421875f;
    return x <= 0 ? g * a * expm1(x) : g * x;
}
static double ref_celu(double x) { return fmax(0, x) + fmin(0, expm1(x)); }
static double ref_thresholded_relu(double x) { return x > 1 ? x : 0; }

static void test_unary_more(void **state) {
    (void)state;
    check_unary("Cos", cos, -10, 10, 1e-6, 1e-7);
    check_unary("Sin", sin, -10, 10, 1e-6, 1e-7);
    check_unary("Floor", floor, -5.5, 5.5, 0, 0);
    check_unary("Ceil", ceil, -5.5, 5.5, 0, 0);
    check_unary("HardSigmoid", ref_hard_sigmoid, -5, 5, 1e-6, 1e-7);
    check_unary("HardSwish", ref_hard_swish, -5, 5, 1e-6, 1e-7);
    check_unary("Softplus", ref_softplus, -50, 50, 1e-6, 1e-30);
    check_unary("Softsign", ref_softsign, -5, 5, 1e-6, 0);
    check_unary("Elu", ref_elu, -5, 5, 1e-6, 0);
    check_unary("Selu", ref_selu, -5, 5, 1e-6, 0);
    check_unary("Celu", ref_celu, -5, 5, 1e-6, 0);
    check_unary("ThresholdedRelu", ref_thresholded_relu, -3, 3, 0, 0);
    const int64_t *s = SHAPE(6);
    tu_expect(RUN("Round", F32(1, s, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.4f)),
              F32(1, s, 0, 2, 2, -0.0f, -2, 2), 0, 0, "Round half to even");
    tu_expect(RUN("Sign", F32(1, s, -2, 0, 3, NAN, -0.0f, INFINITY)), F32(1, s, -1, 0, 1, NAN, 0, 1),
              0, 0, "Sign f32");
    expect_exact(RUN("Sign", I64(1, SHAPE(3), -7, 0, 9)), I64(1, SHAPE(3), -1, 0, 1), "Sign i64");
    expect_exact(RUN("IsNaN", F32(1, SHAPE(3), NAN, 1, INFINITY)), B(1, SHAPE(3), 1, 0, 0), "IsNaN");
    expect_exact(RUN("IsInf", F32(1, SHAPE(3), NAN, -INFINITY, INFINITY)), B(1, SHAPE(3), 0, 1, 1),
                 "IsInf");
    tu_node t;
    tu_node_init(&t, "IsInf", 1,
                 (pp_tensor *[]){F32(1, SHAPE(3), NAN, -INFINITY, INFINITY)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "detect_negative", 0));
    pp_tensor *y;
    TU_OK(tu_node_run(&t, &y));
    expect_exact(y, B(1, SHAPE(3), 0, 0, 1), "IsInf positive only");
    tu_node_free(&t);
    tu_node_init(&t, "Elu", 1, (pp_tensor *[]){F32(1, SHAPE(2), -1, 2)}, 1, NULL);
    TU_OK(pp_node_set_float(t.g, t.node, "alpha", 2));
    TU_OK(tu_node_run(&t, &y));
    tu_expect(y, F32(1, SHAPE(2), 2 * expm1f(-1), 2), 1e-6, 0, "Elu alpha");
    tu_node_free(&t);
}

static void test_mod_prelu(void **state) {
    (void)state;
    const int64_t *s = SHAPE(4);
    /* fmod=0 (default): the result takes the divisor's sign */
    expect_exact(RUN("Mod", I64(1, s, 7, -7, 7, -7), I64(1, s, 3, 3, -3, -3)),
                 I64(1, s, 1, 2, -2, -1), "Mod int64");
    expect_exact(RUN("Mod", T(PP_I32, 1, SHAPE(2), 5, 5), T(PP_I32, 1, SHAPE(2), 0, -1)),
                 T(PP_I32, 1, SHAPE(2), 0, 0), "Mod by 0 and -1");
    tu_node t;
    tu_node_init(&t, "Mod", 2,
                 (pp_tensor *[]){F32(1, s, 7, -7, 7.5f, -7), F32(1, s, 3, 3, -2, -3)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "fmod", 1));
    pp_tensor *y;
    TU_OK(tu_node_run(&t, &y));
    tu_expect(y, F32(1, s, 1, -1, 1.5f, -1), 0, 0, "Mod fmod=1 f32");
    tu_node_free(&t);
    tu_node_init(&t, "Mod", 2, (pp_tensor *[]){F32(1, SHAPE(1), 1), F32(1, SHAPE(1), 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "fmod=1");
    tu_node_free(&t);
    tu_expect(RUN("PRelu", F32(2, SHAPE(2, 2), -1, 2, -3, 4), F32(1, SHAPE(2), 0.5f, 0.25f)),
              F32(2, SHAPE(2, 2), -0.5f, 2, -1.5f, 4), 0, 0, "PRelu channel slope");
    tu_node_init(&t, "PRelu", 2,
                 (pp_tensor *[]){F32(1, SHAPE(2), -1, 2), F32(2, SHAPE(2, 2), 1, 1, 1, 1)},
                 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "does not broadcast to X shape");
    tu_node_free(&t);
}

/* float16 / bfloat16 run through float32 and come back in their dtype. */
static void test_half_types(void **state) {
    (void)state;
    pp_tensor *y = RUN("Add", T(PP_F16, 1, SHAPE(3), 1, 2.5, -3), T(PP_F16, 0, NULL, 0.5));
    assert_int_equal(y->dtype, PP_F16);
    tu_expect(y, T(PP_F16, 1, SHAPE(3), 1.5, 3, -2.5), 0, 0, "Add f16");
    y = RUN("Max", T(PP_BF16, 1, SHAPE(2), 1, 4), T(PP_BF16, 1, SHAPE(2), 3, 2));
    assert_int_equal(y->dtype, PP_BF16);
    tu_expect(y, T(PP_BF16, 1, SHAPE(2), 3, 4), 0, 0, "Max bf16");
    y = RUN("Less", T(PP_F16, 1, SHAPE(2), 1, 4), T(PP_F16, 1, SHAPE(2), 3, 2));
    tu_expect(y, B(1, SHAPE(2), 1, 0), 0, 0, "Less f16 gives bool");
    y = RUN("Exp", T(PP_F16, 1, SHAPE(2), 0, 1));
    tu_expect(y, T(PP_F16, 1, SHAPE(2), 1, 2.71875), 0, 0, "Exp f16");
    /* float base, half exponent: the output keeps the base's float32 */
    y = RUN("Pow", F32(1, SHAPE(2), 2, 3), T(PP_F16, 1, SHAPE(2), 2, 2));
    tu_expect(y, F32(1, SHAPE(2), 4, 9), 0, 0, "Pow f32 ^ f16");
}

/* ------------------------------------------------- 0-size tensors, errors */

static void test_zero_size(void **state) {
    (void)state;
    pp_tensor *e;
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(0, 3), &e));
    pp_tensor *y = RUN("Add", e, F32(1, SHAPE(3), 1, 2, 3));
    assert_int_equal(y->ndim, 2);
    assert_int_equal(y->shape[0], 0);
    assert_int_equal(y->shape[1], 3);
    pp_tensor_free(y);
    TU_OK(pp_tensor_empty(PP_F32, 1, SHAPE(0), &e));
    y = RUN("Exp", e);
    assert_int_equal(pp_tensor_numel(y), 0);
    pp_tensor_free(y);
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(2, 0), &e));
    pp_tensor *c;
    TU_OK(pp_tensor_empty(PP_BOOL, 1, SHAPE(0), &c));
    y = RUN("Where", c, e, F32(0, NULL, 1));
    assert_int_equal(y->shape[0], 2);
    assert_int_equal(y->shape[1], 0);
    pp_tensor_free(y);
}

static void test_errors(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "Add", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), F32(1, SHAPE(4), 1, 2, 3, 4)},
                 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "shapes [2,3] and [4] do not broadcast");
    tu_node_free(&t);
    tu_node_init(&t, "Mul", 2,
                 (pp_tensor *[]){F32(1, SHAPE(2), 1, 2), I64(1, SHAPE(2), 1, 2)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "float32 and int64 differ");
    tu_node_free(&t);
    tu_node_init(&t, "Sqrt", 1, (pp_tensor *[]){I64(1, SHAPE(2), 1, 2)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "int64");
    tu_node_free(&t);
    tu_node_init(&t, "Add", 2, (pp_tensor *[]){B(1, SHAPE(1), 1), B(1, SHAPE(1), 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "bool");
    tu_node_free(&t);
    tu_node_init(&t, "Not", 1, (pp_tensor *[]){F32(1, SHAPE(1), 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "float32");
    tu_node_free(&t);
    tu_node_init(&t, "Exp", 1, (pp_tensor *[]){T(PP_U8, 1, SHAPE(2), 1, 2)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "uint8");
    tu_node_free(&t);
    tu_node_init(&t, "Sum", 2, (pp_tensor *[]){I64(1, SHAPE(1), 1), I64(1, SHAPE(1), 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "int64");
    tu_node_free(&t);
}

/* Every registered elementwise op is found by name. */
static void test_registry(void **state) {
    (void)state;
    static const char *names[] = {"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Sqrt", "Exp", "Log",
                                  "Erf", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "Abs",
                                  "Reciprocal", "Gelu", "Where", "Equal", "Less", "Greater",
                                  "Not", "And", "Or", "Clip", "Max", "Min"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        assert_non_null(pp_op_find("", names[i]));
    assert_non_null(pp_op_find("com.microsoft", "Gelu"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bcast_plan),
        cmocka_unit_test(test_broadcast_to),
        cmocka_unit_test(test_add_same_shape),
        cmocka_unit_test(test_arith_hand),
        cmocka_unit_test(test_add_broadcast_forms),
        cmocka_unit_test(test_broadcast_random),
        cmocka_unit_test(test_integer_arith),
        cmocka_unit_test(test_pow),
        cmocka_unit_test(test_unary_math),
        cmocka_unit_test(test_unary_special_values),
        cmocka_unit_test(test_unary_int),
        cmocka_unit_test(test_leaky_relu_alpha),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_where),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_max_min_sum_mean),
        cmocka_unit_test(test_unary_more),
        cmocka_unit_test(test_mod_prelu),
        cmocka_unit_test(test_half_types),
        cmocka_unit_test(test_zero_size),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_registry),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
