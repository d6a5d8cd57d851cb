/* The generation's next-token choice (runtime/serve_sample.c): greedy picks
 * the first largest; sampling is reproducible for a seed, stays in the top
 * k, follows the temperature; infinities and NaN are handled, not drawn
 * from blindly. */
#include <math.h>
#include <string.h>

#include "serve_sample.h"
#include "test_filter.h"
#include "test_util.h"

/* Expects code and a message holding needle. */
static void fails(pp_status st, pp_status code, const char *needle) {
    assert_int_equal(st, code);
    if (!strstr(pp_last_error(), needle)) fail_msg("'%s' lacks '%s'", pp_last_error(), needle);
}

static int64_t draw(const float *l, int64_t n, float temp, uint32_t k, uint64_t *rng) {
    int64_t t = -1;
    TU_OK(pp_sample_token(l, n, temp, k, rng, &t));
    return t;
}

static void test_greedy(void **state) {
    (void)state;
    float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    uint64_t rng = 1;
    assert_int_equal(draw(l, 5, 0.0f, 0, &rng), 1); /* ties: the first, as torch.argmax */
    assert_int_equal(draw(l, 5, 3.0f, 1, &rng), 1); /* top 1 is greedy whatever the temperature */
    assert_int_equal(rng, 1);                       /* greedy draws nothing */
}

static void test_sampling(void **state) {
    (void)state;
    float l[6] = {3.0f, 2.5f, 2.0f, -5.0f, 1.0f, 0.0f};
    uint64_t a = 42, b = 42, c = 43;
    int same = 1, differs = 0, counts[6] = {0};
    for (int i = 0; i < 2000; i++) {
        int64_t x = draw(l, 6, 1.0f, 3, &a), y = draw(l, 6, 1.0f, 3, &b), z = draw(l, 6, 1.0f, 3, &c);
        same &= x == y;
        differs |= x != z;
        assert_true(x >= 0 && x <= 2); /* only the top 3 */
        counts[x]++;
    }
    assert_true(same && differs);
    /* softmax over {3, 2.5, 2}: 0.506, 0.307, 0.186 (2000 draws: a few sigma) */
    assert_true(counts[0] > 900 && counts[0] < 1130);
    assert_true(counts[2] > 280 && counts[2] < 470);
    /* a high temperature flattens: every one of the 6 comes up */
    int seen[6] = {0};
    for (int i = 0; i < 2000; i++) seen[draw(l, 6, 100.0f, 0, &a)] = 1;
    for (int i = 0; i < 6; i++) assert_true(seen[i]);
}

static void test_infinities(void **state) {
    (void)state;
    float pinf[4] = {0.0f, INFINITY, 1.0f, 2.0f}, minf[3] = {-INFINITY, -INFINITY, -INFINITY};
    float some[3] = {-INFINITY, 1.0f, -INFINITY}, bad[3] = {0.0f, NAN, 1.0f};
    uint64_t rng = 7;
    for (int i = 0; i < 20; i++) assert_int_equal(draw(pinf, 4, 1.0f, 0, &rng), 1); /* +inf is certain */
    for (int i = 0; i < 20; i++) assert_int_equal(draw(some, 3, 1.0f, 0, &rng), 1); /* -inf is never drawn */
    int64_t t;
    fails(pp_sample_token(minf, 3, 1.0f, 0, &rng, &t), PP_ERR_INVALID, "all -inf");
    fails(pp_sample_token(minf, 3, 0.0f, 0, &rng, &t), PP_ERR_INVALID, "all -inf");
    fails(pp_sample_token(bad, 3, 0.0f, 0, &rng, &t), PP_ERR_INVALID, "NaN");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_infinities),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
