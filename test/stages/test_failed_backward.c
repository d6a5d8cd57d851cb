/* A backward that fails part-way must not leave a silently wrong sum
 * (pippin/params.h, grads_incomplete): every node of the example GPT's
 * training step is made to fail in turn (lib/exec_fault.h), and after each
 * failure either the gradients are exactly what they were before the call,
 * or they are marked incomplete and a further backward and the optimizer
 * step refuse until they are zeroed; zeroing and running again gives the
 * clean run's gradients bit for bit. For the whole-model trainer and for a
 * 2-microbatch pipeline step through the runner. */
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "exec_fault.h"
#include "test_filter.h"

static const char *const input_names[2] = {"idx", "targets"};

/* ---- the whole-model trainer ---- */

static float *grads_copy(const pp_flat_params *fp) {
    float *g = malloc(sizeof(float) * (size_t)fp->total);
    assert_non_null(g);
    memcpy(g, fp->grad, sizeof(float) * (size_t)fp->total);
    return g;
}

static void assert_grads(const pp_flat_params *fp, const float *want, const char *what, int n) {
    if (memcmp(fp->grad, want, sizeof(float) * (size_t)fp->total) != 0)
        fail_msg("%s (failure at node %d): the gradients differ", what, n);
}

static void test_trainer_failure_leaves_whole_sum_or_flag(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_trainer *t;
    TU_OK(pp_trainer_new(g, NULL, &t));
    pp_flat_params *fp = pp_trainer_params(t);
    pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
    /* the clean sums: one microbatch, and two */
    pp_flat_params_zero_grad(fp);
    TU_OK(pp_trainer_backward(t, ins, 0.5f, NULL));
    float *one = grads_copy(fp);
    pp_exec_fail_after_nodes(1 << 30);
    TU_OK(pp_trainer_backward(t, ins, 0.5f, NULL));
    int nodes = (1 << 30) - pp_exec_fail_after_nodes(-1);
    float *two = grads_copy(fp);
    assert_true(nodes > 10);
    int flagged = 0, untouched = 0;
    for (int n = 0; n < nodes; n++) {
        pp_flat_params_zero_grad(fp);
        TU_OK(pp_trainer_backward(t, ins, 0.5f, NULL)); /* microbatch 1 of 2 */
        pp_exec_fail_after_nodes(n);
        assert_int_not_equal(pp_trainer_backward(t, ins, 0.5f, NULL), PP_OK); /* microbatch 2 fails */
        pp_exec_fail_after_nodes(-1);
        if (!fp->grads_incomplete) { /* failed before any gradient went in */
            untouched++;
            assert_grads(fp, one, "not flagged", n);
            TU_OK(pp_trainer_backward(t, ins, 0.5f, NULL)); /* a retry completes the sum */
            assert_grads(fp, two, "retried", n);
            continue;
        }
        flagged++;
        assert_int_equal(pp_flat_params_check_grads(fp, "trainer"), PP_ERR_STATE);
        assert_int_equal(pp_trainer_backward(t, ins, 0.5f, NULL), PP_ERR_STATE);
        assert_non_null(strstr(pp_last_error(), "trainer: the gradients hold part of a backward that failed"));
        pp_flat_params_zero_grad(fp); /* the step starts again */
        assert_int_equal(fp->grads_incomplete, 0);
        TU_OK(pp_trainer_backward(t, ins, 0.5f, NULL));
        TU_OK(pp_trainer_backward(t, ins, 0.5f, NULL));
        assert_grads(fp, two, "redone", n);
    }
    /* both outcomes happen: failures in the forward, and in the backward
     * after the last layers' gradients went in */
    assert_true(untouched > 0 && flagged > 0);
    free(one);
    free(two);
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    pp_trainer_free(t);
    pp_graph_free(g);
}

/* ---- a pipeline step through the runner ---- */

static pp_runner *gpt_runner(pp_pipe **p) {
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    TU_OK(pp_pipe_split(g, NULL, p));
    pp_graph_free(g);
    pp_runner *r;
    TU_OK(pp_runner_new(*p, 1, &r));
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_SGD);
    TU_OK(pp_runner_set_optimizer(r, &oc));
    return r;
}

