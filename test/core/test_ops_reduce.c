/* Reductions, Softmax/LogSoftmax, LayerNormalization, ArgMax/ArgMin and
 * SoftmaxCrossEntropyLoss (lib/ops/reduce.c): hand-computed values, random
 * shapes and axes against a naive double reference, numerical stability,
 * 0-sized and 0-d inputs, errors that name the node. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"
#include "op.h"
/* ------------------------------------------------------------- helpers */

/* n, values: for the (int n, const int64_t *axes) parameter pairs */
#define AXES(...)                                                    \
    (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
        ((const int64_t[]){__VA_ARGS__})

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static pp_tensor *rand_t(pp_dtype dt, int nd, const int64_t *shape, double scale) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(dt, nd, shape, &t));
    for (int64_t i = 0; i < pp_tensor_numel(t); i++)
        pp_tensor_set_f64(t, i, tu_urand(&rng_state) * scale);
    return t;
}

/* Reduce op over x with axes as an attribute (n >= 0) and keepdims. */
static pp_tensor *reduce_attr(const char *op, pp_tensor *x, int n, const int64_t *axes,
                              int keepdims) {
    tu_node t;
    tu_node_init(&t, op, 1, (pp_tensor *[]){x}, 1, NULL);
    if (n >= 0) TU_OK(pp_node_set_ints(t.g, t.node, "axes", n, axes));
    TU_OK(pp_node_set_int(t.g, t.node, "keepdims", keepdims));
    pp_tensor *y = tu_node_run_one(&t);
    tu_node_free(&t);
    return y;
}

/* Same with axes as input 1 (opset 13 ReduceSum, opset 18 others). */
static pp_tensor *reduce_input(const char *op, pp_tensor *x, pp_tensor *axes, int keepdims,
                               int noop) {
    tu_node t;
    tu_node_init(&t, op, 2, (pp_tensor *[]){x, axes}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "keepdims", keepdims));
    if (noop) TU_OK(pp_node_set_int(t.g, t.node, "noop_with_empty_axes", 1));
    pp_tensor *y = tu_node_run_one(&t);
    tu_node_free(&t);
    return y;
}

/* ----------------------------------------------------------- reductions */

static void test_reduce_sum_hand(void **state) {
    (void)state;
    const int64_t *s = SHAPE(2, 3);
    pp_tensor *y = reduce_input("ReduceSum", F32(2, s, 1, 2, 3, 4, 5, 6), I64(1, SHAPE(1), 1), 1, 0);
    tu_expect(y, F32(2, SHAPE(2, 1), 6, 15), 0, 0, "sum axis 1 keepdims");
    y = reduce_input("ReduceSum", F32(2, s, 1, 2, 3, 4, 5, 6), I64(1, SHAPE(1), -2), 0, 0);
    tu_expect(y, F32(1, SHAPE(3), 5, 7, 9), 0, 0, "sum axis -2");
    pp_tensor *empty;
    TU_OK(pp_tensor_empty(PP_I64, 1, SHAPE(0), &empty));
    y = reduce_input("ReduceSum", F32(2, s, 1, 2, 3, 4, 5, 6), empty, 0, 0);
    assert_int_equal(y->ndim, 0);
    tu_expect(y, F32(0, NULL, 21), 0, 0, "sum all (empty axes)");
    TU_OK(pp_tensor_empty(PP_I64, 1, SHAPE(0), &empty));
    y = reduce_input("ReduceSum", F32(2, s, 1, 2, 3, 4, 5, 6), empty, 1, 1);
    tu_expect(y, F32(2, s, 1, 2, 3, 4, 5, 6), 0, 0, "noop_with_empty_axes");
    y = reduce_attr("ReduceSum", F32(2, s, 1, 2, 3, 4, 5, 6), -1, NULL, 1);
    tu_expect(y, F32(2, SHAPE(1, 1), 21), 0, 0, "sum all keepdims (no axes)");
    y = reduce_input("ReduceSum", I64(2, s, 1, 2, 3, 4, 5, 6), I64(1, SHAPE(1), 1), 0, 0);
    tu_expect(y, I64(1, SHAPE(2), 6, 15), 0, 0, "sum int64");
}

