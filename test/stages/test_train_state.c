/* Training-mode ops against PyTorch (test/fixtures/bn, test/fixtures/gen_bn.py):
 * BatchNormalization's gradients through the batch statistics and its
 * running statistics updated microbatch after microbatch, through a 2-stage
 * pipe under GPipe and 1F1B; eval mode from the running statistics. */
#include <stdio.h>
#include <string.h>

#include "pippin/pipe.h"
#include "pippin/runner.h"
#include "pippin/schedule.h"
#include "test_util.h"

#include "test_filter.h"

static const char *const input_names[2] = {"x", "y"};

static pp_runner *bn_runner(int training, pp_pipe **p) {
    pp_graph *g = tu_fixture_onnx("bn", "model.onnx");
    TU_OK(pp_pipe_split(g, NULL, p));
    pp_graph_free(g);
    assert_int_equal((*p)->n_stages, 2);
    pp_runner *r;
    TU_OK(pp_runner_new(*p, training, &r));
    return r;
}

static void step(pp_runner *r, int m, const pp_schedule *sched, pp_tensor **outs) {
    pp_tensor *ins[2] = {tu_fixture_npy("bn", "x.npy"), tu_fixture_npy("bn", "y.npy")};
    TU_OK(pp_runner_step(r, m, sched, 2, input_names, ins, outs));
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
}

/* Loss, every parameter gradient and every running statistic as PyTorch's
 * loop over m microbatches left them. */
static void check_training(int m, const pp_schedule *sched, const char *label) {
    pp_pipe *p;
    pp_runner *r = bn_runner(1, &p);
    pp_tensor *outs[2] = {0};
    step(r, m, sched, outs);
    char file[256], what[256];
    snprintf(file, sizeof file, "m%d_loss.npy", m);
    snprintf(what, sizeof what, "%s m=%d loss", label, m);
    pp_tensor *want_loss = tu_fixture_npy("bn", file);
    tu_assert_close(outs[pp_runner_loss_output(r)], want_loss, 1e-5, 1e-6, what);
    pp_tensor_free(want_loss);
    int grads = 0, states = 0;
    for (int s = 0; s < pp_runner_n_stages(r); s++) {
        pp_stage *st = pp_runner_stage(r, s);
        for (int i = 0; i < pp_stage_n_params(st); i++, grads++) {
            const char *name = pp_stage_param_name(st, i);
            assert_null(strstr(name, "running")); /* state, never a parameter */
            pp_tensor *got;
            TU_OK(pp_runner_param_grad(r, name, &got));
            snprintf(file, sizeof file, "m%d_grad_%s.npy", m, name);
            snprintf(what, sizeof what, "%s m=%d grad %s", label, m, name);
            tu_expect(got, tu_fixture_npy("bn", file), 1e-3, 1e-5, what);
        }
        for (int i = 0; i < pp_stage_n_state(st); i++, states++) {
            snprintf(file, sizeof file, "m%d_state_%s.npy", m, pp_stage_state_name(st, i));
            snprintf(what, sizeof what, "%s m=%d state %s", label, m, pp_stage_state_name(st, i));
            pp_tensor *want = tu_fixture_npy("bn", file);
            tu_assert_close(pp_stage_state_tensor(st, i), want, 1e-5, 1e-6, what);
            pp_tensor_free(want);
        }
    }
    assert_int_equal(grads, 14);
    assert_int_equal(states, 6);
    for (int o = 0; o < 2; o++) pp_tensor_free(outs[o]);
    pp_runner_free(r);
    pp_pipe_free(p);
}

static void test_batch_norm_training(void **state) {
    (void)state;
    check_training(1, NULL, "gpipe");
    check_training(2, NULL, "gpipe");
    pp_sched_params sp = {0};
    sp.kind = PP_SCHED_1F1B;
    sp.nranks = 2;
    sp.nmb = 2;
    sp.stages_per_rank = 1;
    pp_schedule *s;
    TU_OK(pp_schedule_generate(&sp, &s));
    check_training(2, s, "1f1b");
    pp_schedule_free(s);
}

/* Inference of the same file uses the running statistics (eval mode). */
static void test_batch_norm_eval(void **state) {
    (void)state;
    pp_pipe *p;
    pp_runner *r = bn_runner(0, &p);
    pp_tensor *outs[2] = {0};
    step(r, 1, NULL, outs);
    int lg = -1;
    for (int o = 0; o < pp_runner_n_outputs(r); o++)
        if (strcmp(pp_runner_output_name(r, o), "logits") == 0) lg = o;
    assert_true(lg >= 0);
    pp_tensor *want = tu_fixture_npy("bn", "eval_logits.npy");
    tu_assert_close(outs[lg], want, 1e-4, 1e-5, "eval logits");
    pp_tensor_free(want);
    for (int o = 0; o < 2; o++) pp_tensor_free(outs[o]);
    pp_runner_free(r);
    pp_pipe_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_norm_training),
        cmocka_unit_test(test_batch_norm_eval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
