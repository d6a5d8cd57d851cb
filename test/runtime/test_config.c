/* Pipeline config files: a full config with every key, defaults, path
 * resolution, every kind of error (each naming file, line and key), YAML
 * syntax errors, the nesting and size limits, checkpoint/run_id/insecure,
 * the protected mode (no unencrypted non-loopback endpoint unless
 * insecure: true), and choosing the rank from --rank or the environment. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pippin/exec.h"
#include "pippin/worker.h"
#include "rank_threads.h"
#include "thread_pool.h"
#include "test_util.h"

#include "test_filter.h"
#define FULL                                                                                   \
    "model: examples/gpt/model.onnx        # relative paths: to the file's directory\n"       \
    "split:                                 # optional; markers in the model also cut\n"      \
    "  before: [\"/blocks.2/\"]\n"                                                            \
    "  after: []\n"                                                                           \
    "  transmit_shared: false\n"                                                              \
    "dims: {seq: 64}\n"                                                                       \
    "mode: train\n"                                                                           \
    "schedule: 1f1b\n"                                                                        \
    "microbatches: 4\n"                                                                       \
    "batch_size: 16\n"                                                                        \
    "steps: 100\n"                                                                            \
    "loss: loss\n"                                                                            \
    "optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.01, betas: [0.9, 0.999], eps: 1.0e-8,\n" \
    "            momentum: 0.0, dampening: 0.0, nesterov: false}\n"                           \
    "data: {idx: data/idx.npy, targets: data/targets.npy}\n"                                  \
    "ranks:\n"                                                                                \
    "  - tcp://10.0.0.1:5555\n"                                                               \
    "  - tcp://10.0.0.2:5555\n"                                                               \
    "bind: tcp://*:5555\n"                                                                    \
    "timeout_ms: 10000\n"                                                                     \
    "shared_memory: false\n"                                                                  \
    "bulk_lanes: false\n"                                                                     \
    "security:\n"                                                                             \
    "  secret_keys: [keys/rank0.key, keys/rank1.key]\n"                                       \
    "  public_keys: [keys/rank0.pub, keys/rank1.pub]\n"                                       \
    "output_dir: out/\n"                                                                     \
    "checkpoint: {dir: ckpt/, every: 10, keep: 3}\n"                                         \
    "run_id: gpt-small-01\n"                                                                 \
    "insecure: false\n"

/* Four lines every error case starts from. */
#define BASE                   \
    "model: m.onnx\n"          \
    "batch_size: 4\n"          \
    "data: {x: x.npy}\n"       \
    "ranks: [tcp://127.0.0.1:1, tcp://localhost:2]\n"

static pp_config *parse_ok(const char *text, const char *dir) {
    pp_config *c = NULL;
    TU_OK(pp_config_parse(text, strlen(text), "cfg.yaml", dir, &c));
    assert_non_null(c);
    return c;
}

/* Parsing fails with code; the message names cfg.yaml and line (0: some
 * line, -1: none) and has each of the (up to two) parts. */
static void expect_err(const char *text, pp_status code, int line, const char *part, const char *part2) {
    pp_config *c = (pp_config *)1;
    pp_status s = pp_config_parse(text, strlen(text), "cfg.yaml", "/d", &c);
    if (s != code) fail_msg("expected %s, got %s (%s) for:\n%s", pp_status_name(code), pp_status_name(s),
                            pp_last_error(), text);
    assert_null(c);
    char where[64];
    if (line > 0) snprintf(where, sizeof where, "cfg.yaml:%d: ", line);
    else snprintf(where, sizeof where, line == 0 ? "cfg.yaml:" : "cfg.yaml: ");
    const char *msg = pp_last_error();
    if (strncmp(msg, where, strlen(where)) != 0) fail_msg("'%s' does not start with '%s'", msg, where);
    if (line == 0 && !(msg[strlen(where)] >= '1' && msg[strlen(where)] <= '9'))
        fail_msg("'%s' has no line number", msg);
    if (part && !strstr(msg, part)) fail_msg("'%s' lacks '%s'", msg, part);
    if (part2 && !strstr(msg, part2)) fail_msg("'%s' lacks '%s'", msg, part2);
}

static void test_full(void **state) {
    (void)state;
    pp_config *c = parse_ok(FULL, "/cfg");
    assert_string_equal(c->path, "cfg.yaml");
    assert_string_equal(c->model, "/cfg/examples/gpt/model.onnx");
    assert_int_equal(c->n_split_before, 1);
    assert_string_equal(c->split_before[0], "/blocks.2/");
    assert_int_equal(c->n_split_after, 0);
    assert_int_equal(c->transmit_shared, 0);
    assert_int_equal(c->n_dims, 1);
    assert_string_equal(c->dims[0].key, "seq");
    assert_string_equal(c->dims[0].value, "64");
    assert_int_equal(c->training, 1);
    assert_string_equal(c->schedule, "1f1b");
    assert_int_equal(c->microbatches, 4);
    assert_int_equal(c->batch_size, 16);
    assert_int_equal(c->steps, 100);
    assert_string_equal(c->loss, "loss");
    assert_int_equal(c->optim.kind, PP_OPTIM_ADAMW);
    assert_true(c->optim.lr == 0.003);
    assert_true(c->optim.weight_decay == 0.01);
    assert_true(c->optim.beta1 == 0.9);
    assert_true(c->optim.beta2 == 0.999);
    assert_true(c->optim.eps == 1.0e-8);
    assert_true(c->optim.momentum == 0.0);
    assert_true(c->optim.dampening == 0.0);
    assert_int_equal(c->optim.nesterov, 0);
    assert_int_equal(c->optim.maximize, 0);
    assert_int_equal(c->n_data, 2);
    assert_string_equal(c->data[0].key, "idx");
    assert_string_equal(c->data[0].value, "/cfg/data/idx.npy");
    assert_string_equal(c->data[1].key, "targets");
    assert_string_equal(c->data[1].value, "/cfg/data/targets.npy");
    assert_null(c->text_file);
    assert_null(c->text_vocab);
    assert_int_equal(c->text_seq, 0);
    assert_int_equal(c->n_ranks, 2);
    assert_string_equal(c->ranks[0], "tcp://10.0.0.1:5555");
    assert_string_equal(c->ranks[1], "tcp://10.0.0.2:5555");
    assert_string_equal(c->bind, "tcp://*:5555");
    assert_int_equal(c->timeout_ms, 10000);
    assert_int_equal(c->shared_memory, 0);
    assert_int_equal(c->bulk_lanes, 0);
    assert_int_equal(c->n_secret_keys, 2);
    assert_int_equal(c->n_public_keys, 2);
    assert_string_equal(c->secret_keys[0], "/cfg/keys/rank0.key");
    assert_string_equal(c->secret_keys[1], "/cfg/keys/rank1.key");
    assert_string_equal(c->public_keys[0], "/cfg/keys/rank0.pub");
    assert_string_equal(c->public_keys[1], "/cfg/keys/rank1.pub");
    assert_string_equal(c->output_dir, "/cfg/out/");
    assert_string_equal(c->checkpoint_dir, "/cfg/ckpt/");
    assert_int_equal(c->checkpoint_every, 10);
    assert_int_equal(c->checkpoint_keep, 3);
    assert_string_equal(c->run_id, "gpt-small-01");
    assert_int_equal(c->insecure, 0);
    pp_config_free(c);
}

static void test_freeze(void **state) {
    (void)state;
    pp_config *c = parse_ok(BASE "freeze: [\"blocks.0.*\", mask]\n", "/d");
    assert_int_equal(c->n_freeze, 2);
    assert_string_equal(c->freeze[0], "blocks.0.*");
    assert_string_equal(c->freeze[1], "mask");
    pp_config_free(c);
}

