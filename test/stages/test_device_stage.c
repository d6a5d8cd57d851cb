/* Stages on a device: the example GPT's training step (forward, I and W,
 * then an AdamW step) with its stages on the fake device equals the CPU
 * run bit for bit (the fake runs the CPU kernels, so any difference is a
 * lost or misplaced copy); over several steps the parameters, gradients
 * and optimizer state stay on the device, so only the stages' boundary
 * values cross; and a missing CUDA device is a clear error naming the
 * stage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_backend.h"
#include "pippin/checkpoint.h"
#include "stage_core.h"
#include "test_util.h"

#include "test_filter.h"

static const char *const input_names[2] = {"idx", "targets"};

/* One training step of the GPT pipe with every stage on `spec` (NULL: the
 * CPU): outs[] the outputs, then an AdamW step. */
/* The end of a test on a CPU runner and a device runner: both runners,
 * their pipes, and the 4 outputs each kept. */
static void free_pair(pp_runner *cpu, pp_runner *dev, pp_pipe *pc, pp_pipe *pd, pp_tensor **oc, pp_tensor **od) {
    for (int o = 0; o < 4; o++) {
        pp_tensor_free(oc[o]);
        pp_tensor_free(od[o]);
    }
    pp_runner_free(cpu);
    pp_runner_free(dev);
    pp_pipe_free(pc);
    pp_pipe_free(pd);
}

/* the ops the CUDA backend claims (lib/cuda/cuda_ops.c) */
#define CUDA_OPS                                                                                                   \
    "fake:Add,Sub,Mul,Div,Relu,Tanh,Gelu,Neg,Exp,Sqrt,Sigmoid,ReluGrad,TanhGrad,GeluGrad,"                         \
    "Softmax,SoftmaxGrad,LayerNormalization,LayerNormGradInput,LayerNormGradWeight,MatMul,"                        \
    "Gemm,MatMulAdd,MatMulGradA,MatMulGradB,Gather,GatherGrad,SoftmaxCrossEntropyLoss,"                            \
    "SoftmaxCrossEntropyLossGrad,SumToShape,Transpose,Reshape,Flatten,Squeeze,Unsqueeze,Identity,Concat,Split,"     \
    "CausalAttention,CausalAttentionGrad"

static pp_runner *gpt_step(const char *spec, pp_pipe **p_out, pp_tensor **outs) {
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    pp_runner *r;
    TU_OK(pp_runner_new(p, 1, &r));
    for (int s = 0; spec && s < pp_runner_n_stages(r); s++) TU_OK(pp_stage_use_device(pp_runner_stage(r, s), spec));
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    TU_OK(pp_runner_set_optimizer(r, &oc));
    pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
    TU_OK(pp_runner_step(r, 2, NULL, 2, input_names, ins, outs));
    TU_OK(pp_runner_optimizer_step(r));
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    *p_out = p;
    return r;
}

static void assert_same(const pp_tensor *a, const pp_tensor *b, const char *what) {
    if (!pp_shape_equal(a->ndim, a->shape, b->ndim, b->shape) || memcmp(a->data, b->data, a->nbytes) != 0)
        fail_msg("%s differs between the fake device and the CPU", what);
}

static void test_gpt_training_step_on_fake_device(void **state) {
    (void)state;
    pp_pipe *pc, *pd;
    pp_tensor *oc[4] = {0}, *od[4] = {0};
    pp_runner *cpu = gpt_step(NULL, &pc, oc);
    /* the ops the CUDA backend claims (lib/cuda/cuda_ops.c) */
    pp_runner *dev = gpt_step(CUDA_OPS, &pd, od);
    for (int o = 0; o < pp_runner_n_outputs(cpu); o++) assert_same(od[o], oc[o], pp_runner_output_name(cpu, o));
    int checked = 0;
    int64_t kernels = 0, copies = 0;
    for (int s = 0; s < pp_runner_n_stages(cpu); s++) {
        pp_stage *sc = pp_runner_stage(cpu, s), *sd = pp_runner_stage(dev, s);
        assert_null(pp_stage_device(sc));
        pp_device_stats st;
        pp_device_get_stats(pp_stage_device(sd), &st);
        kernels += st.kernels;
        copies += st.uploads + st.downloads;
        assert_int_equal(st.fallbacks, 0);
        for (int i = 0; i < pp_stage_n_params(sc); i++) {
            const char *name = pp_stage_param_name(sc, i);
            pp_tensor *gc, *gd, *pc_, *pd_;
            TU_OK(pp_runner_param_grad(cpu, name, &gc));
            TU_OK(pp_runner_param_grad(dev, name, &gd));
            assert_same(gd, gc, name);
            TU_OK(pp_runner_param(cpu, name, &pc_)); /* after the AdamW step */
            TU_OK(pp_runner_param(dev, name, &pd_));
            assert_same(pd_, pc_, name);
            pp_tensor_free(gc);
            pp_tensor_free(gd);
            pp_tensor_free(pc_);
            pp_tensor_free(pd_);
            checked++;
        }
    }
    assert_true(checked > 0);
    assert_true(kernels > 0 && copies > 0);
    free_pair(cpu, dev, pc, pd, oc, od);
}

