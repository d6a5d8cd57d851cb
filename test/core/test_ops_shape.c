/* Shape and data-movement kernels (lib/ops/reshape.c, slice.c, pad.c,
 * cast.c, constant.c): hand-computed cases, naive reference checks for the strided-copy paths, zero-copy views,
 * 0-sized and scalar tensors, and error cases that must name the node. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"
/* ------------------------------------------------------------- helpers */

static pp_tensor *i32t(int nd, const int64_t *shape, const int32_t *v) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_I32, nd, shape, &t));
    if (t->nbytes) memcpy(t->data, v, t->nbytes);
    return t;
}

static pp_tensor *empty_i64(void) { return tu_i64_vec(0, NULL); }

/* Iota tensor of dtype dt (values 0, 1, 2, ... cast). */
static pp_tensor *iota(pp_dtype dt, int nd, const int64_t *shape) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(dt, nd, shape, &t));
    int64_t n = pp_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) pp_tensor_set_f64(t, i, (double)(i % 251));
    return t;
}

static void expect(pp_tensor *got, pp_tensor *want, const char *what) {
    tu_assert_close(got, want, 0, 0, what);
    pp_tensor_free(want);
}

static uint64_t rng_state = 88172645463325252ull;

/* ------------------------------------------------------------- Reshape */

static void test_reshape(void **state) {
    (void)state;
    pp_tensor *ins[2] = {iota(PP_F32, 3, SHAPE(2, 3, 4)), I64(1, SHAPE(3), 0, -1, 2)};
    tu_node t;
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    tu_assert_shape(y, 3, SHAPE(2, 6, 2));
    assert_ptr_equal(y->data, t.in[0]->data); /* zero-copy */
    pp_tensor_free(y);
    tu_node_free(&t);

    /* allowzero: 0 is a real 0-sized dim */
    int64_t zs[] = {0, 3};
    ins[0] = iota(PP_F32, 2, zs);
    ins[1] = I64(1, SHAPE(3), 3, 0, 7);
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "allowzero", 1));
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 3, SHAPE(3, 0, 7));
    pp_tensor_free(y);
    tu_node_free(&t);

    /* scalar <-> [1] */
    TU_OK(pp_tensor_scalar_f32(4.5f, &ins[0]));
    ins[1] = I64(1, SHAPE(1), -1);
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(1), 4.5f), "scalar to [1]");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = F32(1, SHAPE(1), 4.5f);
    ins[1] = empty_i64();
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    assert_int_equal(y->ndim, 0);
    pp_tensor_free(y);
    tu_node_free(&t);
}

static void test_reshape_errors(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[2] = {iota(PP_F32, 2, SHAPE(2, 3)), I64(1, SHAPE(2), -1, -1)};
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(2, 3));
    ins[1] = I64(1, SHAPE(2), 4, -1);
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(2, 3));
    ins[1] = I64(1, SHAPE(2), 5, 1);
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(2, 3));
    ins[1] = I64(1, SHAPE(2), 0, -1);
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "allowzero", 1));
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
}

/* --------------------------------------------- Flatten/Squeeze/Unsqueeze */

static void test_flatten(void **state) {
    (void)state;
    static const struct { int64_t axis; int64_t r, c; } cases[] = {
        {0, 1, 24}, {1, 2, 12}, {2, 6, 4}, {3, 24, 1}, {-1, 6, 4}, {-3, 1, 24}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pp_tensor *ins[1] = {iota(PP_F32, 3, SHAPE(2, 3, 4))};
        tu_node t;
        tu_node_init(&t, "Flatten", 1, ins, 1, NULL);
        TU_OK(pp_node_set_int(t.g, t.node, "axis", cases[i].axis));
        pp_tensor *y = tu_node_run_one(&t);
        tu_assert_shape(y, 2, SHAPE(cases[i].r, cases[i].c));
        assert_ptr_equal(y->data, t.in[0]->data);
        pp_tensor_free(y);
        tu_node_free(&t);
    }
    pp_tensor *ins[1] = {iota(PP_F32, 3, SHAPE(2, 3, 4))};
    tu_node t;
    tu_node_init(&t, "Flatten", 1, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 4));
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
}

static void test_squeeze_unsqueeze(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[2] = {iota(PP_F32, 4, SHAPE(1, 3, 1, 2)), I64(1, SHAPE(1), -2)};
    tu_node_init(&t, "Squeeze", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    tu_assert_shape(y, 3, SHAPE(1, 3, 2));
    assert_ptr_equal(y->data, t.in[0]->data);
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 4, SHAPE(1, 3, 1, 2));
    tu_node_init(&t, "Squeeze", 1, ins, 1, NULL); /* no axes: every unit dim */
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 2, SHAPE(3, 2));
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 2, SHAPE(3, 2));
    ins[1] = I64(1, SHAPE(1), 0);
    tu_node_init(&t, "Squeeze", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 2, SHAPE(3, 2));
    ins[1] = I64(1, SHAPE(3), -1, 0, 2); /* axes index the output rank 5 */
    tu_node_init(&t, "Unsqueeze", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 5, SHAPE(1, 3, 1, 2, 1));
    assert_ptr_equal(y->data, t.in[0]->data);
    pp_tensor_free(y);
    tu_node_free(&t);

    TU_OK(pp_tensor_scalar_i64(7, &ins[0])); /* scalar -> [1] */
    ins[1] = I64(1, SHAPE(1), 0);
    tu_node_init(&t, "Unsqueeze", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, I64(1, SHAPE(1), 7), "unsqueeze scalar");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 1, SHAPE(3));
    ins[1] = I64(1, SHAPE(2), 1, 1);
    tu_node_init(&t, "Unsqueeze", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);

    /* opset < 13 form: axes attribute */
    ins[0] = iota(PP_F32, 1, SHAPE(3));
    tu_node_init(&t, "Unsqueeze", 1, ins, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "axes", 1, SHAPE(1)));
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 2, SHAPE(3, 1));
    pp_tensor_free(y);
    tu_node_free(&t);
}

