/* Data-parallel replicas of a pipeline (replicas: in the config,
 * pp_executor_set_replicas): every rank of R copies of the MLP fixture's
 * 3-stage pipeline as a worker on a thread of its own (inproc endpoints).
 * R = 2 replicas of one microbatch each give the bits of one pipeline of
 * twice the batch in 2 microbatches (losses and trained parameters), with
 * any bucket size; other shapes agree within float rounding of the sums'
 * order; checkpoints written by replica 0 resume every replica; and configs
 * that cannot split are refused naming the key. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grad_ring.h"
#include "pippin/config.h"
#include "pippin/npy.h"
#include "pippin/safetensors.h"
#include "pippin/worker.h"
#include "test_filter.h"
#include "test_util.h"

#define STAGES 3
#define MAX_RANKS 9
#define STEPS 3

static char fx[4096], tmp[256], gpt_dir[4096], text_file[4096];
static int run_no;
/* 1: the runs train the example GPT (4 stages on 2 ranks, zbv; its token
 * embedding is tied to the output layer: a parameter replicated across
 * stages 0 and 3) instead of the MLP's 3 stages on 3 ranks. */
static int gpt;

typedef struct {
    pp_worker_options o;
    pp_worker *w;
    float loss[STEPS];
    int n_loss;
    pp_status status;
    char err[1024];
} rank_run;

typedef struct {
    float loss[STEPS];        /* the last replica's last rank's */
    int n_loss;
    int64_t optim_bytes[MAX_RANKS]; /* each rank's optimizer state */
    char out[300];            /* output_dir: the trained parameters */
} result;

static void on_step(const pp_worker_progress *p, void *user) {
    rank_run *r = user;
    if (p->has_loss && p->step < STEPS) r->loss[p->step] = p->loss, r->n_loss++;
}

static void *rank_main(void *arg) {
    rank_run *r = arg;
    r->status = pp_worker_run(r->w);
    if (r->status != PP_OK) snprintf(r->err, sizeof r->err, "%s", pp_last_error());
    return NULL;
}

/* Writes a config (extra: more keys) for `replicas` x 3 ranks and runs
 * every rank; res gets the losses and where the parameters went. */
static void run_opt(int replicas, int microbatches, int batch, const char *extra, int resume, result *res) {
    int per = gpt ? 2 : STAGES, nr = replicas * per, id = run_no++;
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/run%d.yaml", tmp, id);
    snprintf(res->out, sizeof res->out, "%s/out%d", tmp, id);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    if (gpt)
        fprintf(f, "model: %s/model.onnx\nschedule: zbv\ntext: {file: %s, vocab: %s/vocab.json, seq: 16}\n", gpt_dir,
                text_file, gpt_dir);
    else
        fprintf(f, "model: %s/model.onnx\nschedule: 1f1b\ndata: {x: %s/train_x.npy, y: %s/train_y.npy}\n", fx, fx, fx);
    fprintf(f,
            "microbatches: %d\nbatch_size: %d\nsteps: %d\n"
            "optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}\noutput_dir: %s\ntimeout_ms: 20000\n"
            "replicas: %d\n%s\nranks: [",
            microbatches, batch, STEPS, res->out, replicas, extra ? extra : "");
    for (int r = 0; r < nr; r++) fprintf(f, "%sinproc://rep%d-%d-%d", r ? ", " : "", (int)getpid(), id, r);
    fprintf(f, "]\n");
    fclose(f);
    rank_run runs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < nr; r++) {
        memset(&runs[r], 0, sizeof runs[r]);
        pp_worker_options_init(&runs[r].o);
        runs[r].o.rank = r;
        runs[r].o.resume = resume ? PP_WORKER_RESUME : 0;
        runs[r].o.progress = on_step;
        runs[r].o.progress_user = &runs[r];
        if (pp_worker_open(cfg, &runs[r].o, &runs[r].w) != PP_OK) fail_msg("rank %d: %s", r, pp_last_error());
    }
    for (int r = 0; r < nr; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_main, &runs[r]), 0);
    for (int r = 0; r < nr; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < nr; r++) {
        if (runs[r].status != PP_OK) fail_msg("rank %d: %s", r, runs[r].err);
        res->optim_bytes[r] = pp_worker_optimizer_state_bytes(runs[r].w);
        pp_worker_close(runs[r].w);
    }
    /* one rank of every replica reports the loss, the same one */
    const rank_run *first = NULL;
    for (int k = 0; k < replicas; k++) {
        const rank_run *last = NULL;
        for (int r = k * per; r < (k + 1) * per; r++)
            if (runs[r].n_loss) last = &runs[r];
        assert_non_null(last);
        if (!first) first = last;
        assert_int_equal(last->n_loss, resume ? STEPS - 1 : STEPS);
        for (int s = resume ? 1 : 0; s < STEPS; s++)
            if (memcmp(&last->loss[s], &first->loss[s], sizeof(float)))
                fail_msg("replica %d's loss of step %d is %.9g, replica 0's %.9g", k, s, last->loss[s],
                         first->loss[s]);
    }
    memcpy(res->loss, first->loss, sizeof res->loss);
    res->n_loss = first->n_loss;
    unlink(cfg);
}

