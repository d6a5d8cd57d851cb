/* Training weights packed once per step (pp_exec_set_pack_weights, the
 * optimizer's "pack" bit): the same training with packing on and off, and
 * every path that writes parameters seen by the next forward.
 *
 * Packing on and off run different GEMM kernels (pippin's packed one and
 * OpenBLAS's), so they agree within float rounding (tolerances below);
 * packing once per step and packing on every call run the same kernel on
 * the same panels, so they agree bit for bit.
 *
 * The write-path cases change the parameters a lot (so a stale pack would
 * be far off) and compare the next forward with a stage that never packs;
 * each removes nothing else that would drop the packs in between, so each
 * fails when its own invalidation is removed. The suite runs with
 * PIPPIN_PACK_CHECK=1 (test/meson.build), which turns a stale pack into an
 * error as well. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pippin/checkpoint.h"
#include "pippin/microbatch.h"
#include "test_util.h"

#include "gemm.h"
#include "test_filter.h"

#define STEPS 3
#define MBS 2

/* pp_optimize_default with the pack bit as asked, for what is made next. */
static unsigned with_pack(int on) {
    unsigned before = pp_optimize_default();
    pp_optimize_set_default(on ? before | PP_OPT_PACK : before & ~PP_OPT_PACK);
    return before;
}

static pp_trainer *gpt_trainer(int pack, pp_graph **g) {
    unsigned before = with_pack(pack);
    *g = tu_fixture_onnx("gpt", "model_nosplit.onnx");
    pp_trainer *t;
    TU_OK(pp_trainer_new(*g, "loss", &t));
    pp_optimize_set_default(before);
    return t;
}

/* STEPS AdamW steps of MBS microbatches on the fixture's training data;
 * losses[step]. hold: pp_trainer_hold_params over each step's microbatches. */
static void train(pp_trainer *t, int hold, float *losses) {
    pp_tensor *data[2] = {tu_fixture_npy("gpt", "train_idx.npy"), tu_fixture_npy("gpt", "train_targets.npy")};
    pp_optim_config c;
    pp_optim_config_init(&c, PP_OPTIM_ADAMW);
    c.lr = 0.01;
    pp_flat_params *fp = pp_trainer_params(t);
    pp_optim *o;
    TU_OK(pp_optim_new(&c, fp->total, &o));
    for (int step = 0; step < STEPS; step++) {
        pp_tensor *b[2], *mb[2][MBS];
        for (int i = 0; i < 2; i++) {
            TU_OK(pp_data_batch(data[i], step, 4, &b[i]));
            TU_OK(pp_microbatch_split(b[i], MBS, "batch", mb[i]));
        }
        pp_flat_params_zero_grad(fp);
        if (hold) pp_trainer_hold_params(t, 1);
        losses[step] = 0;
        for (int k = 0; k < MBS; k++) {
            float l;
            pp_trainer_set_step(t, step, k);
            TU_OK(pp_trainer_backward(t, (pp_tensor *[]){mb[0][k], mb[1][k]}, 1.0f / MBS, &l));
            losses[step] += l / MBS;
        }
        if (hold) pp_trainer_hold_params(t, 0);
        TU_OK(pp_optim_step(o, fp->data, fp->grad, fp->total));
        for (int i = 0; i < 2; i++) {
            pp_tensor_free(b[i]);
            for (int k = 0; k < MBS; k++) pp_tensor_free(mb[i][k]);
        }
    }
    pp_optim_free(o);
    pp_tensor_free(data[0]);
    pp_tensor_free(data[1]);
}

