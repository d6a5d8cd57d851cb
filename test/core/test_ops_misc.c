/* Misc kernels (lib/ops/misc.c): CumSum (every exclusive/reverse form,
 * axes, dtypes) against a naive reference; Mish and pippin::MishGrad against
 * double references; ScatterElements/ScatterND (every reduction,
 * duplicates, negative indices); InstanceNormalization; TopK (ties,
 * smallest, K = 0); Einsum (ellipsis broadcast, implicit output, diagonals)
 * against naive loops; the gradient helpers pippin::TileGrad and
 * pippin::GatherElementsGrad against hand-computed sums. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"

static pp_tensor *cumsum(pp_tensor *x, int64_t axis, int exclusive, int reverse) {
    tu_node t;
    pp_tensor *ins[2] = {x, tu_i64(0, NULL, (const int64_t[]){axis})};
    tu_node_init(&t, "CumSum", 2, ins, 1, NULL);
    if (exclusive) TU_OK(pp_node_set_int(t.g, t.node, "exclusive", 1));
    if (reverse) TU_OK(pp_node_set_int(t.g, t.node, "reverse", 1));
    pp_tensor *y = tu_node_run_one(&t);
    tu_node_free(&t);
    return y;
}

static void test_cumsum_hand(void **state) {
    (void)state;
    tu_expect(cumsum(F32(1, SHAPE(5), 1, 2, 3, 4, 5), 0, 0, 0),
              F32(1, SHAPE(5), 1, 3, 6, 10, 15), 0, 0, "1d");
    tu_expect(cumsum(F32(1, SHAPE(5), 1, 2, 3, 4, 5), 0, 1, 0),
              F32(1, SHAPE(5), 0, 1, 3, 6, 10), 0, 0, "exclusive");
    tu_expect(cumsum(F32(1, SHAPE(5), 1, 2, 3, 4, 5), 0, 0, 1),
              F32(1, SHAPE(5), 15, 14, 12, 9, 5), 0, 0, "reverse");
    tu_expect(cumsum(F32(1, SHAPE(5), 1, 2, 3, 4, 5), 0, 1, 1),
              F32(1, SHAPE(5), 14, 12, 9, 5, 0), 0, 0, "reverse exclusive");
    tu_expect(cumsum(F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), 0, 0, 0),
              F32(2, SHAPE(2, 3), 1, 2, 3, 5, 7, 9), 0, 0, "axis 0");
    tu_expect(cumsum(F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), -1, 0, 0),
              F32(2, SHAPE(2, 3), 1, 3, 6, 4, 9, 15), 0, 0, "axis -1");
    tu_expect(cumsum(I64(2, SHAPE(2, 2), INT64_C(1) << 40, 1, 2, 3), 0, 0, 0),
              I64(2, SHAPE(2, 2), INT64_C(1) << 40, 1, (INT64_C(1) << 40) + 2, 4), 0, 0, "int64");
    tu_expect(cumsum(T(PP_I32, 1, SHAPE(3), 7, -2, 5), 0, 0, 1), T(PP_I32, 1, SHAPE(3), 10, 3, 5),
              0, 0, "int32");
    tu_expect(cumsum(T(PP_F64, 1, SHAPE(2), 0.5, 0.25), 0, 0, 0), T(PP_F64, 1, SHAPE(2), 0.5, 0.75),
              0, 0, "float64");
    tu_expect(cumsum(F32(2, SHAPE(0, 3), 0), 1, 0, 0), F32(2, SHAPE(0, 3), 0), 0, 0, "empty");
}

/* Random 3-d tensors, every axis and flag, against a naive reference. */
static void test_cumsum_random(void **state) {
    (void)state;
    uint64_t rng = 42;
    const int64_t shape[3] = {3, 4, 5};
    for (int axis = 0; axis < 3; axis++)
        for (int ex = 0; ex < 2; ex++)
            for (int rev = 0; rev < 2; rev++) {
                float v[60], want[60];
                for (int i = 0; i < 60; i++) v[i] = (float)tu_urand(&rng);
                int64_t st[3] = {20, 5, 1};
                for (int i = 0; i < 60; i++) {
                    int64_t k = (i / st[axis]) % shape[axis];
                    double s = 0;
                    for (int64_t j = 0; j < shape[axis]; j++) {
                        int take = rev ? (ex ? j > k : j >= k) : (ex ? j < k : j <= k);
                        if (take) s += v[i + (j - k) * st[axis]];
                    }
                    want[i] = (float)s;
                }
                char what[64];
                snprintf(what, sizeof what, "axis %d exclusive %d reverse %d", axis, ex, rev);
                tu_expect(cumsum(tu_f32(3, shape, v), axis, ex, rev), tu_f32(3, shape, want), 1e-5,
                          1e-6, what);
            }
}

