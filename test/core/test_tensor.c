/* Tensors: allocation, views, borrowing, casts, half precision, allclose. */
#include <math.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"
static void test_new_is_zeroed(void **state) {
    (void)state;
    int64_t shape[] = {2, 3};
    pp_tensor *t;
    TU_OK(pp_tensor_new(PP_F32, 2, shape, &t));
    assert_int_equal(pp_tensor_numel(t), 6);
    assert_int_equal(t->nbytes, 24);
    for (int i = 0; i < 6; i++) assert_true(((float *)t->data)[i] == 0.0f);
    pp_tensor_free(t);
}

static void test_scalar_and_empty(void **state) {
    (void)state;
    pp_tensor *s, *e;
    TU_OK(pp_tensor_scalar_f32(2.5f, &s));
    assert_int_equal(s->ndim, 0);
    assert_int_equal(pp_tensor_numel(s), 1);
    assert_true(pp_tensor_get_f64(s, 0) == 2.5);
    int64_t shape[] = {0, 4};
    TU_OK(pp_tensor_new(PP_I64, 2, shape, &e));
    assert_int_equal(e->nbytes, 0);
    pp_tensor_free(s);
    pp_tensor_free(e);
}

static void test_bad_shapes(void **state) {
    (void)state;
    pp_tensor *t = NULL;
    int64_t neg[] = {2, -1};
    assert_int_equal(pp_tensor_new(PP_F32, 2, neg, &t), PP_ERR_SHAPE);
    int64_t huge[] = {INT64_C(1) << 40, INT64_C(1) << 40};
    assert_int_equal(pp_tensor_new(PP_F32, 2, huge, &t), PP_ERR_NOMEM);
    /* Regression (fuzz_envelope): a zero dim after huge ones is an empty
     * tensor, not an overflow. */
    int64_t huge_then_zero[] = {INT64_C(1) << 62, INT64_C(1) << 62, 0};
    size_t nb = 1;
    TU_OK(pp_shape_bytes(PP_F32, 3, huge_then_zero, &nb));
    assert_int_equal(nb, 0);
    assert_int_equal(pp_shape_numel(3, huge_then_zero), 0);
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(pp_tensor_new(PP_F32, 9, nine, &t), PP_ERR_INVALID);
    assert_int_equal(pp_tensor_new((pp_dtype)99, 1, nine, &t), PP_ERR_INVALID);
    assert_null(t);
}

static int freed_count;
static void count_free(void *data, void *hint) {
    (void)data;
    freed_count += (int)(intptr_t)hint;
}

static void test_wrap_borrowed(void **state) {
    (void)state;
    float buf[4] = {1, 2, 3, 4};
    int64_t shape[] = {4};
    pp_tensor *t;
    freed_count = 0;
    TU_OK(pp_tensor_wrap(PP_F32, 1, shape, buf, count_free, (void *)(intptr_t)1, &t));
    pp_tensor_retain(t);
    pp_tensor_free(t);
    assert_int_equal(freed_count, 0);
    pp_tensor_free(t);
    assert_int_equal(freed_count, 1);
}

static void test_view_shares_and_keeps_source(void **state) {
    (void)state;
    int64_t shape[] = {2, 3}, flat[] = {6}, bad[] = {5};
    float vals[] = {1, 2, 3, 4, 5, 6};
    pp_tensor *t = tu_f32(2, shape, vals), *v;
    TU_OK(pp_tensor_view(t, 1, flat, &v));
    assert_ptr_equal(v->data, t->data);
    pp_tensor_free(t); /* the view keeps the data alive */
    assert_true(((float *)v->data)[5] == 6.0f);
    pp_tensor *w = NULL;
    assert_int_equal(pp_tensor_view(v, 1, bad, &w), PP_ERR_SHAPE);
    assert_non_null(strstr(pp_last_error(), "[6]"));
    pp_tensor_free(v);
}