/* ----------------------------------------------------------- Transpose */

static pp_tensor *naive_transpose(const pp_tensor *x, const int64_t *perm) {
    int nd = x->ndim;
    int64_t shape[PP_MAX_DIMS], istr[PP_MAX_DIMS], idx[PP_MAX_DIMS] = {0};
    for (int i = 0; i < nd; i++) shape[i] = x->shape[perm[i]];
    int64_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        istr[i] = s;
        s *= x->shape[i];
    }
    pp_tensor *y;
    TU_OK(pp_tensor_empty(x->dtype, nd, shape, &y));
    size_t es = pp_dtype_size(x->dtype);
    int64_t n = pp_tensor_numel(y);
    for (int64_t o = 0; o < n; o++) {
        int64_t src = 0;
        for (int i = 0; i < nd; i++) src += idx[i] * istr[perm[i]];
        memcpy((char *)y->data + o * (int64_t)es, (const char *)x->data + src * (int64_t)es, es);
        for (int i = nd - 1; i >= 0; i--) {
            if (++idx[i] < shape[i]) break;
            idx[i] = 0;
        }
    }
    return y;
}

static void check_transpose(pp_dtype dt, int nd, const int64_t *shape, const int64_t *perm) {
    pp_tensor *ins[1] = {iota(dt, nd, shape)};
    pp_tensor *want = naive_transpose(ins[0], perm);
    tu_node t;
    tu_node_init(&t, "Transpose", 1, ins, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "perm", nd, perm));
    pp_tensor *y = tu_node_run_one(&t);
    char what[256], a[64], b[64];
    snprintf(what, sizeof what, "transpose %s %s perm %s", pp_dtype_name(dt),
             pp_shape_str(nd, shape, a, sizeof a), pp_shape_str(nd, perm, b, sizeof b));
    assert_int_equal(y->nbytes, want->nbytes);
    if (y->nbytes && memcmp(y->data, want->data, y->nbytes) != 0) fail_msg("%s: data differs", what);
    tu_assert_shape(y, want->ndim, want->shape);
    pp_tensor_free(want);
    pp_tensor_free(y);
    tu_node_free(&t);
}

static void test_transpose(void **state) {
    (void)state;
    pp_tensor *ins[1] = {F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6)};
    tu_node t;
    tu_node_init(&t, "Transpose", 1, ins, 1, NULL); /* default perm: reverse */
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(3, 2), 1, 4, 2, 5, 3, 6), "2-D default");
    pp_tensor_free(y);
    tu_node_free(&t);

    check_transpose(PP_F32, 2, SHAPE(67, 45), SHAPE(1, 0));        /* blocked 2-D */
    check_transpose(PP_F32, 4, SHAPE(2, 5, 3, 8), SHAPE(0, 2, 1, 3)); /* attention heads */
    check_transpose(PP_F32, 4, SHAPE(2, 3, 37, 16), SHAPE(0, 1, 3, 2)); /* K^T */
    check_transpose(PP_F32, 4, SHAPE(2, 3, 5, 7), SHAPE(0, 2, 3, 1));   /* NCHW -> NHWC */
    check_transpose(PP_F64, 3, SHAPE(9, 10, 11), SHAPE(2, 0, 1));
    check_transpose(PP_I8, 3, SHAPE(9, 10, 11), SHAPE(1, 2, 0));
    check_transpose(PP_F16, 3, SHAPE(33, 4, 40), SHAPE(2, 1, 0));
    check_transpose(PP_BOOL, 2, SHAPE(3, 5), SHAPE(1, 0));
    check_transpose(PP_F32, 3, SHAPE(0, 4, 5), SHAPE(2, 1, 0));
    check_transpose(PP_F32, 0, NULL, NULL);
    /* random ranks, shapes and permutations against the naive loop */
    for (int it = 0; it < 60; it++) {
        int nd = 1 + (int)(tu_xorshift(&rng_state) % 6);
        int64_t shape[PP_MAX_DIMS], perm[PP_MAX_DIMS];
        for (int i = 0; i < nd; i++) {
            shape[i] = 1 + (int64_t)(tu_xorshift(&rng_state) % 7);
            perm[i] = i;
        }
        for (int i = nd - 1; i > 0; i--) {
            int j = (int)(tu_xorshift(&rng_state) % (uint64_t)(i + 1));
            int64_t tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
        }
        static const pp_dtype dts[] = {PP_F32, PP_I64, PP_U8, PP_BF16};
        check_transpose(dts[it % 4], nd, shape, perm);
    }

    /* only unit dims move: a view */
    ins[0] = iota(PP_F32, 3, SHAPE(4, 1, 5));
    tu_node_init(&t, "Transpose", 1, ins, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "perm", 3, SHAPE(1, 0, 2)));
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 3, SHAPE(1, 4, 5));
    assert_ptr_equal(y->data, t.in[0]->data);
    pp_tensor_free(y);
    tu_node_free(&t);

    /* perm of the wrong length at run time; not a permutation at load time */
    ins[0] = iota(PP_F32, 3, SHAPE(4, 1, 5));
    tu_node_init(&t, "Transpose", 1, ins, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "perm", 2, SHAPE(1, 0)));
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(4, 5));
    tu_node_init(&t, "Transpose", 1, ins, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "perm", 2, SHAPE(1, 1)));
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "'n0'"));
    tu_node_free(&t);
}

/* ------------------------------------------------------ Concat / Split */

