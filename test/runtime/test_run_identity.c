/* The run identity (runtime/run_identity.h): identical configs agree (also
 * through the wire form); each kind of skew is refused naming its key or
 * file (learning rate, microbatches, schedule, batch size, a data file's and
 * the model file's bytes, a key one rank lacks); a tied parameter's copy that
 * differs and a pipe.json without its shared_parameters are refused, on one
 * rank and between ranks, from stage graphs, built stages and a `pippin
 * split` directory; truncated, mutated and garbage bytes fail to decode
 * cleanly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pippin/version.h"
#include "run_identity.h"
#include "test_util.h"

#include "test_filter.h"

#define BASE                                                        \
    "model: model.onnx\n"                                           \
    "schedule: 1f1b\n"                                              \
    "microbatches: 2\n"                                             \
    "batch_size: 4\n"                                               \
    "steps: 3\n"                                                    \
    "optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.01}\n"     \
    "data: {idx: train_idx.npy, targets: train_targets.npy}\n"      \
    "ranks: [inproc://a, inproc://b, inproc://c, inproc://d]\n"

static char fxdir[4096], tmpdir[256];

static int setup(void **state) {
    (void)state;
    snprintf(fxdir, sizeof fxdir, "%s", tu_src_path("test/fixtures/gpt"));
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pippin-test-run-identity-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static pp_config *parse(const char *text) {
    pp_config *c = NULL;
    TU_OK(pp_config_parse(text, strlen(text), "cfg.yaml", fxdir, &c));
    return c;
}

/* The identity of a config alone (no stages). */
static pp_run_identity *identity_of(const char *text) {
    pp_config *c = parse(text);
    pp_run_identity *id;
    TU_OK(pp_run_identity_compute(c, NULL, 0, NULL, &id));
    pp_config_free(c);
    return id;
}