/* A fixture's pipe with every stage on spec (NULL: the CPU) and an optimizer. */
static pp_runner *fixture_runner(const char *fixture, const char *spec, const pp_optim_config *oc, pp_pipe **p_out) {
    pp_graph *g = tu_fixture_onnx(fixture, "model.onnx");
    TU_OK(pp_pipe_split(g, NULL, p_out));
    pp_graph_free(g);
    pp_runner *r;
    TU_OK(pp_runner_new(*p_out, 1, &r));
    for (int s = 0; spec && s < pp_runner_n_stages(r); s++) TU_OK(pp_stage_use_device(pp_runner_stage(r, s), spec));
    TU_OK(pp_runner_set_optimizer(r, oc));
    return r;
}

/* The copies of every stage's device since the last reset, summed; then reset. */
static pp_device_stats take_copies(pp_runner *r) {
    pp_device_stats sum = {0};
    for (int s = 0; s < pp_runner_n_stages(r); s++) {
        pp_device *d = pp_stage_device(pp_runner_stage(r, s));
        if (!d) continue;
        pp_device_stats st;
        pp_device_get_stats(d, &st);
        sum.uploads += st.uploads;
        sum.downloads += st.downloads;
        sum.upload_bytes += st.upload_bytes;
        sum.download_bytes += st.download_bytes;
        sum.fallbacks += st.fallbacks;
        pp_device_reset_stats(d);
    }
    return sum;
}

static pp_runner *gpt_runner(const char *spec, const pp_optim_config *oc, pp_pipe **p_out) {
    return fixture_runner("gpt", spec, oc, p_out);
}

/* One training step of a fixture fed its two inputs: zero_grad, 2
 * microbatches, the optimizer. */
static void fixture_step(const char *fixture, const char *const names[2], pp_runner *r, pp_tensor **outs) {
    char f0[64], f1[64];
    snprintf(f0, sizeof f0, "%s.npy", names[0]);
    snprintf(f1, sizeof f1, "%s.npy", names[1]);
    pp_tensor *ins[2] = {tu_fixture_npy(fixture, f0), tu_fixture_npy(fixture, f1)};
    pp_runner_zero_grad(r);
    for (int o = 0; o < pp_runner_n_outputs(r); o++) pp_tensor_free(outs[o]), outs[o] = NULL;
    TU_OK(pp_runner_step(r, 2, NULL, 2, names, ins, outs));
    TU_OK(pp_runner_optimizer_step(r));
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
}

static void train_step(pp_runner *r, pp_tensor **outs) { fixture_step("gpt", input_names, r, outs); }

/* Every parameter and gradient of a equals b's, bit for bit. */
static void assert_same_params(pp_runner *a, pp_runner *b) {
    for (int s = 0; s < pp_runner_n_stages(a); s++) {
        pp_stage *st = pp_runner_stage(a, s);
        for (int i = 0; i < pp_stage_n_params(st); i++) {
            for (int grad = 0; grad < 2; grad++) {
                pp_tensor *ta, *tb;
                TU_OK(pp_stage_param_copy(st, i, grad, &ta));
                TU_OK(pp_stage_param_copy(pp_runner_stage(b, s), i, grad, &tb));
                char what[160];
                snprintf(what, sizeof what, "stage %d %s of '%s'", s, grad ? "gradient" : "weights",
                         pp_stage_param_name(st, i));
                assert_same(ta, tb, what);
                pp_tensor_free(ta);
                pp_tensor_free(tb);
            }
        }
    }
}

/* Bytes of every stage's trainable parameters. */
static int64_t param_bytes(pp_runner *r) {
    int64_t n = 0;
    for (int s = 0; s < pp_runner_n_stages(r); s++) {
        pp_stage *st = pp_runner_stage(r, s);
        for (int i = 0; i < pp_stage_n_params(st); i++) {
            pp_tensor *t;
            TU_OK(pp_stage_param_copy(st, i, 0, &t));
            n += (int64_t)t->nbytes;
            pp_tensor_free(t);
        }
    }
    return n;
}