static void run(int replicas, int microbatches, int batch, const char *extra, result *res) {
    run_opt(replicas, microbatches, batch, extra, 0, res);
}

static long read_all(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    if (fread(*out, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

/* The largest difference between the parameters of two runs (0: the same
 * bits in every file); fails when a file is missing. */
static double param_diff(const result *a, const result *b) {
    DIR *d = opendir(a->out);
    assert_non_null(d);
    struct dirent *e;
    double worst = 0;
    int files = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".npy")) continue;
        char pa[700], pb[700];
        snprintf(pa, sizeof pa, "%s/%s", a->out, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b->out, e->d_name);
        char *x, *y;
        long nx = read_all(pa, &x), ny = read_all(pb, &y);
        if (ny < 0) fail_msg("%s has no %s", b->out, e->d_name);
        assert_int_equal(nx, ny);
        files++;
        if (memcmp(x, y, (size_t)nx) != 0) {
            pp_tensor *ta, *tb;
            TU_OK(pp_npy_load(pa, &ta));
            TU_OK(pp_npy_load(pb, &tb));
            for (int64_t i = 0; i < pp_tensor_numel(ta); i++) {
                double df = fabs(pp_tensor_get_f64(ta, i) - pp_tensor_get_f64(tb, i));
                if (df > worst) worst = df;
            }
            if (worst == 0) worst = 1e-300; /* the headers differ */
            pp_tensor_free(ta);
            pp_tensor_free(tb);
        }
        free(x);
        free(y);
    }
    closedir(d);
    assert_true(files >= 6); /* the MLP's fc1..fc3, weight and bias; the GPT's more */
    return worst;
}

/* R = 2 replicas of one microbatch of 2 rows: the bits of one pipeline with
 * 2 microbatches of the same rows (the sum of two numbers does not depend
 * on their order), with the default buckets and with buckets so small that
 * every parameter is its own and the sums overlap the other stages' work. */
static void test_two_replicas_bit_identical(void **state) {
    (void)state;
    result one, two, small;
    run(1, 2, 4, NULL, &one);
    run(2, 1, 4, NULL, &two);
    run(2, 1, 4, "gradient_buckets: {first_bytes: 16, bytes: 64}", &small);
    for (int s = 0; s < STEPS; s++) {
        if (memcmp(&one.loss[s], &two.loss[s], sizeof(float)))
            fail_msg("step %d: loss %.9g with 2 replicas, %.9g with one pipeline", s, two.loss[s], one.loss[s]);
        assert_memory_equal(&one.loss[s], &small.loss[s], sizeof(float));
    }
    assert_true(param_diff(&one, &two) == 0);
    assert_true(param_diff(&one, &small) == 0);
    /* and they trained: torch's AdamW trajectory on this batch */
    static const double torch_adamw[STEPS] = {2.263859510421753, 2.3356568813323975, 2.143181800842285};
    for (int s = 0; s < STEPS; s++) assert_true(fabs(two.loss[s] - torch_adamw[s]) < 1e-4);
}

/* 2 replicas x 2 microbatches and 3 replicas x 1 against one pipeline of
 * the whole batch: the same up to the order of the gradient sums. */