static void test_reduce_kinds(void **state) {
    (void)state;
    const int64_t *s = SHAPE(2, 3);
#define X F32(2, s, 1, -2, 3, 4, 5, -6)
    tu_expect(reduce_attr("ReduceMean", X, AXES(1), 0), F32(1, SHAPE(2), 2.0f / 3, 1), 1e-7, 0,
              "mean");
    tu_expect(reduce_attr("ReduceMax", X, AXES(1), 0), F32(1, SHAPE(2), 3, 5), 0, 0, "max");
    tu_expect(reduce_attr("ReduceMin", X, AXES(0), 0), F32(1, SHAPE(3), 1, -2, -6), 0, 0, "min");
    tu_expect(reduce_attr("ReduceProd", X, AXES(1), 0), F32(1, SHAPE(2), -6, -120), 0, 0, "prod");
    tu_expect(reduce_attr("ReduceSumSquare", X, AXES(1), 0), F32(1, SHAPE(2), 14, 77), 0, 0,
              "sumsquare");
    tu_expect(reduce_attr("ReduceL1", X, AXES(1), 0), F32(1, SHAPE(2), 6, 15), 0, 0, "l1");
    tu_expect(reduce_attr("ReduceL2", X, AXES(1), 0), F32(1, SHAPE(2), sqrtf(14), sqrtf(77)), 1e-7,
              0, "l2");
#undef X
    tu_expect(reduce_attr("ReduceMax", F32(2, SHAPE(2, 2), 1, NAN, 3, 4), AXES(1), 0),
              F32(1, SHAPE(2), NAN, 4), 0, 0, "max propagates NaN");
    tu_expect(reduce_attr("ReduceMax", T(PP_I32, 2, SHAPE(2, 2), 1, -5, -3, -4), AXES(1), 1),
              T(PP_I32, 2, SHAPE(2, 1), 1, -3), 0, 0, "max int32");
    tu_expect(reduce_attr("ReduceMean", T(PP_F64, 1, SHAPE(3), 1, 2, 4), AXES(0), 0),
              T(PP_F64, 0, NULL, 7.0 / 3), 1e-15, 0, "mean f64");
}

/* Naive reference: reduce x over mask in double. */
static void ref_reduce(const pp_tensor *x, const uint8_t *mask, int kind, double *out,
                       int64_t on) {
    for (int64_t i = 0; i < on; i++) out[i] = kind == 2 ? -INFINITY : 0;
    int64_t n = pp_tensor_numel(x), count = 1;
    for (int d = 0; d < x->ndim; d++)
        if (mask[d]) count *= x->shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, oi = 0, ost = 1;
        for (int d = x->ndim - 1; d >= 0; d--) {
            int64_t c = rem % x->shape[d];
            rem /= x->shape[d];
            if (!mask[d]) {
                oi += c * ost;
                ost *= x->shape[d];
            }
        }
        double v = pp_tensor_get_f64(x, i);
        if (kind == 2) out[oi] = v > out[oi] ? v : out[oi];
        else out[oi] += v;
    }
    if (kind == 1)
        for (int64_t i = 0; i < on; i++) out[i] /= (double)count;
}

static void test_reduce_random(void **state) {
    (void)state;
    static const char *ops[] = {"ReduceSum", "ReduceMean", "ReduceMax"};
    static const int64_t shapes[][5] = {{4, 3, 4, 5, 6}, {3, 7, 1, 33}, {2, 50, 40}, {1, 1000},
                                        {4, 2, 1, 2, 17}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int nd = (int)shapes[k][0];
        for (int maskbits = 1; maskbits < (1 << nd); maskbits++)
            for (int kind = 0; kind < 3; kind++) {
                pp_tensor *x = rand_t(PP_F32, nd, shapes[k] + 1, 2);
                pp_tensor *keep = pp_tensor_retain(x);
                int64_t axes[PP_MAX_DIMS];
                uint8_t mask[PP_MAX_DIMS] = {0};
                int na = 0;
                for (int d = 0; d < nd; d++)
                    if (maskbits & (1 << d)) {
                        mask[d] = 1;
                        /* alternate between positive and negative spellings */
                        axes[na++] = (d + maskbits) % 2 ? d : d - nd;
                    }
                pp_tensor *y = reduce_attr(ops[kind], x, na, axes, 1);
                int64_t on = pp_tensor_numel(y);
                double *want = malloc(sizeof(double) * (size_t)on);
                ref_reduce(keep, mask, kind, want, on);
                char what[96];
                snprintf(what, sizeof what, "%s shape case %zu mask %d", ops[kind], k, maskbits);
                for (int d = 0; d < nd; d++)
                    if (y->shape[d] != (mask[d] ? 1 : shapes[k][d + 1])) fail_msg("%s: shape", what);
                tu_expect(y, tu_typed(PP_F32, y->ndim, y->shape, want), 1e-5, 1e-5, what);
                free(want);
                pp_tensor_free(keep);
            }
    }
}

static void test_reduce_long_row_accuracy(void **state) {
    (void)state;
    enum { N = 1 << 20 };
    pp_tensor *x;
    TU_OK(pp_tensor_empty(PP_F32, 1, SHAPE(N), &x));
    double want = 0;
    for (int i = 0; i < N; i++) {
        ((float *)x->data)[i] = 0.1f + (float)(i % 7) * 1e-3f;
        want += ((float *)x->data)[i];
    }
    pp_tensor *y = reduce_attr("ReduceMean", x, AXES(0), 0);
    tu_expect(y, T(PP_F32, 0, NULL, want / N), 1e-6, 0, "mean of 2^20 elements");
}