static void test_cumsum_errors(void **state) {
    (void)state;
    tu_node t;
    /* regression (review): an int32 sum past INT32_MAX wraps (as ONNX Runtime), no undefined behaviour */
    pp_tensor *wrap[2] = {T(PP_I32, 1, SHAPE(2), INT32_MAX, 5), tu_i64(0, NULL, (const int64_t[]){0})};
    tu_node_init(&t, "CumSum", 2, wrap, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    assert_int_equal(((const int32_t *)y->data)[1], INT32_MIN + 4);
    pp_tensor_free(y);
    tu_node_free(&t);

    pp_tensor *ins[2] = {F32(1, SHAPE(2), 1, 2), tu_i64(0, NULL, (const int64_t[]){1})};
    tu_node_init(&t, "CumSum", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "axis");
    tu_node_free(&t);

    pp_tensor *ins2[2] = {T(PP_BOOL, 1, SHAPE(2), 1, 0), tu_i64(0, NULL, (const int64_t[]){0})};
    tu_node_init(&t, "CumSum", 2, ins2, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "bool");
    tu_node_free(&t);

    pp_tensor *ins3[2] = {F32(1, SHAPE(2), 1, 2), tu_i64(0, NULL, (const int64_t[]){0})};
    tu_node_init(&t, "CumSum", 2, ins3, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "reverse", 2));
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "'n0'"));
    tu_node_free(&t);
}

static void test_tile_grad(void **state) {
    (void)state;
    tu_node t;
    /* x [2,1] tiled by [2,3] -> dy [4,3]; dx[i,0] = sum of dy[i + 2a, b] */
    pp_tensor *ins[2] = {F32(2, SHAPE(4, 3), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
                         tu_i64_vec(2, (const int64_t[]){2, 1})};
    tu_node_init_dom(&t, "TileGrad", "pippin", 2, ins, 1, NULL);
    tu_expect(tu_node_run_one(&t),
              F32(2, SHAPE(2, 1), 1 + 2 + 3 + 7 + 8 + 9, 4 + 5 + 6 + 10 + 11 + 12), 0, 0,
              "tile grad");
    tu_node_free(&t);

    pp_tensor *ins2[2] = {F32(1, SHAPE(5), 1, 2, 3, 4, 5), tu_i64_vec(1, (const int64_t[]){2})};
    tu_node_init_dom(&t, "TileGrad", "pippin", 2, ins2, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "multiple");
    tu_node_free(&t);
}

static void test_gather_elements_grad(void **state) {
    (void)state;
    tu_node t;
    /* x [2,3], axis 1, indices [2,2]: repeated index 0 in row 0 sums. */
    pp_tensor *ins[3] = {F32(2, SHAPE(2, 2), 1, 2, 3, 4), I64(2, SHAPE(2, 2), 0, 0, 2, -3),
                         tu_i64_vec(2, (const int64_t[]){2, 3})};
    tu_node_init_dom(&t, "GatherElementsGrad", "pippin", 3, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 1));
    tu_expect(tu_node_run_one(&t), F32(2, SHAPE(2, 3), 3, 0, 0, 4, 0, 3), 0, 0, "axis 1");
    tu_node_free(&t);

    pp_tensor *ins2[3] = {F32(2, SHAPE(1, 2), 5, 7), I64(2, SHAPE(1, 2), 2, 0),
                          tu_i64_vec(2, (const int64_t[]){3, 2})};
    tu_node_init_dom(&t, "GatherElementsGrad", "pippin", 3, ins2, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(2, SHAPE(3, 2), 0, 7, 0, 0, 5, 0), 0, 0, "axis 0");
    tu_node_free(&t);

    pp_tensor *ins3[3] = {F32(1, SHAPE(1), 5), I64(1, SHAPE(1), 3),
                          tu_i64_vec(1, (const int64_t[]){3})};
    tu_node_init_dom(&t, "GatherElementsGrad", "pippin", 3, ins3, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "out of range");
    tu_node_free(&t);
}