static void test_trainer_on_off(void **state) {
    (void)state;
    pp_graph *g[3];
    pp_trainer *t[3] = {gpt_trainer(1, &g[0]), gpt_trainer(1, &g[1]), gpt_trainer(0, &g[2])};
    float losses[3][STEPS];
    train(t[0], 1, losses[0]); /* packed once per step */
    train(t[1], 0, losses[1]); /* packed on every backward */
    train(t[2], 1, losses[2]); /* OpenBLAS */
    int64_t packed[3], reused[3];
    for (int k = 0; k < 3; k++) pp_exec_pack_stats(pp_trainer_exec(t[k]), &packed[k], &reused[k]);
    assert_true(packed[0] > 0 && reused[0] > 0);
    /* 2 layouts per packed weight: held, each step packs each once */
    assert_true(packed[1] > packed[0]);
    assert_int_equal(packed[2], 0);
    pp_flat_params *fp[3] = {pp_trainer_params(t[0]), pp_trainer_params(t[1]), pp_trainer_params(t[2])};
    /* once per step vs every call: the same kernel on the same panels */
    assert_memory_equal(losses[0], losses[1], sizeof losses[0]);
    assert_memory_equal(fp[0]->data, fp[1]->data, sizeof(float) * (size_t)fp[0]->total);
    /* with AVX-512, unpacked products pack W^T per call into the same
     * panels and run the same tasks (pp_gemm_packed_any_panels): the same
     * bits */
    if (pp_gemm_packed_wide()) {
        assert_memory_equal(losses[0], losses[2], sizeof losses[0]);
        assert_memory_equal(fp[0]->data, fp[2]->data, sizeof(float) * (size_t)fp[0]->total);
    }
    /* packed vs OpenBLAS: within float rounding after STEPS updates; AdamW
     * scales a near-zero gradient up to about lr, so a rounding difference
     * there moves a parameter by up to a small part of lr (0.01): 1e-4 */
    for (int s = 0; s < STEPS; s++)
        if (fabsf(losses[0][s] - losses[2][s]) > 1e-5f * fabsf(losses[2][s]))
            fail_msg("step %d: loss %.8f packed, %.8f unpacked", s, losses[0][s], losses[2][s]);
    for (int i = 0; i < fp[0]->n; i++) {
        pp_tensor *a, *b;
        TU_OK(pp_flat_params_data_view(fp[0], i, &a));
        TU_OK(pp_flat_params_data_view(fp[2], i, &b));
        tu_assert_close(a, b, 1e-4, 1e-4, fp[0]->names[i]);
        pp_tensor_free(a);
        pp_tensor_free(b);
    }
    for (int k = 0; k < 3; k++) {
        pp_trainer_free(t[k]);
        pp_graph_free(g[k]);
    }
}

/* The fixture's 4 stages through the local runner (its default schedule)
 * over 2 microbatches, STEPS AdamW steps; the stages' executors pack once per
 * step and agree with unpacked stages within float rounding. */
static void pipeline_losses(int pack, float *losses, int64_t *reused) {
    unsigned before = with_pack(pack);
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    pp_tensor *data[2] = {tu_fixture_npy("gpt", "train_idx.npy"), tu_fixture_npy("gpt", "train_targets.npy")};
    const char *names[2] = {"idx", "targets"};
    pp_runner *r;
    TU_OK(pp_runner_new(p, 1, &r));
    pp_optimize_set_default(before);
    pp_optim_config c;
    pp_optim_config_init(&c, PP_OPTIM_ADAMW);
    c.lr = 0.01;
    TU_OK(pp_runner_set_optimizer(r, &c));
    for (int step = 0; step < STEPS; step++) {
        pp_tensor *b[2], *outs[2] = {0};
        for (int i = 0; i < 2; i++) TU_OK(pp_data_batch(data[i], step, 4, &b[i]));
        pp_runner_zero_grad(r);
        pp_runner_set_step(r, step);
        TU_OK(pp_runner_step(r, MBS, NULL, 2, names, b, outs));
        TU_OK(pp_runner_optimizer_step(r));
        losses[step] = (float)pp_tensor_get_f64(outs[pp_runner_loss_output(r)], 0);
        for (int i = 0; i < 2; i++) pp_tensor_free(b[i]);
        for (int k = 0; k < pp_runner_n_outputs(r); k++) pp_tensor_free(outs[k]);
    }
    *reused = 0;
    for (int s = 0; s < pp_runner_n_stages(r); s++) {
        int64_t n;
        pp_exec_pack_stats(pp_stage_exec(pp_runner_stage(r, s)), NULL, &n);
        *reused += n;
    }
    pp_runner_free(r);
    pp_pipe_free(p);
    pp_tensor_free(data[0]);
    pp_tensor_free(data[1]);
}