static void test_concat(void **state) {
    (void)state;
    pp_tensor *ins[3] = {F32(2, SHAPE(2, 1), 1, 2), F32(2, SHAPE(2, 2), 3, 4, 5, 6),
                         tu_f32(2, SHAPE(2, 0), NULL)};
    tu_node t;
    tu_node_init(&t, "Concat", 3, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", -1));
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 3), 1, 3, 4, 2, 5, 6), "axis -1");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = I64(1, SHAPE(2), 1, 2);
    ins[1] = I64(1, SHAPE(1), 3);
    ins[2] = empty_i64();
    tu_node_init(&t, "Concat", 3, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 0));
    y = tu_node_run_one(&t);
    expect(y, I64(1, SHAPE(3), 1, 2, 3), "shape vectors");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 2, SHAPE(2, 2));
    ins[1] = iota(PP_F32, 2, SHAPE(3, 2));
    tu_node_init(&t, "Concat", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 1)); /* dim 0 differs */
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 1, SHAPE(2));
    ins[1] = iota(PP_I64, 1, SHAPE(2));
    tu_node_init(&t, "Concat", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 0));
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 1, SHAPE(2)); /* axis is required */
    tu_node_init(&t, "Concat", 1, ins, 1, NULL);
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_INVALID);
    tu_node_free(&t);
}

static void test_split(void **state) {
    (void)state;
    pp_tensor *ins[2] = {F32(2, SHAPE(2, 6), 0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15), NULL};
    tu_node t;
    pp_tensor *o[3];
    tu_node_init(&t, "Split", 1, ins, 3, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 1));
    TU_OK(tu_node_run(&t, o));
    expect(o[0], F32(2, SHAPE(2, 2), 0, 1, 10, 11), "equal 0");
    expect(o[1], F32(2, SHAPE(2, 2), 2, 3, 12, 13), "equal 1");
    expect(o[2], F32(2, SHAPE(2, 2), 4, 5, 14, 15), "equal 2");
    for (int k = 0; k < 3; k++) pp_tensor_free(o[k]);
    tu_node_free(&t);

    ins[0] = F32(2, SHAPE(2, 6), 0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15);
    ins[1] = I64(1, SHAPE(3), 1, 0, 5);
    tu_node_init(&t, "Split", 2, ins, 3, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", -1));
    TU_OK(tu_node_run(&t, o));
    expect(o[0], F32(2, SHAPE(2, 1), 0, 10), "sizes 0");
    tu_assert_shape(o[1], 2, SHAPE(2, 0));
    expect(o[2], F32(2, SHAPE(2, 5), 1, 2, 3, 4, 5, 11, 12, 13, 14, 15), "sizes 2");
    for (int k = 0; k < 3; k++) pp_tensor_free(o[k]);
    tu_node_free(&t);

    /* axis 0: each part is a contiguous block of the input, shared */
    ins[0] = iota(PP_F32, 2, SHAPE(4, 3));
    ins[1] = I64(1, SHAPE(2), 1, 3);
    tu_node_init(&t, "Split", 2, ins, 2, NULL);
    TU_OK(tu_node_run(&t, o));
    assert_ptr_equal(o[0]->data, t.in[0]->data);
    assert_ptr_equal(o[1]->data, (float *)t.in[0]->data + 3);
    expect(o[1], F32(2, SHAPE(3, 3), 3, 4, 5, 6, 7, 8, 9, 10, 11), "view part");
    pp_tensor_free(o[0]);
    pp_tensor_free(o[1]);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 1, SHAPE(5));
    ins[1] = I64(1, SHAPE(2), 2, 2);
    tu_node_init(&t, "Split", 2, ins, 2, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 1, SHAPE(5));
    tu_node_init(&t, "Split", 1, ins, 2, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL); /* 5 does not split in 2 equal parts */
    tu_node_free(&t);
}

/* --------------------------------------------------------------- Slice */