/* text with the first `from` replaced by `to` (malloc'd). */
static char *replace(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    if (!at) fail_msg("'%s' is not in the config", from);
    size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
    char *r = malloc(n);
    assert_non_null(r);
    snprintf(r, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return r;
}

/* Passes through the wire form. */
static pp_run_identity *round_trip(const pp_run_identity *id) {
    uint8_t *b;
    size_t n;
    TU_OK(pp_run_identity_encode(id, &b, &n));
    pp_run_identity *back;
    TU_OK(pp_run_identity_decode(b, n, &back));
    free(b);
    return back;
}

/* mine (rank 0) and theirs (rank 1) must disagree with a message holding
 * part, both ways and through the wire form, and part2 when rank 0 judges
 * (the message says "rank 1's X differs from rank 0's"). */
static void expect_refused(const pp_run_identity *mine, const pp_run_identity *theirs, const char *part,
                           const char *part2) {
    pp_run_identity *wire = round_trip(theirs);
    for (int way = 0; way < 3; way++) {
        pp_status s = way == 0   ? pp_run_identity_compare(mine, 0, theirs, 1)
                      : way == 1 ? pp_run_identity_compare(theirs, 1, mine, 0)
                                 : pp_run_identity_compare(mine, 0, wire, 1);
        if (s != PP_ERR_INVALID) fail_msg("way %d: expected a refusal naming '%s', got %s", way, part, pp_status_name(s));
        const char *msg = pp_last_error();
        if (!strstr(msg, part) || (part2 && way != 1 && !strstr(msg, part2)))
            fail_msg("way %d: the message lacks '%s'/'%s': %s", way, part, part2 ? part2 : "", msg);
        if (!strstr(msg, "rank 0") || !strstr(msg, "rank 1")) fail_msg("the message names no ranks: %s", msg);
    }
    pp_run_identity_free(wire);
}

/* BASE against BASE with `from` replaced by `to`: refused naming part. */
static void expect_config_refused(const char *from, const char *to, const char *part, const char *part2) {
    char *text = replace(BASE, from, to);
    pp_run_identity *a = identity_of(BASE), *b = identity_of(text);
    expect_refused(a, b, part, part2);
    assert_true(pp_run_identity_digest(a) != pp_run_identity_digest(b));
    pp_run_identity_free(a);
    pp_run_identity_free(b);
    free(text);
}

/* A copy of fixture file `name` under tmpdir with byte `at` (from the end
 * when negative) flipped; returns its path (static). */
static const char *perturbed_copy(const char *name, long at) {
    static char path[600];
    char src[5000];
    snprintf(src, sizeof src, "%s/%s", fxdir, name);
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[at < 0 ? n + at : at] ^= 1;
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    free(b);
    return path;
}

/* ---- config and files ---- */

static void test_identical_configs_agree(void **state) {
    (void)state;
    pp_run_identity *a = identity_of(BASE), *b = identity_of(BASE);
    TU_OK(pp_run_identity_compare(a, 0, b, 3));
    TU_OK(pp_run_identity_compare(b, 3, a, 0));
    assert_true(pp_run_identity_digest(a) == pp_run_identity_digest(b));
    pp_run_identity *w = round_trip(b);
    TU_OK(pp_run_identity_compare(a, 0, w, 3));
    assert_true(pp_run_identity_digest(a) == pp_run_identity_digest(w));
    assert_int_equal(pp_run_identity_count(w), pp_run_identity_count(a));
    /* the keys this config gives, and their kinds */
    static const char *const values[] = {"pippin.version", "mode", "schedule", "microbatches", "batch_size", "steps", "loss",
                                         "optimizer.kind", "optimizer.lr", "optimizer.weight_decay",
                                         "optimizer.beta1", "optimizer.beta2", "optimizer.eps", "optimizer.momentum",
                                         "split.before", "freeze", "n_ranks", "ranks", "security",
                                         "checkpoint", "checkpoint.every"};
    for (size_t i = 0; i < sizeof values / sizeof *values; i++) {
        const pp_run_identity_entry *e = pp_run_identity_find(a, values[i]);
        if (!e) fail_msg("no key %s", values[i]);
        assert_int_equal(e->kind, PP_RUN_IDENTITY_VALUE);
    }
    assert_string_equal(pp_run_identity_find(a, "optimizer.lr")->detail, "0.003");
    assert_string_equal(pp_run_identity_find(a, "pippin.version")->detail, pp_version());
    static const char *const files[] = {"model", "data.idx", "data.targets"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        const pp_run_identity_entry *e = pp_run_identity_find(a, files[i]);
        if (!e) fail_msg("no key %s", files[i]);
        assert_int_equal(e->kind, PP_RUN_IDENTITY_FILE);
    }
    /* the order of a mapping's keys does not matter */
    char *text = replace(BASE, "{idx: train_idx.npy, targets: train_targets.npy}",
                         "{targets: train_targets.npy, idx: train_idx.npy}");
    pp_run_identity *c = identity_of(text);
    TU_OK(pp_run_identity_compare(a, 0, c, 1));
    assert_true(pp_run_identity_digest(a) == pp_run_identity_digest(c));
    free(text);
    pp_run_identity_free(a);
    pp_run_identity_free(b);
    pp_run_identity_free(c);
    pp_run_identity_free(w);
}

static void test_config_skew_refused(void **state) {
    (void)state;
    expect_config_refused("lr: 0.003", "lr: 0.0031", "optimizer.lr",
                          "rank 1's optimizer.lr (0.0031) differs from rank 0's (0.003): the ranks' configs do not agree");
    expect_config_refused("weight_decay: 0.01", "weight_decay: 0.02", "optimizer.weight_decay", NULL);
    expect_config_refused("kind: adamw", "kind: sgd", "optimizer.kind", NULL);
    expect_config_refused("microbatches: 2", "microbatches: 4", "microbatches", "(4)");
    expect_config_refused("schedule: 1f1b", "schedule: gpipe", "schedule", "gpipe");
    expect_config_refused("batch_size: 4", "batch_size: 8", "batch_size", "(8)");
    expect_config_refused("steps: 3", "steps: 4", "steps", NULL);
    expect_config_refused("inproc://d", "inproc://e", "ranks", NULL);
    expect_config_refused("steps: 3\n", "steps: 3\nmode: infer\n", "mode", NULL);
    /* shared_memory changes no number: each host may set it */
    expect_config_refused("steps: 3\n", "steps: 3\nsplit: {transmit_shared: true}\n", "split.transmit_shared", NULL);
    expect_config_refused("steps: 3\n", "steps: 3\nfreeze: [\"pos_emb.*\"]\n", "freeze", NULL);
    expect_config_refused("steps: 3\n", "steps: 3\ncheckpoint: {dir: ck, every: 2}\n", "checkpoint", NULL);
    /* a key only one rank has */
    expect_config_refused("steps: 3\n", "steps: 3\nrun_id: other\n", "run_id",
                          "rank 1 has run_id (other) and rank 0 has none");
    expect_config_refused("steps: 3\n", "steps: 3\ndims: {seq: 16}\n", "dims.seq", "rank 1 has dims.seq (16) and rank 0 has none");
}

static void test_file_skew_refused(void **state) {
    (void)state;
    char from[5000], to[700];
    /* the data file's last byte (a sample) */
    const char *idx = perturbed_copy("train_idx.npy", -1);
    snprintf(to, sizeof to, "idx: %s", idx);
    snprintf(from, sizeof from, "the file %s differs", idx);
    expect_config_refused("idx: train_idx.npy", to, "data.idx", from);
    /* the model file's last byte */
    const char *model = perturbed_copy("model.onnx", -1);
    snprintf(to, sizeof to, "model: %s", model);
    snprintf(from, sizeof from, "the file %s differs", model);
    expect_config_refused("model: model.onnx", to, "model differs", from);
    /* the same bytes elsewhere agree */
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "cp '%s/train_idx.npy' '%s/same.npy'", fxdir, tmpdir);
    assert_int_equal(system(cmd), 0);
    snprintf(to, sizeof to, "idx: %s/same.npy", tmpdir);
    char *text = replace(BASE, "idx: train_idx.npy", to);
    pp_run_identity *a = identity_of(BASE), *b = identity_of(text);
    TU_OK(pp_run_identity_compare(a, 0, b, 1));
    free(text);
    pp_run_identity_free(a);
    pp_run_identity_free(b);
    /* a file that cannot be read is named */
    pp_config *c = parse(BASE);
    free(c->data[0].value);
    c->data[0].value = strdup("/nonexistent/x.npy");
    pp_run_identity *id = (pp_run_identity *)1;
    assert_int_equal(pp_run_identity_compute(c, NULL, 0, NULL, &id), PP_ERR_IO);
    assert_null(id);
    assert_non_null(strstr(pp_last_error(), "/nonexistent/x.npy"));
    pp_config_free(c);
}