/* The other alternatives: text instead of data, SGD, csv schedule, infer. */
static void test_text_sgd_csv(void **state) {
    (void)state;
    pp_config *c = parse_ok("model: /abs/model.onnx\n"
                            "mode: train\n"
                            "schedule: csv:s/sched.csv\n"
                            "batch_size: 8\n"
                            "steps: 0\n"
                            "optimizer:\n"
                            "  kind: SGD\n"
                            "  lr: 1e-1\n"
                            "  momentum: 0.9\n"
                            "  nesterov: yes\n"
                            "text: {file: data/tiny.txt, vocab: /v/vocab.json, seq: 32}\n"
                            "split: {after: [a, 'b c'], transmit_shared: True}\n"
                            "dims: {seq: 64, batch: \"2\"}\n"
                            "ranks: [ipc:///tmp/a, ipc:///tmp/b, ipc:///tmp/c]\n",
                            "base");
    assert_string_equal(c->model, "/abs/model.onnx");
    assert_string_equal(c->schedule, "csv:base/s/sched.csv");
    assert_int_equal(c->steps, 0);
    assert_int_equal(c->optim.kind, PP_OPTIM_SGD);
    assert_true(c->optim.lr == 0.1);
    assert_true(c->optim.momentum == 0.9);
    assert_true(c->optim.weight_decay == 0); /* SGD's default, not AdamW's */
    assert_int_equal(c->optim.nesterov, 1);
    assert_string_equal(c->text_file, "base/data/tiny.txt");
    assert_string_equal(c->text_vocab, "/v/vocab.json");
    assert_int_equal(c->text_seq, 32);
    assert_int_equal(c->n_data, 0);
    assert_int_equal(c->n_split_before, 0);
    assert_int_equal(c->n_split_after, 2);
    assert_string_equal(c->split_after[1], "b c");
    assert_int_equal(c->transmit_shared, 1);
    assert_int_equal(c->n_dims, 2);
    assert_string_equal(c->dims[1].key, "batch");
    assert_string_equal(c->dims[1].value, "2");
    assert_int_equal(c->n_ranks, 3);
    pp_config_free(c);

    /* Inference needs no data; torch class names for schedules. */
    c = parse_ok("model: m.onnx\nmode: infer\nbatch_size: 2\nschedule: Interleaved1F1B\nranks: [a]\n", NULL);
    assert_int_equal(c->training, 0);
    assert_string_equal(c->schedule, "interleaved-1f1b");
    assert_int_equal(c->n_data, 0);
    assert_null(c->text_file);
    pp_config_free(c);
}

static void test_defaults(void **state) {
    (void)state;
    pp_config *c = parse_ok(BASE, NULL);
    assert_string_equal(c->model, "m.onnx"); /* dir "." leaves paths alone */
    assert_int_equal(c->n_split_before, 0);
    assert_int_equal(c->n_split_after, 0);
    assert_int_equal(c->transmit_shared, 0);
    assert_int_equal(c->n_dims, 0);
    assert_int_equal(c->training, 1);
    assert_string_equal(c->schedule, "gpipe");
    assert_int_equal(c->microbatches, 1);
    assert_int_equal(c->batch_size, 4);
    assert_int_equal(c->steps, 1);
    assert_null(c->loss);
    pp_optim_config want;
    pp_optim_config_init(&want, PP_OPTIM_ADAMW);
    assert_memory_equal(&c->optim, &want, sizeof want);
    assert_int_equal(c->n_data, 1);
    assert_string_equal(c->data[0].value, "x.npy");
    assert_null(c->text_file);
    assert_int_equal(c->text_seq, 0);
    assert_null(c->bind);
    assert_int_equal(c->timeout_ms, 10000);
    assert_int_equal(c->shared_memory, 1);
    assert_int_equal(c->bulk_lanes, 1);
    assert_int_equal(c->n_secret_keys, 0);
    assert_int_equal(c->n_public_keys, 0);
    assert_null(c->secret_keys);
    assert_null(c->output_dir);
    assert_null(c->checkpoint_dir);
    assert_int_equal(c->checkpoint_every, 0);
    assert_int_equal(c->checkpoint_keep, 2);
    assert_null(c->run_id);
    assert_int_equal(c->insecure, 0);
    pp_config_free(c);

    /* Null values mean "the default"; an optimizer with only a kind gets
     * that kind's defaults. */
    c = parse_ok(BASE "loss: ~\nbind: null\nsplit:\nsteps:\noptimizer: {kind: sgd}\ncheckpoint:\nrun_id: ~\n"
                      "insecure: null\n", ".");
    assert_null(c->checkpoint_dir);
    assert_int_equal(c->checkpoint_keep, 2);
    assert_null(c->run_id);
    assert_int_equal(c->insecure, 0);
    assert_null(c->loss);
    assert_null(c->bind);
    assert_int_equal(c->steps, 1);
    pp_optim_config_init(&want, PP_OPTIM_SGD);
    assert_memory_equal(&c->optim, &want, sizeof want);
    pp_config_free(c);
    pp_config_free(NULL);
}