static void test_slice(void **state) {
    (void)state;
    tu_node t;
    /* x = 0..19 as [4,5]; rows 1..3, cols 0..3 step 2 */
    pp_tensor *ins[5] = {iota(PP_F32, 2, SHAPE(4, 5)), I64(1, SHAPE(2), 1, 0),
                         I64(1, SHAPE(2), 3, INT64_MAX), I64(1, SHAPE(2), 0, 1),
                         I64(1, SHAPE(2), 1, 2)};
    tu_node_init(&t, "Slice", 5, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 3), 5, 7, 9, 10, 12, 14), "steps");
    pp_tensor_free(y);
    tu_node_free(&t);

    /* negative steps with clamping: x[::-1, -1:-100:-2] */
    ins[0] = iota(PP_F32, 2, SHAPE(4, 5));
    ins[1] = I64(1, SHAPE(2), -1, INT64_MAX);
    ins[2] = I64(1, SHAPE(2), -100, INT64_MIN);
    ins[3] = I64(1, SHAPE(2), -1, 0);
    ins[4] = I64(1, SHAPE(2), -2, -1);
    tu_node_init(&t, "Slice", 5, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(4, 3), 19, 17, 15, 14, 12, 10, 9, 7, 5, 4, 2, 0), "negative steps");
    pp_tensor_free(y);
    tu_node_free(&t);

    /* leading-dim slice is contiguous: a view at an offset */
    ins[0] = iota(PP_F32, 2, SHAPE(4, 5));
    ins[1] = I64(1, SHAPE(1), 1);
    ins[2] = I64(1, SHAPE(1), 3);
    tu_node_init(&t, "Slice", 3, ins, 1, NULL);
    y = tu_node_run_one(&t);
    assert_ptr_equal(y->data, (float *)t.in[0]->data + 5);
    expect(y, F32(2, SHAPE(2, 5), 5, 6, 7, 8, 9, 10, 11, 12, 13, 14), "view");
    pp_tensor_free(y);
    tu_node_free(&t);

    /* start past the end: empty; int32 starts/ends */
    ins[0] = iota(PP_F32, 2, SHAPE(4, 5));
    ins[1] = i32t(1, SHAPE(1), (const int32_t[]){10});
    ins[2] = i32t(1, SHAPE(1), (const int32_t[]){20});
    tu_node_init(&t, "Slice", 3, ins, 1, NULL);
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 2, SHAPE(0, 5));
    pp_tensor_free(y);
    tu_node_free(&t);

    /* 3-D with negative steps against a naive loop */
    ins[0] = iota(PP_F32, 3, SHAPE(5, 6, 7));
    ins[1] = I64(1, SHAPE(3), 4, 1, -1);
    ins[2] = I64(1, SHAPE(3), 0, 6, 0);
    ins[3] = I64(1, SHAPE(3), 0, 1, 2);
    ins[4] = I64(1, SHAPE(3), -2, 2, -3);
    tu_node_init(&t, "Slice", 5, ins, 1, NULL);
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 3, SHAPE(2, 3, 2));
    const float *yd = y->data;
    int k = 0;
    for (int i = 4; i > 0; i -= 2)
        for (int j = 1; j < 6; j += 2)
            for (int l = 6; l > 0; l -= 3) assert_true(yd[k++] == (float)((i * 42 + j * 7 + l) % 251));
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 1, SHAPE(4));
    ins[1] = I64(1, SHAPE(1), 0);
    ins[2] = I64(1, SHAPE(1), 4);
    ins[3] = I64(1, SHAPE(1), 0);
    ins[4] = I64(1, SHAPE(1), 0);
    tu_node_init(&t, "Slice", 5, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, NULL); /* step 0 */
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 1, SHAPE(4));
    ins[1] = I64(1, SHAPE(1), 0);
    ins[2] = I64(1, SHAPE(1), 4);
    ins[3] = I64(1, SHAPE(1), 1);
    tu_node_init(&t, "Slice", 4, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL); /* axis out of range */
    tu_node_free(&t);
}

/* -------------------------------------------------------------- Gather */

static void test_gather(void **state) {
    (void)state;
    tu_node t;
    /* embedding lookup, negative index */
    pp_tensor *ins[2] = {iota(PP_F32, 2, SHAPE(4, 3)), I64(2, SHAPE(2, 2), 1, 0, -1, 1)};
    tu_node_init(&t, "Gather", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(3, SHAPE(2, 2, 3), 3, 4, 5, 0, 1, 2, 9, 10, 11, 3, 4, 5), "axis 0");
    pp_tensor_free(y);
    tu_node_free(&t);

    /* axis 1, int32 indices */
    ins[0] = iota(PP_F32, 2, SHAPE(2, 3));
    ins[1] = i32t(1, SHAPE(2), (const int32_t[]){2, 0});
    tu_node_init(&t, "Gather", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", -1));
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 2), 2, 0, 5, 3), "axis 1");
    pp_tensor_free(y);
    tu_node_free(&t);

    /* scalar index drops the axis (shape sub-graphs do this) */
    ins[0] = I64(1, SHAPE(3), 8, 16, 32);
    TU_OK(pp_tensor_scalar_i64(1, &ins[1]));
    tu_node_init(&t, "Gather", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    assert_int_equal(y->ndim, 0);
    assert_int_equal(((int64_t *)y->data)[0], 16);
    pp_tensor_free(y);
    tu_node_free(&t);

    /* empty indices */
    ins[0] = iota(PP_F32, 2, SHAPE(4, 3));
    ins[1] = empty_i64();
    tu_node_init(&t, "Gather", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 2, SHAPE(0, 3));
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 2, SHAPE(4, 3));
    ins[1] = I64(1, SHAPE(2), 0, 4);
    tu_node_init(&t, "Gather", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, NULL);
    assert_non_null(strstr(pp_last_error(), "out of range"));
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(4, 3));
    ins[1] = I64(1, SHAPE(1), -5);
    tu_node_init(&t, "Gather", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(4, 3));
    ins[1] = F32(1, SHAPE(1), 0);
    tu_node_init(&t, "Gather", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL); /* float indices */
    tu_node_free(&t);
}

static void test_gather_elements(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[2] = {F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), I64(2, SHAPE(2, 2), 0, -1, 2, 1)};
    tu_node_init(&t, "GatherElements", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "axis", 1));
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 2), 1, 3, 6, 5), "axis 1");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = F32(2, SHAPE(3, 2), 1, 2, 3, 4, 5, 6);
    ins[1] = I64(2, SHAPE(2, 2), 2, 0, 1, 2);
    tu_node_init(&t, "GatherElements", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 2), 5, 2, 3, 6), "axis 0");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = F32(2, SHAPE(3, 2), 1, 2, 3, 4, 5, 6);
    ins[1] = I64(2, SHAPE(1, 1), 3);
    tu_node_init(&t, "GatherElements", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, NULL);
    tu_node_free(&t);
}

static void test_gather_nd(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[2] = {iota(PP_F32, 2, SHAPE(2, 2)), I64(2, SHAPE(2, 2), 0, 0, 1, -1)};
    tu_node_init(&t, "GatherND", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(2), 0, 3), "elements");
    pp_tensor_free(y);
    tu_node_free(&t);
    /* slices, with one batch dim */
    ins[0] = iota(PP_F32, 3, SHAPE(2, 2, 2));
    ins[1] = I64(2, SHAPE(2, 1), 1, 0);
    tu_node_init(&t, "GatherND", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "batch_dims", 1));
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 2), 2, 3, 4, 5), "batch_dims 1");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(2, 2));
    ins[1] = I64(2, SHAPE(1, 2), 0, 2);
    tu_node_init(&t, "GatherND", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(2, 2));
    ins[1] = I64(2, SHAPE(1, 3), 0, 0, 0);
    tu_node_init(&t, "GatherND", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
}