/* ---- tied parameters ---- */

static pp_pipe *split_gpt(void) {
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    const char *dims[] = {"seq=16"};
    TU_OK(pp_pipe_probe_shapes(p, 1, dims));
    assert_int_equal(p->n_stages, 4);
    assert_int_equal(p->n_shared, 1);
    assert_string_equal(p->shared[0].name, "tok_emb.weight");
    return p;
}

/* The identity of a rank holding the given stages' graphs of p. */
static pp_status graphs_identity(const pp_config *c, const pp_pipe *p, int n, const int *stages,
                                 pp_run_identity **out) {
    const pp_graph *g[4];
    for (int i = 0; i < n; i++) g[i] = p->stages[stages[i]];
    return pp_run_identity_compute_graphs(c, p, n, g, stages, out);
}

static float *tok_emb(pp_graph *g) {
    int v = pp_graph_find_value(g, "tok_emb.weight");
    assert_true(v >= 0);
    return g->values[v].data->data;
}

static void test_tied_copy_from_graphs(void **state) {
    (void)state;
    pp_config *c = parse(BASE);
    pp_pipe *p = split_gpt();
    pp_run_identity *r0, *r3;
    TU_OK(graphs_identity(c, p, 1, (int[]){0}, &r0));
    TU_OK(graphs_identity(c, p, 1, (int[]){3}, &r3));
    const pp_run_identity_entry *e = pp_run_identity_find(r3, "param.tok_emb.weight");
    assert_non_null(e);
    assert_int_equal(e->kind, PP_RUN_IDENTITY_PARAM);
    assert_int_equal(e->stage, 3);
    assert_true(e->flags & PP_RUN_IDENTITY_SHARED);
    TU_OK(pp_run_identity_compare(r0, 0, r3, 1));
    /* parameters are not part of the common digest */
    assert_true(pp_run_identity_digest(r0) == pp_run_identity_digest(r3));
    /* stage 3's copy differs */
    tok_emb(p->stages[3])[5] += 1e-3f;
    pp_run_identity *bad;
    TU_OK(graphs_identity(c, p, 1, (int[]){3}, &bad));
    expect_refused(r0, bad, "copy of shared parameter 'tok_emb.weight'", "the stage files do not agree");
    /* ... and on one rank holding both */
    pp_run_identity *both = (pp_run_identity *)1;
    assert_int_equal(graphs_identity(c, p, 2, (int[]){0, 3}, &both), PP_ERR_INVALID);
    assert_null(both);
    assert_non_null(strstr(pp_last_error(), "stage 3's copy of 'tok_emb.weight' differs from stage 0's"));
    tok_emb(p->stages[3])[5] -= 1e-3f;
    TU_OK(graphs_identity(c, p, 2, (int[]){0, 3}, &both));
    TU_OK(pp_run_identity_compare(r0, 0, both, 1));
    /* a pipe that does not list the sharing: each copy would train alone */
    int n_shared = p->n_shared;
    p->n_shared = 0;
    pp_run_identity *u0, *u3, *u;
    TU_OK(graphs_identity(c, p, 1, (int[]){0}, &u0));
    TU_OK(graphs_identity(c, p, 1, (int[]){3}, &u3));
    expect_refused(u0, u3, "parameter 'tok_emb.weight' is in rank", "does not list it as shared");
    assert_int_equal(graphs_identity(c, p, 2, (int[]){0, 3}, &u), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "is in stage 0 and stage 3, but the pipe does not list it as shared"));
    p->n_shared = n_shared;
    pp_run_identity_free(r0);
    pp_run_identity_free(r3);
    pp_run_identity_free(bad);
    pp_run_identity_free(both);
    pp_run_identity_free(u0);
    pp_run_identity_free(u3);
    pp_pipe_free(p);
    pp_config_free(c);
}