static void test_paths(void **state) {
    (void)state;
    const char *text = BASE "output_dir: out\ntext: ~\n";
    pp_config *c = parse_ok(text, "/a/b/");
    assert_string_equal(c->model, "/a/b/m.onnx");
    assert_string_equal(c->data[0].value, "/a/b/x.npy");
    assert_string_equal(c->output_dir, "/a/b/out");
    pp_config_free(c);
    c = parse_ok(text, "rel");
    assert_string_equal(c->model, "rel/m.onnx");
    pp_config_free(c);
    c = parse_ok("model: /m.onnx\nbatch_size: 1\ndata: {x: /x.npy}\nranks: [a]\n", "/ignored");
    assert_string_equal(c->model, "/m.onnx");
    assert_string_equal(c->data[0].value, "/x.npy");
    pp_config_free(c);

    /* pp_config_load: against the file's own directory. */
    char dir[64], file[128], want[160];
    snprintf(dir, sizeof dir, "/tmp/pippin-config-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/pipe.yaml", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(FULL, f);
    fclose(f);
    TU_OK(pp_config_load(file, &c));
    assert_string_equal(c->path, file);
    snprintf(want, sizeof want, "%s/examples/gpt/model.onnx", dir);
    assert_string_equal(c->model, want);
    snprintf(want, sizeof want, "%s/keys/rank1.pub", dir);
    assert_string_equal(c->public_keys[1], want);
    pp_config_free(c);

    /* Errors from a file name it. */
    f = fopen(file, "w");
    fputs(BASE "microbatches: x\n", f);
    fclose(f);
    c = (pp_config *)1;
    assert_int_equal(pp_config_load(file, &c), PP_ERR_PARSE);
    assert_null(c);
    snprintf(want, sizeof want, "%s:5: key 'microbatches'", file);
    assert_non_null(strstr(pp_last_error(), want));
    unlink(file);
    assert_int_equal(pp_config_load(file, &c), PP_ERR_IO);
    assert_non_null(strstr(pp_last_error(), file));
    assert_int_equal(pp_config_load(dir, &c), PP_ERR_IO); /* a directory */
    rmdir(dir);
}

static void test_type_errors(void **state) {
    (void)state;
    expect_err(BASE "foo: 1\n", PP_ERR_PARSE, 5, "unknown key 'foo'", "output_dir");
    expect_err(BASE "optimizer:\n  lr: 0.1\n  lrr: 2\n", PP_ERR_PARSE, 7, "unknown key 'optimizer.lrr'", NULL);
    expect_err(BASE "split: {before: [], middle: 1}\n", PP_ERR_PARSE, 5, "unknown key 'split.middle'", NULL);
    expect_err(BASE "security:\n  secret_keys: [a, b]\n  public_keys: [a, b]\n  x: 1\n", PP_ERR_PARSE, 8,
               "unknown key 'security.x'", NULL);
    expect_err("model: m.onnx\nbatch_size: 4\nranks: [a]\ntext: {file: t, vocab: v, size: 3}\n", PP_ERR_PARSE, 4,
               "unknown key 'text.size'", NULL);
    expect_err(BASE "loss: [a, b]\n", PP_ERR_PARSE, 5, "key 'loss': expected a string, got a list", NULL);
    expect_err(BASE "model2: {a: 1}\n", PP_ERR_PARSE, 5, "unknown key 'model2'", NULL);
    expect_err("model: {a: 1}\nbatch_size: 4\n", PP_ERR_PARSE, 1, "key 'model': expected a path, got a mapping", NULL);
    expect_err(BASE "microbatches: abc\n", PP_ERR_PARSE, 5, "key 'microbatches': expected an integer, got 'abc'",
               NULL);
    expect_err(BASE "microbatches: 2.5\n", PP_ERR_PARSE, 5, "key 'microbatches'", "'2.5'");
    expect_err(BASE "steps: 0x10\n", PP_ERR_PARSE, 5, "key 'steps'", NULL);
    expect_err(BASE "steps: 99999999999999999999999\n", PP_ERR_INVALID, 5, "key 'steps'", "at most");
    /* An underflow is below the minimum, not above the maximum. */
    expect_err(BASE "steps: -99999999999999999999999\n", PP_ERR_INVALID, 5, "key 'steps'", "at least 0");
    expect_err(BASE "optimizer: {lr: abc}\n", PP_ERR_PARSE, 5, "key 'optimizer.lr': expected a number, got 'abc'",
               NULL);
    expect_err(BASE "optimizer: {lr: nan}\n", PP_ERR_PARSE, 5, "key 'optimizer.lr'", NULL);
    expect_err(BASE "optimizer: {lr: 1e999}\n", PP_ERR_PARSE, 5, "key 'optimizer.lr'", NULL);
    expect_err(BASE "optimizer: {lr: ' 1'}\n", PP_ERR_PARSE, 5, "key 'optimizer.lr'", NULL);
    expect_err(BASE "optimizer:\n  betas: 0.9\n", PP_ERR_PARSE, 6, "key 'optimizer.betas'", "got '0.9'");
    expect_err(BASE "optimizer:\n  betas: [0.9, 0.99, 0.5]\n", PP_ERR_PARSE, 6, "key 'optimizer.betas'", "2 numbers");
    expect_err(BASE "optimizer:\n  betas: [0.9, [1]]\n", PP_ERR_PARSE, 6, "key 'optimizer.betas[1]'", "a list");
    expect_err(BASE "split: {transmit_shared: maybe}\n", PP_ERR_PARSE, 5, "key 'split.transmit_shared'",
               "true or false");
    expect_err(BASE "split: [a]\n", PP_ERR_PARSE, 5, "key 'split': expected a mapping", NULL);
    expect_err(BASE "split:\n  before: /a/\n", PP_ERR_PARSE, 6, "key 'split.before': expected a list", NULL);
    expect_err(BASE "dims: {seq: abc}\n", PP_ERR_PARSE, 5, "key 'dims.seq'", NULL);
    expect_err(BASE "loss: \"a\\0b\"\n", PP_ERR_PARSE, 5, "key 'loss'", "NUL");
    expect_err("model: m.onnx\nbatch_size: 4\ndata: {x: x.npy}\nranks: tcp://a:1\n", PP_ERR_PARSE, 4,
               "key 'ranks': expected a list", NULL);
    expect_err("model: m.onnx\nbatch_size: 4\ndata: {x: x.npy}\nranks:\n  - tcp://a:1\n  - {a: 1}\n", PP_ERR_PARSE,
               6, "key 'ranks[1]': expected a string, got a mapping", NULL);
    expect_err("model: m.onnx\nbatch_size: 4\ndata: {x: x.npy}\nranks: [a, ~]\n", PP_ERR_PARSE, 4,
               "key 'ranks[1]'", "null");
    expect_err(BASE "[a]: 1\n", PP_ERR_PARSE, 5, "expected a name as key", NULL);
    expect_err(BASE "data2:\n", PP_ERR_PARSE, 5, "unknown key 'data2'", NULL);
    /* Missing required keys: the line of the mapping. */
    expect_err("model: m.onnx\ndata: {x: x.npy}\nranks: [a]\n", PP_ERR_PARSE, 1, "missing key 'batch_size'", NULL);
    expect_err("batch_size: 1\ndata: {x: x.npy}\nranks: [a]\n", PP_ERR_PARSE, 1, "missing key 'model'", NULL);
    expect_err("model: m.onnx\nbatch_size: 1\ndata: {x: x.npy}\n", PP_ERR_PARSE, 1, "missing key 'ranks'", NULL);
    expect_err("model: m.onnx\nbatch_size:\ndata: {x: x.npy}\nranks: [a]\n", PP_ERR_PARSE, 2,
               "key 'batch_size': expected an integer, got null", NULL);
    expect_err("model: m.onnx\nbatch_size: 1\nranks: [a]\ntext:\n  vocab: v.json\n", PP_ERR_PARSE, 5,
               "missing key 'text.file'", NULL);
    expect_err(BASE "security: {secret_keys: [a, b]}\n", PP_ERR_PARSE, 5, "missing key 'security.public_keys'", NULL);
}

static void test_duplicates(void **state) {
    (void)state;
    expect_err(BASE "model: n.onnx\n", PP_ERR_PARSE, 5, "duplicate key 'model'", "first at line 1");
    expect_err(BASE "optimizer: {lr: 1,\n  lr: 2}\n", PP_ERR_PARSE, 6, "duplicate key 'optimizer.lr'",
               "first at line 5");
    expect_err("model: m.onnx\nbatch_size: 4\ndata:\n  x: a.npy\n  x: b.npy\nranks: [a]\n", PP_ERR_PARSE, 5,
               "duplicate key 'data.x'", NULL);
    expect_err(BASE "dims: {seq: 1, seq: 2}\n", PP_ERR_PARSE, 5, "duplicate key 'dims.seq'", NULL);
}

static void test_value_errors(void **state) {
    (void)state;
    expect_err(BASE "steps: -1\n", PP_ERR_INVALID, 5, "key 'steps': must be at least 0, got '-1'", NULL);
    expect_err(BASE "microbatches: 0\n", PP_ERR_INVALID, 5, "key 'microbatches': must be at least 1", NULL);
    expect_err(BASE "microbatches: -3\n", PP_ERR_INVALID, 5, "key 'microbatches'", NULL);
    expect_err(BASE "microbatches: 5\n", PP_ERR_INVALID, 5, "key 'microbatches'", "batch_size 4");
    expect_err("model: m.onnx\nbatch_size: 0\ndata: {x: x.npy}\nranks: [a]\n", PP_ERR_INVALID, 2,
               "key 'batch_size': must be at least 1", NULL);
    expect_err(BASE "timeout_ms: 0\n", PP_ERR_INVALID, 5, "key 'timeout_ms'", NULL);
    expect_err(BASE "text: {file: t.txt, vocab: v.json, seq: -2}\n", PP_ERR_INVALID, 5, "key 'text.seq'", NULL);
    expect_err(BASE "dims: {seq: 0}\n", PP_ERR_INVALID, 5, "key 'dims.seq'", NULL);
    expect_err(BASE "optimizer: {lr: -0.1}\n", PP_ERR_INVALID, 5, "key 'optimizer.lr': must be at least 0", NULL);
    expect_err(BASE "optimizer: {weight_decay: -1}\n", PP_ERR_INVALID, 5, "key 'optimizer.weight_decay'", NULL);
    expect_err(BASE "optimizer: {eps: -1e-8}\n", PP_ERR_INVALID, 5, "key 'optimizer.eps'", NULL);
    expect_err(BASE "optimizer: {momentum: -0.5}\n", PP_ERR_INVALID, 5, "key 'optimizer.momentum'", NULL);
    expect_err(BASE "optimizer: {betas: [0.9, 1.0]}\n", PP_ERR_INVALID, 5, "key 'optimizer.betas[1]'", "[0, 1)");
    expect_err(BASE "optimizer: {betas: [-0.1, 0.5]}\n", PP_ERR_INVALID, 5, "key 'optimizer.betas[0]'", NULL);
    expect_err(BASE "optimizer: {kind: adam}\n", PP_ERR_INVALID, 5, "key 'optimizer.kind'", "'adam'");
    expect_err(BASE "optimizer:\n  kind: sgd\n  nesterov: true\n", PP_ERR_INVALID, 7, "key 'optimizer.nesterov'",
               NULL);
    expect_err(BASE "mode: eval\n", PP_ERR_INVALID, 5, "key 'mode': expected train, infer or serve, got 'eval'", NULL);
    expect_err(BASE "schedule: nope\n", PP_ERR_INVALID, 5, "key 'schedule'", "zbv");
    expect_err(BASE "schedule: 'csv:'\n", PP_ERR_INVALID, 5, "key 'schedule'", NULL);
    expect_err(BASE "loss: ''\n", PP_ERR_INVALID, 5, "key 'loss': must not be empty", NULL);
    expect_err("stages: split/\nbatch_size: 4\ndata: {x: x.npy}\nranks: [a]\nfreeze: [mask]\n", PP_ERR_INVALID, 5,
               "key 'freeze'", "pippin split --freeze");
    expect_err("model: m.onnx\nbatch_size: 4\ndata: {x: x.npy}\nranks: []\n", PP_ERR_INVALID, 4, "key 'ranks'",
               NULL);
    expect_err("model: m.onnx\nbatch_size: 4\ndata: {}\nranks: [a]\n", PP_ERR_INVALID, 3, "key 'data'", NULL);
    /* Both or neither of data and text. */
    expect_err(BASE "text: {file: t.txt, vocab: v.json}\n", PP_ERR_INVALID, 5, "key 'text'", "not both");
    expect_err("model: m.onnx\nbatch_size: 4\nranks: [a]\n", PP_ERR_INVALID, 1, "key 'data'", "train");
    expect_err("model: m.onnx\nbatch_size: 4\nmode: train\nranks: [a]\n", PP_ERR_INVALID, 3, "key 'data'", "train");
    /* One key file per rank. */
    expect_err(BASE "security:\n  secret_keys: [a.key]\n  public_keys: [a.pub, b.pub]\n", PP_ERR_INVALID, 6,
               "key 'security.secret_keys'", "2 ranks");
    expect_err(BASE "security:\n  secret_keys: [a.key, b.key]\n  public_keys: [a.pub, b.pub, c.pub]\n",
               PP_ERR_INVALID, 7, "key 'security.public_keys'", "3 key files");
    /* Limits. */
    size_t cap = 4200 * 4 + 64;
    char *big = malloc(cap);
    assert_non_null(big);
    size_t n = (size_t)snprintf(big, cap, "model: m.onnx\nbatch_size: 1\ndata: {x: x}\nranks: [");
    for (int i = 0; i < 4097; i++) n += (size_t)snprintf(big + n, cap - n, "%sa", i ? "," : "");
    snprintf(big + n, cap - n, "]\n");
    expect_err(big, PP_ERR_INVALID, 4, "key 'ranks'", "4096");
    free(big);
    pp_config *c = (pp_config *)1;
    assert_int_equal(pp_config_parse("", (1u << 20) + 1, "big.yaml", NULL, &c), PP_ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(pp_last_error(), "big.yaml"));
}

/* split.auto: a stage count for balanced stages, with an optional
 * split.memory_cap; not with before/after, the cap not without auto. */
static void test_split_auto(void **state) {
    (void)state;
    pp_config *c = parse_ok(BASE, NULL);
    assert_int_equal(c->split_auto, 0);
    assert_true(c->split_memory_cap == 0);
    pp_config_free(c);
    c = parse_ok(BASE "split: {auto: 4, memory_cap: 2000000000}\n", NULL);
    assert_int_equal(c->split_auto, 4);
    assert_true(c->split_memory_cap == 2000000000);
    pp_config_free(c);
    c = parse_ok(BASE "split: {auto: 2, transmit_shared: true}\n", NULL);
    assert_int_equal(c->split_auto, 2);
    assert_int_equal(c->transmit_shared, 1);
    pp_config_free(c);
    expect_err(BASE "split: {auto: 0}\n", PP_ERR_INVALID, 5, "key 'split.auto'", "at least 1");
    expect_err(BASE "split: {auto: four}\n", PP_ERR_PARSE, 5, "key 'split.auto'", NULL);
    expect_err(BASE "split: {auto: 3, before: [a]}\n", PP_ERR_INVALID, 5, "key 'split.auto'", "no 'before'");
    expect_err(BASE "split: {memory_cap: 100}\n", PP_ERR_INVALID, 5, "key 'split.memory_cap'", "needs 'split.auto'");
    expect_err(BASE "split: {auto: 2, memory_cap: 0}\n", PP_ERR_INVALID, 5, "key 'split.memory_cap'", NULL);
}

/* recompute: true, false or a list of distinct stage indices (mode train);
 * indices past the pipeline's stages are refused when a worker opens it. */
static void test_recompute(void **state) {
    (void)state;
    pp_config *c = parse_ok(BASE, NULL);
    assert_int_equal(c->recompute, 0);
    assert_int_equal(c->n_recompute_stages, 0);
    pp_config_free(c);
    c = parse_ok(BASE "recompute: true\n", NULL);
    assert_int_equal(c->recompute, 1);
    assert_int_equal(c->recompute_line, 5);
    pp_config_free(c);
    c = parse_ok(BASE "recompute: false\n", NULL);
    assert_int_equal(c->recompute, 0);
    pp_config_free(c);
    c = parse_ok(BASE "recompute: [0, 2]\n", NULL);
    assert_int_equal(c->recompute, 0);
    assert_int_equal(c->n_recompute_stages, 2);
    assert_int_equal(c->recompute_stages[0], 0);
    assert_int_equal(c->recompute_stages[1], 2);
    pp_config_free(c);
    c = parse_ok(BASE "recompute: []\n", NULL);
    assert_int_equal(c->n_recompute_stages, 0);
    pp_config_free(c);
    expect_err(BASE "recompute: maybe\n", PP_ERR_PARSE, 5, "key 'recompute'",
               "expected true, false or a list of stage indices, got 'maybe'");
    expect_err(BASE "recompute:\n", PP_ERR_PARSE, 5, "key 'recompute'", "got null");
    expect_err(BASE "recompute: {stage: 1}\n", PP_ERR_PARSE, 5, "key 'recompute'", "a list of stage indices");
    expect_err(BASE "recompute: [0, -1]\n", PP_ERR_INVALID, 5, "key 'recompute[1]': must be at least 0", NULL);
    expect_err(BASE "recompute: [one]\n", PP_ERR_PARSE, 5, "key 'recompute[0]': expected an integer", NULL);
    expect_err(BASE "recompute:\n  - 1\n  - 1\n", PP_ERR_INVALID, 7, "key 'recompute[1]'", "stage 1 is listed twice");
    expect_err(BASE "mode: infer\nrecompute: true\n", PP_ERR_INVALID, 6, "key 'recompute'", "mode: train");
    c = parse_ok(BASE "mode: infer\nrecompute: false\n", NULL);
    pp_config_free(c);

    /* [7] for the 2-stage bn fixture: the worker names the key and the count */
    char dir[1024];
    const char *root = getenv("PIPPIN_SOURCE_ROOT");
    snprintf(dir, sizeof dir, "%s/test/fixtures/bn", root ? root : ".");
    const char *text = "model: model.onnx\nbatch_size: 4\nmicrobatches: 2\ndata: {x: x.npy, y: y.npy}\n"
                       "ranks: [inproc://rc0, inproc://rc1]\nschedule: 1f1b\nrecompute: [1, 7]\n";
    c = parse_ok(text, dir);
    pp_worker_options o;
    pp_worker_options_init(&o);
    o.rank = 0;
    pp_worker *w = (pp_worker *)1;
    assert_int_equal(pp_worker_open_config(c, &o, &w), PP_ERR_INVALID);
    assert_null(w);
    const char *msg = pp_last_error();
    if (!strstr(msg, "cfg.yaml:7: key 'recompute[1]': stage 7, but the pipeline has 2 stages (0-1)"))
        fail_msg("unclear error for recompute: [7]: %s", msg);
    pp_config_free(c);
    /* a block list: the line of the entry itself (regression: the key's) */
    c = parse_ok("model: model.onnx\nbatch_size: 4\nmicrobatches: 2\ndata: {x: x.npy, y: y.npy}\n"
                 "ranks: [inproc://rd0, inproc://rd1]\nschedule: 1f1b\nrecompute:\n  - 1\n  - 7\n", dir);
    w = (pp_worker *)1;
    assert_int_equal(pp_worker_open_config(c, &o, &w), PP_ERR_INVALID);
    msg = pp_last_error();
    if (!strstr(msg, "cfg.yaml:9: key 'recompute[1]': stage 7"))
        fail_msg("recompute's block list entry is not named by its line: %s", msg);
    pp_config_free(c);
}

static void test_yaml_errors(void **state) {
    (void)state;
    expect_err("model: m.onnx\nbatch_size: 4\nloss: a: b\n", PP_ERR_PARSE, 3, "invalid YAML", NULL);
    expect_err("model: m.onnx\nranks: [a, b\nbatch_size: 4\n", PP_ERR_PARSE, 3, "invalid YAML", NULL);
    expect_err("model: m.onnx\n\tbatch_size: 4\n", PP_ERR_PARSE, 2, "invalid YAML", NULL);
    expect_err("model: *nothing\n", PP_ERR_PARSE, 1, "invalid YAML", NULL);
    expect_err("model: \xff\xfe\xfd\n", PP_ERR_PARSE, 1, "invalid YAML", NULL);
    expect_err("", PP_ERR_PARSE, -1, "empty config", NULL);
    expect_err("# nothing\n\n", PP_ERR_PARSE, -1, "empty config", NULL);
    expect_err("\n- a\n- b\n", PP_ERR_PARSE, 2, "expected a mapping of keys, got a list", NULL);
    expect_err("hello\n", PP_ERR_PARSE, 1, "expected a mapping of keys, got 'hello'", NULL);
    expect_err("---\n" BASE "---\nfoo: 1\n", PP_ERR_PARSE, 7, "more than one YAML document", NULL);
    expect_err(BASE "---\n[unclosed\n", PP_ERR_PARSE, 0, "invalid YAML", NULL);
    /* Aliases are resolved; a recursive one is just a wrong type. */
    pp_config *c = parse_ok("model: &m m.onnx\nloss: *m\nbatch_size: 4\ndata: {x: x.npy}\nranks: [a]\n", NULL);
    assert_string_equal(c->loss, "m.onnx");
    pp_config_free(c);
    expect_err(BASE "split: &s {before: *s}\n", PP_ERR_PARSE, 5, "key 'split.before'", NULL);
}

/* checkpoint: {dir, every, keep}, run_id, insecure: values, defaults inside
 * checkpoint, and every error naming file, line and key. */
/* mode: serve and its serve: section: defaults, values, errors. */
static void test_serve(void **state) {
    (void)state;
    const char *base = "model: m.onnx\nranks: [ipc:///tmp/a, ipc:///tmp/b]\nmode: serve\n";
    char text[1024];
    snprintf(text, sizeof text, "%sserve: {endpoint: 'tcp://127.0.0.1:5600'}\n", base);
    pp_config *c = parse_ok(text, "/a");
    assert_true(c->serving);
    assert_false(c->training);
    assert_string_equal(c->serve_endpoint, "tcp://127.0.0.1:5600");
    assert_int_equal(c->serve_max_batch, 8);
    assert_int_equal(c->serve_max_wait_us, 500);
    assert_int_equal(c->serve_max_queue, 256);
    assert_int_equal(c->serve_max_inflight, 0);
    assert_true(c->serve_max_request_bytes == (int64_t)64 << 20);
    /* spin_us, auto: serving with a core per rank's threads spins 2 ms */
    int cpus = pp_affinity_cpus();
    assert_int_equal(pp_worker_spin_us(c, 1), 2 <= cpus ? 2000 : 0);
    assert_int_equal(pp_worker_spin_us(c, cpus), 0); /* 2 ranks x all the CPUs: no core to spare */
    c->spin_us = 50;
    assert_int_equal(pp_worker_spin_us(c, cpus), 50); /* given: as given */
    pp_config_free(c);
    snprintf(text, sizeof text, "%sserve: {endpoint: ipc:///tmp/f, max_batch: 32, max_wait_us: 0, max_queue: 9, "
             "max_inflight: 3, max_request_bytes: 1000}\n", base);
    c = parse_ok(text, "/a");
    assert_int_equal(c->serve_max_batch, 32);
    assert_int_equal(c->serve_max_wait_us, 0);
    assert_int_equal(c->serve_max_queue, 9);
    assert_int_equal(c->serve_max_inflight, 3);
    assert_true(c->serve_max_request_bytes == 1000);
    pp_config_free(c);
    expect_err(base, PP_ERR_PARSE, 0, "mode serve needs a 'serve:' section", NULL);
    snprintf(text, sizeof text, "%sserve: {max_batch: 4}\n", base);
    expect_err(text, PP_ERR_PARSE, 4, "missing key 'serve.endpoint'", NULL);
    snprintf(text, sizeof text, "%sserve: {endpoint: 'inproc://x'}\n", base);
    expect_err(text, PP_ERR_INVALID, 4, "'inproc://x' is not a tcp:// or ipc:// endpoint", NULL);
    snprintf(text, sizeof text, "%sserve: {endpoint: ipc:///f, max_batch: 0}\n", base);
    expect_err(text, PP_ERR_INVALID, 4, "serve.max_batch", NULL);
    snprintf(text, sizeof text, "%sserve: {endpoint: ipc:///f, speed: 3}\n", base);
    expect_err(text, PP_ERR_PARSE, 4, "speed", NULL);
    expect_err(BASE "serve: {endpoint: ipc:///f}\n", PP_ERR_INVALID, 5, "key 'serve': only for mode: serve", NULL);
    snprintf(text, sizeof text, "%sserve: {endpoint: 'tcp://10.0.0.1:5600'}\n", base);
    expect_err(text, PP_ERR_INVALID, 4, "serve.endpoint", "insecure");
    snprintf(text, sizeof text, "%sserve: {endpoint: 'tcp://10.0.0.1:5600'}\ninsecure: true\n", base);
    pp_config_free(parse_ok(text, "/a"));

    /* CURVE on the front: serve.client_keys with security:, and only then */
    const char *sec = "security: {secret_keys: [r0.key, r1.key], public_keys: [r0.pub, r1.pub]}\n";
    snprintf(text, sizeof text, "%sserve: {endpoint: 'tcp://10.0.0.1:5600', client_keys: [c/a.pub, /k/b.pub]}\n%s",
             base, sec);
    c = parse_ok(text, "/a"); /* not loopback: fine with security */
    assert_int_equal(c->n_serve_client_keys, 2);
    assert_string_equal(c->serve_client_keys[0], "/a/c/a.pub"); /* resolved like other paths */
    assert_string_equal(c->serve_client_keys[1], "/k/b.pub");
    pp_config_free(c);
    snprintf(text, sizeof text, "%sserve: {endpoint: ipc:///f, client_keys: [a.pub]}\n", base);
    expect_err(text, PP_ERR_INVALID, 4, "key 'serve.client_keys'", "needs 'security:'");
    snprintf(text, sizeof text, "%sserve: {endpoint: ipc:///f}\n%s", base, sec);
    expect_err(text, PP_ERR_INVALID, 4, "serve.client_keys: needed with security: the clients the front admits", NULL);
    snprintf(text, sizeof text, "%sserve:\n  endpoint: ipc:///f\n  client_keys: []\n%s", base, sec);
    expect_err(text, PP_ERR_INVALID, 6, "serve.client_keys: needed with security", NULL);
    snprintf(text, sizeof text, "%sserve: {endpoint: ipc:///f, client_keys: a.pub}\n%s", base, sec);
    expect_err(text, PP_ERR_PARSE, 4, "serve.client_keys", "a list");
}

static void test_checkpoint_run_id(void **state) {
    (void)state;
    pp_config *c = parse_ok(BASE "checkpoint:\n  dir: ck\n", "/a");
    assert_string_equal(c->checkpoint_dir, "/a/ck"); /* resolved like other paths */
    assert_int_equal(c->checkpoint_every, 0);
    assert_int_equal(c->checkpoint_keep, 2);
    pp_config_free(c);
    c = parse_ok(BASE "checkpoint: {dir: /abs/ck, every: 1, keep: 1}\nrun_id: 'run 7: lr=3e-3'\n", "/a");
    assert_string_equal(c->checkpoint_dir, "/abs/ck");
    assert_int_equal(c->checkpoint_every, 1);
    assert_int_equal(c->checkpoint_keep, 1);
    assert_string_equal(c->run_id, "run 7: lr=3e-3");
    pp_config_free(c);

    expect_err(BASE "checkpoint: {every: 2}\n", PP_ERR_PARSE, 5, "missing key 'checkpoint.dir'", NULL);
    expect_err(BASE "checkpoint: {dir: ~}\n", PP_ERR_PARSE, 5, "key 'checkpoint.dir'", "a path");
    expect_err(BASE "checkpoint: {dir: ck, keep: 0}\n", PP_ERR_INVALID, 5, "key 'checkpoint.keep'", "at least 1");
    expect_err(BASE "checkpoint: {dir: ck, every: -1}\n", PP_ERR_INVALID, 5, "key 'checkpoint.every'",
               "at least 0");
    expect_err(BASE "checkpoint: {dir: ck, every: often}\n", PP_ERR_PARSE, 5, "key 'checkpoint.every'",
               "an integer");
    expect_err(BASE "checkpoint:\n  dir: ck\n  kept: 3\n", PP_ERR_PARSE, 7, "unknown key 'checkpoint.kept'",
               "keep");
    expect_err(BASE "checkpoint: ck/\n", PP_ERR_PARSE, 5, "key 'checkpoint': expected a mapping", NULL);
    /* Only a training run checkpoints. */
    expect_err("model: m.onnx\nmode: infer\nbatch_size: 4\nranks: [a]\ncheckpoint: {dir: ck}\n", PP_ERR_INVALID, 5,
               "key 'checkpoint'", "mode: train");
    expect_err(BASE "run_id: [a]\n", PP_ERR_PARSE, 5, "key 'run_id': expected a string", NULL);
    expect_err(BASE "run_id: ''\n", PP_ERR_INVALID, 5, "key 'run_id': must not be empty", NULL);
    expect_err(BASE "run_id: \"a\\tb\"\n", PP_ERR_INVALID, 5, "key 'run_id'", "control character");
    char big[400];
    int n = snprintf(big, sizeof big, BASE "run_id: ");
    memset(big + n, 'r', 257);
    strcpy(big + n + 257, "\n");
    expect_err(big, PP_ERR_INVALID, 5, "key 'run_id'", "256 bytes");
    big[n + 256] = '\n';
    big[n + 257] = '\0';
    c = parse_ok(big, NULL);
    assert_int_equal(strlen(c->run_id), 256);
    pp_config_free(c);

    c = parse_ok(BASE "insecure: yes\n", NULL);
    assert_int_equal(c->insecure, 1);
    pp_config_free(c);
    expect_err(BASE "insecure: sometimes\n", PP_ERR_PARSE, 5, "key 'insecure'", "true or false");
}

/* Protected mode: without security, an endpoint off this host needs
 * insecure: true; the error names file, line, key and endpoint and says
 * what to do. */
#define HEAD "model: m.onnx\nbatch_size: 4\ndata: {x: x.npy}\n"
static void test_protected_mode(void **state) {
    (void)state;
    static const char *const local[] = {
        "ranks: [tcp://127.0.0.1:5555, tcp://127.0.0.2:5556]\n",
        "ranks: [tcp://127.255.0.9:1]\nbind: tcp://127.0.0.1:1\n",
        "ranks: [tcp://localhost:1, tcp://LOCALHOST:2]\n",
        "ranks: ['tcp://[::1]:5555', 'tcp://[::ffff:127.0.0.1]:5556']\n",
        "ranks: ['tcp://127.0.0.1:9;127.0.0.1:5555']\n", /* source;destination */
        "ranks: [ipc:///tmp/a, 'inproc://b', ipc://@abstract]\nbind: ipc:///tmp/c\n",
    };
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, HEAD "%s", local[i]);
        pp_config_free(parse_ok(text, NULL));
    }
    static const struct {
        const char *tail;
        int line, n_ranks;
        const char *key, *endpoint;
    } refused[] = {
        {"ranks: [tcp://127.0.0.1:1, tcp://10.0.0.1:5555]\n", 4, 2, "key 'ranks[1]'", "'tcp://10.0.0.1:5555'"},
        {"ranks:\n  - tcp://127.0.0.1:1\n  - tcp://127.0.0.1:2\n  - tcp://node7:3\n", 7, 3, "key 'ranks[2]'",
         "tcp://node7:3"},
        {"ranks: [tcp://127.0.0.1:1]\nbind: tcp://0.0.0.0:1\n", 5, 1, "key 'bind'", "tcp://0.0.0.0:1"},
        {"ranks: [tcp://127.0.0.1:1]\nbind: tcp://*:1\n", 5, 1, "key 'bind'", "tcp://*:1"},
        {"ranks: ['tcp://[::]:1']\n", 4, 1, "key 'ranks[0]'", "tcp://[::]:1"},
        {"ranks: ['tcp://[2001:db8::1]:1']\n", 4, 1, "key 'ranks[0]'", NULL},
        {"ranks: [tcp://128.0.0.1:1]\n", 4, 1, "key 'ranks[0]'", NULL},
        {"ranks: [tcp://localhost.example.com:1]\n", 4, 1, "key 'ranks[0]'", NULL},
        {"ranks: [tcp://lo:1]\n", 4, 1, "key 'ranks[0]'", NULL},              /* an interface name */
        {"ranks: [tcp://127.0.0.1:1;10.0.0.2:1]\n", 4, 1, "key 'ranks[0]'", NULL}, /* one of two */
        {"ranks: ['tipc://{5560,0,0}']\n", 4, 1, "key 'ranks[0]'", NULL},        /* other networks too */
        {"ranks: [TCP://127.0.0.1:1]\n", 4, 1, "key 'ranks[0]'", NULL},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, HEAD "%s", refused[i].tail);
        expect_err(text, PP_ERR_INVALID, refused[i].line, refused[i].key, refused[i].endpoint);
        expect_err(text, PP_ERR_INVALID, refused[i].line, "set 'insecure: true' to allow unencrypted traffic",
                   "'security:'");
        /* insecure: true allows it; so does CURVE. */
        snprintf(text, sizeof text, HEAD "%sinsecure: true\n", refused[i].tail);
        pp_config_free(parse_ok(text, NULL));
        static const char *const keys[] = {"", "a", "a, b", "a, b, c"};
        const char *k = keys[refused[i].n_ranks];
        snprintf(text, sizeof text, HEAD "%ssecurity:\n  secret_keys: [%s]\n  public_keys: [%s]\n", refused[i].tail,
                 k, k);
        pp_config_free(parse_ok(text, NULL));
    }
    /* insecure: false is the default, said explicitly. */
    expect_err(HEAD "ranks: [tcp://10.0.0.1:1]\ninsecure: false\n", PP_ERR_INVALID, 4, "key 'ranks[0]'",
               "insecure: true");
    /* Other errors come first: the endpoint rule runs on a config that is
     * otherwise valid. */
    expect_err(HEAD "ranks: [tcp://10.0.0.1:1]\nsteps: -1\n", PP_ERR_INVALID, 5, "key 'steps'", NULL);
}