static void test_mish(void **state) {
    (void)state;
    const float v[6] = {-30, -2, -0.5f, 0, 1.5f, 30};
    float want[6], dwant[6];
    for (int i = 0; i < 6; i++) {
        double x = v[i], sp = log1p(exp(x)), t = tanh(sp), sig = 1 / (1 + exp(-x));
        want[i] = (float)(x * t);
        dwant[i] = (float)(2 * (t + x * (1 - t * t) * sig));
    }
    tu_node t;
    pp_tensor *ins[1] = {tu_f32(1, SHAPE(6), v)};
    tu_node_init(&t, "Mish", 1, ins, 1, NULL);
    tu_expect(tu_node_run_one(&t), tu_f32(1, SHAPE(6), want), 1e-6, 1e-7, "mish");
    tu_node_free(&t);

    pp_tensor *ins2[2] = {F32(1, SHAPE(6), 2, 2, 2, 2, 2, 2), tu_f32(1, SHAPE(6), v)};
    tu_node_init_dom(&t, "MishGrad", "pippin", 2, ins2, 1, NULL);
    tu_expect(tu_node_run_one(&t), tu_f32(1, SHAPE(6), dwant), 1e-5, 1e-7, "mish grad");
    tu_node_free(&t);

    pp_tensor *ins3[1] = {tu_i64_vec(1, (const int64_t[]){1})};
    tu_node_init(&t, "Mish", 1, ins3, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "float32");
    tu_node_free(&t);
}

static pp_tensor *run3(const char *op, pp_tensor *a, pp_tensor *b, pp_tensor *c, const char *attr,
                       int64_t ival, const char *sval) {
    tu_node t;
    pp_tensor *ins[3] = {a, b, c};
    tu_node_init(&t, op, 3, ins, 1, NULL);
    if (attr) {
        if (sval) TU_OK(pp_node_set_string(t.g, t.node, attr, sval));
        else TU_OK(pp_node_set_int(t.g, t.node, attr, ival));
    }
    pp_tensor *y = tu_node_run_one(&t);
    tu_node_free(&t);
    return y;
}