/* Built training stages (their graphs hold the autodiff's constants, whose
 * names repeat across stages): the ranks agree until one copy is changed
 * through the flat parameters. */
static void test_tied_copy_from_stages(void **state) {
    (void)state;
    pp_config *c = parse(BASE);
    pp_pipe *p = split_gpt();
    pp_stage *st[4];
    for (int k = 0; k < 4; k++) TU_OK(pp_stage_from_pipe(p, k, 1, &st[k]));
    pp_run_identity *id[4];
    for (int k = 0; k < 4; k++) TU_OK(pp_run_identity_compute(c, p, 1, &st[k], &id[k]));
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            if (a != b) TU_OK(pp_run_identity_compare(id[a], a, id[b], b));
    pp_flat_params *fp = pp_stage_params(st[3]);
    int i = pp_flat_params_find(fp, "tok_emb.weight");
    assert_true(i >= 0);
    fp->data[fp->offset[i] + 7] *= 2.0f;
    pp_run_identity *bad;
    TU_OK(pp_run_identity_compute(c, p, 1, &st[3], &bad));
    expect_refused(id[0], bad, "copy of shared parameter 'tok_emb.weight'", "(stage 3) differs from rank 0's (stage 0)");
    TU_OK(pp_run_identity_compare(id[1], 1, bad, 3)); /* rank 1 holds no copy */
    pp_run_identity *two = (pp_run_identity *)1;
    assert_int_equal(pp_run_identity_compute(c, p, 2, (pp_stage *[]){st[0], st[3]}, &two), PP_ERR_INVALID);
    pp_run_identity_free(bad);
    for (int k = 0; k < 4; k++) {
        pp_run_identity_free(id[k]);
        pp_stage_free(st[k]);
    }
    pp_pipe_free(p);
    pp_config_free(c);
}