/* ---------------------------------------------------- Expand/Tile/Pad */

static void test_expand(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[2] = {F32(2, SHAPE(3, 1), 1, 2, 3), I64(1, SHAPE(3), 2, 1, 2)};
    tu_node_init(&t, "Expand", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(3, SHAPE(2, 3, 2), 1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3), "bidirectional");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = F32(1, SHAPE(3), 1, 2, 3);
    ins[1] = I64(1, SHAPE(2), 2, 1);
    tu_node_init(&t, "Expand", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 3), 1, 2, 3, 1, 2, 3), "rows");
    pp_tensor_free(y);
    tu_node_free(&t);

    TU_OK(pp_tensor_scalar_i64(5, &ins[0]));
    ins[1] = I64(1, SHAPE(1), 3);
    tu_node_init(&t, "Expand", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, I64(1, SHAPE(3), 5, 5, 5), "scalar");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = F32(1, SHAPE(3), 1, 2, 3);
    ins[1] = I64(1, SHAPE(1), 4);
    tu_node_init(&t, "Expand", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
}

static void test_tile(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[2] = {F32(2, SHAPE(2, 2), 1, 2, 3, 4), I64(1, SHAPE(2), 2, 3)};
    tu_node_init(&t, "Tile", 2, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(4, 6), 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4),
           "tile");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = F32(2, SHAPE(2, 2), 1, 2, 3, 4);
    ins[1] = I64(1, SHAPE(1), 2);
    tu_node_init(&t, "Tile", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
}

static void test_pad(void **state) {
    (void)state;
    tu_node t;
    float v = 9;
    pp_tensor *ins[3] = {F32(2, SHAPE(2, 2), 1, 2, 3, 4), I64(1, SHAPE(4), 1, 0, 0, 2),
                         tu_f32(0, NULL, &v)};
    tu_node_init(&t, "Pad", 3, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(3, 4), 9, 9, 9, 9, 1, 2, 9, 9, 3, 4, 9, 9), "constant 9");
    pp_tensor_free(y);
    tu_node_free(&t);

    /* negative pads crop */
    ins[0] = iota(PP_I64, 2, SHAPE(3, 3));
    ins[1] = I64(1, SHAPE(4), -1, 1, 0, -1);
    tu_node_init(&t, "Pad", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, I64(2, SHAPE(2, 3), 0, 3, 4, 0, 6, 7), "crop");
    pp_tensor_free(y);
    tu_node_free(&t);

    /* edge and reflect (numpy semantics, pads wider than the input too) */
    ins[0] = F32(1, SHAPE(3), 1, 2, 3);
    ins[1] = I64(1, SHAPE(2), 2, 5);
    tu_node_init(&t, "Pad", 2, ins, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "mode", "edge"));
    y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(10), 1, 1, 1, 2, 3, 3, 3, 3, 3, 3), "edge");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = F32(1, SHAPE(3), 1, 2, 3);
    ins[1] = I64(1, SHAPE(2), 2, 5);
    tu_node_init(&t, "Pad", 2, ins, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "mode", "reflect"));
    y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(10), 3, 2, 1, 2, 3, 2, 1, 2, 3, 2), "reflect");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = F32(2, SHAPE(2, 2), 1, 2, 3, 4);
    ins[1] = I64(1, SHAPE(4), 1, 0, 0, 1);
    tu_node_init(&t, "Pad", 2, ins, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "mode", "reflect"));
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(3, 3), 3, 4, 3, 1, 2, 1, 3, 4, 3), "reflect 2-D");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 1, SHAPE(3));
    ins[1] = I64(1, SHAPE(2), 1, 1);
    tu_node_init(&t, "Pad", 2, ins, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "mode", "mirror")); /* wrap: test_ops_upsample.c */
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "mirror");
    tu_node_free(&t);
}

/* ---------------------------------------------------------------- Cast */

static pp_tensor *cast_one(pp_tensor *x, pp_dtype to) {
    tu_node t;
    pp_tensor *ins[1] = {x};
    tu_node_init(&t, "Cast", 1, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "to", to));
    pp_tensor *y = tu_node_run_one(&t);
    tu_node_free(&t);
    return y;
}