static void test_reduce_zero_size_and_scalar(void **state) {
    (void)state;
    pp_tensor *e;
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(0, 3), &e));
    pp_tensor *y = reduce_attr("ReduceSum", e, AXES(0), 0);
    tu_expect(y, F32(1, SHAPE(3), 0, 0, 0), 0, 0, "sum over empty axis");
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(0, 3), &e));
    y = reduce_attr("ReduceMean", e, AXES(0), 0);
    tu_expect(y, F32(1, SHAPE(3), NAN, NAN, NAN), 0, 0, "mean over empty axis");
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(0, 3), &e));
    y = reduce_attr("ReduceSum", e, AXES(1), 1);
    tu_assert_shape(y, 2, SHAPE(0, 1));
    pp_tensor_free(y);
    y = reduce_attr("ReduceSum", F32(0, NULL, 2.5f), -1, NULL, 1);
    assert_int_equal(y->ndim, 0);
    tu_expect(y, F32(0, NULL, 2.5f), 0, 0, "sum of a scalar");
}

static void test_reduce_errors(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "ReduceSum", 2,
                 (pp_tensor *[]){F32(1, SHAPE(2), 1, 2), I64(1, SHAPE(1), 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "axis 1 is out of range for rank 1");
    tu_node_free(&t);
    tu_node_init(&t, "ReduceMean", 1, (pp_tensor *[]){F32(2, SHAPE(1, 2), 1, 2)}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "axes", AXES(1, -1)));
    tu_node_expect_error(&t, PP_ERR_INVALID, "twice");
    tu_node_free(&t);
    pp_tensor *b;
    TU_OK(pp_tensor_new(PP_BOOL, 1, SHAPE(2), &b));
    tu_node_init(&t, "ReduceMean", 1, (pp_tensor *[]){b}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "bool");
    tu_node_free(&t);
    tu_node_init(&t, "ReduceMean", 1, (pp_tensor *[]){F32(1, SHAPE(2), 1, 2)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "keepdims", 2));
    tu_node_expect_error(&t, PP_ERR_INVALID, "keepdims");
    tu_node_free(&t);
    tu_node_init(&t, "ReduceSum", 2,
                 (pp_tensor *[]){F32(1, SHAPE(2), 1, 2), F32(1, SHAPE(1), 0)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "axes");
    tu_node_free(&t);
}

/* -------------------------------------------------------------- ArgMax */

static void test_argmax(void **state) {
    (void)state;
    const int64_t *s = SHAPE(2, 3);
    tu_node t;
    tu_node_init(&t, "ArgMax", 1, (pp_tensor *[]){F32(2, s, 1, 5, 5, 7, 2, 7)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 1));
    tu_expect(tu_node_run_one(&t), I64(2, SHAPE(2, 1), 1, 0), 0, 0, "argmax axis 1");
    TU_OK(pp_node_set_int(t.g, t.node, "select_last_index", 1));
    tu_expect(tu_node_run_one(&t), I64(2, SHAPE(2, 1), 2, 2), 0, 0, "argmax select_last_index");
    tu_node_free(&t);
    tu_node_init(&t, "ArgMin", 1, (pp_tensor *[]){F32(2, s, 1, 5, 5, 7, 2, 7)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "keepdims", 0));
    tu_expect(tu_node_run_one(&t), I64(1, SHAPE(3), 0, 1, 0), 0, 0, "argmin axis 0");
    tu_node_free(&t);
    tu_node_init(&t, "ArgMax", 1, (pp_tensor *[]){F32(1, SHAPE(3), 1, NAN, 3)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), I64(1, SHAPE(1), 1), 0, 0, "argmax NaN wins");
    tu_node_free(&t);
    tu_node_init(&t, "ArgMax", 1, (pp_tensor *[]){I64(1, SHAPE(3), 1, 9, 3)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", -1));
    tu_expect(tu_node_run_one(&t), I64(1, SHAPE(1), 1), 0, 0, "argmax int64");
    tu_node_free(&t);
}

/* ------------------------------------------------------------- Softmax */

static void ref_softmax(const double *x, int64_t outer, int64_t len, int64_t inner, int log_,
                        double *y) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *p = x + o * len * inner + j;
            double m = -INFINITY, s = 0;
            for (int64_t l = 0; l < len; l++) m = fmax(m, p[l * inner]);
            for (int64_t l = 0; l < len; l++) s += exp(p[l * inner] - m);
            for (int64_t l = 0; l < len; l++)
                y[o * len * inner + l * inner + j] =
                    log_ ? p[l * inner] - m - log(s) : exp(p[l * inner] - m) / s;
        }
}

static void check_softmax(const char *op, pp_dtype dt, int nd, const int64_t *shape, int64_t axis,
                          int set_axis, double scale) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    double *x = malloc(sizeof(double) * (size_t)n), *y = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = tu_urand(&rng_state) * scale;
        if (dt == PP_F32) x[i] = (float)x[i];
    }
    int a = (int)(axis < 0 ? axis + nd : axis);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < a; d++) outer *= shape[d];
    for (int d = a + 1; d < nd; d++) inner *= shape[d];
    ref_softmax(x, outer, shape[a], inner, strcmp(op, "LogSoftmax") == 0, y);
    tu_node t;
    tu_node_init(&t, op, 1, (pp_tensor *[]){tu_typed(dt, nd, shape, x)}, 1, NULL);
    if (set_axis) TU_OK(pp_node_set_int(t.g, t.node, "axis", axis));
    char what[96];
    snprintf(what, sizeof what, "%s %s axis %lld", op, pp_dtype_name(dt), (long long)axis);
    /* LogSoftmax values near 0 come from a cancellation, so f32 gets an
     * absolute tolerance of a few ulp of the inputs' magnitude. */
    double rtol = dt == PP_F32 ? 2e-6 : 1e-13, atol = dt == PP_F32 ? 1e-6 : 1e-14;
    tu_expect(tu_node_run_one(&t), tu_typed(dt, nd, shape, y), rtol, atol, what);
    tu_node_free(&t);
    free(x);
    free(y);
}

