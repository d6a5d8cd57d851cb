/* The array-growing helper (lib/grow.h) and, through its fault injection,
 * the out-of-memory paths of its callers: every allocation pp_grow makes in
 * an autodiff pass fails in turn, and the pass must fail cleanly and without
 * leaking (the region split once returned from the middle of regions() and
 * leaked its work arrays). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "grow.h"
#include "test_util.h"

#include "test_filter.h"

static void test_grow_doubles(void **state) {
    (void)state;
    int *a = NULL, cap = 0;
    for (int n = 0; n < 100; n++) {
        TU_OK(PP_GROW(a, cap, n));
        assert_true(cap > n);
        a[n] = n * 3;
    }
    assert_int_equal(cap, 128); /* 16, 32, 64, 128 */
    for (int n = 0; n < 100; n++) assert_int_equal(a[n], n * 3);
    TU_OK(PP_GROW(a, cap, 99)); /* room already: nothing changes */
    assert_int_equal(cap, 128);
    TU_OK(PP_GROW(a, cap, 1000)); /* an index far past the end */
    assert_int_equal(cap, 1024);
    for (int n = 0; n < 100; n++) assert_int_equal(a[n], n * 3);
    free(a);
}

static void test_grow_exact(void **state) {
    (void)state;
    double *a = NULL;
    for (int n = 0; n < 40; n++) {
        TU_OK(PP_GROW_EXACT(a, n));
        a[n] = n + 0.5;
    }
    for (int n = 0; n < 40; n++) assert_true(a[n] == n + 0.5);
    free(a);
}

static void test_grow_failure_keeps_array(void **state) {
    (void)state;
    int *a = NULL, cap = 0;
    for (int n = 0; n < 16; n++) {
        TU_OK(PP_GROW(a, cap, n));
        a[n] = n;
    }
    assert_int_equal(pp_grow_fail_after(1), -1); /* the second allocation from now fails */
    TU_OK(PP_GROW(a, cap, 15));                  /* room already: allocates nothing */
    TU_OK(PP_GROW(a, cap, 16));                  /* the first */
    assert_int_equal(cap, 32);
    int *kept = a;
    assert_int_equal(PP_GROW(a, cap, 32), PP_ERR_NOMEM);
    assert_non_null(strstr(pp_last_error(), "out of memory"));
    assert_ptr_equal(a, kept); /* unchanged, elements and all */
    assert_int_equal(cap, 32);
    for (int n = 0; n < 16; n++) assert_int_equal(a[n], n);
    TU_OK(PP_GROW(a, cap, 32)); /* it fails once only */
    assert_int_equal(cap, 64);
    assert_int_equal(pp_grow_fail_after(-1), -1);
    free(a);
    int *e = NULL;
    pp_grow_fail_after(0);
    assert_int_equal(PP_GROW_EXACT(e, 0), PP_ERR_NOMEM);
    assert_null(e);
    assert_int_equal(PP_GROW(e, cap, -1), PP_ERR_INTERNAL);
}

/* Bytes in use on the heap (glibc); -1 where that cannot be read. */
static long long heap_in_use(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 mi = mallinfo2();
    return (long long)(mi.uordblks + mi.hblkhd);
#else
    return -1;
#endif
}

static char mlp_path[4096];

/* Autodiff of the mlp fixture with d/dx too (so regions I and W, a stash and
 * an I->W handoff all exist) while pp_grow's allocation number fail (from 0)
 * fails; fail < 0: none does. *calls (fail < 0) receives how many
 * allocations pp_grow made. No cmocka asserts: this also runs on a worker
 * thread; a result that breaks the contract comes back as PP_ERR_INTERNAL. */
static pp_status autodiff_failing_at(int fail, int *calls) {
    pp_graph *g = NULL;
    pp_backward *b = NULL;
    pp_status s = pp_onnx_load(mlp_path, &g);
    if (s != PP_OK) return s;
    enum { PLENTY = 1 << 30 };
    pp_grow_fail_after(fail >= 0 ? fail : PLENTY);
    s = pp_autodiff_model(g, NULL, 1, &b);
    int left = pp_grow_fail_after(-1);
    if (calls) *calls = PLENTY - left;
    if (s == PP_OK && !(b && b->n_i > 0 && b->n_w > 0 && b->n_stash > 0 && b->n_handoff > 0))
        s = PP_ERR_INTERNAL;
    if (s != PP_OK && b) s = PP_ERR_INTERNAL; /* a failed pass hands out nothing */
    pp_backward_free(b);
    pp_graph_free(g);
    return s;
}

static void test_autodiff_out_of_memory_everywhere(void **state) {
    (void)state;
    snprintf(mlp_path, sizeof mlp_path, "%s", tu_src_path("test/fixtures/mlp/model.onnx"));
    int calls;
    TU_OK(autodiff_failing_at(-1, &calls));
    assert_true(calls > 0);
    for (int k = 0; k < calls; k++) {
        pp_status s = autodiff_failing_at(k, NULL);
        if (s != PP_ERR_NOMEM)
            fail_msg("pp_grow allocation %d of %d failing: status %d (%s)", k, calls, (int)s,
                     pp_last_error());
    }
    TU_OK(autodiff_failing_at(calls, NULL)); /* one past the last: nothing fails */
}

typedef struct {
    int fail, reps;
    pp_status worst; /* PP_ERR_NOMEM when every run failed as it should */
} failing_runs;

static void *run_failing(void *arg) {
    failing_runs *r = arg;
    r->worst = PP_ERR_NOMEM;
    for (int i = 0; i < r->reps; i++) {
        pp_status s = autodiff_failing_at(r->fail, NULL);
        if (s != PP_ERR_NOMEM) r->worst = s;
    }
    return NULL;
}

/* Heap growth over reps failing runs, on a thread of their own: its exit
 * hands the thread's malloc cache back, so a run that frees everything
 * leaves the count exactly where it was. */
static long long heap_growth(int fail, int reps) {
    failing_runs r = {fail, reps, PP_OK};
    pthread_t t;
    long long before = heap_in_use();
    assert_int_equal(pthread_create(&t, NULL, run_failing, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    long long after = heap_in_use();
    assert_int_equal(r.worst, PP_ERR_NOMEM);
    return after - before;
}

/* The last allocations of the pass are regions() listing the stash and the
 * handoff; failing there must free its work arrays (before the fix each run
 * leaked five arrays of n_values bytes). Some round of runs must leave the
 * heap as it found it (one round may not, for one-time allocations). */
static void test_regions_out_of_memory_no_leak(void **state) {
    (void)state;
    snprintf(mlp_path, sizeof mlp_path, "%s", tu_src_path("test/fixtures/mlp/model.onnx"));
    if (heap_in_use() < 0) skip();
    int calls;
    TU_OK(autodiff_failing_at(-1, &calls));
    for (int k = calls - 3; k < calls; k++) {
        long long least = heap_growth(k, 5);
        for (int round = 0; round < 3 && least > 0; round++) {
            long long grew = heap_growth(k, 10);
            if (grew < least) least = grew;
        }
        if (least > 0)
            fail_msg("failing pp_grow allocation %d of %d: every round of runs leaked (at "
                     "least %lld bytes)", k, calls, least);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow_doubles),
        cmocka_unit_test(test_grow_exact),
        cmocka_unit_test(test_grow_failure_keeps_array),
        cmocka_unit_test(test_autodiff_out_of_memory_everywhere),
        cmocka_unit_test(test_regions_out_of_memory_no_leak),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