/* stages: a `pippin split` directory, each rank loading its own stage
 * files; a pipe.json without shared_parameters is refused. */
static void test_stages_dir(void **state) {
    (void)state;
    pp_pipe *p = split_gpt();
    char good[400], bare[400];
    snprintf(good, sizeof good, "%s/split", tmpdir);
    snprintf(bare, sizeof bare, "%s/bare", tmpdir);
    TU_OK(pp_pipe_save(p, good));
    int n_shared = p->n_shared;
    p->n_shared = 0;
    TU_OK(pp_pipe_save(p, bare));
    p->n_shared = n_shared;
    pp_pipe_free(p);
    const char *dirs[2] = {good, bare};
    for (int d = 0; d < 2; d++) {
        char text[2000];
        snprintf(text, sizeof text, "stages: %s\n%s", dirs[d], strstr(BASE, "schedule:"));
        pp_config *c = parse(text);
        pp_run_identity *id[4];
        for (int k = 0; k < 4; k++) {
            pp_pipe *q;
            TU_OK(pp_pipe_load_meta(dirs[d], &q));
            TU_OK(pp_pipe_load_graph(q, dirs[d], k));
            TU_OK(graphs_identity(c, q, 1, &k, &id[k]));
            pp_pipe_free(q);
        }
        const pp_run_identity_entry *e = pp_run_identity_find(id[0], "stages/pipe.json");
        assert_non_null(e);
        assert_int_equal(e->kind, PP_RUN_IDENTITY_FILE);
        assert_null(pp_run_identity_find(id[0], "model"));
        TU_OK(pp_run_identity_compare(id[0], 0, id[1], 1));
        if (d == 0) TU_OK(pp_run_identity_compare(id[0], 0, id[3], 3));
        else expect_refused(id[0], id[3], "tok_emb.weight", "missing its shared_parameters");
        for (int k = 0; k < 4; k++) pp_run_identity_free(id[k]);
        pp_config_free(c);
    }
}

/* ---- the wire form ---- */

static void expect_parse_error(const uint8_t *b, size_t n, const char *part) {
    pp_run_identity *id = (pp_run_identity *)1;
    pp_status s = pp_run_identity_decode(b, n, &id);
    if (s != PP_ERR_PARSE) fail_msg("%zu bytes: expected PARSE, got %s", n, pp_status_name(s));
    assert_null(id);
    if (part && !strstr(pp_last_error(), part)) fail_msg("the message lacks '%s': %s", part, pp_last_error());
}