/* Every stage's gradients (grad 1) or parameters (grad 0), concatenated
 * (the runner's host buffers, one layout for both); *n_out their count. */
static float *runner_buffers(pp_runner *r, int grad, int64_t *n_out) {
    int64_t n = 0;
    for (int s = 0; s < pp_runner_n_stages(r); s++) n += pp_stage_params(pp_runner_stage(r, s))->total;
    float *all = malloc(sizeof(float) * (size_t)(n + 1)), *at = all;
    assert_non_null(all);
    for (int s = 0; s < pp_runner_n_stages(r); s++) {
        const pp_flat_params *fp = pp_stage_params(pp_runner_stage(r, s));
        memcpy(at, grad ? fp->grad : fp->data, sizeof(float) * (size_t)fp->total);
        at += fp->total;
    }
    *n_out = n;
    return all;
}

static int any_flagged(pp_runner *r) {
    int k = 0;
    for (int s = 0; s < pp_runner_n_stages(r); s++) k |= pp_stage_params(pp_runner_stage(r, s))->grads_incomplete;
    return k;
}

static void test_runner_failed_step_leaves_whole_sum_or_flag(void **state) {
    (void)state;
    pp_pipe *p;
    pp_runner *r = gpt_runner(&p);
    pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
    pp_runner_zero_grad(r);
    pp_exec_fail_after_nodes(1 << 30);
    TU_OK(pp_runner_step(r, 2, NULL, 2, input_names, ins, NULL));
    int nodes = (1 << 30) - pp_exec_fail_after_nodes(-1);
    int64_t n;
    float *clean = runner_buffers(r, 1, &n);
    float *zero = calloc((size_t)n + 1, sizeof(float));
    assert_non_null(zero);
    int flagged = 0, untouched = 0;
    for (int k = 0; k < nodes; k++) {
        pp_runner_zero_grad(r);
        pp_exec_fail_after_nodes(k);
        assert_int_not_equal(pp_runner_step(r, 2, NULL, 2, input_names, ins, NULL), PP_OK);
        pp_exec_fail_after_nodes(-1);
        if (!any_flagged(r)) {
            untouched++;
            float *got = runner_buffers(r, 1, &n);
            if (memcmp(got, zero, sizeof(float) * (size_t)n) != 0)
                fail_msg("failure at node %d: gradients changed but are not flagged", k);
            free(got);
            continue;
        }
        flagged++;
        float *before = runner_buffers(r, 0, &n);
        assert_int_equal(pp_runner_optimizer_step(r), PP_ERR_STATE);
        assert_non_null(strstr(pp_last_error(), "the gradients hold part of a backward that failed"));
        float *after = runner_buffers(r, 0, &n); /* all stages or none: not one stepped before another refused */
        if (memcmp(before, after, sizeof(float) * (size_t)n) != 0) {
            fail_msg("failure at node %d: a refused optimizer step changed parameters", k);
        }
        free(before);
        free(after);
        assert_int_equal(pp_runner_step(r, 2, NULL, 2, input_names, ins, NULL), PP_ERR_STATE); /* said at once */
        pp_runner_zero_grad(r);
        assert_int_equal(any_flagged(r), 0);
        TU_OK(pp_runner_step(r, 2, NULL, 2, input_names, ins, NULL));
        float *got = runner_buffers(r, 1, &n);
        if (memcmp(got, clean, sizeof(float) * (size_t)n) != 0)
            fail_msg("failure at node %d: the step redone after zeroing differs from the clean one", k);
        free(got);
    }
    assert_true(untouched > 0 && flagged > 0);
    TU_OK(pp_runner_optimizer_step(r)); /* the last redone step is whole */
    free(clean);
    free(zero);
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    pp_runner_free(r);
    pp_pipe_free(p);
}

/* A failed assertion jumps out of a test with the hook still set. */
static int hook_off(void **state) {
    (void)state;
    pp_exec_fail_after_nodes(-1);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_trainer_failure_leaves_whole_sum_or_flag, hook_off),
        cmocka_unit_test_teardown(test_runner_failed_step_leaves_whole_sum_or_flag, hook_off),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