/* Text nested far too deep fails at once (libyaml's scanner slows down
 * with the depth: 500 KB of brackets used to take over 30 s), with the file
 * and line; 32 levels are allowed, 33 are not. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_nesting_limit(void **state) {
    (void)state;
    const char *head = "model: m.onnx\nbatch_size: 1\ndata: {x: x}\nranks: ";
    size_t half = 250000, hl = strlen(head);
    char *t = malloc(hl + 2 * half + 2);
    assert_non_null(t);
    memcpy(t, head, hl);
    memset(t + hl, '[', half);
    memset(t + hl + half, ']', half);
    strcpy(t + hl + 2 * half, "\n");
    double t0 = now_s();
    expect_err(t, PP_ERR_UNSUPPORTED, 4, "nested more than 32 levels", NULL);
    double took = now_s() - t0;
    if (took > 1.0) fail_msg("500 KB of nested brackets took %.2f s to refuse", took);
    /* Unclosed: still the depth, not a syntax error at the end. */
    t[hl + half] = '\0';
    expect_err(t, PP_ERR_UNSUPPORTED, 4, "nested more than 32 levels", NULL);
    free(t);

    /* The boundary: the top mapping is level 1, so 31 lists under a key
     * are 32 levels (a type error), 32 lists are too many. */
    char text[512];
    int n = snprintf(text, sizeof text, BASE "loss: ");
    for (int i = 0; i < 31; i++) text[n++] = '[';
    for (int i = 0; i < 31; i++) text[n++] = ']';
    strcpy(text + n, "\n");
    expect_err(text, PP_ERR_PARSE, 5, "key 'loss': expected a string", NULL);
    n = snprintf(text, sizeof text, BASE "loss: ");
    for (int i = 0; i < 32; i++) text[n++] = '[';
    for (int i = 0; i < 32; i++) text[n++] = ']';
    strcpy(text + n, "\n");
    expect_err(text, PP_ERR_UNSUPPORTED, 5, "nested more than 32 levels", NULL);

    /* Block style counts the same: 40 nested mappings by indentation. */
    size_t cap = 8192, len = (size_t)snprintf(text, sizeof text, "%s", BASE);
    char *b = malloc(cap);
    assert_non_null(b);
    memcpy(b, text, len);
    for (int i = 0; i < 40; i++) len += (size_t)snprintf(b + len, cap - len, "%*sk%d:\n", 2 * i, "", i);
    expect_err(b, PP_ERR_UNSUPPORTED, 0, "nested more than 32 levels", NULL);
    free(b);

    /* A file over 1 MiB is refused before it is read. */
    char dir[64], file[128];
    snprintf(dir, sizeof dir, "/tmp/pippin-config-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/big.yaml", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    for (int i = 0; i < (1 << 20) / 16 + 1; i++) fputs("# padding line.\n", f);
    fclose(f);
    pp_config *c = (pp_config *)1;
    assert_int_equal(pp_config_load(file, &c), PP_ERR_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(pp_last_error(), file));
    unlink(file);
    rmdir(dir);
}