static void test_replicas_close_to_one_pipeline(void **state) {
    (void)state;
    result one4, two2, one3, three1;
    run(1, 4, 8, NULL, &one4);
    run(2, 2, 8, NULL, &two2);
    run(1, 3, 6, NULL, &one3);
    run(3, 1, 6, "gradient_buckets: {first_bytes: 100, bytes: 300}", &three1);
    for (int s = 0; s < STEPS; s++) {
        assert_true(fabs(one4.loss[s] - two2.loss[s]) <= 1e-6 * fabs(one4.loss[s]) + 1e-7);
        assert_true(fabs(one3.loss[s] - three1.loss[s]) <= 1e-6 * fabs(one3.loss[s]) + 1e-7);
    }
    double d22 = param_diff(&one4, &two2), d31 = param_diff(&one3, &three1);
    print_message("# parameters after %d AdamW steps: 2x2 vs 1x4 differ by %.3g, 3x1 vs 1x3 by %.3g\n", STEPS, d22,
                  d31);
    assert_true(d22 < 1e-5);
    assert_true(d31 < 1e-5);
}

/* Checkpoints every step (replica 0 writes them; keep 5), the newer
 * commits dropped, then a resume from step 0: steps 1 and 2 as in the
 * uninterrupted run. */
static void resume_case(int r_save, const char *save_extra, int r_resume, const char *resume_extra) {
    char extra[800], cmd[700];
    result full, part, rest;
    run(1, 2, 4, NULL, &full);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/ckpt'", tmp);
    assert_int_equal(system(cmd), 0);
    snprintf(extra, sizeof extra, "checkpoint: {dir: %s/ckpt, every: 1, keep: 5}\n%s", tmp, save_extra);
    run(r_save, 2 / r_save, 4, extra, &part);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/ckpt/step_1' '%s/ckpt/step_2'", tmp, tmp);
    assert_int_equal(system(cmd), 0);
    snprintf(extra, sizeof extra, "checkpoint: {dir: %s/ckpt, every: 1, keep: 5}\n%s", tmp, resume_extra);
    run_opt(r_resume, 2 / r_resume, 4, extra, 1, &rest);
    for (int s = 1; s < STEPS; s++) assert_memory_equal(&rest.loss[s], &full.loss[s], sizeof(float));
    assert_true(param_diff(&full, &rest) == 0);
}

static void test_replicas_resume(void **state) {
    (void)state;
    resume_case(2, "", 2, "");
}

/* ZeRO-1: each replica updates its shard of the optimizer state, then the
 * parameters are all-gathered: the unsharded run's bits, with any buckets
 * and 3 replicas too. */
static void test_sharded_optimizer_bit_identical(void **state) {
    (void)state;
    result plain, sharded, small, plain3, sharded3;
    run(2, 1, 4, NULL, &plain);
    run(2, 1, 4, "shard_optimizer: true", &sharded);
    run(2, 1, 4, "shard_optimizer: true\ngradient_buckets: {first_bytes: 16, bytes: 64}", &small);
    run(3, 1, 6, "gradient_buckets: {first_bytes: 100, bytes: 300}", &plain3);
    run(3, 1, 6, "shard_optimizer: true\ngradient_buckets: {first_bytes: 100, bytes: 300}", &sharded3);
    for (int s = 0; s < STEPS; s++) {
        assert_memory_equal(&plain.loss[s], &sharded.loss[s], sizeof(float));
        assert_memory_equal(&plain.loss[s], &small.loss[s], sizeof(float));
        assert_memory_equal(&plain3.loss[s], &sharded3.loss[s], sizeof(float));
    }
    assert_true(param_diff(&plain, &sharded) == 0);
    assert_true(param_diff(&plain, &small) == 0);
    assert_true(param_diff(&plain3, &sharded3) == 0);
    /* AdamW's two moments per element: each rank holds its shard's, about 1/R */
    for (int r = 0; r < 2 * STAGES; r++) {
        int64_t whole = plain.optim_bytes[r], part = sharded.optim_bytes[r];
        assert_true(whole > 0);
        if (part > whole / 2 + 64 || part < whole / 2 - 64)
            fail_msg("rank %d holds %lld bytes of optimizer state sharded, %lld unsharded", r, (long long)part,
                     (long long)whole);
    }
    for (int r = 0; r < 3 * STAGES; r++)
        if (sharded3.optim_bytes[r] > plain3.optim_bytes[r] / 3 + 64 * 3)
            fail_msg("rank %d of 3 replicas holds %lld bytes of optimizer state sharded, %lld unsharded", r,
                     (long long)sharded3.optim_bytes[r], (long long)plain3.optim_bytes[r]);
    print_message("# optimizer state per rank, 2 replicas: %lld bytes unsharded, %lld sharded (stage 0)\n",
                  (long long)plain.optim_bytes[0], (long long)sharded.optim_bytes[0]);
}

