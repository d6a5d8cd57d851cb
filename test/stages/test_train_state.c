/* Training-mode ops against PyTorch (test/fixtures/bn, test/fixtures/gen_bn.py):
 * BatchNormalization's gradients through the batch statistics and its
 * running statistics updated microbatch after microbatch, through a 2-stage
 * pipe under GPipe and 1F1B; eval mode from the running statistics.
 * Activation recomputation gives the same bits (BatchNorm state, Dropout
 * masks) with a smaller stash. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pippin/exec.h"
#include "pippin/optim.h"
#include "pippin/pipe.h"
#include "pippin/runner.h"
#include "pippin/schedule.h"
#include "pippin/trainer.h"
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

/* The single-graph trainer (unsplit `pippin train`, `pippin grad`) keeps
 * the state too, and unsplit inference uses it. (Regression: it left the
 * statistics as they were and inference used batch statistics.) */
static void test_unsplit_trainer_and_inference(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("bn", "model.onnx");
    pp_trainer *t;
    TU_OK(pp_trainer_new(g, NULL, &t));
    pp_tensor *ins[2] = {tu_fixture_npy("bn", "x.npy"), tu_fixture_npy("bn", "y.npy")};
    float loss;
    pp_trainer_set_step(t, 0, 0);
    TU_OK(pp_trainer_backward(t, ins, 1.0f, &loss));
    pp_tensor *want = tu_fixture_npy("bn", "m1_loss.npy");
    assert_true(fabs(loss - pp_tensor_get_f64(want, 0)) < 1e-5);
    pp_tensor_free(want);
    assert_int_equal(pp_trainer_n_state(t), 6);
    for (int i = 0; i < pp_trainer_n_state(t); i++) {
        char file[256];
        snprintf(file, sizeof file, "m1_state_%s.npy", pp_trainer_state_name(t, i));
        want = tu_fixture_npy("bn", file);
        tu_assert_close(pp_trainer_state_tensor(t, i), want, 1e-5, 1e-6, file);
        pp_tensor_free(want);
    }
    pp_trainer_free(t);
    pp_graph_free(g);

    g = tu_fixture_onnx("bn", "model.onnx");
    TU_OK(pp_graph_prepare_inference(g));
    pp_tensor *outs[2] = {0};
    TU_OK(pp_graph_run(g, ins, outs));
    want = tu_fixture_npy("bn", "eval_logits.npy");
    tu_assert_close(outs[1], want, 1e-4, 1e-5, "unsplit eval logits");
    pp_tensor_free(want);
    for (int i = 0; i < 2; i++) {
        pp_tensor_free(outs[i]);
        pp_tensor_free(ins[i]);
    }
    pp_graph_free(g);
}

/* A step that fails leaves the statistics as they were before it (a retry
 * must not apply its microbatches twice), and training a pipe leaves the
 * graph it was split from untouched. */
static void test_failed_step_and_source_graph(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("bn", "model.onnx");
    int v = pp_graph_find_value(g, "bn1.running_mean");
    assert_true(v >= 0);
    pp_tensor *before;
    TU_OK(pp_tensor_clone(g->values[v].data, &before));
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_runner *r;
    TU_OK(pp_runner_new(p, 1, &r));
    /* microbatch 1's labels are out of range: its loss fails on stage 1 after
     * stage 0 ran its forward (and updated bn1's statistics) */
    pp_tensor *ins[2] = {tu_fixture_npy("bn", "x.npy"), tu_fixture_npy("bn", "y.npy")};
    pp_tensor *bad;
    TU_OK(pp_tensor_clone(ins[1], &bad));
    ((int64_t *)bad->data)[3] = 99;
    pp_tensor *feed[2] = {ins[0], bad};
    assert_int_not_equal(pp_runner_step(r, 2, NULL, 2, input_names, feed, NULL), PP_OK);
    pp_stage *s0 = pp_runner_stage(r, 0);
    int k = 0;
    while (strcmp(pp_stage_state_name(s0, k), "bn1.running_mean") != 0) k++;
    tu_assert_close(pp_stage_state_tensor(s0, k), before, 0, 0, "bn1.running_mean after a failed step");
    /* then a good step: PyTorch's statistics, and the source graph unchanged */
    pp_tensor *outs[2] = {0};
    TU_OK(pp_runner_step(r, 2, NULL, 2, input_names, ins, outs));
    pp_tensor *want = tu_fixture_npy("bn", "m2_state_bn1.running_mean.npy");
    tu_assert_close(pp_stage_state_tensor(s0, k), want, 1e-5, 1e-6, "bn1.running_mean after the retry");
    tu_assert_close(g->values[v].data, before, 0, 0, "the source graph's bn1.running_mean");
    for (int i = 0; i < 2; i++) {
        pp_tensor_free(outs[i]);
        pp_tensor_free(ins[i]);
    }
    pp_tensor_free(want);
    pp_tensor_free(bad);
    pp_tensor_free(before);
    pp_runner_free(r);
    pp_pipe_free(p);
    pp_graph_free(g);
}