#define STEPS 3

/* Several steps of an optimizer with the stages on the fake device (the
 * CUDA backend's ops): the CPU's bits after every step, and after the
 * first step no parameter crosses: the weights, gradients, optimizer state
 * and stash stay on the device, so steps 2 and 3 copy the same values (the
 * stages' boundary values, and the q, k, v the CPU's Split and attention
 * read) and fewer bytes than the weights. */
static void check_steps_on_device(const pp_optim_config *oc) {
    pp_pipe *pc, *pd;
    pp_runner *cpu = gpt_runner(NULL, oc, &pc), *dev = gpt_runner(CUDA_OPS, oc, &pd);
    pp_tensor *oc_[4] = {0}, *od[4] = {0};
    pp_device_stats per[STEPS];
    take_copies(dev);
    for (int k = 0; k < STEPS; k++) {
        train_step(cpu, oc_);
        train_step(dev, od);
        per[k] = take_copies(dev); /* before the reads below */
        for (int o = 0; o < pp_runner_n_outputs(cpu); o++) assert_same(od[o], oc_[o], pp_runner_output_name(cpu, o));
        assert_same_params(dev, cpu);
        take_copies(dev); /* the reads' own copies */
        print_message("# %s step %d on the fake device: %lld uploads (%lld bytes), %lld downloads (%lld bytes)\n",
                      pp_optim_kind_name(oc->kind), k + 1, (long long)per[k].uploads, (long long)per[k].upload_bytes,
                      (long long)per[k].downloads, (long long)per[k].download_bytes);
    }
    int64_t weights = param_bytes(dev);
    for (int k = 1; k < STEPS; k++) {
        assert_int_equal(per[k].fallbacks, 0);
        assert_int_equal(per[k].uploads, per[1].uploads);
        assert_int_equal(per[k].downloads, per[1].downloads);
        assert_int_equal(per[k].upload_bytes, per[1].upload_bytes);
        assert_int_equal(per[k].download_bytes, per[1].download_bytes);
        /* every step used to bring up each weight it read and take down every
         * gradient (and the stash): now neither adds up to the weights */
        assert_true(per[k].upload_bytes < weights);
        assert_true(per[k].download_bytes < weights);
    }
    print_message("# the stages' parameters: %lld bytes\n", (long long)weights);
    /* the first step brings the weights up once (and the state, zero) */
    assert_true(per[0].upload_bytes >= weights);
    free_pair(cpu, dev, pc, pd, oc_, od);
}

static void test_adamw_steps_keep_params_on_device(void **state) {
    (void)state;
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    check_steps_on_device(&oc);
}

static void test_sgd_momentum_steps_keep_params_on_device(void **state) {
    (void)state;
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_SGD);
    oc.lr = 0.05;
    oc.momentum = 0.9;
    oc.weight_decay = 1e-3;
    check_steps_on_device(&oc);
}

/* Host writes between steps (a checkpoint load, pp_flat_params_set)
 * reach the device: pp_stage_params brings the host's buffers up to date
 * and the device takes them again. Switching a stage back to the CPU
 * brings its values back. */
static void test_host_writes_reach_the_device(void **state) {
    (void)state;
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    pp_pipe *pc, *pd;
    pp_runner *cpu = gpt_runner(NULL, &oc, &pc), *dev = gpt_runner(CUDA_OPS, &oc, &pd);
    pp_tensor *oc_[4] = {0}, *od[4] = {0};
    train_step(cpu, oc_);
    train_step(dev, od);
    for (int s = 0; s < pp_runner_n_stages(cpu); s++) { /* halve every weight, and the moments */
        pp_runner *rs[2] = {cpu, dev};
        for (int k = 0; k < 2; k++) {
            pp_flat_params *fp = pp_stage_params(pp_runner_stage(rs[k], s));
            for (int64_t j = 0; j < fp->total; j++) fp->data[j] *= 0.5f;
            pp_optim *o = pp_runner_optimizer(rs[k], s);
            for (int b = 0; b < pp_optim_state(o, -1, NULL, NULL); b++) {
                float *buf;
                pp_optim_state(o, b, NULL, &buf);
                for (int64_t j = 0; j < fp->total; j++) buf[j] *= 0.5f;
            }
        }
    }
    train_step(cpu, oc_);
    train_step(dev, od);
    for (int o = 0; o < pp_runner_n_outputs(cpu); o++) assert_same(od[o], oc_[o], pp_runner_output_name(cpu, o));
    assert_same_params(dev, cpu);
    TU_OK(pp_stage_use_device(pp_runner_stage(dev, 1), "cpu")); /* its values come back */
    assert_null(pp_stage_device(pp_runner_stage(dev, 1)));
    train_step(cpu, oc_);
    train_step(dev, od);
    assert_same_params(dev, cpu);
    free_pair(cpu, dev, pc, pd, oc_, od);
}