/* Replicas whose stages run on the fake device (which keeps weights,
 * gradients and optimizer state in its memory and runs the CPU kernels):
 * the unsharded gradient sum brings only the gradients to the host
 * (pp_stage_grads), the sharded one everything (pp_stage_params); both give
 * the CPU run's bits. */
static void test_replicas_on_a_device(void **state) {
    (void)state;
    static const char *const dev =
        "device: \"fake:MatMul,Gemm,Add,Relu,ReluGrad,MatMulAdd,MatMulGradA,MatMulGradB,SumToShape,Softmax\"";
    char sharded_dev[400];
    snprintf(sharded_dev, sizeof sharded_dev, "%s\nshard_optimizer: true", dev);
    result cpu, on_dev, sharded;
    run(2, 1, 4, NULL, &cpu);
    run(2, 1, 4, dev, &on_dev);
    run(2, 1, 4, sharded_dev, &sharded);
    for (int s = 0; s < STEPS; s++) {
        assert_memory_equal(&cpu.loss[s], &on_dev.loss[s], sizeof(float));
        assert_memory_equal(&cpu.loss[s], &sharded.loss[s], sizeof(float));
    }
    assert_true(param_diff(&cpu, &on_dev) == 0);
    assert_true(param_diff(&cpu, &sharded) == 0);
}

/* Sharded checkpoints are whole (put together on replica 0): they resume
 * sharded, unsharded, and with another number of replicas. */
static void test_sharded_checkpoints_resume_any_replicas(void **state) {
    (void)state;
    resume_case(2, "shard_optimizer: true", 2, "shard_optimizer: true");
    resume_case(2, "shard_optimizer: true", 1, "");
    resume_case(1, "", 2, "shard_optimizer: true");
}

/* A parameter replicated across stages (the GPT's tied token embedding,
 * on stages 0 and 3) with sharded optimizer state: the copies' sum across
 * stages comes after the replicas' sum, as unsharded, so 3 replicas give
 * the unsharded bits (the copies stay equal; the trained parameters hold
 * one of them). */
static void test_sharded_tied_parameters(void **state) {
    (void)state;
    gpt = 1;
    result plain, sharded, one;
    run(3, 1, 6, "gradient_buckets: {first_bytes: 4096, bytes: 16384}", &plain);
    run(3, 1, 6, "shard_optimizer: true\ngradient_buckets: {first_bytes: 4096, bytes: 16384}", &sharded);
    run(1, 3, 6, NULL, &one);
    gpt = 0;
    for (int s = 0; s < STEPS; s++) {
        assert_memory_equal(&plain.loss[s], &sharded.loss[s], sizeof(float));
        assert_true(fabs(plain.loss[s] - one.loss[s]) < 1e-5 * fabs(one.loss[s]));
    }
    assert_true(param_diff(&plain, &sharded) == 0);
    /* the copies of the tied embedding in stage 0's and stage 3's checkpoint files agree */
    char extra[600], p0[700], p3[700];
    result ck;
    gpt = 1;
    snprintf(extra, sizeof extra, "shard_optimizer: true\ngradient_buckets: {first_bytes: 4096, bytes: 16384}\n"
             "checkpoint: {dir: %s/ck-tied, every: 1, keep: 1}", tmp);
    run(3, 1, 6, extra, &ck);
    gpt = 0;
    snprintf(p0, sizeof p0, "%s/ck-tied/step_%d/stage_0.safetensors", tmp, STEPS - 1);
    snprintf(p3, sizeof p3, "%s/ck-tied/step_%d/stage_3.safetensors", tmp, STEPS - 1);
    pp_safetensors *s0, *s3;
    TU_OK(pp_safetensors_load(p0, &s0));
    TU_OK(pp_safetensors_load(p3, &s3));
    const pp_tensor *e0 = pp_safetensors_find(s0, "tok_emb.weight"), *e3 = pp_safetensors_find(s3, "tok_emb.weight");
    assert_non_null(e0);
    assert_non_null(e3);
    assert_int_equal(e0->nbytes, e3->nbytes);
    assert_memory_equal(e0->data, e3->data, e0->nbytes);
    pp_safetensors_free(s0);
    pp_safetensors_free(s3);
    double d = param_diff(&plain, &one);
    print_message("# GPT, 3 replicas x 1 microbatch vs 1 x 3: parameters differ by %.3g after %d AdamW steps\n", d, STEPS);
    assert_true(d < 1e-4);
}