static void test_pipeline_on_off(void **state) {
    (void)state;
    float on[STEPS], off[STEPS];
    int64_t reused_on, reused_off;
    pipeline_losses(1, on, &reused_on);
    pipeline_losses(0, off, &reused_off);
    assert_true(reused_on > 0);
    assert_int_equal(reused_off, 0);
    for (int s = 0; s < STEPS; s++)
        if (fabsf(on[s] - off[s]) > 1e-5f * fabsf(off[s]))
            fail_msg("step %d: loss %.8f packed, %.8f unpacked", s, on[s], off[s]);
}

/* ---- every write path is seen by the next forward ---- */

typedef struct pair {
    pp_stage *st[2]; /* [0] packs, [1] never does */
    pp_tensor *in[2][2]; /* two microbatches' idx and targets */
} pair;

static void pair_init(pair *p) {
    for (int k = 0; k < 2; k++) {
        unsigned before = with_pack(k == 0);
        pp_graph *g = tu_fixture_onnx("gpt", "model_nosplit.onnx");
        pp_stage_spec spec;
        pp_stage_spec_init(&spec, 0);
        spec.training = 1;
        spec.loss = "loss";
        TU_OK(pp_stage_new(g, &spec, &p->st[k]));
        pp_optimize_set_default(before);
    }
    pp_tensor *idx = tu_fixture_npy("gpt", "train_idx.npy"), *tgt = tu_fixture_npy("gpt", "train_targets.npy");
    for (int m = 0; m < 2; m++) {
        TU_OK(pp_data_batch(idx, m, 2, &p->in[m][0]));
        TU_OK(pp_data_batch(tgt, m, 2, &p->in[m][1]));
    }
    pp_tensor_free(idx);
    pp_tensor_free(tgt);
}

static void pair_free(pair *p) {
    for (int k = 0; k < 2; k++) pp_stage_free(p->st[k]);
    for (int m = 0; m < 2; m++) pp_tensor_free(p->in[m][0]), pp_tensor_free(p->in[m][1]);
}

/* Microbatch mb's forward on stage k; its loss (the stash is dropped). */
static float loss_of(pair *p, int k, int mb, int data) {
    pp_tensor *outs[2] = {0};
    TU_OK(pp_stage_forward(p->st[k], mb, p->in[data], outs));
    float l = (float)pp_tensor_get_f64(outs[0], 0);
    pp_tensor_free(outs[0]);
    pp_tensor_free(outs[1]);
    pp_stage_discard_pending(p->st[k]);
    return l;
}

/* Both stages' next forward on the same data: the packed one matches,
 * and differs from `stale` (the loss before the write) by far more. */
static void expect_seen(pair *p, int mb, float stale, const char *path) {
    float got = loss_of(p, 0, mb, 0), want = loss_of(p, 1, mb, 0);
    if (fabsf(got - want) > 1e-5f * fabsf(want))
        fail_msg("%s: loss %.8f with packing, %.8f without (%.8f before the write)", path, got, want, stale);
    if (!(fabsf(want - stale) > 1e-3f * fabsf(want)))
        fail_msg("%s: the write changed the loss too little to tell (%.8f -> %.8f)", path, stale, want);
}

/* Every parameter scaled by f through the flat buffer. */
static void scale_params(pp_flat_params *fp, float f) {
    for (int64_t i = 0; i < fp->total; i++) fp->data[i] *= f;
}

static void test_optimizer_step_seen(void **state) {
    (void)state;
    pair p;
    pair_init(&p);
    pp_optim_config c;
    pp_optim_config_init(&c, PP_OPTIM_SGD);
    c.lr = 0.5;
    float stale = 0;
    for (int k = 0; k < 2; k++) {
        pp_optim *o;
        TU_OK(pp_optim_new(&c, pp_stage_params(p.st[k])->total, &o));
        pp_tensor *outs[2] = {0};
        TU_OK(pp_stage_forward(p.st[k], 0, p.in[0], outs)); /* packs */
        stale = (float)pp_tensor_get_f64(outs[0], 0);
        TU_OK(pp_stage_backward(p.st[k], 0, NULL, NULL));
        TU_OK(pp_stage_optimizer_step(p.st[k], o)); /* the only invalidation before the next forward */
        pp_optim_free(o);
        pp_tensor_free(outs[0]);
        pp_tensor_free(outs[1]);
    }
    expect_seen(&p, 1, stale, "optimizer step");
    pair_free(&p);
}