static void test_cast(void **state) {
    (void)state;
    /* float -> int truncates toward zero; NaN gives 0, out of range saturates */
    pp_tensor *y = cast_one(F32(1, SHAPE(6), -1.7f, 2.9f, -0.5f, NAN, 1e30f, -1e30f), PP_I64);
    expect(y, I64(1, SHAPE(6), -1, 2, 0, 0, INT64_MAX, INT64_MIN), "f32->i64");
    pp_tensor_free(y);
    /* narrower ints wrap like numpy's astype */
    y = cast_one(F32(1, SHAPE(3), -1.0f, 256.0f, 300.5f), PP_U8);
    assert_int_equal(((uint8_t *)y->data)[0], 255);
    assert_int_equal(((uint8_t *)y->data)[1], 0);
    assert_int_equal(((uint8_t *)y->data)[2], 44);
    pp_tensor_free(y);
    y = cast_one(I64(1, SHAPE(2), INT64_C(4294967297), -1), PP_I32);
    assert_int_equal(((int32_t *)y->data)[0], 1);
    assert_int_equal(((int32_t *)y->data)[1], -1);
    pp_tensor_free(y);
    /* bool both ways (NaN is truthy) */
    y = cast_one(F32(1, SHAPE(4), 0.0f, -0.0f, 0.25f, NAN), PP_BOOL);
    uint8_t *b = y->data;
    assert_true(b[0] == 0 && b[1] == 0 && b[2] == 1 && b[3] == 1);
    pp_tensor *f = cast_one(y, PP_F32);
    expect(f, F32(1, SHAPE(4), 0, 0, 1, 1), "bool->f32");
    pp_tensor_free(f);
    /* f16: round to nearest even, overflow to inf; 2049 is a tie -> 2048 */
    y = cast_one(F32(1, SHAPE(5), 1.0f, 2049.0f, 2051.0f, 70000.0f, -3.0e-8f), PP_F16);
    uint16_t *h = y->data;
    assert_int_equal(h[0], 0x3c00);
    assert_int_equal(h[1], 0x6800);
    assert_int_equal(h[2], 0x6802);
    assert_int_equal(h[3], 0x7c00);
    assert_int_equal(h[4], 0x8001); /* subnormal */
    f = cast_one(y, PP_F32);
    expect(f, F32(1, SHAPE(5), 1.0f, 2048.0f, 2052.0f, INFINITY, -5.9604645e-08f), "f16->f32");
    pp_tensor_free(f);
    /* f64 -> f16 rounds once, from the double: 1 + 2^-11 + 2^-30 is just
     * above a tie and must round up (through float it would tie to even) */
    pp_tensor *d;
    TU_OK(pp_tensor_empty(PP_F64, 1, SHAPE(2), &d));
    ((double *)d->data)[0] = 1.0 + ldexp(1, -11) + ldexp(1, -30);
    ((double *)d->data)[1] = 65519.0;
    y = cast_one(d, PP_F16);
    assert_int_equal(((uint16_t *)y->data)[0], 0x3c01);
    assert_int_equal(((uint16_t *)y->data)[1], 0x7bff);
    pp_tensor_free(y);
    /* bf16 round to nearest even */
    y = cast_one(F32(1, SHAPE(2), 0.48033667f, 1.0f), PP_BF16);
    assert_int_equal(((uint16_t *)y->data)[0], 0x3ef6);
    assert_int_equal(((uint16_t *)y->data)[1], 0x3f80);
    f = cast_one(y, PP_F64);
    assert_true(((double *)f->data)[1] == 1.0);
    pp_tensor_free(f);
    /* same dtype: the input is shared */
    pp_tensor *x = F32(1, SHAPE(2), 1, 2);
    tu_node t;
    pp_tensor *ins[1] = {x};
    tu_node_init(&t, "Cast", 1, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "to", PP_F32));
    y = tu_node_run_one(&t);
    assert_ptr_equal(y->data, x->data);
    pp_tensor_free(y);
    tu_node_free(&t);
    /* unsupported target (STRING = 8) is refused at load time */
    ins[0] = F32(1, SHAPE(2), 1, 2);
    tu_node_init(&t, "Cast", 1, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "to", 8));
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_UNSUPPORTED);
    assert_non_null(strstr(pp_last_error(), "'n0'"));
    tu_node_free(&t);
    /* CastLike takes the target from its second input */
    pp_tensor *ins2[2] = {F32(1, SHAPE(2), 1.5f, -2.5f), I64(1, SHAPE(1), 0)};
    tu_node_init(&t, "CastLike", 2, ins2, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, I64(1, SHAPE(2), 1, -2), "castlike");
    pp_tensor_free(y);
    tu_node_free(&t);
}

/* ------------------------------------------- Shape/Size/Range/Constant */

static void test_shape_size(void **state) {
    (void)state;
    static const struct { int has_start, has_end; int64_t start, end; int n; int64_t v[4]; } c[] = {
        {0, 0, 0, 0, 4, {2, 3, 4, 5}}, {1, 0, 1, 0, 3, {3, 4, 5}}, {0, 1, 0, -1, 3, {2, 3, 4}},
        {1, 1, -3, 3, 2, {3, 4}},      {1, 1, -10, 10, 4, {2, 3, 4, 5}}, {1, 1, 3, 1, 0, {0}}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        tu_node t;
        pp_tensor *ins[1] = {iota(PP_F32, 4, SHAPE(2, 3, 4, 5))};
        tu_node_init(&t, "Shape", 1, ins, 1, NULL);
        if (c[i].has_start) TU_OK(pp_node_set_int(t.g, t.node, "start", c[i].start));
        if (c[i].has_end) TU_OK(pp_node_set_int(t.g, t.node, "end", c[i].end));
        pp_tensor *y = tu_node_run_one(&t);
        expect(y, tu_i64_vec(c[i].n, c[i].v), "shape");
        pp_tensor_free(y);
        tu_node_free(&t);
    }
    tu_node t;
    pp_tensor *ins[1];
    TU_OK(pp_tensor_scalar_f32(1, &ins[0]));
    tu_node_init(&t, "Shape", 1, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    tu_assert_shape(y, 1, SHAPE(0));
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 3, SHAPE(2, 3, 4));
    tu_node_init(&t, "Size", 1, ins, 1, NULL);
    y = tu_node_run_one(&t);
    assert_int_equal(y->ndim, 0);
    assert_int_equal(((int64_t *)y->data)[0], 24);
    pp_tensor_free(y);
    tu_node_free(&t);
}