/* The shards of the replicas cover every element of a stage's flat buffer
 * once, each about 1/R of it. */
static void test_shards_partition_the_buffer(void **state) {
    (void)state;
    enum { NP = 5 };
    int64_t offset[NP] = {0, 16, 1040, 1056, 5152}, numel[NP] = {10, 1000, 16, 4096, 3};
    char *names[NP] = {0};
    pp_flat_params fp = {NP, NULL, names, offset, numel, NULL, NULL, 5168, NULL, NULL, NULL};
    for (int r = 2; r <= 4; r++)
        for (int64_t first = 16; first <= 8192; first *= 8) {
            pp_grad_ring_options o = {NULL, r, 0, 1, first, 4 * first, 1};
            uint8_t *seen = calloc((size_t)fp.total, 1);
            int64_t total = 0;
            for (int k = 0; k < r; k++) {
                pp_ring_ranges rr;
                TU_OK(pp_grad_ring_shard(&o, k, &fp, &rr));
                for (int i = 0; i < rr.n; i++)
                    for (int64_t j = rr.lo[i]; j < rr.lo[i] + rr.len[i]; j++) seen[j]++;
                total += rr.count;
                if (first == 16 && rr.count > fp.total / r + 4 * 4)
                    fail_msg("replica %d of %d holds %lld of %lld elements", k, r, (long long)rr.count,
                             (long long)fp.total);
                pp_ring_ranges_free(&rr);
            }
            assert_int_equal(total, fp.total);
            for (int64_t j = 0; j < fp.total; j++) assert_int_equal(seen[j], 1);
            free(seen);
        }
}

/* wire_dtype: bfloat16: the activations and gradients between ranks are
 * rounded to bfloat16, so the losses move a little (not bit-identical: the
 * narrowing ran) but stay close; with replicas too. */
static void test_wire_bf16(void **state) {
    (void)state;
    result f32, bf16, bf16_rep;
    run(1, 2, 4, NULL, &f32);
    run(1, 2, 4, "wire_dtype: bfloat16", &bf16);
    run(2, 1, 4, "wire_dtype: bfloat16", &bf16_rep);
    int differ = 0;
    for (int s = 0; s < STEPS; s++) {
        differ |= memcmp(&f32.loss[s], &bf16.loss[s], sizeof(float)) != 0;
        if (fabs(f32.loss[s] - bf16.loss[s]) > 1e-2 * fabs(f32.loss[s]))
            fail_msg("step %d: loss %.7f with bfloat16 on the wire, %.7f without", s, bf16.loss[s], f32.loss[s]);
        assert_memory_equal(&bf16.loss[s], &bf16_rep.loss[s], sizeof(float));
    }
    assert_true(differ);
    assert_true(param_diff(&bf16, &bf16_rep) == 0);
}

/* Configs that cannot split are refused at load, naming the key. */
static void expect_config_error(const char *body, const char *needle) {
    char text[2048];
    snprintf(text, sizeof text,
             "model: m.onnx\ndata: {x: x.npy}\nranks: [inproc://a, inproc://b, inproc://c, inproc://d]\n%s\n", body);
    pp_config *c = NULL;
    pp_status s = pp_config_parse(text, strlen(text), "r.yaml", ".", &c);
    pp_config_free(c);
    if (s == PP_OK) fail_msg("accepted: %s", body);
    if (!strstr(pp_last_error(), needle)) fail_msg("'%s': error '%s' lacks '%s'", body, pp_last_error(), needle);
}