static void test_softmax(void **state) {
    (void)state;
    static const char *ops[] = {"Softmax", "LogSoftmax"};
    for (int k = 0; k < 2; k++) {
        check_softmax(ops[k], PP_F32, 3, SHAPE(3, 4, 37), -1, 0, 5);
        check_softmax(ops[k], PP_F32, 3, SHAPE(3, 4, 37), 2, 1, 5);
        check_softmax(ops[k], PP_F32, 3, SHAPE(3, 4, 37), 1, 1, 5);
        check_softmax(ops[k], PP_F32, 3, SHAPE(3, 4, 37), 0, 1, 5);
        check_softmax(ops[k], PP_F64, 3, SHAPE(3, 4, 5), -2, 1, 5);
        check_softmax(ops[k], PP_F64, 2, SHAPE(2, 1000), -1, 1, 30);
    }
    /* large logits: numerically stable */
    tu_node t;
    tu_node_init(&t, "Softmax", 1, (pp_tensor *[]){F32(1, SHAPE(3), 1000, 1001, 1002)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(1, SHAPE(3), 0.09003057f, 0.24472847f, 0.66524096f), 1e-6, 0,
              "softmax large");
    tu_node_free(&t);
    tu_node_init(&t, "LogSoftmax", 1, (pp_tensor *[]){F32(1, SHAPE(3), 1000, 1001, 1002)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(1, SHAPE(3), -2.40760596f, -1.40760596f, -0.40760596f), 1e-6, 0,
              "logsoftmax large");
    tu_node_free(&t);
    /* -inf entries (masked attention) get probability 0 */
    tu_node_init(&t, "Softmax", 1, (pp_tensor *[]){F32(1, SHAPE(3), 0, -INFINITY, 0)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(1, SHAPE(3), 0.5f, 0, 0.5f), 1e-7, 0, "softmax -inf");
    tu_node_free(&t);
}

static void test_softmax_opset11_and_edges(void **state) {
    (void)state;
    /* Opset < 13 coerces to 2-D at axis (default 1): [2,2,2] normalises
     * over the last 4 elements of each batch row. */
    tu_node t;
    tu_node_init(&t, "Softmax", 1,
                 (pp_tensor *[]){F32(3, SHAPE(2, 2, 2), 0, 0, 0, 0, 1, 1, 1, 1)}, 1, NULL);
    t.g->opset = 11;
    tu_expect(tu_node_run_one(&t),
              F32(3, SHAPE(2, 2, 2), .25f, .25f, .25f, .25f, .25f, .25f, .25f, .25f), 1e-7, 0,
              "opset 11 softmax");
    tu_node_free(&t);
    pp_tensor *e;
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(0, 5), &e));
    tu_node_init(&t, "Softmax", 1, (pp_tensor *[]){e}, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    tu_assert_shape(y, 2, SHAPE(0, 5));
    pp_tensor_free(y);
    tu_node_free(&t);
    tu_node_init(&t, "LogSoftmax", 1, (pp_tensor *[]){F32(0, NULL, 3)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(0, NULL, 0), 0, 0, "logsoftmax scalar");
    tu_node_free(&t);
    tu_node_init(&t, "Softmax", 1, (pp_tensor *[]){F32(2, SHAPE(1, 2), 1, 2)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 2));
    tu_node_expect_error(&t, PP_ERR_INVALID, "axis 2 is out of range for rank 2");
    tu_node_free(&t);
    tu_node_init(&t, "Softmax", 1, (pp_tensor *[]){I64(1, SHAPE(2), 1, 2)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "int64");
    tu_node_free(&t);
}

/* ---------------------------------------------------- LayerNormalization */

static void ref_layernorm(const double *x, int64_t rows, int64_t len, const double *w,
                          const double *b, double eps, double *y, double *mean, double *inv) {
    for (int64_t r = 0; r < rows; r++) {
        const double *p = x + r * len;
        double m = 0, v = 0;
        for (int64_t i = 0; i < len; i++) m += p[i];
        m /= (double)len;
        for (int64_t i = 0; i < len; i++) v += (p[i] - m) * (p[i] - m);
        v /= (double)len;
        double is = 1 / sqrt(v + eps);
        for (int64_t i = 0; i < len; i++) y[r * len + i] = (p[i] - m) * is * w[i] + (b ? b[i] : 0);
        mean[r] = m;
        inv[r] = is;
    }
}

static void check_layernorm(pp_dtype dt, int nd, const int64_t *shape, int64_t axis, int bias,
                            float eps) {
    int a = (int)(axis < 0 ? axis + nd : axis);
    int64_t rows = 1, len = 1;
    for (int d = 0; d < nd; d++) *(d < a ? &rows : &len) *= shape[d];
    size_t n = (size_t)(rows * len);
    double *x = malloc(sizeof(double) * n), *y = malloc(sizeof(double) * n);
    double *w = malloc(sizeof(double) * (size_t)len), *b = malloc(sizeof(double) * (size_t)len);
    double *mean = malloc(sizeof(double) * (size_t)rows), *inv = malloc(sizeof(double) * (size_t)rows);
    for (int64_t i = 0; i < rows * len; i++) x[i] = (float)(tu_urand(&rng_state) * 3 + 1);
    for (int64_t i = 0; i < len; i++) {
        w[i] = (float)(tu_urand(&rng_state) + 1);
        b[i] = (float)tu_urand(&rng_state);
    }
    ref_layernorm(x, rows, len, w, bias ? b : NULL, (double)eps, y, mean, inv);
    tu_node t;
    pp_tensor *ins[3] = {tu_typed(dt, nd, shape, x), tu_typed(dt, nd - a, shape + a, w),
                         bias ? tu_typed(dt, nd - a, shape + a, b) : NULL};
    tu_node_init(&t, "LayerNormalization", bias ? 3 : 2, ins, 3, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", axis));
    TU_OK(pp_node_set_float(t.g, t.node, "epsilon", eps));
    pp_tensor *out[3];
    TU_OK(tu_node_run(&t, out));
    int64_t sshape[PP_MAX_DIMS];
    for (int d = 0; d < nd; d++) sshape[d] = d < a ? shape[d] : 1;
    char what[96];
    snprintf(what, sizeof what, "LayerNorm %s axis %lld", pp_dtype_name(dt), (long long)axis);
    double tol = dt == PP_F32 ? 1e-5 : 1e-12;
    tu_expect(out[0], tu_typed(dt, nd, shape, y), tol, tol, what);
    tu_expect(out[1], tu_typed(PP_F32, nd, sshape, mean), 1e-6, 1e-6, "LayerNorm mean");
    tu_expect(out[2], tu_typed(PP_F32, nd, sshape, inv), 1e-5, 1e-6, "LayerNorm inv std");
    tu_node_free(&t);
    free(x);
    free(y);
    free(w);
    free(b);
    free(mean);
    free(inv);
}

static void test_layernorm(void **state) {
    (void)state;
    check_layernorm(PP_F32, 3, SHAPE(2, 5, 37), -1, 1, 1e-5f);
    check_layernorm(PP_F32, 3, SHAPE(2, 5, 37), 1, 0, 1e-2f);
    check_layernorm(PP_F32, 3, SHAPE(2, 5, 37), 0, 1, 1e-5f);
    check_layernorm(PP_F64, 2, SHAPE(4, 768), -1, 1, 1e-5f);
    check_layernorm(PP_F32, 1, SHAPE(1), -1, 1, 1e-5f);

    /* hand-computed: rows [1,2,3] and [2,2,2], scale 1, bias 0, eps 0 */
    tu_node t;
    tu_node_init(&t, "LayerNormalization", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 3), 1, 2, 3, 2, 2, 2), F32(1, SHAPE(3), 1, 1, 1)},
                 1, NULL);
    TU_OK(pp_node_set_float(t.g, t.node, "epsilon", 0));
    pp_tensor *y = tu_node_run_one(&t);
    const float *d = y->data;
    float r = sqrtf(1.5f);
    assert_true(fabsf(d[0] + r) < 1e-6f && fabsf(d[1]) < 1e-6f && fabsf(d[2] - r) < 1e-6f);
    assert_true(isnan(d[3])); /* 0 / sqrt(0): as the ONNX reference */
    pp_tensor_free(y);
    tu_node_free(&t);

    /* a scale of shape [1] broadcasts over the normalised dims */
    tu_node_init(&t, "LayerNormalization", 3,
                 (pp_tensor *[]){F32(2, SHAPE(1, 2), 1, 3), F32(1, SHAPE(1), 2), F32(0, NULL, 1)},
                 1, NULL);
    TU_OK(pp_node_set_float(t.g, t.node, "epsilon", 0));
    tu_expect(tu_node_run_one(&t), F32(2, SHAPE(1, 2), -1, 3), 1e-6, 0, "broadcast scale and bias");
    tu_node_free(&t);

    /* only Mean requested, InvStdDev omitted */
    tu_node_init(&t, "LayerNormalization", 2,
                 (pp_tensor *[]){F32(2, SHAPE(1, 2), 1, 3), F32(1, SHAPE(2), 1, 1)}, 2,
                 (const char *const[]){"y", "m"});
    pp_tensor *out[2];
    TU_OK(tu_node_run(&t, out));
    tu_expect(out[1], F32(2, SHAPE(1, 1), 2), 0, 0, "mean only");
    pp_tensor_free(out[0]);
    tu_node_free(&t);
    tu_node_init(&t, "LayerNormalization", 2,
                 (pp_tensor *[]){F32(2, SHAPE(1, 2), 1, 3), F32(1, SHAPE(2), 1, 1)}, 3,
                 (const char *const[]){"y", "", "inv"});
    TU_OK(tu_node_run(&t, out));
    assert_int_equal(out[1]->dtype, PP_F32);
    pp_tensor_free(out[0]);
    pp_tensor_free(out[1]);
    tu_node_free(&t);
}

static void test_layernorm_errors(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "LayerNormalization", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), F32(1, SHAPE(2), 1, 1)},
                 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "Scale shape [2] does not fit normalised shape [3]");
    tu_node_free(&t);
    tu_node_init(&t, "LayerNormalization", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), T(PP_F64, 1, SHAPE(3), 1, 1, 1)},
                 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "float64");
    tu_node_free(&t);
    tu_node_init(&t, "LayerNormalization", 2,
                 (pp_tensor *[]){I64(1, SHAPE(1), 1), I64(1, SHAPE(1), 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "int64");
    tu_node_free(&t);
    tu_node_init(&t, "LayerNormalization", 2,
                 (pp_tensor *[]){F32(1, SHAPE(1), 1), F32(1, SHAPE(1), 1)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "stash_type", 10));
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "stash_type");
    tu_node_free(&t);
}