static void test_params_write_seen(void **state) {
    (void)state;
    pair p;
    pair_init(&p);
    float stale = loss_of(&p, 0, 0, 0); /* packs */
    loss_of(&p, 1, 0, 0);
    for (int k = 0; k < 2; k++) scale_params(pp_stage_params(p.st[k]), 0.5f);
    expect_seen(&p, 1, stale, "pp_stage_params write");
    pair_free(&p);
}

/* pp_stage_set_constant on a trained weight (weights replaced in place):
 * the next forward reads the new bytes, not a copy packed from the old.
 * Regression (review): the set only dropped the constant cache and the
 * device's copies. */
static void test_set_constant_seen(void **state) {
    (void)state;
    pair p;
    pair_init(&p);
    float stale = loss_of(&p, 0, 0, 0); /* packs */
    loss_of(&p, 1, 0, 0);
    for (int k = 0; k < 2; k++) {
        const pp_graph *g = pp_stage_graph(p.st[k]);
        int written = 0;
        for (int v = 0; v < g->n_values; v++) {
            const pp_value *val = &g->values[v];
            if (val->kind != PP_VALUE_PARAM || !val->data || val->data->ndim != 2) continue;
            pp_tensor *w;
            TU_OK(pp_tensor_clone(val->data, &w)); /* not through pp_stage_params, which would drop the packs */
            for (int64_t i = 0; i < pp_tensor_numel(w); i++) ((float *)w->data)[i] *= 0.5f;
            TU_OK(pp_stage_set_constant(p.st[k], val->name, w));
            pp_tensor_free(w);
            written++;
        }
        assert_true(written > 0);
    }
    expect_seen(&p, 1, stale, "pp_stage_set_constant");
    pair_free(&p);
}

/* A writer that kept the buffers from before (the replicas' parameter
 * gather, a rejoin's broadcast): the next step's start drops the packs. */
static void test_write_between_steps_seen(void **state) {
    (void)state;
    pair p;
    pair_init(&p);
    pp_flat_params *fp[2] = {pp_stage_params(p.st[0]), pp_stage_params(p.st[1])};
    float stale = loss_of(&p, 0, 0, 0);
    loss_of(&p, 1, 0, 0);
    for (int k = 0; k < 2; k++) {
        scale_params(fp[k], 0.5f);
        TU_OK(pp_stage_begin_step(p.st[k], 1));
    }
    expect_seen(&p, 1, stale, "write before pp_stage_begin_step");
    pair_free(&p);
}

static void test_checkpoint_load_seen(void **state) {
    (void)state;
    pair p;
    pair_init(&p);
    char dir[] = "/tmp/pippin-pack-ckpt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    float before = loss_of(&p, 0, 0, 0);
    TU_OK(pp_checkpoint_save_stage(dir, 0, p.st[0], NULL));
    scale_params(pp_stage_params(p.st[0]), 0.5f);
    TU_OK(pp_stage_begin_step(p.st[0], 1));
    float changed = loss_of(&p, 0, 1, 0); /* packs the changed weights, which the load must drop */
    assert_true(fabsf(changed - before) > 1e-3f * fabsf(before));
    TU_OK(pp_checkpoint_load_stage(dir, 0, p.st[0], NULL));
    float after = loss_of(&p, 0, 2, 0);
    /* the same weights, data and kernels as the first forward: the same bits */
    assert_memory_equal(&after, &before, sizeof after);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    pair_free(&p);
}

/* The trainer: a write through the buffers it handed out earlier is seen
 * by the next backward unless the caller holds the parameters. */