static void clear_rank_env(void) {
    unsetenv("PIPPIN_RANK");
    unsetenv("SLURM_PROCID");
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("PMI_RANK");
}

static void rank_err(int arg, int nranks, const char *part, const char *part2) {
    int r = 7;
    assert_int_equal(pp_config_rank(arg, nranks, &r), PP_ERR_INVALID);
    assert_int_equal(r, -1);
    if (part && !strstr(pp_last_error(), part)) fail_msg("'%s' lacks '%s'", pp_last_error(), part);
    if (part2 && !strstr(pp_last_error(), part2)) fail_msg("'%s' lacks '%s'", pp_last_error(), part2);
}

static void test_rank(void **state) {
    (void)state;
    int r = -1;
    clear_rank_env();
    rank_err(-1, 2, "--rank", "PIPPIN_RANK");
    TU_OK(pp_config_rank(1, 2, &r));
    assert_int_equal(r, 1);
    TU_OK(pp_config_rank(0, 1, &r));
    assert_int_equal(r, 0);
    rank_err(2, 2, "--rank 2", NULL);
    rank_err(0, 0, "ranks", NULL);

    setenv("PMI_RANK", "3", 1);
    TU_OK(pp_config_rank(-1, 4, &r));
    assert_int_equal(r, 3);
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    TU_OK(pp_config_rank(-1, 4, &r));
    assert_int_equal(r, 2);
    setenv("SLURM_PROCID", "1", 1);
    TU_OK(pp_config_rank(-1, 4, &r));
    assert_int_equal(r, 1);
    setenv("PIPPIN_RANK", "0", 1);
    TU_OK(pp_config_rank(-1, 4, &r));
    assert_int_equal(r, 0);
    TU_OK(pp_config_rank(3, 4, &r)); /* the argument wins */
    assert_int_equal(r, 3);

    setenv("PIPPIN_RANK", "abc", 1);
    rank_err(-1, 4, "PIPPIN_RANK", "abc");
    setenv("PIPPIN_RANK", "-1", 1);
    rank_err(-1, 4, "PIPPIN_RANK", "-1");
    setenv("PIPPIN_RANK", "99999999999999", 1);
    rank_err(-1, 4, "PIPPIN_RANK", NULL);
    setenv("PIPPIN_RANK", "", 1); /* empty: as if unset */
    TU_OK(pp_config_rank(-1, 4, &r));
    assert_int_equal(r, 1);
    unsetenv("PIPPIN_RANK");
    setenv("SLURM_PROCID", "4", 1);
    rank_err(-1, 4, "SLURM_PROCID", "4");
    unsetenv("SLURM_PROCID");
    setenv("OMPI_COMM_WORLD_RANK", " 1", 1);
    rank_err(-1, 4, "OMPI_COMM_WORLD_RANK", NULL);
    unsetenv("OMPI_COMM_WORLD_RANK");
    setenv("PMI_RANK", "9", 1);
    rank_err(-1, 4, "PMI_RANK", "9");
    clear_rank_env();
}