/* ------------------------------------------------ SoftmaxCrossEntropyLoss */

/* Reference loss for scores [n, c, inner] in double. */
static double ref_sce(const double *x, const int64_t *lab, const double *w, int64_t n, int64_t c,
                      int64_t inner, int has_ii, int64_t ii, const char *red, double *none,
                      double *lp) {
    ref_softmax(x, n, c, inner, 1, lp);
    double total = 0, denom = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < inner; j++) {
            int64_t t = lab[i * inner + j];
            double l = 0, wt = 0;
            if (!(has_ii && t == ii)) {
                wt = w ? w[t] : 1;
                l = -lp[(i * c + t) * inner + j] * wt;
            }
            none[i * inner + j] = l;
            total += l;
            denom += wt;
        }
    return strcmp(red, "sum") == 0 ? total : total / denom;
}

static void check_sce(int nd, const int64_t *shape, const char *red, int weights, int has_ii,
                      int64_t ii, pp_dtype label_dt) {
    int64_t n = shape[0], c = shape[1], inner = 1;
    for (int d = 2; d < nd; d++) inner *= shape[d];
    int64_t total = n * c * inner;
    double *x = malloc(sizeof(double) * (size_t)total), *lp = malloc(sizeof(double) * (size_t)total);
    double *none = malloc(sizeof(double) * (size_t)(n * inner)), w[16];
    int64_t *lab = malloc(sizeof(int64_t) * (size_t)(n * inner));
    double labd[256];
    for (int64_t i = 0; i < total; i++) x[i] = (float)(tu_urand(&rng_state) * 3);
    for (int64_t i = 0; i < n * inner; i++) {
        lab[i] = (int64_t)((tu_urand(&rng_state) + 1) / 2 * (double)c) % c;
        if (has_ii && i % 3 == 1) lab[i] = ii;
        labd[i] = (double)lab[i];
    }
    for (int64_t k = 0; k < c; k++) w[k] = (float)(tu_urand(&rng_state) + 1.5);
    double loss = ref_sce(x, lab, weights ? w : NULL, n, c, inner, has_ii, ii, red, none, lp);
    int64_t lshape[PP_MAX_DIMS];
    lshape[0] = n;
    for (int d = 2; d < nd; d++) lshape[d - 1] = shape[d];
    pp_tensor *ins[3] = {tu_typed(PP_F32, nd, shape, x), tu_typed(label_dt, nd - 1, lshape, labd),
                         weights ? tu_typed(PP_F32, 1, SHAPE(c), w) : NULL};
    tu_node t;
    tu_node_init(&t, "SoftmaxCrossEntropyLoss", weights ? 3 : 2, ins, 2, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "reduction", red));
    if (has_ii) TU_OK(pp_node_set_int(t.g, t.node, "ignore_index", ii));
    pp_tensor *out[2];
    TU_OK(tu_node_run(&t, out));
    char what[128];
    snprintf(what, sizeof what, "sce nd %d %s weights %d ii %d", nd, red, weights, has_ii);
    if (strcmp(red, "none") == 0)
        tu_expect(out[0], tu_typed(PP_F32, nd - 1, lshape, none), 1e-5, 1e-6, what);
    else
        tu_expect(out[0], T(PP_F32, 0, NULL, loss), 1e-5, 1e-6, what);
    tu_expect(out[1], tu_typed(PP_F32, nd, shape, lp), 1e-5, 1e-6, "sce log_prob");
    tu_node_free(&t);
    free(x);
    free(lp);
    free(none);
    free(lab);
}