static void test_trainer_write_seen(void **state) {
    (void)state;
    pp_graph *g[2];
    pp_trainer *t[2] = {gpt_trainer(1, &g[0]), gpt_trainer(0, &g[1])};
    pp_tensor *in[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
    float l[2][4];
    for (int k = 0; k < 2; k++) {
        pp_flat_params *fp = pp_trainer_params(t[k]);
        TU_OK(pp_trainer_backward(t[k], in, 1.0f, &l[k][0])); /* packs */
        scale_params(fp, 0.5f);                              /* no call in between */
        TU_OK(pp_trainer_backward(t[k], in, 1.0f, &l[k][1]));
        scale_params(fp, -1.0f);
        pp_trainer_hold_params(t[k], 1);
        TU_OK(pp_trainer_backward(t[k], in, 1.0f, &l[k][2])); /* packs, kept */
        TU_OK(pp_trainer_backward(t[k], in, 1.0f, &l[k][3])); /* reuses */
        pp_trainer_hold_params(t[k], 0);
        scale_params(fp, -2.0f); /* back where it started, exactly */
    }
    for (int s = 1; s < 4; s++) {
        if (fabsf(l[0][s] - l[1][s]) > 1e-5f * fabsf(l[1][s]))
            fail_msg("backward %d: loss %.8f with packing, %.8f without", s, l[0][s], l[1][s]);
        if (s < 3 && !(fabsf(l[1][s] - l[1][s - 1]) > 1e-3f * fabsf(l[1][s])))
            fail_msg("backward %d: the write changed the loss too little to tell", s);
    }
    float again;
    TU_OK(pp_trainer_backward(t[0], in, 1.0f, &again)); /* after hold(0): the write is seen */
    assert_memory_equal(&again, &l[0][0], sizeof again);
    for (int k = 0; k < 2; k++) pp_trainer_free(t[k]), pp_graph_free(g[k]);
    pp_tensor_free(in[0]);
    pp_tensor_free(in[1]);
}

/* pp_exec on its own: pp_exec_params_changed is the contract, and
 * PIPPIN_PACK_CHECK=1 names the parameter when a write skipped it. */
static pp_graph *linear_graph(int *w) {
    pp_graph *g;
    TU_OK(pp_graph_new("lin", &g));
    int x, b, n;
    uint64_t seed = 7;
    float vw[48 * 32], vb[48];
    for (int i = 0; i < 48 * 32; i++) vw[i] = (float)tu_urand(&seed);
    for (int i = 0; i < 48; i++) vb[i] = (float)tu_urand(&seed);
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, (int64_t[]){-1, 32}, &x));
    TU_OK(pp_graph_add_initializer(g, "W", PP_VALUE_PARAM, tu_f32(2, (int64_t[]){48, 32}, vw), w));
    TU_OK(pp_graph_add_initializer(g, "b", PP_VALUE_PARAM, tu_f32(1, (int64_t[]){48}, vb), &b));
    TU_OK(pp_graph_add_node(g, "MatMulAdd", "pippin", "fc", 3, (int[]){x, *w, b}, 1, (const char *[]){"y"}, &n));
    TU_OK(pp_node_set_int(g, n, "transB", 1));
    TU_OK(pp_graph_add_output(g, g->nodes[n].out[0]));
    return g;
}