/* Regression: a device whose values cannot be brought back. pp_stage_params
 * logged it and handed out the host's stale buffers, so a checkpoint saved
 * them as if current; pp_stage_params_sync and the checkpoint now fail,
 * naming the stage, and once the device answers again the values are the
 * CPU run's. */
static void test_failed_bring_back_is_an_error(void **state) {
    (void)state;
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    pp_pipe *pc, *pd;
    pp_runner *cpu = gpt_runner(NULL, &oc, &pc), *dev = gpt_runner(CUDA_OPS, &oc, &pd);
    pp_tensor *oc_[4] = {0}, *od[4] = {0};
    train_step(cpu, oc_);
    train_step(dev, od); /* the weights now newer on the device */
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/pippin-device-ckpt-%d", (int)getpid());
    pp_stage *st = pp_runner_stage(dev, 0);
    pp_device_fail_copies_out_after(0);
    pp_flat_params *fp = (pp_flat_params *)1;
    pp_status s = pp_stage_params_sync(st, &fp);
    char err[512];
    snprintf(err, sizeof err, "%s", pp_last_error());
    pp_status ck = pp_checkpoint_save_stage(dir, 1, st, pp_runner_optimizer(dev, 0));
    char ck_err[512];
    snprintf(ck_err, sizeof ck_err, "%s", pp_last_error());
    pp_device_fail_copies_out_after(-1);
    assert_int_not_equal(s, PP_OK);
    assert_null(fp);
    if (!strstr(err, "stage 0") || !strstr(err, "not brought back")) fail_msg("the error should name the stage: %s", err);
    assert_int_not_equal(ck, PP_OK);
    if (!strstr(ck_err, "not brought back")) fail_msg("the checkpoint should fail on the stale values: %s", ck_err);
    TU_OK(pp_stage_params_sync(st, &fp));
    assert_non_null(fp);
    assert_same_params(dev, cpu);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    free_pair(cpu, dev, pc, pd, oc_, od);
}

/* BatchNorm's running statistics: the host updates them after each
 * microbatch (stages/train_state.c), and a device node reading them must
 * see the update, not the copy it made at the first run (the device kept
 * constants' copies by pointer, so microbatch 2 on, the statistics were
 * computed from stale ones). Two steps of 2 microbatches with the
 * BatchNormalization nodes (and the convolutions) on the fake device give
 * the CPU's running statistics and loss bit for bit; then a host write of
 * the statistics (a checkpoint load) reaches the device too. */
static const char *const bn_inputs[2] = {"x", "y"};

static void bn_step(pp_runner *r, pp_tensor **outs) { fixture_step("bn", bn_inputs, r, outs); }

static void assert_same_state(pp_runner *dev, pp_runner *cpu) {
    int states = 0;
    for (int s = 0; s < pp_runner_n_stages(cpu); s++)
        for (int i = 0; i < pp_stage_n_state(pp_runner_stage(cpu, s)); i++, states++)
            assert_same(pp_stage_state_tensor(pp_runner_stage(dev, s), i), pp_stage_state_tensor(pp_runner_stage(cpu, s), i),
                        pp_stage_state_name(pp_runner_stage(cpu, s), i));
    assert_int_equal(states, 6);
}