static void test_sce(void **state) {
    (void)state;
    check_sce(2, SHAPE(5, 4), "mean", 0, 0, 0, PP_I64);
    check_sce(2, SHAPE(5, 4), "sum", 0, 0, 0, PP_I64);
    check_sce(2, SHAPE(5, 4), "none", 0, 0, 0, PP_I32);
    check_sce(2, SHAPE(5, 4), "mean", 1, 0, 0, PP_I64);
    check_sce(2, SHAPE(6, 4), "mean", 0, 1, 2, PP_I64);
    check_sce(2, SHAPE(6, 4), "mean", 1, 1, -1, PP_I64);
    check_sce(3, SHAPE(3, 5, 2), "mean", 1, 1, 0, PP_I64);
    check_sce(4, SHAPE(2, 3, 2, 4), "none", 0, 1, -5, PP_I32);
    check_sce(4, SHAPE(2, 3, 2, 4), "sum", 1, 0, 0, PP_I64);

    /* hand-computed: uniform scores over 4 classes, loss log 4 */
    tu_node t;
    tu_node_init(&t, "SoftmaxCrossEntropyLoss", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 4), 0, 0, 0, 0, 1, 1, 1, 1), I64(1, SHAPE(2), 3, 0)},
                 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    assert_int_equal(y->ndim, 0);
    tu_expect(y, F32(0, NULL, logf(4)), 1e-6, 0, "sce uniform");
    tu_node_free(&t);
}