static void test_exec_contract(void **state) {
    (void)state;
    int w;
    pp_graph *g = linear_graph(&w);
    uint64_t seed = 3;
    float vx[24 * 32];
    for (int i = 0; i < 24 * 32; i++) vx[i] = (float)tu_urand(&seed);
    pp_tensor *x = tu_f32(2, (int64_t[]){24, 32}, vx), *y[3] = {0}, *ref = NULL;
    pp_exec *ex, *plain;
    const char *check_was = getenv("PIPPIN_PACK_CHECK"); /* the suite's, put back after */
    char was[16] = "";
    if (check_was) snprintf(was, sizeof was, "%s", check_was);
    setenv("PIPPIN_PACK_CHECK", "1", 1);
    TU_OK(pp_exec_new(g, &ex));
    TU_OK(pp_exec_new(g, &plain));
    TU_OK(pp_exec_set_pack_weights(ex, 1));
    assert_true(pp_exec_pack_weights(ex) && !pp_exec_pack_weights(plain));
    TU_OK(pp_exec_run(ex, &x, &y[0]));
    TU_OK(pp_exec_run(ex, &x, &y[1])); /* reused: the same bits */
    tu_assert_close(y[1], y[0], 0, 0, "reused panels");
    float *wd = g->values[w].data->data;
    for (int i = 0; i < 48 * 32; i++) wd[i] *= -1.0f;
    pp_exec_params_changed(ex);
    TU_OK(pp_exec_run(ex, &x, &y[2]));
    TU_OK(pp_exec_run(plain, &x, &ref));
    tu_assert_close(y[2], ref, 1e-5, 1e-5, "after pp_exec_params_changed");
    int64_t packed, reused;
    pp_exec_pack_stats(ex, &packed, &reused);
    assert_int_equal(packed, 2);
    assert_int_equal(reused, 1);
    wd[0] += 1.0f; /* no pp_exec_params_changed: the check catches it */
    pp_tensor *stale = NULL;
    assert_int_equal(pp_exec_run(ex, &x, &stale), PP_ERR_STATE);
    assert_non_null(strstr(pp_last_error(), "'W'"));
    assert_null(stale);
    wd[0] -= 1.0f;
    /* Row counts pick the copy (pp_pack_choice): with the AVX2 kernel, 300
     * rows read W^T through OpenBLAS (a second copy), 600 rows W as stored
     * (none); with AVX-512 the panels serve every row count. */
    int wide = pp_gemm_packed_wide(), isa_was = pp_gemm_packed_limit_isa(1);
    pp_exec_params_changed(ex);
    for (int rows = 300; rows <= 600; rows += 300) {
        float *vb = malloc(sizeof(float) * (size_t)rows * 32);
        for (int i = 0; i < rows * 32; i++) vb[i] = (float)tu_urand(&seed);
        pp_tensor *xb = tu_f32(2, (int64_t[]){rows, 32}, vb), *yb[2] = {0}, *rb = NULL;
        TU_OK(pp_exec_run(ex, &xb, &yb[0]));
        TU_OK(pp_exec_run(ex, &xb, &yb[1]));
        TU_OK(pp_exec_run(plain, &xb, &rb));
        tu_assert_close(yb[0], rb, 1e-5, 1e-5, rows == 300 ? "through W^T" : "unpacked");
        tu_assert_close(yb[1], yb[0], 0, 0, "reused copy");
        pp_exec_pack_stats(ex, &packed, &reused);
        assert_int_equal(packed, 3);
        assert_int_equal(reused, 2); /* 600 rows: neither packed nor reused */
        free(vb);
        pp_tensor_free(xb);
        pp_tensor_free(yb[0]);
        pp_tensor_free(yb[1]);
        pp_tensor_free(rb);
    }
    pp_gemm_packed_limit_isa(isa_was);
    if (wide) { /* the panels of 24 rows, read again at 312 and 600 */
        pp_exec_params_changed(ex);
        pp_exec_pack_stats(ex, &packed, &reused);
        int64_t packed_was = packed, reused_was = reused;
        for (int rows = 24; rows <= 600; rows += 288) {
            float *vb = malloc(sizeof(float) * (size_t)rows * 32);
            for (int i = 0; i < rows * 32; i++) vb[i] = (float)tu_urand(&seed);
            pp_tensor *xb = tu_f32(2, (int64_t[]){rows, 32}, vb), *yb = NULL, *rb = NULL;
            TU_OK(pp_exec_run(ex, &xb, &yb));
            TU_OK(pp_exec_run(plain, &xb, &rb));
            tu_assert_close(yb, rb, 1e-5, 1e-5, "panels at any row count");
            free(vb);
            pp_tensor_free(xb);
            pp_tensor_free(yb);
            pp_tensor_free(rb);
        }
        pp_exec_pack_stats(ex, &packed, &reused);
        assert_int_equal(packed, packed_was + 1); /* packed at 24 rows, after the change */
        assert_int_equal(reused, reused_was + 2); /* and read at 312 and 600 */
    }
    if (check_was) setenv("PIPPIN_PACK_CHECK", was, 1);
    else unsetenv("PIPPIN_PACK_CHECK");
    for (int k = 0; k < 3; k++) pp_tensor_free(y[k]);
    pp_tensor_free(ref);
    pp_tensor_free(x);
    pp_exec_free(ex);
    pp_exec_free(plain);
    pp_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trainer_on_off),
        cmocka_unit_test(test_pipeline_on_off),
        cmocka_unit_test(test_optimizer_step_seen),
        cmocka_unit_test(test_params_write_seen),
        cmocka_unit_test(test_set_constant_seen),
        cmocka_unit_test(test_write_between_steps_seen),
        cmocka_unit_test(test_checkpoint_load_seen),
        cmocka_unit_test(test_trainer_write_seen),
        cmocka_unit_test(test_exec_contract),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