/* spin_us: 0 unless given, a bounded count. share_cores: on by default; a rank joins the host's sharing only with
 * another rank on the host and more CPUs than its own threads, and not
 * when the key says false. */
static void test_share_cores(void **state) {
    (void)state;
    pp_config *c = parse_ok(BASE, "/d");
    assert_int_equal(c->share_cores, 1);
    int joined = 0, other = 0;
    pp_set_threads(1);
    pp_rank_share_cores(c, 0, &joined);
    assert_int_equal(pp_share_cores_joined(), joined);
    if (joined) assert_int_equal(pp_get_threads(), pp_affinity_cpus()); /* room for lent threads */
    pp_rank_share_cores_done(joined);
    assert_false(pp_share_cores_joined());
    assert_int_equal(pp_get_threads(), 1);
    assert_int_equal(c->spin_us, -1); /* spin_us: auto */
    assert_int_equal(pp_worker_spin_us(c, 1), 0); /* training: never */
    pp_config_free(c);
    c = parse_ok(BASE "spin_us: 300\n", "/d");
    assert_int_equal(c->spin_us, 300);
    pp_config_free(c);
    expect_err(BASE "spin_us: -1\n", PP_ERR_INVALID, 0, "spin_us", NULL);
    expect_err(BASE "spin_us: 10001\n", PP_ERR_INVALID, 0, "spin_us", NULL);
    expect_err(BASE "spin_us: fast\n", PP_ERR_PARSE, 0, "spin_us", NULL);
    c = parse_ok(BASE "share_cores: false\n", "/d");
    assert_int_equal(c->share_cores, 0);
    pp_rank_share_cores(c, 0, &joined);
    assert_int_equal(joined, 0);
    pp_rank_share_cores_done(joined);
    pp_config_free(c);
    c = parse_ok("model: m.onnx\nbatch_size: 4\ndata: {x: x.npy}\n"
                 "ranks: [ipc:///tmp/a, tcp://10.0.0.2:1]\ninsecure: true\n", "/d");
    pp_rank_share_cores(c, 0, &joined);
    assert_int_equal(joined, 0); /* alone on this host */
    pp_rank_share_cores_done(joined);
    pp_config_free(c);
    c = parse_ok("model: m.onnx\nbatch_size: 4\ndata: {x: x.npy}\n"
                 "ranks: [inproc://a, inproc://b]\ninsecure: true\n", "/d");
    pp_rank_share_cores(c, 0, &joined);
    assert_int_equal(joined, 0); /* threads of one process */
    pp_rank_share_cores_done(joined);
    pp_config_free(c);
    /* a second worker of the process stops the sharing, for good */
    c = parse_ok(BASE, "/d");
    pp_rank_share_cores(c, 0, &joined);
    pp_rank_share_cores(c, 1, &other);
    assert_int_equal(other, 0);
    assert_false(pp_share_cores_joined());
    pp_rank_share_cores_done(other);
    pp_rank_share_cores_done(joined);
    pp_rank_share_cores(c, 0, &joined);
    assert_int_equal(joined, 0);
    pp_rank_share_cores_done(joined);
    pp_config_free(c);
    expect_err(BASE "share_cores: 3\n", PP_ERR_PARSE, 5, "key 'share_cores'", NULL);
    pp_set_threads(0);
}