static void test_batch_norm_state_reaches_the_device(void **state) {
    (void)state;
    pp_pipe *pc, *pd;
    pp_optim_config sgd;
    pp_optim_config_init(&sgd, PP_OPTIM_SGD);
    pp_runner *cpu = fixture_runner("bn", NULL, &sgd, &pc);
    pp_runner *dev = fixture_runner("bn", "fake:BatchNormalization,Conv", &sgd, &pd);
    pp_tensor *oc[2] = {0}, *od[2] = {0};
    for (int step = 0; step < 2; step++) {
        bn_step(cpu, oc);
        bn_step(dev, od);
        assert_same_state(dev, cpu);
        for (int o = 0; o < pp_runner_n_outputs(cpu); o++) assert_same(od[o], oc[o], pp_runner_output_name(cpu, o));
    }
    int64_t kernels = 0;
    for (int s = 0; s < pp_runner_n_stages(dev); s++) {
        pp_device_stats st;
        pp_device_get_stats(pp_stage_device(pp_runner_stage(dev, s)), &st);
        kernels += st.kernels;
    }
    assert_true(kernels > 0); /* the nodes did run on the device */
    for (int s = 0; s < pp_runner_n_stages(cpu); s++) /* a host write: what a checkpoint load does */
        for (int i = 0; i < pp_stage_n_state(pp_runner_stage(cpu, s)); i++) {
            pp_tensor *a = pp_stage_state_tensor(pp_runner_stage(cpu, s), i), *b = pp_stage_state_tensor(pp_runner_stage(dev, s), i);
            for (int64_t j = 0; j < pp_tensor_numel(a); j++) ((float *)a->data)[j] = ((float *)b->data)[j] = 0.25f * (float)j;
        }
    bn_step(cpu, oc);
    bn_step(dev, od);
    assert_same_state(dev, cpu);
    for (int o = 0; o < 2; o++) {
        pp_tensor_free(oc[o]);
        pp_tensor_free(od[o]);
    }
    pp_runner_free(cpu);
    pp_runner_free(dev);
    pp_pipe_free(pc);
    pp_pipe_free(pd);
}

/* ---- a microbatch's send overlaps the next one's compute ---- */

/* A route that keeps what is sent (the local runner's way, with ready
 * hooks) and notes, for each send, how many kernels stage 0's device had
 * run by then, and whether the tensor held NaN (the fake device's staging
 * buffers hold NaN until their download is waited for). */
typedef struct sent_box {
    int n;
    int e[32], mb[32], to[32];
    pp_tensor *t[32];
    int64_t kernels_at_send[32];
    int nan_sends;
    pp_device *dev0;
} sent_box;

static int box_find(const sent_box *b, int e, int mb, int to) {
    for (int i = 0; i < b->n; i++)
        if (b->e[i] == e && b->mb[i] == mb && b->to[i] == to) return i;
    return -1;
}

static int box_ready(void *ctx, int e, int mb, int consumer) { return box_find(ctx, e, mb, consumer) >= 0; }

static pp_status box_send(void *ctx, int e, int mb, int consumer, pp_tensor *t) {
    sent_box *b = ctx;
    assert_true(b->n < 32);
    assert_false(pp_tensor_pending(t)); /* the core waited for the download */
    for (int64_t i = 0; t->dtype == PP_F32 && i < pp_tensor_numel(t); i++)
        if (((float *)t->data)[i] != ((float *)t->data)[i]) {
            b->nan_sends++;
            break;
        }
    pp_device_stats st = {0};
    if (b->dev0) pp_device_get_stats(b->dev0, &st);
    b->e[b->n] = e, b->mb[b->n] = mb, b->to[b->n] = consumer;
    b->kernels_at_send[b->n] = st.kernels;
    b->t[b->n++] = pp_tensor_retain(t);
    return PP_OK;
}

static pp_status box_recv(void *ctx, int e, int mb, int consumer, pp_tensor **out) {
    sent_box *b = ctx;
    int i = box_find(b, e, mb, consumer);
    if (i < 0) return PP_ERR_STATE; /* the ready hook said so: not reached */
    *out = pp_tensor_retain(b->t[i]);
    return PP_OK;
}

/* The GPT's inference forward over 2 microbatches through the execution
 * core, every stage on spec (NULL: the CPU), GPipe order; box gets the
 * sends. Returns the number of sends made once stage 0's forward of
 * microbatch 0 had run, and of its device's kernels then and after
 * microbatch 1 (k0, k1). */
static int core_forward(const char *spec, sent_box *box, pp_tensor **outs, int64_t *k0, int64_t *k1) {
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    pp_core c;
    TU_OK(pp_core_init(&c, p, NULL, -1, 0));
    for (int s = 0; spec && s < c.n_stages; s++) TU_OK(pp_stage_use_device(c.stages[s], spec));
    memset(box, 0, sizeof *box);
    box->dev0 = pp_stage_device(c.stages[0]);
    pp_route r = {box, box_ready, box_send, box_recv, NULL, NULL, NULL, NULL, NULL};
    pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
    TU_OK(pp_core_step_begin(&c, 0, 2, 2, input_names, ins));
    int ran, sent_after_first = -1;
    pp_device_stats st = {0};
    for (int s = 0; s < c.n_stages; s++)
        for (int mb = 0; mb < 2; mb++) {
            pp_action a = pp_act(PP_ACT_F, s, mb);
            TU_OK(pp_core_run_action(&c, &r, 0, &a, &ran));
            assert_int_equal(ran, 1);
            if (s == 0 && box->dev0) pp_device_get_stats(box->dev0, &st);
            if (s == 0 && mb == 0) sent_after_first = box->n, *k0 = st.kernels;
            if (s == 0 && mb == 1) *k1 = st.kernels;
        }
    TU_OK(pp_core_step_end(&c, &r, PP_OK, outs));
    for (int i = 0; i < box->n; i++) pp_tensor_free(box->t[i]);
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    pp_core_free(&c);
    pp_pipe_free(p);
    return sent_after_first;
}