/* ------------------------------------------------------------ recompute */

static pp_runner *fixture_runner(const char *fx, pp_pipe **p) {
    pp_graph *g = tu_fixture_onnx(fx, "model.onnx");
    TU_OK(pp_pipe_split(g, NULL, p));
    pp_graph_free(g);
    assert_int_equal((*p)->n_stages, 2);
    pp_runner *r;
    TU_OK(pp_runner_new(*p, 1, &r));
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_SGD);
    oc.lr = 0.1;
    TU_OK(pp_runner_set_optimizer(r, &oc));
    return r;
}

static void assert_same_bits(const pp_tensor *a, const pp_tensor *b, const char *what) {
    if (!a || !b || a->nbytes != b->nbytes || memcmp(a->data, b->data, a->nbytes) != 0)
        fail_msg("%s: recompute changed the bits", what);
}

/* Three steps (with SGD updates between them) with recomputation on every
 * stage equal those without, bit for bit: losses, every gradient, every
 * parameter, BatchNorm's running statistics. fx: bn (BatchNorm, state) or
 * dropout (training-mode masks from step and microbatch). */
static void check_recompute(const char *fx, int m, const pp_schedule *sched, const char *label) {
    pp_pipe *p[2];
    pp_runner *r[2] = {fixture_runner(fx, &p[0]), fixture_runner(fx, &p[1])};
    for (int s = 0; s < 2; s++) {
        assert_int_equal(pp_stage_recompute(pp_runner_stage(r[1], s)), 0);
        TU_OK(pp_stage_set_recompute(pp_runner_stage(r[1], s), 1));
        assert_int_equal(pp_stage_recompute(pp_runner_stage(r[1], s)), 1);
    }
    pp_tensor *ins[2] = {tu_fixture_npy(fx, "x.npy"), tu_fixture_npy(fx, "y.npy")};
    char what[256];
    for (int64_t step = 0; step < 3; step++) {
        pp_tensor *outs[2][2] = {{0}};
        for (int k = 0; k < 2; k++) {
            pp_runner_zero_grad(r[k]);
            pp_runner_set_step(r[k], step);
            TU_OK(pp_runner_step(r[k], m, sched, 2, input_names, ins, outs[k]));
        }
        int lo = pp_runner_loss_output(r[0]);
        snprintf(what, sizeof what, "%s %s step %lld loss", fx, label, (long long)step);
        assert_same_bits(outs[1][lo], outs[0][lo], what);
        for (int s = 0; s < 2; s++) {
            pp_stage *st = pp_runner_stage(r[0], s), *rc = pp_runner_stage(r[1], s);
            assert_int_equal(pp_stage_pending(rc), 0);
            assert_int_equal(pp_stage_n_params(st), pp_stage_n_params(rc));
            for (int i = 0; i < pp_stage_n_params(st); i++) {
                const char *name = pp_stage_param_name(st, i);
                pp_tensor *a, *b;
                TU_OK(pp_runner_param_grad(r[0], name, &a));
                TU_OK(pp_runner_param_grad(r[1], name, &b));
                snprintf(what, sizeof what, "%s %s step %lld grad %s", fx, label, (long long)step, name);
                assert_same_bits(b, a, what);
                pp_tensor_free(a);
                pp_tensor_free(b);
            }
            for (int i = 0; i < pp_stage_n_state(st); i++) {
                snprintf(what, sizeof what, "%s %s step %lld state %s", fx, label, (long long)step,
                         pp_stage_state_name(st, i));
                assert_same_bits(pp_stage_state_tensor(rc, i), pp_stage_state_tensor(st, i), what);
            }
        }
        for (int k = 0; k < 2; k++) {
            TU_OK(pp_runner_optimizer_step(r[k]));
            for (int o = 0; o < 2; o++) pp_tensor_free(outs[k][o]);
        }
    }
    for (int s = 0; s < 2; s++) { /* and the parameters the updates left */
        pp_stage *st = pp_runner_stage(r[0], s);
        for (int i = 0; i < pp_stage_n_params(st); i++) {
            pp_tensor *a, *b;
            TU_OK(pp_runner_param(r[0], pp_stage_param_name(st, i), &a));
            TU_OK(pp_runner_param(r[1], pp_stage_param_name(st, i), &b));
            snprintf(what, sizeof what, "%s %s parameter %s", fx, label, pp_stage_param_name(st, i));
            assert_same_bits(b, a, what);
            pp_tensor_free(a);
            pp_tensor_free(b);
        }
    }
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    for (int k = 0; k < 2; k++) {
        pp_runner_free(r[k]);
        pp_pipe_free(p[k]);
    }
}