static void test_range(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[3];
    float fs = 1, fl = 5, fd = 1.5f;
    ins[0] = tu_f32(0, NULL, &fs);
    ins[1] = tu_f32(0, NULL, &fl);
    ins[2] = tu_f32(0, NULL, &fd);
    tu_node_init(&t, "Range", 3, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(3), 1, 2.5f, 4), "float");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = i32t(0, NULL, (const int32_t[]){10});
    ins[1] = i32t(0, NULL, (const int32_t[]){6});
    ins[2] = i32t(0, NULL, (const int32_t[]){-3});
    tu_node_init(&t, "Range", 3, ins, 1, NULL);
    y = tu_node_run_one(&t);
    assert_int_equal(y->dtype, PP_I32);
    tu_assert_shape(y, 1, SHAPE(2));
    assert_int_equal(((int32_t *)y->data)[0], 10);
    assert_int_equal(((int32_t *)y->data)[1], 7);
    pp_tensor_free(y);
    tu_node_free(&t);

    TU_OK(pp_tensor_scalar_i64(5, &ins[0]));
    TU_OK(pp_tensor_scalar_i64(5, &ins[1]));
    TU_OK(pp_tensor_scalar_i64(1, &ins[2]));
    tu_node_init(&t, "Range", 3, ins, 1, NULL);
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 1, SHAPE(0));
    pp_tensor_free(y);
    tu_node_free(&t);

    TU_OK(pp_tensor_scalar_i64(0, &ins[0]));
    TU_OK(pp_tensor_scalar_i64(5, &ins[1]));
    TU_OK(pp_tensor_scalar_i64(0, &ins[2]));
    tu_node_init(&t, "Range", 3, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, NULL);
    tu_node_free(&t);
}

static void test_constant_of_shape(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[1] = {I64(1, SHAPE(2), 2, 3)};
    tu_node_init(&t, "ConstantOfShape", 1, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(2, 3), 0, 0, 0, 0, 0, 0), "default");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = I64(1, SHAPE(1), 3);
    tu_node_init(&t, "ConstantOfShape", 1, ins, 1, NULL);
    TU_OK(pp_node_set_tensor(t.g, t.node, "value", I64(1, SHAPE(1), -7)));
    y = tu_node_run_one(&t);
    expect(y, I64(1, SHAPE(3), -7, -7, -7), "int value");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = empty_i64(); /* scalar */
    tu_node_init(&t, "ConstantOfShape", 1, ins, 1, NULL);
    TU_OK(pp_node_set_tensor(t.g, t.node, "value", F32(1, SHAPE(1), 2.5f)));
    y = tu_node_run_one(&t);
    assert_int_equal(y->ndim, 0);
    assert_true(((float *)y->data)[0] == 2.5f);
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = I64(1, SHAPE(2), 0, 3);
    tu_node_init(&t, "ConstantOfShape", 1, ins, 1, NULL);
    y = tu_node_run_one(&t);
    tu_assert_shape(y, 2, SHAPE(0, 3));
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = I64(1, SHAPE(1), -1);
    tu_node_init(&t, "ConstantOfShape", 1, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
}

static void test_constant(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "Constant", 0, NULL, 1, NULL);
    TU_OK(pp_node_set_tensor(t.g, t.node, "value", F32(1, SHAPE(2), 1, 2)));
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(2), 1, 2), "value");
    pp_tensor_free(y);
    tu_node_free(&t);

    tu_node_init(&t, "Constant", 0, NULL, 1, NULL);
    TU_OK(pp_node_set_float(t.g, t.node, "value_float", 0.5f));
    y = tu_node_run_one(&t);
    assert_int_equal(y->ndim, 0);
    assert_true(((float *)y->data)[0] == 0.5f);
    pp_tensor_free(y);
    tu_node_free(&t);

    tu_node_init(&t, "Constant", 0, NULL, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "value_ints", 3, SHAPE(4, 5, 6)));
    y = tu_node_run_one(&t);
    expect(y, I64(1, SHAPE(3), 4, 5, 6), "value_ints");
    pp_tensor_free(y);
    tu_node_free(&t);

    tu_node_init(&t, "Constant", 0, NULL, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "value_int", -3));
    y = tu_node_run_one(&t);
    expect(y, tu_i64(0, NULL, (const int64_t[]){-3}), "value_int");
    pp_tensor_free(y);
    tu_node_free(&t);

    tu_node_init(&t, "Constant", 0, NULL, 1, NULL);
    TU_OK(pp_node_set_floats(t.g, t.node, "value_floats", 2, (const float[]){1, 2}));
    y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(2), 1, 2), "value_floats");
    pp_tensor_free(y);
    tu_node_free(&t);

    tu_node_init(&t, "Constant", 0, NULL, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "value_int", 1));
    TU_OK(pp_node_set_float(t.g, t.node, "value_float", 1));
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "'n0'"));
    tu_node_free(&t);

    tu_node_init(&t, "Constant", 0, NULL, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "value_string", "x"));
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_UNSUPPORTED);
    tu_node_free(&t);
}

/* ------------------------------------------- Identity/Dropout/Trilu */