static void test_scatter_elements(void **state) {
    (void)state;
    /* axis 1, one index repeated (the last write wins without reduction) */
    tu_expect(run3("ScatterElements", F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6),
                   I64(2, SHAPE(2, 2), 2, 0, -1, 0), F32(2, SHAPE(2, 2), 10, 20, 30, 40), "axis", 1,
                   NULL),
              F32(2, SHAPE(2, 3), 20, 2, 10, 40, 5, 30), 0, 0, "axis 1");
    tu_expect(run3("ScatterElements", F32(2, SHAPE(3, 2), 1, 2, 3, 4, 5, 6),
                   I64(2, SHAPE(2, 2), 2, 0, 2, 0), F32(2, SHAPE(2, 2), 10, 20, 30, 40),
                   "reduction", 0, "add"),
              F32(2, SHAPE(3, 2), 1, 62, 3, 4, 45, 6), 0, 0, "add, duplicates");
    tu_expect(run3("ScatterElements", I64(1, SHAPE(3), 5, 5, 5), I64(1, SHAPE(3), 0, 1, 1),
                   I64(1, SHAPE(3), 2, 3, 4), "reduction", 0, "mul"),
              I64(1, SHAPE(3), 10, 60, 5), 0, 0, "mul int64");
    tu_expect(run3("ScatterElements", F32(1, SHAPE(2), 5, 5), I64(1, SHAPE(3), 0, 1, 1),
                   F32(1, SHAPE(3), 2, 7, 9), "reduction", 0, "max"),
              F32(1, SHAPE(2), 5, 9), 0, 0, "max");
    tu_expect(run3("ScatterElements", F32(1, SHAPE(2), 5, 5), I64(1, SHAPE(3), 0, 1, 1),
                   F32(1, SHAPE(3), 2, 7, 9), "reduction", 0, "min"),
              F32(1, SHAPE(2), 2, 5), 0, 0, "min");

    tu_node t;
    pp_tensor *ins[3] = {F32(1, SHAPE(2), 1, 2), I64(1, SHAPE(1), 2), F32(1, SHAPE(1), 3)};
    tu_node_init(&t, "ScatterElements", 3, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "out of range");
    tu_node_free(&t);

    pp_tensor *ins2[3] = {F32(1, SHAPE(2), 1, 2), I64(1, SHAPE(1), 0), F32(1, SHAPE(1), 3)};
    tu_node_init(&t, "ScatterElements", 3, ins2, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "reduction", "mean"));
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_UNSUPPORTED);
    assert_non_null(strstr(pp_last_error(), "'n0'"));
    tu_node_free(&t);
}

static void test_scatter_nd(void **state) {
    (void)state;
    /* whole rows: data [3,2], indices [2,1], updates [2,2] */
    tu_expect(run3("ScatterND", F32(2, SHAPE(3, 2), 1, 2, 3, 4, 5, 6), I64(2, SHAPE(2, 1), 2, -3),
                   F32(2, SHAPE(2, 2), 10, 20, 30, 40), NULL, 0, NULL),
              F32(2, SHAPE(3, 2), 30, 40, 3, 4, 10, 20), 0, 0, "rows");
    /* single elements, with add and a duplicate */
    tu_expect(run3("ScatterND", F32(2, SHAPE(2, 2), 1, 2, 3, 4),
                   I64(2, SHAPE(3, 2), 0, 1, 1, 0, 0, 1), F32(1, SHAPE(3), 10, 20, 30),
                   "reduction", 0, "add"),
              F32(2, SHAPE(2, 2), 1, 42, 23, 4), 0, 0, "elements add");
    tu_expect(run3("ScatterND", I64(1, SHAPE(3), 1, 2, 3), I64(2, SHAPE(1, 1), 1),
                   I64(1, SHAPE(1), 9), "reduction", 0, "mul"),
              I64(1, SHAPE(3), 1, 18, 3), 0, 0, "mul int64");

    tu_node t;
    pp_tensor *ins[3] = {F32(2, SHAPE(2, 2), 1, 2, 3, 4), I64(2, SHAPE(1, 1), 0),
                         F32(1, SHAPE(3), 1, 2, 3)};
    tu_node_init(&t, "ScatterND", 3, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "do not fit");
    tu_node_free(&t);
}