static void test_cast(void **state) {
    (void)state;
    int64_t shape[] = {4};
    float vals[] = {-1.7f, 0.5f, 2.9f, 3.0f};
    pp_tensor *t = tu_f32(1, shape, vals), *i, *h, *b;
    TU_OK(pp_tensor_cast(t, PP_I64, &i));
    assert_int_equal(((int64_t *)i->data)[0], -1); /* truncation toward zero */
    assert_int_equal(((int64_t *)i->data)[2], 2);
    TU_OK(pp_tensor_cast(t, PP_F16, &h));
    assert_true(fabs(pp_tensor_get_f64(h, 0) - -1.7) < 1e-3);
    TU_OK(pp_tensor_cast(t, PP_BOOL, &b));
    assert_int_equal(((uint8_t *)b->data)[1], 1);
    pp_tensor_free(t);
    pp_tensor_free(i);
    pp_tensor_free(h);
    pp_tensor_free(b);
}

/* Regression: out-of-range float -> int casts were undefined behaviour. */
static void test_cast_saturates(void **state) {
    (void)state;
    int64_t shape[] = {4};
    float vals[] = {-1.0f, 300.0f, NAN, 1e20f};
    pp_tensor *t = tu_f32(1, shape, vals), *u8, *i32;
    TU_OK(pp_tensor_cast(t, PP_U8, &u8));
    TU_OK(pp_tensor_cast(t, PP_I32, &i32));
    const uint8_t *a = u8->data;
    const int32_t *b = i32->data;
    assert_int_equal(a[0], 0);
    assert_int_equal(a[1], 255);
    assert_int_equal(a[2], 0);
    assert_int_equal(b[3], INT32_MAX);
    /* int64 -> uint8 wraps exactly, as numpy does. */
    int64_t big[] = {257, -1};
    int64_t two[] = {2};
    pp_tensor *i = tu_i64(1, two, big), *w;
    TU_OK(pp_tensor_cast(i, PP_U8, &w));
    assert_int_equal(((uint8_t *)w->data)[0], 1);
    assert_int_equal(((uint8_t *)w->data)[1], 255);
    pp_tensor_free(t);
    pp_tensor_free(u8);
    pp_tensor_free(i32);
    pp_tensor_free(i);
    pp_tensor_free(w);
}

static void test_half_round_trip(void **state) {
    (void)state;
    /* Every finite f16 survives f16 -> f32 -> f16. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        assert_int_equal(pp_f32_to_f16(pp_f16_to_f32((uint16_t)h)), h);
    }
    assert_true(pp_f16_to_f32(0x3c00) == 1.0f);
    assert_int_equal(pp_f32_to_f16(65520.0f), 0x7c00); /* rounds to inf */
    assert_true(isnan(pp_f16_to_f32(pp_f32_to_f16(NAN))));
    assert_true(pp_bf16_to_f32(pp_f32_to_bf16(1.0f)) == 1.0f);
    assert_int_equal(pp_f32_to_bf16(1.00390625f), 0x3f80); /* tie to even */
}

static void test_allclose(void **state) {
    (void)state;
    int64_t shape[] = {3};
    float a[] = {1, 2, NAN}, b[] = {1, 2.001f, NAN};
    pp_tensor *x = tu_f32(1, shape, a), *y = tu_f32(1, shape, b);
    char why[256];
    assert_true(pp_tensor_allclose(x, y, 1e-3, 0, why, sizeof why));
    assert_false(pp_tensor_allclose(x, y, 1e-5, 0, why, sizeof why));
    assert_non_null(strstr(why, "element 1"));
    pp_tensor_free(x);
    pp_tensor_free(y);
}

static void test_dtype_names(void **state) {
    (void)state;
    pp_dtype all[] = {PP_F32, PP_F64, PP_F16, PP_BF16, PP_I64, PP_I32, PP_I8, PP_U8, PP_BOOL};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        assert_int_equal(pp_dtype_from_name(pp_dtype_name(all[i])), all[i]);
    assert_int_equal(pp_dtype_size(PP_BF16), 2);
    assert_string_equal(pp_dtype_name((pp_dtype)42), "undefined");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_is_zeroed),     cmocka_unit_test(test_scalar_and_empty),
        cmocka_unit_test(test_bad_shapes),        cmocka_unit_test(test_wrap_borrowed),
        cmocka_unit_test(test_view_shares_and_keeps_source), cmocka_unit_test(test_cast), cmocka_unit_test(test_cast_saturates),
        cmocka_unit_test(test_half_round_trip),   cmocka_unit_test(test_allclose),
        cmocka_unit_test(test_dtype_names),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