/* threads: parsed and range-checked; pp_worker_threads takes a flag, then
 * PIPPIN_THREADS, then the key, then the CPUs over the local ranks. */
static void test_threads(void **state) {
    (void)state;
    unsetenv("PIPPIN_THREADS");
    pp_config *c = parse_ok(BASE, "/d");
    assert_int_equal(c->threads, 0);
    int cpus = pp_default_threads(1);
    /* BASE's two ranks are both loopback: the CPUs are halved */
    assert_int_equal(pp_worker_threads(c, 0, 0), cpus / 2 > 0 ? cpus / 2 : 1);
    assert_int_equal(pp_worker_threads(c, 0, 1), cpus);
    assert_int_equal(pp_worker_threads(c, 5, 0), 5);
    pp_config_free(c);
    c = parse_ok("model: m.onnx\nbatch_size: 4\ndata: {x: x.npy}\n"
                 "ranks: [ipc:///tmp/a, tcp://10.0.0.2:1, tcp://10.0.0.3:1]\ninsecure: true\n", "/d");
    assert_int_equal(pp_worker_threads(c, 0, 0), cpus); /* one rank on this host */
    pp_config_free(c);
    c = parse_ok(BASE "threads: 3\n", "/d");
    assert_int_equal(c->threads, 3);
    assert_int_equal(pp_worker_threads(c, 0, 0), 3);
    assert_int_equal(pp_worker_threads(c, 2, 0), 2);
    setenv("PIPPIN_THREADS", "7", 1);
    assert_int_equal(pp_worker_threads(c, 0, 0), 7);
    assert_int_equal(pp_worker_threads(c, 2, 0), 2);
    assert_int_equal(pp_worker_threads(NULL, 0, 0), 7);
    unsetenv("PIPPIN_THREADS");
    pp_config_free(c);
    expect_err(BASE "threads: -1\n", PP_ERR_INVALID, 5, "key 'threads'", NULL);
    expect_err(BASE "threads: 5000\n", PP_ERR_INVALID, 5, "key 'threads'", NULL);
    expect_err(BASE "threads: many\n", PP_ERR_PARSE, 5, "key 'threads'", NULL);
}