static void test_instance_norm(void **state) {
    (void)state;
    /* x [1,2,3]: plane 0 = 1,2,3 (mean 2, var 2/3), plane 1 = 4,4,4 (var 0) */
    tu_node t;
    pp_tensor *ins[3] = {F32(3, SHAPE(1, 2, 3), 1, 2, 3, 4, 4, 4), F32(1, SHAPE(2), 2, 3),
                         F32(1, SHAPE(2), 0.5f, -1)};
    tu_node_init(&t, "InstanceNormalization", 3, ins, 1, NULL);
    TU_OK(pp_node_set_float(t.g, t.node, "epsilon", 0.01f));
    double g = 2 / sqrt(2.0 / 3 + 0.01f);
    tu_expect(tu_node_run_one(&t),
              F32(3, SHAPE(1, 2, 3), (float)(-g + 0.5), 0.5f, (float)(g + 0.5), -1, -1, -1), 1e-6,
              1e-6, "instance norm");
    tu_node_free(&t);

    pp_tensor *ins2[3] = {F32(3, SHAPE(1, 2, 1), 1, 2), F32(1, SHAPE(3), 1, 1, 1),
                          F32(1, SHAPE(2), 0, 0)};
    tu_node_init(&t, "InstanceNormalization", 3, ins2, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "scale");
    tu_node_free(&t);
}

static void test_topk(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *outs[2];
    /* ties go to the lower index; rows along the last axis */
    pp_tensor *ins[2] = {F32(2, SHAPE(2, 4), 3, 1, 3, 2, -1, 5, 0, 5), I64(1, SHAPE(1), 3)};
    tu_node_init(&t, "TopK", 2, ins, 2, NULL);
    TU_OK(tu_node_run(&t, outs));
    tu_expect(outs[0], F32(2, SHAPE(2, 3), 3, 3, 2, 5, 5, 0), 0, 0, "values");
    tu_expect(outs[1], I64(2, SHAPE(2, 3), 0, 2, 3, 1, 3, 2), 0, 0, "indices");
    tu_node_free(&t);

    pp_tensor *ins2[2] = {I64(2, SHAPE(3, 2), 4, 1, 2, 1, 9, 0), I64(1, SHAPE(1), 2)};
    tu_node_init(&t, "TopK", 2, ins2, 2, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 0));
    TU_OK(pp_node_set_int(t.g, t.node, "largest", 0));
    TU_OK(tu_node_run(&t, outs));
    tu_expect(outs[0], I64(2, SHAPE(2, 2), 2, 0, 4, 1), 0, 0, "smallest values");
    tu_expect(outs[1], I64(2, SHAPE(2, 2), 1, 2, 0, 0), 0, 0, "smallest indices");
    tu_node_free(&t);

    pp_tensor *ins3[2] = {F32(1, SHAPE(3), 1, 2, 3), I64(1, SHAPE(1), 0)};
    tu_node_init(&t, "TopK", 2, ins3, 2, NULL);
    TU_OK(tu_node_run(&t, outs));
    tu_assert_shape(outs[0], 1, SHAPE(0));
    tu_assert_shape(outs[1], 1, SHAPE(0));
    pp_tensor_free(outs[0]);
    pp_tensor_free(outs[1]);
    tu_node_free(&t);

    pp_tensor *ins4[2] = {F32(1, SHAPE(3), 1, 2, 3), I64(1, SHAPE(1), 4)};
    tu_node_init(&t, "TopK", 2, ins4, 2, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "K 4");
    tu_node_free(&t);

    pp_tensor *ins5[2] = {F32(1, SHAPE(3), 1, 2, 3), I64(1, SHAPE(1), 1)};
    tu_node_init(&t, "TopK", 2, ins5, 2, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "sorted", 0));
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_UNSUPPORTED);
    tu_node_free(&t);
}

static pp_tensor *einsum(const char *eq, int n, pp_tensor *const *ins) {
    tu_node t;
    tu_node_init(&t, "Einsum", n, ins, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "equation", eq));
    pp_tensor *y = tu_node_run_one(&t);
    tu_node_free(&t);
    return y;
}

static pp_tensor *rand_f32(int nd, const int64_t *shape, uint64_t *rng) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) ((float *)t->data)[i] = (float)tu_urand(rng);
    return t;
}

