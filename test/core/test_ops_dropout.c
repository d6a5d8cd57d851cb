/* Training-mode Dropout: Philox4x32-10 against Random123's known answers,
 * the kept fraction and scale, and masks that depend on (seed, step,
 * microbatch, node) only. (Its gradient: test_gradcheck.c.) */
#include <math.h>
#include <string.h>

#include "pippin/exec.h"
#include "philox.h"
#include "test_util.h"

#include "test_filter.h"

/* Random123's kat_vectors for philox4x32 with 10 rounds. */
static void test_philox_known_answers(void **state) {
    (void)state;
    static const uint32_t cases[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e,
         0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
         0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        pp_philox4x32(cases[i] + 4, cases[i], out);
        for (int k = 0; k < 4; k++) assert_int_equal(out[k], cases[i][6 + k]);
    }
}

/* Dropout(x, ratio, training_mode=true) over n elements. */
static pp_exec *dropout_exec(pp_graph **gp, int64_t n, float ratio, const char *name) {
    pp_graph *g;
    TU_OK(pp_graph_new("dropout", &g));
    int in[3], node;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 1, &n, &in[0]));
    TU_OK(pp_graph_add_initializer(g, "ratio", PP_VALUE_CONST, T(PP_F32, 0, NULL, ratio), &in[1]));
    TU_OK(pp_graph_add_initializer(g, "training", PP_VALUE_CONST, T(PP_BOOL, 0, NULL, 1), &in[2]));
    TU_OK(pp_graph_add_node(g, "Dropout", "", name, 3, in, 2, NULL, &node));
    TU_OK(pp_graph_add_output(g, g->nodes[node].out[0]));
    TU_OK(pp_graph_add_output(g, g->nodes[node].out[1]));
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    *gp = g;
    return ex;
}

static pp_tensor *ones(int64_t n) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, 1, &n, &t));
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = 1.0f;
    return t;
}

static void run(pp_exec *ex, pp_tensor *x, uint64_t seed, int64_t step, int64_t mb, pp_tensor **outs) {
    pp_exec_set_random_stream(ex, seed, step, mb);
    TU_OK(pp_exec_run(ex, &x, outs));
}

static void test_kept_fraction_and_scale(void **state) {
    (void)state;
    const int64_t n = 200000;
    pp_graph *g;
    pp_exec *ex = dropout_exec(&g, n, 0.25f, "drop");
    pp_tensor *x = ones(n), *outs[2];
    run(ex, x, 1, 3, 0, outs);
    const float *y = outs[0]->data;
    const uint8_t *mask = outs[1]->data;
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        if (mask[i]) {
            kept++;
            assert_true(fabsf(y[i] - 1.0f / 0.75f) < 1e-6f);
        } else {
            assert_true(y[i] == 0.0f);
        }
    }
    double frac = (double)kept / (double)n; /* 0.75, sd 0.001 */
    assert_true(fabs(frac - 0.75) < 0.005);
    pp_tensor_free(outs[0]);
    pp_tensor_free(outs[1]);
    pp_tensor_free(x);
    pp_exec_free(ex);
    pp_graph_free(g);
}

/* The mask is a function of (seed, step, microbatch, node name) alone. */
static void test_masks_are_keyed(void **state) {
    (void)state;
    const int64_t n = 4096;
    pp_graph *g, *g2, *g3;
    pp_exec *ex = dropout_exec(&g, n, 0.5f, "drop"), *same = dropout_exec(&g2, n, 0.5f, "drop"),
            *other = dropout_exec(&g3, n, 0.5f, "drop2");
    pp_tensor *x = ones(n), *a[2], *b[2];
    run(ex, x, 9, 5, 1, a);
    run(ex, x, 9, 4, 1, b); /* another step first: no hidden state */
    pp_tensor_free(b[0]);
    pp_tensor_free(b[1]);
    run(same, x, 9, 5, 1, b);
    assert_memory_equal(a[1]->data, b[1]->data, (size_t)n);
    pp_tensor_free(b[0]);
    pp_tensor_free(b[1]);
    const struct { pp_exec *e; uint64_t seed; int64_t step, mb; } differ[4] = {
        {ex, 10, 5, 1}, {ex, 9, 6, 1}, {ex, 9, 5, 2}, {other, 9, 5, 1}};
    for (int k = 0; k < 4; k++) {
        run(differ[k].e, x, differ[k].seed, differ[k].step, differ[k].mb, b);
        assert_true(memcmp(a[1]->data, b[1]->data, (size_t)n) != 0);
        pp_tensor_free(b[0]);
        pp_tensor_free(b[1]);
    }
    pp_tensor_free(a[0]);
    pp_tensor_free(a[1]);
    pp_tensor_free(x);
    pp_exec_free(ex);
    pp_exec_free(same);
    pp_exec_free(other);
    pp_graph_free(g);
    pp_graph_free(g2);
    pp_graph_free(g3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_kept_fraction_and_scale),
        cmocka_unit_test(test_masks_are_keyed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