static void test_sce_errors(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "SoftmaxCrossEntropyLoss", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 2), 0, 0, 0, 0), I64(1, SHAPE(2), 0, 2)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "label 2 at position 1 is out of range [0, 2)");
    tu_node_free(&t);
    tu_node_init(&t, "SoftmaxCrossEntropyLoss", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 2), 0, 0, 0, 0), I64(1, SHAPE(3), 0, 1, 0)},
                 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "labels shape [3] does not fit scores shape [2,2]");
    tu_node_free(&t);
    tu_node_init(&t, "SoftmaxCrossEntropyLoss", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 2), 0, 0, 0, 0), F32(1, SHAPE(2), 0, 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "labels have dtype float32");
    tu_node_free(&t);
    tu_node_init(&t, "SoftmaxCrossEntropyLoss", 3,
                 (pp_tensor *[]){F32(2, SHAPE(2, 2), 0, 0, 0, 0), I64(1, SHAPE(2), 0, 1),
                            F32(1, SHAPE(3), 1, 1, 1)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "weights");
    tu_node_free(&t);
    tu_node_init(&t, "SoftmaxCrossEntropyLoss", 2,
                 (pp_tensor *[]){F32(2, SHAPE(2, 2), 0, 0, 0, 0), I64(1, SHAPE(2), 0, 1)}, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "reduction", "max"));
    tu_node_expect_error(&t, PP_ERR_INVALID, "reduction");
    tu_node_free(&t);
}

static void test_nll(void **state) {
    (void)state;
    /* log-probs [2,3]; labels 2 and 0 (ignored via ignore_index 0) */
    tu_node t;
    tu_node_init(&t, "NegativeLogLikelihoodLoss", 3,
                 (pp_tensor *[]){F32(2, SHAPE(2, 3), -1, -2, -3, -4, -5, -6), I64(1, SHAPE(2), 2, 0),
                            F32(1, SHAPE(3), 1, 2, 4)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "ignore_index", 0));
    tu_expect(tu_node_run_one(&t), F32(0, NULL, 3), 0, 0, "nll mean weight ii"); /* (3*4)/4 */
    TU_OK(pp_node_set_string(t.g, t.node, "reduction", "none"));
    tu_expect(tu_node_run_one(&t), F32(1, SHAPE(2), 12, 0), 0, 0, "nll none");
    tu_node_free(&t);
    tu_node_init(&t, "NegativeLogLikelihoodLoss", 2,
                 (pp_tensor *[]){F32(3, SHAPE(1, 2, 2), -1, -2, -3, -4), I64(2, SHAPE(1, 2), 1, 0)},
                 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "reduction", "sum"));
    tu_expect(tu_node_run_one(&t), F32(0, NULL, 5), 0, 0, "nll NCd sum"); /* -(-3) + -(-2) */
    tu_node_free(&t);
}

static void test_reduce_log_sum_exp_hardmax(void **state) {
    (void)state;
    const int64_t *s = SHAPE(2, 3);
    tu_expect(reduce_attr("ReduceLogSumExp", F32(2, s, 1, 2, 3, 1000, 1000, -INFINITY), AXES(1), 0),
              F32(1, SHAPE(2), 3.40760596f, 1000.693147f), 1e-6, 0, "logsumexp stable");
    tu_expect(reduce_attr("ReduceLogSumExp", F32(2, s, 1, 2, 3, 4, 5, 6), AXES(0), 1),
              F32(2, SHAPE(1, 3), 4.04858735f, 5.04858735f, 6.04858735f), 1e-6, 0, "logsumexp axis 0");
    tu_expect(reduce_attr("ReduceLogSumExp", F32(1, SHAPE(2), -INFINITY, -INFINITY), AXES(0), 0),
              F32(0, NULL, -INFINITY), 0, 0, "logsumexp of -inf");
    tu_expect(reduce_attr("ReduceLogSum", F32(2, s, 1, 2, 3, 4, 5, 6), AXES(1), 0),
              F32(1, SHAPE(2), logf(6), logf(15)), 1e-6, 0, "logsum");
    tu_node t;
    tu_node_init(&t, "Hardmax", 1, (pp_tensor *[]){F32(2, s, 1, 3, 3, 7, 2, 1)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(2, s, 0, 1, 0, 1, 0, 0), 0, 0, "hardmax last axis");
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 0));
    tu_expect(tu_node_run_one(&t), F32(2, s, 0, 1, 1, 1, 0, 0), 0, 0, "hardmax axis 0");
    tu_node_free(&t);
}