static void test_replica_config_errors(void **state) {
    (void)state;
    expect_config_error("batch_size: 6\nreplicas: 3", "r.yaml:5: key 'replicas': 3 replicas, but 'ranks' lists 4 endpoints");
    expect_config_error("batch_size: 6\nreplicas: 4", "batch_size 6 does not split into 4 equal shares");
    expect_config_error("batch_size: 6\nmicrobatches: 4\nreplicas: 2", "each replica's 3 rows cannot make 4 microbatches");
    expect_config_error("batch_size: 6\nreplicas: 0", "replicas");
    expect_config_error("batch_size: 6\nmode: infer\nreplicas: 2", "for mode: train");
    expect_config_error("batch_size: 6\nreplicas: 2\ngradient_buckets: {first_bytes: 0}", "gradient_buckets.first_bytes");
    expect_config_error("batch_size: 6\nreplicas: 2\ngradient_buckets: {size: 10}", "size");
    expect_config_error("batch_size: 6\nreplicas: 2\ngradient_buckets: {direct_links: maybe}",
                        "gradient_buckets.direct_links");
    expect_config_error("batch_size: 6\nwire_dtype: float16", "key 'wire_dtype': expected float32 or bfloat16, got 'float16'");
    expect_config_error("batch_size: 6\nshard_optimizer: true", "key 'shard_optimizer': shards the optimizer over the "
                        "replicas; needs 'replicas' of 2 or more");
    pp_config *c = NULL;
    const char *ok = "model: m.onnx\nbatch_size: 6\nmicrobatches: 3\ndata: {x: x.npy}\n"
                     "ranks: [inproc://a, inproc://b]\nreplicas: 2\ngradient_buckets: {first_bytes: 64, bytes: 128}\n";
    TU_OK(pp_config_parse(ok, strlen(ok), "ok.yaml", ".", &c));
    assert_int_equal(c->replicas, 2);
    assert_int_equal(c->bucket_first_bytes, 64);
    assert_int_equal(c->bucket_bytes, 128);
    assert_int_equal(c->bucket_direct_links, 1);
    pp_config_free(c);
    const char *off = "model: m.onnx\nbatch_size: 6\nmicrobatches: 3\ndata: {x: x.npy}\n"
                      "ranks: [inproc://a, inproc://b]\nreplicas: 2\ngradient_buckets: {direct_links: false}\n";
    TU_OK(pp_config_parse(off, strlen(off), "off.yaml", ".", &c));
    assert_int_equal(c->bucket_direct_links, 0);
    pp_config_free(c);
}

/* Regression: pp_replica_options_init left shard_optimizer (and any field
 * added since) as whatever the caller's stack held. */
static void test_replica_options_init_sets_every_field(void **state) {
    (void)state;
    pp_replica_options o;
    memset(&o, 0x5a, sizeof o);
    pp_replica_options_init(&o);
    assert_int_equal(o.replicas, 1);
    assert_int_equal(o.replica, 0);
    assert_int_equal(o.shard_optimizer, 0);
    assert_int_equal(o.direct_links, 0);
    assert_true(o.first_bucket_bytes > 0 && o.bucket_bytes > 0);
}

/* The worker refuses a rank count that is not replicas x the schedule's. */
static void test_replica_rank_count(void **state) {
    (void)state;
    char cfg[300];
    snprintf(cfg, sizeof cfg, "%s/bad.yaml", tmp);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fprintf(f,
            "model: %s/model.onnx\nschedule: 1f1b\nbatch_size: 4\ndata: {x: %s/train_x.npy, y: %s/train_y.npy}\n"
            "replicas: 2\nranks: [inproc://x0, inproc://x1, inproc://x2, inproc://x3]\n",
            fx, fx, fx);
    fclose(f);
    pp_worker_options o;
    pp_worker_options_init(&o);
    o.rank = 0;
    pp_worker *w = NULL;
    assert_int_not_equal(pp_worker_open(cfg, &o, &w), PP_OK);
    assert_null(w);
    if (!strstr(pp_last_error(), "needs 3 ranks per replica, 6 for 2 replicas; the config lists 4"))
        fail_msg("%s", pp_last_error());
    unlink(cfg);
}

static int setup(void **state) {
    (void)state;
    snprintf(fx, sizeof fx, "%s", tu_src_path("test/fixtures/mlp"));
    snprintf(gpt_dir, sizeof gpt_dir, "%s", tu_src_path("examples/gpt"));
    snprintf(text_file, sizeof text_file, "%s", tu_src_path("examples/data/tiny.txt"));
    snprintf(tmp, sizeof tmp, "/tmp/pippin-test-replicas-%d", (int)getpid());
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", tmp, tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    tu_filter_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_replicas_bit_identical),
        cmocka_unit_test(test_replicas_close_to_one_pipeline),
        cmocka_unit_test(test_replicas_resume),
        cmocka_unit_test(test_sharded_optimizer_bit_identical),
        cmocka_unit_test(test_sharded_checkpoints_resume_any_replicas),
        cmocka_unit_test(test_replicas_on_a_device),
        cmocka_unit_test(test_sharded_tied_parameters),
        cmocka_unit_test(test_shards_partition_the_buffer),
        cmocka_unit_test(test_wire_bf16),
        cmocka_unit_test(test_replica_config_errors),
        cmocka_unit_test(test_replica_options_init_sets_every_field),
        cmocka_unit_test(test_replica_rank_count),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