/* On a device, stage 0's send of microbatch 0 waits in flight on the copy
 * stream while microbatch 1's compute is queued, and goes out after it:
 * when it was sent the device had run microbatch 1's kernels too. The
 * bytes sent are the download's (a send before its wait would send the
 * fake device's NaN), and the outputs equal the CPU's bit for bit. On the
 * CPU the send goes out with its own action, as before. */
static void test_send_overlaps_next_compute(void **state) {
    (void)state;
    sent_box cpu_box, dev_box;
    pp_tensor *oc[4] = {0}, *od[4] = {0};
    int64_t k0 = 0, k1 = 0;
    assert_true(core_forward(NULL, &cpu_box, oc, &k0, &k1) > 0); /* the CPU sends at once */
    assert_int_equal(core_forward(CUDA_OPS, &dev_box, od, &k0, &k1), 0); /* held while its download is in flight */
    assert_true(k1 > k0);
    int first = -1;
    for (int i = 0; i < dev_box.n && first < 0; i++)
        if (dev_box.mb[i] == 0) first = i;
    assert_true(first >= 0);
    assert_int_equal(dev_box.kernels_at_send[first], k1); /* microbatch 1's compute came first */
    assert_int_equal(dev_box.nan_sends, 0);
    assert_int_equal(cpu_box.nan_sends, 0);
    assert_int_equal(dev_box.n, cpu_box.n);
    for (int o = 0; o < 4 && oc[o]; o++) {
        assert_same(od[o], oc[o], "output");
        pp_tensor_free(oc[o]);
        pp_tensor_free(od[o]);
    }
}

/* Held sends under schedules that interleave F, I and W across ranks and
 * put two stages on a rank (the local runner's ready hooks: a rank whose
 * next action waits for a held send sends it and looks again): a training
 * step on the fake device equals the CPU's bit for bit. */
static void test_schedules_with_held_sends(void **state) {
    (void)state;
    static const struct { pp_sched_kind kind; int per_rank; } kinds[] = {
        {PP_SCHED_1F1B, 1}, {PP_SCHED_INTERLEAVED_ZB, 2}, {PP_SCHED_ZBV, 2}};
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_SGD);
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        pp_pipe *pc, *pd;
        pp_runner *cpu = gpt_runner(NULL, &oc, &pc), *dev = gpt_runner(CUDA_OPS, &oc, &pd);
        pp_sched_params sp = {0};
        sp.kind = kinds[k].kind;
        sp.stages_per_rank = kinds[k].per_rank;
        sp.nranks = pp_runner_n_stages(cpu) / kinds[k].per_rank;
        sp.nmb = 2;
        pp_schedule *sched;
        TU_OK(pp_schedule_generate(&sp, &sched));
        pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
        pp_tensor *oc_[4] = {0}, *od[4] = {0};
        TU_OK(pp_runner_step(cpu, 2, sched, 2, input_names, ins, oc_));
        TU_OK(pp_runner_step(dev, 2, sched, 2, input_names, ins, od));
        for (int o = 0; o < pp_runner_n_outputs(cpu); o++) assert_same(od[o], oc_[o], pp_runner_output_name(cpu, o));
        assert_same_params(dev, cpu);
        for (int o = 0; o < 4; o++) {
            pp_tensor_free(oc_[o]);
            pp_tensor_free(od[o]);
        }
        pp_tensor_free(ins[0]);
        pp_tensor_free(ins[1]);
        pp_schedule_free(sched);
        pp_runner_free(cpu);
        pp_runner_free(dev);
        pp_pipe_free(pc);
        pp_pipe_free(pd);
    }
}

/* ---- constants the host rewrites reach an inference stage's device ---- */

