/* Mailbox: filing by key, any order, FIFO for equal keys, step purge. */
#include <stdio.h>

#include "mailbox.h"
#include "tt_util.h"

#include "test_filter.h"
static pp_tensor *scalar(float v) {
    pp_tensor *t;
    TT_OK(pp_tensor_scalar_f32(v, &t));
    return t;
}

static float val(pp_tensor *t) {
    float v = ((float *)t->data)[0];
    pp_tensor_free(t);
    return v;
}

static void test_any_order(void **state) {
    (void)state;
    pp_mailbox *mb;
    TT_OK(pp_mailbox_new(&mb));
    for (int m = 0; m < 8; m++) {
        pp_mbox_key k = {PP_MSG_ACTIVATION, 1, m, 0, 1, "x"};
        TT_OK(pp_mailbox_put(mb, &k, scalar((float)m)));
    }
    assert_int_equal(pp_mailbox_count(mb), 8);
    assert_int_equal(pp_mailbox_bytes(mb), 32);
    for (int m = 7; m >= 0; m--) {
        pp_mbox_key k = {PP_MSG_ACTIVATION, 1, m, 0, 1, "x"};
        pp_tensor *t = pp_mailbox_take(mb, &k);
        assert_non_null(t);
        assert_true(val(t) == (float)m);
    }
    pp_mbox_key k = {PP_MSG_ACTIVATION, 1, 0, 0, 1, "x"};
    assert_null(pp_mailbox_take(mb, &k));
    assert_int_equal(pp_mailbox_count(mb), 0);
    pp_mailbox_free(mb);
}

static void test_keys_differ(void **state) {
    (void)state;
    pp_mailbox *mb;
    TT_OK(pp_mailbox_new(&mb));
    pp_mbox_key base = {PP_MSG_ACTIVATION, 2, 1, 0, 1, "x"};
    pp_mbox_key ks[6];
    for (int i = 0; i < 6; i++) ks[i] = base;
    ks[1].kind = PP_MSG_GRADIENT;
    ks[2].step = 3;
    ks[3].microbatch = 2;
    ks[4].src_stage = 2;
    ks[5].name = "y";
    for (int i = 0; i < 6; i++) TT_OK(pp_mailbox_put(mb, &ks[i], scalar((float)i)));
    for (int i = 5; i >= 0; i--) assert_true(val(pp_mailbox_take(mb, &ks[i])) == (float)i);
    pp_mailbox_free(mb);
}

static void test_fifo_duplicates(void **state) {
    (void)state;
    pp_mailbox *mb;
    TT_OK(pp_mailbox_new(&mb));
    pp_mbox_key k = {PP_MSG_CONTROL, 0, 0, 0, 0, "cmd"};
    for (int i = 0; i < 3; i++) TT_OK(pp_mailbox_put(mb, &k, scalar((float)i)));
    for (int i = 0; i < 3; i++) assert_true(val(pp_mailbox_take(mb, &k)) == (float)i);
    pp_mailbox_free(mb);
}

static void test_grow_and_purge(void **state) {
    (void)state;
    pp_mailbox *mb;
    TT_OK(pp_mailbox_new(&mb));
    char name[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "v%d", i % 50);
        pp_mbox_key k = {PP_MSG_ACTIVATION, i % 10, i / 50, 0, 1, name};
        TT_OK(pp_mailbox_put(mb, &k, scalar((float)i)));
    }
    assert_int_equal(pp_mailbox_count(mb), 5000);
    char first[300];
    assert_int_equal(pp_mailbox_drop_before(mb, 5, first, sizeof first), 2500);
    tt_assert_mentions(first, "activation step ", "stage 0->1", NULL); /* names one of them */
    assert_int_equal(pp_mailbox_drop_before(mb, 5, NULL, 0), 0);
    assert_int_equal(pp_mailbox_count(mb), 2500);
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "v%d", i % 50);
        pp_mbox_key k = {PP_MSG_ACTIVATION, i % 10, i / 50, 0, 1, name};
        pp_tensor *t = pp_mailbox_take(mb, &k);
        if (i % 10 < 5) assert_null(t);
        else assert_true(val(t) == (float)i);
    }
    assert_int_equal(pp_mailbox_count(mb), 0);
    assert_int_equal(pp_mailbox_bytes(mb), 0);
    /* freeing with tensors inside releases them (checked by ASan) */
    pp_mbox_key k = {PP_MSG_ACTIVATION, 0, 0, 0, 1, "left"};
    TT_OK(pp_mailbox_put(mb, &k, scalar(1)));
    pp_mailbox_free(mb);
    pp_mailbox_free(NULL);
}

static void test_key_str(void **state) {
    (void)state;
    pp_mbox_key k = {PP_MSG_GRADIENT, 4, 2, 3, 1, "h"};
    char buf[128];
    assert_string_equal(pp_mbox_key_str(&k, buf, sizeof buf),
                        "gradient step 4 microbatch 2 stage 3->1 'h'");
}

/* Bytes are counted per owner (the source rank) until entries leave by
 * take or purge; unowned entries count only in the total. */
static void test_owner_bytes(void **state) {
    (void)state;
    pp_mailbox *mb;
    TT_OK(pp_mailbox_new(&mb));
    TT_OK(pp_mailbox_set_owners(mb, 3));
    for (int m = 0; m < 4; m++) {
        pp_mbox_key k = {PP_MSG_ACTIVATION, m, 0, 0, 1, "x"};
        TT_OK(pp_mailbox_put_from(mb, &k, m % 2 ? 2 : 1, scalar((float)m)));
    }
    pp_mbox_key own = {PP_MSG_ACTIVATION, 9, 0, 1, 1, "x"};
    TT_OK(pp_mailbox_put(mb, &own, scalar(9)));
    assert_int_equal(pp_mailbox_owner_bytes(mb, 1), 8);
    assert_int_equal(pp_mailbox_owner_bytes(mb, 2), 8);
    assert_int_equal(pp_mailbox_owner_bytes(mb, 0), 0);
    assert_int_equal(pp_mailbox_owner_bytes(mb, 7), 0);
    assert_int_equal(pp_mailbox_bytes(mb), 20);
    pp_mbox_key k1 = {PP_MSG_ACTIVATION, 1, 0, 0, 1, "x"};
    assert_true(val(pp_mailbox_take(mb, &k1)) == 1.0f);
    assert_int_equal(pp_mailbox_owner_bytes(mb, 2), 4);
    assert_int_equal(pp_mailbox_drop_before(mb, 3, NULL, 0), 2); /* steps 0 and 2 */
    assert_int_equal(pp_mailbox_owner_bytes(mb, 1), 0);
    assert_int_equal(pp_mailbox_owner_bytes(mb, 2), 4);
    assert_int_equal(pp_mailbox_bytes(mb), 8);
    pp_mailbox_free(mb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_any_order),       cmocka_unit_test(test_keys_differ),
        cmocka_unit_test(test_fifo_duplicates), cmocka_unit_test(test_grow_and_purge),
        cmocka_unit_test(test_key_str),         cmocka_unit_test(test_owner_bytes),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