static void test_decode_hostile(void **state) {
    (void)state;
    pp_config *c = parse(BASE);
    pp_pipe *p = split_gpt();
    pp_run_identity *id;
    TU_OK(graphs_identity(c, p, 1, (int[]){3}, &id));
    uint8_t *b;
    size_t n;
    TU_OK(pp_run_identity_encode(id, &b, &n));
    /* every truncation */
    for (size_t k = 0; k < n; k++) expect_parse_error(b, k, NULL);
    expect_parse_error(NULL, 0, "shorter");
    /* one byte more */
    uint8_t *longer = malloc(n + 1);
    memcpy(longer, b, n);
    longer[n] = 0;
    expect_parse_error(longer, n + 1, "left over");
    free(longer);
    /* header fields */
    uint8_t *m = malloc(n);
    memcpy(m, b, n);
    m[0] = 'X';
    expect_parse_error(m, n, "magic");
    memcpy(m, b, n);
    m[4] = 2;
    expect_parse_error(m, n, "version");
    memcpy(m, b, n);
    m[8] = m[9] = m[10] = m[11] = 0xff;
    expect_parse_error(m, n, "entries");
    /* the first entry: kind, flags, key length, a control character, a duplicate */
    memcpy(m, b, n);
    m[12] = 9;
    expect_parse_error(m, n, "kind");
    memcpy(m, b, n);
    m[13] = 0x80;
    expect_parse_error(m, n, "flags");
    memcpy(m, b, n);
    m[14] = 0xff, m[15] = 0xff;
    expect_parse_error(m, n, "out of bounds");
    memcpy(m, b, n);
    m[14] = 0, m[15] = 0;
    expect_parse_error(m, n, "out of bounds");
    memcpy(m, b, n);
    m[12 + 18] = '\n';
    expect_parse_error(m, n, "control character");
    memcpy(m, b, n);
    m[18] = 0xfe, m[19] = m[20] = m[21] = 0xff; /* stage -2 */
    expect_parse_error(m, n, "stage");
    /* two entries with one key ("k") */
    static const uint8_t dup[] = {'P', 'P', 'R', 'I', 1, 0, 0, 0, 2, 0, 0, 0,
                                  0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 'k',
                                  0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 9, 'k'};
    expect_parse_error(dup, sizeof dup, "twice");
    uint8_t one[sizeof dup];
    memcpy(one, dup, sizeof dup);
    one[8] = 1; /* the first entry alone decodes */
    pp_run_identity *single;
    TU_OK(pp_run_identity_decode(one, sizeof dup - 19, &single));
    assert_int_equal(pp_run_identity_count(single), 1);
    assert_int_equal(pp_run_identity_entry_at(single, 0)->stage, -1);
    pp_run_identity_free(single);
    /* random mutations: either refused or decoded; nothing crashes */
    uint64_t rng = 0x1234567;
    int decoded = 0;
    for (int t = 0; t < 3000; t++) {
        memcpy(m, b, n);
        int flips = 1 + (int)(tu_xorshift(&rng) % 4);
        for (int f = 0; f < flips; f++) m[tu_xorshift(&rng) % n] = (uint8_t)tu_xorshift(&rng);
        size_t len = t % 3 == 0 ? (size_t)(tu_xorshift(&rng) % (n + 1)) : n;
        pp_run_identity *x;
        if (pp_run_identity_decode(m, len, &x) == PP_OK) {
            decoded++;
            (void)pp_run_identity_compare(id, 0, x, 1);
            (void)pp_run_identity_digest(x);
            pp_run_identity_free(x);
        }
    }
    assert_true(decoded > 0); /* e.g. a changed hash byte still decodes */
    /* garbage */
    for (int t = 0; t < 2000; t++) {
        size_t len = (size_t)(tu_xorshift(&rng) % 200);
        uint8_t g[200];
        for (size_t k = 0; k < len; k++) g[k] = (uint8_t)tu_xorshift(&rng);
        if (len >= 5 && t % 2) memcpy(g, "PPRI\1", 5);
        pp_run_identity *x;
        if (pp_run_identity_decode(g, len, &x) == PP_OK) pp_run_identity_free(x);
    }
    /* the pp_agree_bytes check: a peer's garbage is its fault */
    pp_run_identity_peer me = {id, 0};
    assert_int_equal(pp_run_identity_check_peer(&me, 2, (const uint8_t *)"junk", 4), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "rank 2's run identity"));
    TU_OK(pp_run_identity_check_peer(&me, 2, b, n));
    free(m);
    free(b);
    pp_run_identity_free(id);
    pp_pipe_free(p);
    pp_config_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_configs_agree), cmocka_unit_test(test_config_skew_refused),
        cmocka_unit_test(test_file_skew_refused),       cmocka_unit_test(test_tied_copy_from_graphs),
        cmocka_unit_test(test_tied_copy_from_stages),   cmocka_unit_test(test_stages_dir),
        cmocka_unit_test(test_decode_hostile),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