static int64_t param_value_bytes(pp_runner *r) {
    int64_t n = 0;
    for (int s = 0; s < pp_runner_n_stages(r); s++) {
        const pp_graph *g = pp_stage_graph(pp_runner_stage(r, s));
        for (int v = 0; v < g->n_values; v++)
            if (g->values[v].kind == PP_VALUE_PARAM && g->values[v].data) n += (int64_t)g->values[v].data->nbytes;
    }
    return n;
}

static void infer_step(pp_runner *r, pp_tensor **outs) {
    pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
    for (int o = 0; o < pp_runner_n_outputs(r); o++) pp_tensor_free(outs[o]), outs[o] = NULL;
    TU_OK(pp_runner_step(r, 2, NULL, 2, input_names, ins, outs));
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
}

/* An inference stage's weights are constants: the device keeps its copies
 * across runs (a second step uploads far fewer bytes than the weights),
 * and a host write of them (pp_stage_set_constant: weights replaced on a
 * running service) reaches the device: the next step equals the CPU's
 * with the new weights. Before, the device kept its copy keyed by the
 * tensor, which an in-place write leaves as it was. */
static void test_inference_constants_rewritten(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *pc, *pd;
    TU_OK(pp_pipe_split(g, NULL, &pc));
    pp_graph_free(g);
    g = tu_fixture_onnx("gpt", "model.onnx");
    TU_OK(pp_pipe_split(g, NULL, &pd));
    pp_graph_free(g);
    pp_runner *cpu, *dev;
    TU_OK(pp_runner_new(pc, 0, &cpu));
    TU_OK(pp_runner_new(pd, 0, &dev));
    for (int s = 0; s < pp_runner_n_stages(dev); s++) TU_OK(pp_stage_use_device(pp_runner_stage(dev, s), CUDA_OPS));
    pp_tensor *oc[4] = {0}, *od[4] = {0};
    infer_step(cpu, oc);
    infer_step(dev, od);
    for (int o = 0; o < pp_runner_n_outputs(cpu); o++) assert_same(od[o], oc[o], pp_runner_output_name(cpu, o));
    (void)take_copies(dev);
    infer_step(dev, od);
    pp_device_stats st = take_copies(dev);
    int64_t weights = param_value_bytes(dev);
    assert_true(weights > 0);
    printf("# uploads %lld bytes %lld weights %lld\n", (long long)st.uploads, (long long)st.upload_bytes, (long long)weights);
    assert_true(st.upload_bytes < weights / 4); /* the weights stayed on the device */
    int written = 0;
    for (int s = 0; s < pp_runner_n_stages(cpu); s++) { /* every float weight: w * 0.5 + 0.125 */
        const pp_graph *sg = pp_stage_graph(pp_runner_stage(cpu, s));
        for (int v = 0; v < sg->n_values; v++) {
            const pp_value *val = &sg->values[v];
            if (val->kind != PP_VALUE_PARAM || !val->data || val->data->dtype != PP_F32) continue;
            pp_tensor *w;
            TU_OK(pp_tensor_clone(val->data, &w));
            for (int64_t j = 0; j < pp_tensor_numel(w); j++) ((float *)w->data)[j] = ((float *)w->data)[j] * 0.5f + 0.125f;
            TU_OK(pp_stage_set_constant(pp_runner_stage(cpu, s), val->name, w));
            TU_OK(pp_stage_set_constant(pp_runner_stage(dev, s), val->name, w));
            pp_tensor_free(w);
            written++;
        }
    }
    assert_true(written > 0);
    infer_step(cpu, oc);
    infer_step(dev, od);
    st = take_copies(dev);
    assert_true(st.upload_bytes >= weights / 2); /* made again */
    for (int o = 0; o < pp_runner_n_outputs(cpu); o++) assert_same(od[o], oc[o], pp_runner_output_name(cpu, o));
    pp_tensor *bad = NULL;
    TU_OK(pp_tensor_new(PP_F32, 1, (int64_t[]){3}, &bad));
    assert_int_equal(pp_stage_set_constant(pp_runner_stage(dev, 0), "no such weight", bad), PP_ERR_NOT_FOUND);
    pp_tensor_free(bad);
    free_pair(cpu, dev, pc, pd, oc, od);
}

/* The last stage's device peak over an inference step of m one-row
 * microbatches (the fixture's rows repeated). */