static void test_identity_dropout(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[3] = {F32(1, SHAPE(3), 1, 2, 3), NULL, NULL};
    tu_node_init(&t, "Identity", 1, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    assert_ptr_equal(y->data, t.in[0]->data);
    pp_tensor_free(y);
    tu_node_free(&t);

    /* inference: identity plus an all-true mask */
    ins[0] = F32(2, SHAPE(2, 2), 1, 2, 3, 4);
    ins[1] = tu_f32(0, NULL, (const float[]){0.3f});
    tu_node_init(&t, "Dropout", 2, ins, 2, NULL);
    pp_tensor *o[2];
    TU_OK(tu_node_run(&t, o));
    assert_ptr_equal(o[0]->data, t.in[0]->data);
    assert_int_equal(o[1]->dtype, PP_BOOL);
    tu_assert_shape(o[1], 2, SHAPE(2, 2));
    for (int i = 0; i < 4; i++) assert_int_equal(((uint8_t *)o[1]->data)[i], 1);
    pp_tensor_free(o[0]);
    pp_tensor_free(o[1]);
    tu_node_free(&t);

    /* training: ratio 1 drops everything, a ratio past 1 is refused (ratios
     * in between: test_ops_dropout.c); ratio 0 is an identity */
    ins[0] = F32(1, SHAPE(2), 1, 2);
    ins[1] = tu_f32(0, NULL, (const float[]){1.0f});
    TU_OK(pp_tensor_empty(PP_BOOL, 0, NULL, &ins[2]));
    *(uint8_t *)ins[2]->data = 1;
    tu_node_init(&t, "Dropout", 3, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(2), 0, 0), "ratio 1");
    pp_tensor_free(y);
    tu_node_free(&t);
    ins[0] = F32(1, SHAPE(2), 1, 2);
    ins[1] = tu_f32(0, NULL, (const float[]){1.5f});
    TU_OK(pp_tensor_empty(PP_BOOL, 0, NULL, &ins[2]));
    *(uint8_t *)ins[2]->data = 1;
    tu_node_init(&t, "Dropout", 3, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "outside [0, 1]");
    tu_node_free(&t);
    ins[0] = F32(1, SHAPE(2), 1, 2);
    ins[1] = tu_f32(0, NULL, (const float[]){0.0f});
    TU_OK(pp_tensor_empty(PP_BOOL, 0, NULL, &ins[2]));
    *(uint8_t *)ins[2]->data = 1;
    tu_node_init(&t, "Dropout", 3, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, F32(1, SHAPE(2), 1, 2), "ratio 0");
    pp_tensor_free(y);
    tu_node_free(&t);
}

static void test_trilu(void **state) {
    (void)state;
    tu_node t;
    /* x = 1..12 as [3,4] */
    pp_tensor *ins[2] = {F32(2, SHAPE(3, 4), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), NULL};
    tu_node_init(&t, "Trilu", 1, ins, 1, NULL);
    pp_tensor *y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(3, 4), 1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12), "upper");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = F32(2, SHAPE(3, 4), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
    ins[1] = tu_i64(0, NULL, (const int64_t[]){-1});
    tu_node_init(&t, "Trilu", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "upper", 0));
    y = tu_node_run_one(&t);
    expect(y, F32(2, SHAPE(3, 4), 0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0), "lower k=-1");
    pp_tensor_free(y);
    tu_node_free(&t);

    /* batched causal mask, k far out of range */
    ins[0] = iota(PP_I64, 3, SHAPE(2, 2, 2));
    ins[1] = tu_i64(0, NULL, (const int64_t[]){INT64_MAX});
    tu_node_init(&t, "Trilu", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "upper", 0));
    y = tu_node_run_one(&t);
    expect(y, I64(3, SHAPE(2, 2, 2), 0, 1, 2, 3, 4, 5, 6, 7), "lower k=max");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_I64, 3, SHAPE(2, 2, 2));
    ins[1] = tu_i64(0, NULL, (const int64_t[]){1});
    tu_node_init(&t, "Trilu", 2, ins, 1, NULL);
    y = tu_node_run_one(&t);
    expect(y, I64(3, SHAPE(2, 2, 2), 0, 1, 0, 0, 0, 5, 0, 0), "upper k=1");
    pp_tensor_free(y);
    tu_node_free(&t);

    ins[0] = iota(PP_F32, 1, SHAPE(3));
    tu_node_init(&t, "Trilu", 1, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
}

/* Shapes read from tensors are untrusted: huge values give errors, not
 * overflow or giant allocations. */
static void test_hostile_shapes(void **state) {
    (void)state;
    const int64_t big = INT64_C(1) << 40;
    tu_node t;
    pp_tensor *ins[2] = {iota(PP_F32, 1, SHAPE(4)), I64(1, SHAPE(3), INT64_MAX, 2, -1)};
    tu_node_init(&t, "Reshape", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 1, SHAPE(4));
    ins[1] = I64(1, SHAPE(3), big, big, 4);
    tu_node_init(&t, "Expand", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 2, SHAPE(2, 2));
    ins[1] = I64(1, SHAPE(2), INT64_MAX, big);
    tu_node_init(&t, "Tile", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = iota(PP_F32, 1, SHAPE(2));
    ins[1] = I64(1, SHAPE(2), INT64_MAX, INT64_MAX);
    tu_node_init(&t, "Pad", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, NULL);
    tu_node_free(&t);
    ins[0] = I64(1, SHAPE(2), big, big);
    tu_node_init(&t, "ConstantOfShape", 1, ins, 1, NULL);
    pp_tensor *y = NULL;
    assert_int_not_equal(tu_node_run(&t, &y), PP_OK);
    tu_node_free(&t);
}

/* Arity is checked at load time against the op table. */
static void test_arity(void **state) {
    (void)state;
    tu_node t;
    pp_tensor *ins[1] = {iota(PP_F32, 1, SHAPE(3))};
    tu_node_init(&t, "Gather", 1, ins, 1, NULL);
    assert_int_equal(pp_graph_resolve(t.g), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "'n0'"));
    tu_node_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_reshape_errors),
        cmocka_unit_test(test_flatten),
        cmocka_unit_test(test_squeeze_unsqueeze),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_gather),
        cmocka_unit_test(test_gather_elements),
        cmocka_unit_test(test_gather_nd),
        cmocka_unit_test(test_expand),
        cmocka_unit_test(test_tile),
        cmocka_unit_test(test_pad),
        cmocka_unit_test(test_cast),
        cmocka_unit_test(test_shape_size),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_constant_of_shape),
        cmocka_unit_test(test_constant),
        cmocka_unit_test(test_identity_dropout),
        cmocka_unit_test(test_trilu),
        cmocka_unit_test(test_hostile_shapes),
        cmocka_unit_test(test_arity),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