static pp_schedule *make_schedule(pp_sched_kind kind, int m) {
    pp_sched_params sp = {0};
    sp.kind = kind;
    sp.nranks = 2;
    sp.nmb = m;
    sp.stages_per_rank = 1;
    pp_schedule *s;
    TU_OK(pp_schedule_generate(&sp, &s));
    return s;
}

static void test_recompute_bit_identical(void **state) {
    (void)state;
    const char *fixtures[2] = {"bn", "dropout"};
    for (int f = 0; f < 2; f++) {
        check_recompute(fixtures[f], 2, NULL, "gpipe");
        pp_schedule *s = make_schedule(PP_SCHED_1F1B, 2);
        check_recompute(fixtures[f], 2, s, "1f1b");
        pp_schedule_free(s);
        int m = f == 0 ? 2 : 4; /* bn's BatchNorm needs 2 rows per microbatch */
        s = make_schedule(PP_SCHED_ZB_H1, m); /* I and W apart: W finds what I kept */
        check_recompute(fixtures[f], m, s, "zb-h1");
        pp_schedule_free(s);
    }
}

/* The stash a forward leaves is smaller with recompute (measured and
 * predicted per sample); dropping a pending microbatch frees it; the
 * setting refuses stages built for inference. */
static void test_recompute_stash(void **state) {
    (void)state;
    const char *fixtures[2] = {"bn", "dropout"};
    for (int f = 0; f < 2; f++) {
        pp_pipe *p;
        pp_runner *r = fixture_runner(fixtures[f], &p);
        pp_stage *st = pp_runner_stage(r, 0);
        assert_int_equal(pp_stage_n_inputs(st), 1);
        assert_string_equal(pp_stage_input_name(st, 0), "x");
        pp_tensor *x = tu_fixture_npy(fixtures[f], "x.npy");
        size_t bytes[2];
        int64_t per_sample[2];
        for (int on = 0; on < 2; on++) {
            TU_OK(pp_stage_set_recompute(st, on));
            TU_OK(pp_stage_begin_step(st, 0));
            pp_tensor *outs[4] = {0};
            TU_OK(pp_stage_forward(st, 0, &x, outs));
            assert_int_equal(pp_stage_pending(st), 1);
            bytes[on] = pp_stage_stash_bytes(st);
            /* a backward-input without its gradients fails before any re-run:
             * the stash stays the inputs alone (regression: it re-ran first) */
            pp_tensor *in_grads[4] = {0};
            assert_int_equal(pp_stage_backward_input(st, 0, NULL, in_grads), PP_ERR_INVALID);
            assert_int_equal(pp_stage_stash_bytes(st), bytes[on]);
            pp_stage_discard_pending(st); /* a failed step: nothing kept, nothing leaked */
            pp_stage_abort_step(st);
            assert_int_equal(pp_stage_pending(st), 0);
            assert_int_equal(pp_stage_stash_bytes(st), 0);
            for (int o = 0; o < pp_stage_n_outputs(st); o++) pp_tensor_free(outs[o]);
        }
        assert_int_equal(bytes[1], x->nbytes); /* the input alone */
        assert_true(bytes[1] < bytes[0]);
        TU_OK(pp_stage_stash_per_sample_dims(st, NULL, 0, NULL, &per_sample[0]));
        TU_OK(pp_stage_recompute_stash_per_sample_dims(st, NULL, 0, NULL, &per_sample[1]));
        assert_int_equal(per_sample[1], x->nbytes / (size_t)x->shape[0]);
        assert_true(per_sample[1] < per_sample[0]);
        pp_tensor_free(x);
        pp_runner_free(r);
        pp_pipe_free(p);
    }
    pp_pipe *p;
    pp_runner *r = bn_runner(0, &p);
    assert_int_equal(pp_stage_set_recompute(pp_runner_stage(r, 0), 1), PP_ERR_STATE);
    assert_non_null(strstr(pp_last_error(), "training"));
    pp_runner_free(r);
    pp_pipe_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_norm_training),
        cmocka_unit_test(test_batch_norm_eval),
        cmocka_unit_test(test_unsplit_trainer_and_inference),
        cmocka_unit_test(test_failed_step_and_source_graph),
        cmocka_unit_test(test_recompute_bit_identical),
        cmocka_unit_test(test_recompute_stash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