static void test_batchnorm(void **state) {
    (void)state;
    /* x [2,2,2]: channel 0 holds 1,2,5,6; channel 1 holds 3,4,7,8 */
    pp_tensor *ins[5] = {F32(3, SHAPE(2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8), F32(1, SHAPE(2), 1, 2),
                         F32(1, SHAPE(2), 0, 1), F32(1, SHAPE(2), 1, 2), F32(1, SHAPE(2), 4, 1)};
    tu_node t;
    tu_node_init(&t, "BatchNormalization", 5, ins, 1, NULL);
    TU_OK(pp_node_set_float(t.g, t.node, "epsilon", 0));
    /* inference: (x - mean) / sqrt(var) * scale + B */
    tu_expect(tu_node_run_one(&t), F32(3, SHAPE(2, 2, 2), 0, 0.5f, 3, 5, 2, 2.5f, 11, 13), 1e-6, 0,
              "batchnorm inference");
    tu_node_free(&t);
    pp_tensor *ins2[5] = {F32(3, SHAPE(2, 2, 2), 1, 2, 3, 4, 5, 6, 7, 8), F32(1, SHAPE(2), 1, 1),
                          F32(1, SHAPE(2), 0, 0), F32(1, SHAPE(2), 0, 0), F32(1, SHAPE(2), 1, 1)};
    tu_node_init(&t, "BatchNormalization", 5, ins2, 3, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "training_mode", 1));
    TU_OK(pp_node_set_float(t.g, t.node, "epsilon", 0));
    pp_tensor *out[3];
    TU_OK(tu_node_run(&t, out));
    /* batch mean 3.5 / 5.5, biased var 4.25 for both */
    float r = 1 / sqrtf(4.25f);
    tu_expect(out[0], F32(3, SHAPE(2, 2, 2), -2.5f * r, -1.5f * r, -2.5f * r, -1.5f * r, 1.5f * r,
                          2.5f * r, 1.5f * r, 2.5f * r),
              1e-6, 1e-7, "batchnorm training y");
    tu_expect(out[1], F32(1, SHAPE(2), 0.35f, 0.55f), 1e-6, 0, "running mean");
    tu_expect(out[2], F32(1, SHAPE(2), 0.9f + 0.425f, 0.9f + 0.425f), 1e-6, 0, "running var");
    tu_node_free(&t);
}

static void test_half_types(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "LayerNormalization", 2,
                 (pp_tensor *[]){T(PP_F16, 2, SHAPE(1, 2), 1, 3), T(PP_F16, 1, SHAPE(2), 1, 1)},
                 1, NULL);
    TU_OK(pp_node_set_float(t.g, t.node, "epsilon", 0));
    pp_tensor *y = tu_node_run_one(&t);
    assert_int_equal(y->dtype, PP_F16);
    tu_expect(y, T(PP_F16, 2, SHAPE(1, 2), -1, 1), 0, 0, "layernorm f16");
    tu_node_free(&t);
    tu_node_init(&t, "Softmax", 1, (pp_tensor *[]){T(PP_BF16, 1, SHAPE(2), 0, 0)}, 1, NULL);
    y = tu_node_run_one(&t);
    assert_int_equal(y->dtype, PP_BF16);
    tu_expect(y, T(PP_BF16, 1, SHAPE(2), 0.5, 0.5), 0, 0, "softmax bf16");
    tu_node_free(&t);
    tu_node_init(&t, "ArgMax", 1, (pp_tensor *[]){T(PP_F16, 1, SHAPE(3), 1, 5, 2)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), I64(1, SHAPE(1), 1), 0, 0, "argmax f16");
    tu_node_free(&t);
}

static void test_registry(void **state) {
    (void)state;
    static const char *names[] = {"ReduceMean", "ReduceSum", "ReduceMax", "Softmax", "LogSoftmax",
                                  "LayerNormalization", "SoftmaxCrossEntropyLoss", "ArgMax"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        assert_non_null(pp_op_find("", names[i]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce_sum_hand),
        cmocka_unit_test(test_reduce_kinds),
        cmocka_unit_test(test_reduce_random),
        cmocka_unit_test(test_reduce_long_row_accuracy),
        cmocka_unit_test(test_reduce_zero_size_and_scalar),
        cmocka_unit_test(test_reduce_errors),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_softmax_opset11_and_edges),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_layernorm_errors),
        cmocka_unit_test(test_sce),
        cmocka_unit_test(test_sce_errors),
        cmocka_unit_test(test_nll),
        cmocka_unit_test(test_reduce_log_sum_exp_hardmax),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_half_types),
        cmocka_unit_test(test_registry),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