/* device: one spec for all, a list per rank, stage_devices per stage;
 * specs checked for form with the line. */
static void test_devices(void **state) {
    (void)state;
    pp_config *c = parse_ok(BASE, "/d");
    assert_string_equal(pp_config_device(c, 0, 0), "cpu"); /* the default */
    pp_config_free(c);
    c = parse_ok(BASE "device: cuda:1\n", "/d");
    assert_string_equal(pp_config_device(c, 1, 3), "cuda:1");
    pp_config_free(c);
    c = parse_ok(BASE "device: [cuda:0, cpu]\nstage_devices: [fake, cpu, cuda:1]\n", "/d");
    assert_string_equal(pp_config_device(c, 1, 5), "cpu");    /* rank 1's entry */
    assert_string_equal(pp_config_device(c, 0, 5), "cuda:0"); /* no stage 5 entry: rank 0's */
    assert_string_equal(pp_config_device(c, 1, 0), "fake");   /* stage 0's over rank 1's */
    assert_string_equal(pp_config_device(c, 0, 2), "cuda:1");
    pp_config_free(c);
    expect_err(BASE "device: gpu0\n", PP_ERR_INVALID, 5, "key 'device'", "device 'gpu0'");
    expect_err(BASE "device: [cuda:0]\n", PP_ERR_INVALID, 5, "key 'device'", "1 devices for 2 ranks");
    expect_err(BASE "stage_devices:\n  - cpu\n  - cuda:x\n", PP_ERR_INVALID, 7, "key 'stage_devices'",
               "device 'cuda:x'");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_freeze),         cmocka_unit_test(test_text_sgd_csv),
        cmocka_unit_test(test_defaults),     cmocka_unit_test(test_paths),
        cmocka_unit_test(test_type_errors),  cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_value_errors), cmocka_unit_test(test_yaml_errors),
        cmocka_unit_test(test_recompute),
        cmocka_unit_test(test_split_auto),
        cmocka_unit_test(test_checkpoint_run_id),
        cmocka_unit_test(test_serve), cmocka_unit_test(test_protected_mode),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_rank),
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_share_cores),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