static int64_t last_stage_peak(int m, int64_t *logits_bytes) {
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    pp_runner *r;
    TU_OK(pp_runner_new(p, 0, &r));
    int ns = pp_runner_n_stages(r);
    for (int s = 0; s < ns; s++) TU_OK(pp_stage_use_device(pp_runner_stage(r, s), CUDA_OPS));
    pp_tensor *idx = tu_fixture_npy("gpt", "idx.npy"), *tg = tu_fixture_npy("gpt", "targets.npy");
    pp_tensor *ins[2];
    TU_OK(pp_data_batch(idx, 0, m, &ins[0]));
    TU_OK(pp_data_batch(tg, 0, m, &ins[1]));
    pp_tensor *outs[4] = {0};
    TU_OK(pp_runner_step(r, m, NULL, 2, input_names, ins, outs)); /* warm: the weights go up */
    for (int o = 0; o < pp_runner_n_outputs(r); o++) pp_tensor_free(outs[o]), outs[o] = NULL;
    pp_device *d = pp_stage_device(pp_runner_stage(r, ns - 1));
    pp_device_reset_stats(d);
    TU_OK(pp_runner_step(r, m, NULL, 2, input_names, ins, outs));
    pp_device_stats st;
    pp_device_get_stats(d, &st);
    *logits_bytes = 0;
    for (int o = 0; o < pp_runner_n_outputs(r); o++) {
        if (strcmp(pp_runner_output_name(r, o), "logits") == 0) *logits_bytes = (int64_t)outs[o]->nbytes / m;
        pp_tensor_free(outs[o]);
    }
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    pp_tensor_free(idx);
    pp_tensor_free(tg);
    pp_runner_free(r);
    pp_pipe_free(p);
    return st.peak_bytes_in_use;
}

/* A device stage's model outputs (the logits) are downloaded while the
 * next microbatch computes; their device buffers go once that compute is
 * queued, not at the step's end. What stays per microbatch is the host
 * (pinned) copy each output needs until the outputs are merged, as on the
 * CPU: from 4 to 8 microbatches the peak (the pool counts both kinds)
 * grows by about one logits per microbatch. Regression (review): the
 * device buffer stayed too, two logits per microbatch. */
static void test_model_outputs_do_not_pile_up_on_the_device(void **state) {
    (void)state;
    int64_t l4, l8;
    int64_t four = last_stage_peak(4, &l4), eight = last_stage_peak(8, &l8);
    assert_true(l4 > 0 && l4 == l8);
    double per = (double)(eight - four) / 4;
    printf("# peak m=4 %lld, m=8 %lld: %.0f bytes more per microbatch, logits %lld each\n", (long long)four,
           (long long)eight, per, (long long)l4);
    if (per >= 1.5 * (double)l4)
        fail_msg("the device peak grows by %.0f bytes per microbatch (logits: %lld)", per, (long long)l4);
}

/* Without a GPU (or a CUDA build): an error naming the stage, the stage
 * still usable on the CPU. */
static void test_no_cuda_device_is_an_error(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    pp_stage *st;
    TU_OK(pp_stage_from_pipe(p, 1, 0, &st));
    pp_status s = pp_stage_use_device(st, "cuda:0");
    if (s == PP_OK) { /* a machine with a GPU */
        assert_non_null(pp_stage_device(st));
    } else {
        assert_int_equal(s, PP_ERR_UNSUPPORTED);
        assert_non_null(strstr(pp_last_error(), "stage 1: device 'cuda:0': no CUDA device"));
        assert_null(pp_stage_device(st));
    }
    TU_OK(pp_stage_use_device(st, "cpu"));
    assert_null(pp_stage_device(st));
    pp_stage_free(st);
    pp_pipe_free(p);
}

int main(void) {
    /* The fake device runs OpenBLAS's GEMMs on its copies; the CPU's
     * weights packed once per step (pippin's packed GEMM, another order of
     * sums) would differ in rounding from them: bits are compared with
     * packing off on both sides (test_pack_weights covers it). */
    pp_optimize_set_default(pp_optimize_default() & ~PP_OPT_PACK);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_training_step_on_fake_device),
        cmocka_unit_test(test_adamw_steps_keep_params_on_device),
        cmocka_unit_test(test_sgd_momentum_steps_keep_params_on_device),
        cmocka_unit_test(test_host_writes_reach_the_device),
        cmocka_unit_test(test_failed_bring_back_is_an_error),
        cmocka_unit_test(test_batch_norm_state_reaches_the_device),
        cmocka_unit_test(test_send_overlaps_next_compute),
        cmocka_unit_test(test_schedules_with_held_sends),
        cmocka_unit_test(test_inference_constants_rewritten),
        cmocka_unit_test(test_model_outputs_do_not_pile_up_on_the_device),
        cmocka_unit_test(test_no_cuda_device_is_an_error),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