static void test_einsum(void **state) {
    (void)state;
    uint64_t rng = 7;
    /* batched matmul with a broadcast ellipsis, against a naive loop */
    pp_tensor *a = rand_f32(4, SHAPE(2, 1, 2, 3), &rng), *b = rand_f32(3, SHAPE(3, 3, 4), &rng);
    float want[2 * 3 * 2 * 4];
    const float *av = a->data, *bv = b->data;
    for (int p = 0; p < 2; p++)
        for (int q = 0; q < 3; q++)
            for (int i = 0; i < 2; i++)
                for (int k = 0; k < 4; k++) {
                    double acc = 0;
                    for (int j = 0; j < 3; j++)
                        acc += (double)av[(p * 2 + i) * 3 + j] * bv[(q * 3 + j) * 4 + k];
                    want[((p * 3 + q) * 2 + i) * 4 + k] = (float)acc;
                }
    tu_expect(einsum("...ij, ...jk -> ...ik", 2, (pp_tensor *[]){a, b}),
              tu_f32(4, SHAPE(2, 3, 2, 4), want), 1e-6, 1e-6, "ellipsis matmul");
    /* implicit output: labels seen once, sorted */
    tu_expect(einsum("ji", 1, (pp_tensor *[]){F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6)}),
              F32(2, SHAPE(3, 2), 1, 4, 2, 5, 3, 6), 0, 0, "implicit transpose");
    tu_expect(einsum("ij,jk", 2,
                     (pp_tensor *[]){F32(2, SHAPE(1, 2), 1, 2), F32(2, SHAPE(2, 2), 1, 2, 3, 4)}),
              F32(2, SHAPE(1, 2), 7, 10), 0, 0, "implicit matmul");
    /* repeated label: trace and diagonal */
    tu_expect(einsum("ii->", 1, (pp_tensor *[]){F32(2, SHAPE(2, 2), 1, 2, 3, 4)}),
              F32(0, NULL, 5), 0, 0, "trace");
    tu_expect(einsum("ii->i", 1, (pp_tensor *[]){I64(2, SHAPE(2, 2), 1, 2, 3, 4)}),
              I64(1, SHAPE(2), 1, 4), 0, 0, "diagonal int64");
    tu_expect(einsum("i,j->ij", 2,
                     (pp_tensor *[]){F32(1, SHAPE(2), 1, 2), F32(1, SHAPE(3), 1, 10, 100)}),
              F32(2, SHAPE(2, 3), 1, 10, 100, 2, 20, 200), 0, 0, "outer");
    tu_expect(einsum("ij->", 1, (pp_tensor *[]){F32(2, SHAPE(0, 3), 0)}), F32(0, NULL, 0), 0, 0,
              "empty sum");

    tu_node t;
    tu_node_init(&t, "Einsum", 2,
                 (pp_tensor *[]){F32(1, SHAPE(2), 1, 2), F32(1, SHAPE(3), 1, 2, 3)}, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "equation", "i,i->"));
    tu_node_expect_error(&t, PP_ERR_SHAPE, "sizes");
    tu_node_free(&t);
    tu_node_init(&t, "Einsum", 1, (pp_tensor *[]){F32(1, SHAPE(2), 1, 2)}, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "equation", "ij->i"));
    tu_node_expect_error(&t, PP_ERR_INVALID, "does not fit");
    tu_node_free(&t);
    tu_node_init(&t, "Einsum", 1, (pp_tensor *[]){F32(1, SHAPE(2), 1, 2)}, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "equation", "i->k"));
    tu_node_expect_error(&t, PP_ERR_INVALID, "unknown");
    tu_node_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cumsum_hand),
        cmocka_unit_test(test_cumsum_random),
        cmocka_unit_test(test_cumsum_errors),
        cmocka_unit_test(test_tile_grad),
        cmocka_unit_test(test_gather_elements_grad),
        cmocka_unit_test(test_mish),
        cmocka_unit_test(test_scatter_elements),
        cmocka_unit_test(test_scatter_nd),
        cmocka_unit_test(test_instance_norm),
        cmocka_unit_test(test_topk),
        cmocka_unit_test(test_einsum),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
