/* ONNX external data: the mlp fixture re-saved by onnx with its weights in
 * a side file gives the same numbers as the original; pippin's own writer
 * round-trips (whole models and split stages); and every hostile side-file
 * reference (escaping paths, symlinks, offsets past the end, wrong lengths,
 * missing files, models parsed from memory) is refused with a message that
 * names the initializer and the file; a model or side file truncated while
 * it is being loaded is an error, not a SIGBUS. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "onnx.pb-c.h"
#include "test_util.h"

#include "test_filter.h"

static char tmp_dir[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/pippin-ext-XXXXXX");
    assert_non_null(mkdtemp(tmp_dir));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* tmp_dir/rel in a rotating buffer (several live at once). */
static const char *tmp_path(const char *rel) {
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", tmp_dir, rel);
    return b;
}

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*len ? *len : 1);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

static void write_all(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("%s: cannot create", path);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* ------------------------------------------------ the onnx-made fixture */

/* Runs g's forward and backward (loss seed 0.25) on the mlp inputs. */
static pp_tensor **run_mlp(pp_graph *g, pp_backward **b, int *n_out) {
    TU_OK(pp_autodiff_model(g, NULL, 0, b));
    pp_tensor *ins[3] = {tu_fixture_npy("mlp", "x.npy"), tu_fixture_npy("mlp", "y.npy"), NULL};
    TU_OK(pp_tensor_scalar_f32(0.25f, &ins[2]));
    assert_int_equal(g->n_inputs, 3);
    pp_tensor **outs = calloc((size_t)g->n_outputs, sizeof *outs);
    TU_OK(pp_graph_run(g, ins, outs));
    for (int i = 0; i < 3; i++) pp_tensor_free(ins[i]);
    *n_out = g->n_outputs;
    return outs;
}

/* The loss, the logits and every parameter gradient of a and b are equal
 * bit for bit. */
static void expect_same_training(pp_graph *a, pp_graph *b) {
    pp_backward *ba, *bb;
    int na, nb;
    pp_tensor **oa = run_mlp(a, &ba, &na), **ob = run_mlp(b, &bb, &nb);
    assert_int_equal(na, nb);
    assert_int_equal(ba->n_params, 6);
    assert_int_equal(bb->n_params, 6);
    for (int i = 0; i < na; i++) {
        assert_int_equal(oa[i]->nbytes, ob[i]->nbytes);
        if (memcmp(oa[i]->data, ob[i]->data, oa[i]->nbytes) != 0)
            fail_msg("output '%s' differs", a->values[a->outputs[i]].name);
    }
    for (int i = 0; i < na; i++) {
        pp_tensor_free(oa[i]);
        pp_tensor_free(ob[i]);
    }
    free(oa);
    free(ob);
    pp_backward_free(ba);
    pp_backward_free(bb);
}

/* Parameter tensors of a and b hold the same bytes. */
static void expect_same_initializers(const pp_graph *a, const pp_graph *b) {
    int n = 0;
    for (int v = 0; v < a->n_values; v++) {
        const pp_value *va = &a->values[v];
        if ((va->kind != PP_VALUE_PARAM && va->kind != PP_VALUE_CONST) || !va->data) continue;
        int w = pp_graph_find_value(b, va->name);
        if (w < 0 || !b->values[w].data) fail_msg("initializer '%s' is missing", va->name);
        assert_int_equal(b->values[w].kind, va->kind);
        const pp_tensor *ta = va->data, *tb = b->values[w].data;
        assert_int_equal(ta->dtype, tb->dtype);
        assert_true(pp_shape_equal(ta->ndim, ta->shape, tb->ndim, tb->shape));
        if (ta->nbytes && memcmp(ta->data, tb->data, ta->nbytes) != 0)
            fail_msg("initializer '%s' differs", va->name);
        n++;
    }
    assert_true(n > 0);
}

static void test_fixture_matches_mlp(void **state) {
    (void)state;
    pp_graph *ext = tu_fixture_onnx("external", "model.onnx");
    pp_graph *mlp = tu_fixture_onnx("mlp", "model.onnx");
    expect_same_initializers(mlp, ext);
    /* a weight outlives its graph */
    int w = pp_graph_find_value(ext, "fc2.weight");
    assert_true(w >= 0);
    pp_tensor *kept = pp_tensor_retain(ext->values[w].data);
    expect_same_training(mlp, ext);
    pp_graph_free(ext);
    pp_tensor *want = pp_tensor_retain(mlp->values[pp_graph_find_value(mlp, "fc2.weight")].data);
    assert_memory_equal(kept->data, want->data, want->nbytes);
    /* writing a loaded weight never reaches the file */
    ((float *)kept->data)[0] += 1.0f;
    pp_tensor_free(kept);
    pp_graph *again = tu_fixture_onnx("external", "model.onnx");
    assert_memory_equal(again->values[pp_graph_find_value(again, "fc2.weight")].data->data, want->data,
                        want->nbytes);
    pp_tensor_free(want);
    pp_graph_free(again);
    pp_graph_free(mlp);
}

/* Bytes in memory have no directory: external data is refused, naming the
 * initializer and the file (and the fuzzer cannot reach the file system). */
static void test_parse_from_memory_refused(void **state) {
    (void)state;
    size_t len;
    unsigned char *buf = read_all(tu_src_path("test/fixtures/external/model.onnx"), &len);
    pp_graph *g = NULL;
    assert_int_equal(pp_onnx_parse(buf, len, "mem.onnx", &g), PP_ERR_UNSUPPORTED);
    assert_null(g);
    const char *e = pp_last_error();
    assert_non_null(strstr(e, "mem.onnx"));
    assert_non_null(strstr(e, "fc1.weight"));
    assert_non_null(strstr(e, "model.data"));
    assert_non_null(strstr(e, "memory"));
    free(buf);
}

/* ------------------------------------------------ pippin's writer */

static void test_save_round_trip(void **state) {
    (void)state;
    pp_graph *mlp = tu_fixture_onnx("mlp", "model.onnx");
    pp_onnx_save_options o;
    pp_onnx_save_options_init(&o);
    assert_int_equal(o.external_data, PP_ONNX_EXTERNAL_AUTO);
    /* the default: small models stay in one file */
    TU_OK(pp_onnx_save_with(mlp, tmp_path("auto.onnx"), &o));
    assert_false(exists(tmp_path("auto.onnx.data")));
    /* forced: the three weights (1 KiB and more) move, the biases stay */
    o.external_data = PP_ONNX_EXTERNAL_ALWAYS;
    TU_OK(pp_onnx_save_with(mlp, tmp_path("ext.onnx"), &o));
    assert_true(exists(tmp_path("ext.onnx.data")));
    size_t len;
    unsigned char *buf = read_all(tmp_path("ext.onnx"), &len);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
    assert_non_null(m);
    int n_ext = 0;
    for (size_t i = 0; i < m->graph->n_initializer; i++) {
        const Onnx__TensorProto *tp = m->graph->initializer[i];
        int ext = tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
        n_ext += ext;
        assert_int_equal(ext, strstr(tp->name, "weight") != NULL);
        for (size_t k = 0; ext && k < tp->n_external_data; k++) {
            const Onnx__StringStringEntryProto *e = tp->external_data[k];
            if (!strcmp(e->key, "location")) assert_string_equal(e->value, "ext.onnx.data");
            if (!strcmp(e->key, "offset")) assert_int_equal(strtoull(e->value, NULL, 10) % 64, 0);
        }
    }
    assert_int_equal(n_ext, 3);
    onnx__model_proto__free_unpacked(m, NULL);
    free(buf);
    pp_graph *g = NULL;
    TU_OK(pp_onnx_load(tmp_path("ext.onnx"), &g));
    expect_same_initializers(mlp, g);
    expect_same_training(mlp, g);
    /* saving over the files the graph was loaded from: the new pair
     * replaces the old by rename, the loaded graph keeps its bytes */
    o.external_min_bytes = 0;
    TU_OK(pp_onnx_save_with(g, tmp_path("ext.onnx"), &o));
    expect_same_initializers(mlp, g);
    pp_graph *h = NULL;
    TU_OK(pp_onnx_load(tmp_path("ext.onnx"), &h));
    expect_same_initializers(mlp, h);
    pp_graph_free(h);
    pp_graph_free(g);
    o.external_data = (pp_onnx_external_mode)7;
    assert_int_equal(pp_onnx_save_with(mlp, tmp_path("bad.onnx"), &o), PP_ERR_INVALID);
    pp_graph_free(mlp);
}

/* Runs the pipe's stages in order on the mlp inputs, each stage fed by name
 * from the model inputs and earlier stages' outputs; returns the loss and
 * the logits. */
static void run_pipe(pp_pipe *p, pp_tensor **loss, pp_tensor **logits) {
    enum { MAXV = 32 };
    const char *names[MAXV];
    pp_tensor *vals[MAXV];
    int nv = 0;
    names[nv] = "x";
    vals[nv++] = tu_fixture_npy("mlp", "x.npy");
    names[nv] = "y";
    vals[nv++] = tu_fixture_npy("mlp", "y.npy");
    *loss = *logits = NULL;
    for (int s = 0; s < p->n_stages; s++) {
        pp_graph *g = p->stages[s];
        pp_tensor *ins[8], *outs[8];
        assert_true(g->n_inputs <= 8 && g->n_outputs <= 8);
        for (int i = 0; i < g->n_inputs; i++) {
            ins[i] = NULL;
            for (int k = 0; k < nv; k++)
                if (!strcmp(names[k], g->values[g->inputs[i]].name)) ins[i] = vals[k];
            if (!ins[i]) fail_msg("stage %d: no value for input '%s'", s, g->values[g->inputs[i]].name);
        }
        TU_OK(pp_graph_run(g, ins, outs));
        for (int o = 0; o < g->n_outputs; o++) {
            assert_true(nv < MAXV);
            names[nv] = g->values[g->outputs[o]].name;
            vals[nv++] = outs[o];
        }
    }
    for (int k = 0; k < nv; k++) {
        if (!strcmp(names[k], "loss")) *loss = pp_tensor_retain(vals[k]);
        if (!strcmp(names[k], "logits")) *logits = pp_tensor_retain(vals[k]);
        pp_tensor_free(vals[k]);
    }
    assert_non_null(*loss);
    assert_non_null(*logits);
}

/* pp_pipe_save_with forced external data: every stage file has its side
 * file, reloading gives the same weights and the same numbers. */
static void test_split_round_trip(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("external", "model.onnx");
    pp_split_spec spec;
    pp_split_spec_init(&spec);
    pp_pipe *p = NULL, *q = NULL;
    TU_OK(pp_pipe_split(g, &spec, &p));
    assert_int_equal(p->n_stages, 3);
    pp_onnx_save_options o;
    pp_onnx_save_options_init(&o);
    o.external_data = PP_ONNX_EXTERNAL_ALWAYS;
    o.external_min_bytes = 0;
    const char *dir = tmp_path("pipe");
    TU_OK(pp_pipe_save_with(p, dir, &o));
    for (int s = 0; s < p->n_stages; s++) {
        char rel[64];
        snprintf(rel, sizeof rel, "pipe/stage_%d.onnx.data", s);
        if (!exists(tmp_path(rel))) fail_msg("%s was not written", rel);
    }
    TU_OK(pp_pipe_load(dir, &q));
    assert_int_equal(q->n_stages, p->n_stages);
    for (int s = 0; s < p->n_stages; s++) expect_same_initializers(p->stages[s], q->stages[s]);
    pp_tensor *l1, *g1, *l2, *g2;
    run_pipe(p, &l1, &g1);
    run_pipe(q, &l2, &g2);
    assert_memory_equal(l1->data, l2->data, l1->nbytes);
    assert_memory_equal(g1->data, g2->data, g1->nbytes);
    tu_expect(l2, tu_fixture_npy("mlp", "out_loss.npy"), 1e-5, 1e-6, "loss");
    tu_expect(g2, tu_fixture_npy("mlp", "out_logits.npy"), 1e-4, 1e-5, "logits");
    pp_tensor_free(l1);
    pp_tensor_free(g1);
    /* one stage alone, as a worker loads it */
    pp_pipe *r = NULL;
    TU_OK(pp_pipe_load_stage(dir, 1, &r));
    expect_same_initializers(p->stages[1], r->stages[1]);
    pp_pipe_free(r);
    pp_pipe_free(q);
    pp_pipe_free(p);
    pp_graph_free(g);
}

/* ------------------------------------------------ hostile references */

/* y = x + w with w float32 [4] = {1, 2, 3, 4} saved by pippin with w in
 * DIR/base.onnx.data; returns the model bytes (unpacked, for editing). */
static Onnx__ModelProto *small_external(const char *path) {
    pp_graph *g;
    TU_OK(pp_graph_new("small", &g));
    int x, w, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 1, SHAPE(4), &x));
    TU_OK(pp_graph_add_initializer(g, "w", PP_VALUE_PARAM, F32(1, SHAPE(4), 1, 2, 3, 4), &w));
    const char *outs[] = {"y"};
    TU_OK(pp_graph_add_node(g, "Add", "", "add", 2, (int[]){x, w}, 1, outs, &n));
    TU_OK(pp_graph_add_output(g, g->nodes[n].out[0]));
    pp_onnx_save_options o;
    pp_onnx_save_options_init(&o);
    o.external_data = PP_ONNX_EXTERNAL_ALWAYS;
    o.external_min_bytes = 0;
    TU_OK(pp_onnx_save_with(g, path, &o));
    pp_graph_free(g);
    size_t len;
    unsigned char *buf = read_all(path, &len);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(m);
    assert_int_equal(m->graph->n_initializer, 1);
    assert_int_equal(m->graph->initializer[0]->n_external_data, 3);
    return m;
}

/* Writes m with w's entries set to location / offset / length (NULL: the
 * entry left out) as tmp_dir/<name>. */
static const char *write_variant(Onnx__ModelProto *m, const char *name, const char *location,
                                 const char *offset, const char *length) {
    Onnx__TensorProto *tp = m->graph->initializer[0];
    Onnx__StringStringEntryProto e[3], *ep[3];
    const char *keys[3] = {"location", "offset", "length"}, *vals[3] = {location, offset, length};
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        if (!vals[i]) continue;
        onnx__string_string_entry_proto__init(&e[n]);
        e[n].key = (char *)keys[i];
        e[n].value = (char *)vals[i];
        ep[n] = &e[n];
        n++;
    }
    size_t saved_n = tp->n_external_data;
    Onnx__StringStringEntryProto **saved = tp->external_data;
    tp->n_external_data = n;
    tp->external_data = ep;
    size_t len = onnx__model_proto__get_packed_size(m);
    unsigned char *buf = malloc(len);
    onnx__model_proto__pack(m, buf);
    tp->n_external_data = saved_n;
    tp->external_data = saved;
    const char *path = tmp_path(name);
    write_all(path, buf, len);
    free(buf);
    return path;
}

/* Loading path fails with code; the message names the model file, the
 * initializer 'w' and holds each of the parts given. */
static void expect_refused(const char *path, pp_status code, const char *part1, const char *part2) {
    pp_graph *g = NULL;
    pp_status s = pp_onnx_load(path, &g);
    if (s == PP_OK) fail_msg("%s loaded", path);
    assert_null(g);
    const char *e = pp_last_error();
    if (s != code) fail_msg("%s: status %d, wanted %d: %s", path, (int)s, (int)code, e);
    if (!strstr(e, path) || !strstr(e, "'w'")) fail_msg("%s: message does not name model and initializer: %s", path, e);
    if (part1 && !strstr(e, part1)) fail_msg("%s: message lacks '%s': %s", path, part1, e);
    if (part2 && !strstr(e, part2)) fail_msg("%s: message lacks '%s': %s", path, part2, e);
}

static void expect_w(const char *path) {
    pp_graph *g = NULL;
    pp_status s = pp_onnx_load(path, &g);
    if (s != PP_OK) fail_msg("%s: %s", path, pp_last_error());
    pp_tensor *w = g->values[pp_graph_find_value(g, "w")].data;
    tu_expect(pp_tensor_retain(w), F32(1, SHAPE(4), 1, 2, 3, 4), 0, 0, "w");
    pp_graph_free(g);
}

static void test_hostile_references(void **state) {
    (void)state;
    assert_int_equal(mkdir(tmp_path("m"), 0777), 0);
    assert_int_equal(mkdir(tmp_path("m/sub"), 0777), 0);
    assert_int_equal(mkdir(tmp_path("out"), 0777), 0);
    Onnx__ModelProto *m = small_external(tmp_path("m/base.onnx"));
    expect_w(tmp_path("m/base.onnx"));
    /* a valid copy of the side file outside the model's directory */
    size_t dlen;
    unsigned char *data = read_all(tmp_path("m/base.onnx.data"), &dlen);
    assert_int_equal(dlen, 16);
    write_all(tmp_path("out/w.data"), data, dlen);
    write_all(tmp_path("m/sub/w.data"), data, dlen);
    unsigned char shifted[21] = {9, 9, 9, 9};
    memcpy(shifted + 4, data, 16);
    write_all(tmp_path("m/shifted.data"), shifted, sizeof shifted);

    /* accepted: a subdirectory, an inner symlink, a misaligned offset
     * (copied), no length (the rest of the file), './' */
    expect_w(write_variant(m, "m/a.onnx", "sub/w.data", "0", "16"));
    assert_int_equal(symlink("sub/w.data", tmp_path("m/alias.data")), 0);
    expect_w(write_variant(m, "m/b.onnx", "alias.data", "0", "16"));
    expect_w(write_variant(m, "m/c.onnx", "shifted.data", "4", "16"));
    expect_w(write_variant(m, "m/d.onnx", "./sub//w.data", NULL, NULL));

    /* refused */
    expect_refused(write_variant(m, "m/e1.onnx", "../out/w.data", "0", "16"), PP_ERR_INVALID, "../out/w.data",
                   "'..'");
    expect_refused(write_variant(m, "m/e2.onnx", "sub/../../out/w.data", "0", "16"), PP_ERR_INVALID, "'..'", NULL);
    expect_refused(write_variant(m, "m/e3.onnx", tmp_path("out/w.data"), "0", "16"), PP_ERR_INVALID, "absolute",
                   NULL);
    assert_int_equal(symlink("../out/w.data", tmp_path("m/escape.data")), 0);
    expect_refused(write_variant(m, "m/e4.onnx", "escape.data", "0", "16"), PP_ERR_INVALID, "escape.data",
                   "outside the model's directory");
    assert_int_equal(symlink(tmp_path("out"), tmp_path("m/outdir")), 0);
    expect_refused(write_variant(m, "m/e5.onnx", "outdir/w.data", "0", "16"), PP_ERR_INVALID, "outdir/w.data",
                   "outside");
    expect_refused(write_variant(m, "m/e6.onnx", "base.onnx.data", "1000", "16"), PP_ERR_PARSE, "base.onnx.data",
                   "past its end");
    expect_refused(write_variant(m, "m/e7.onnx", "base.onnx.data", "4", "16"), PP_ERR_PARSE, "past its end", NULL);
    expect_refused(write_variant(m, "m/e8.onnx", "base.onnx.data", "18446744073709551615", "16"), PP_ERR_PARSE,
                   "past its end", NULL);
    expect_refused(write_variant(m, "m/e9.onnx", "base.onnx.data", "0", "12"), PP_ERR_PARSE, "12 bytes",
                   "needs 16");
    expect_refused(write_variant(m, "m/e10.onnx", "base.onnx.data", "0", "18446744073709551615"), PP_ERR_PARSE,
                   "needs 16", NULL);
    expect_refused(write_variant(m, "m/e11.onnx", "base.onnx.data", "8", NULL), PP_ERR_PARSE, "gives 8 bytes", NULL);
    expect_refused(write_variant(m, "m/e12.onnx", "missing.data", "0", "16"), PP_ERR_IO, "missing.data",
                   "No such file");
    expect_refused(write_variant(m, "m/e13.onnx", "sub", "0", "16"), PP_ERR_IO, "not a regular file", NULL);
    expect_refused(write_variant(m, "m/e14.onnx", "base.onnx.data", "-1", "16"), PP_ERR_PARSE, "offset '-1'", NULL);
    expect_refused(write_variant(m, "m/e15.onnx", "base.onnx.data", "0", "16 "), PP_ERR_PARSE, "length '16 '",
                   NULL);
    expect_refused(write_variant(m, "m/e16.onnx", NULL, "0", "16"), PP_ERR_PARSE, "location", NULL);
    expect_refused(write_variant(m, "m/e17.onnx", "", "0", "16"), PP_ERR_PARSE, "location", NULL);
    assert_int_equal(mkfifo(tmp_path("m/fifo"), 0600), 0);
    expect_refused(write_variant(m, "m/e18.onnx", "fifo", "0", "16"), PP_ERR_IO, "not a regular file", NULL);
    /* external and inline data at once */
    Onnx__TensorProto *tp = m->graph->initializer[0];
    tp->has_raw_data = 1;
    tp->raw_data.len = 16;
    tp->raw_data.data = data;
    expect_refused(write_variant(m, "m/e19.onnx", "base.onnx.data", "0", "16"), PP_ERR_PARSE, "besides", NULL);
    tp->has_raw_data = 0;
    tp->raw_data.len = 0;
    tp->raw_data.data = NULL;
    /* a duplicated key */
    Onnx__StringStringEntryProto e[2], *ep[2] = {&e[0], &e[1]};
    for (int i = 0; i < 2; i++) {
        onnx__string_string_entry_proto__init(&e[i]);
        e[i].key = (char *)"location";
        e[i].value = (char *)(i ? "../out/w.data" : "base.onnx.data");
    }
    size_t saved_n = tp->n_external_data;
    Onnx__StringStringEntryProto **saved = tp->external_data;
    tp->n_external_data = 2;
    tp->external_data = ep;
    size_t len = onnx__model_proto__get_packed_size(m);
    unsigned char *buf = malloc(len);
    onnx__model_proto__pack(m, buf);
    tp->n_external_data = saved_n;
    tp->external_data = saved;
    write_all(tmp_path("m/e20.onnx"), buf, len);
    free(buf);
    expect_refused(tmp_path("m/e20.onnx"), PP_ERR_PARSE, "twice", NULL);
    /* a model in the current directory (no '/' in its path) */
    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(tmp_path("m")), 0);
    pp_graph *g = NULL;
    pp_status s = pp_onnx_load("a.onnx", &g);
    assert_int_equal(chdir(cwd), 0);
    if (s != PP_OK) fail_msg("a.onnx from its directory: %s", pp_last_error());
    pp_graph_free(g);
    onnx__model_proto__free_unpacked(m, NULL);
    free(data);
}

/* ------------------------------------------------ files cut short */

/* y = x + a + b, a and b float32 [1024] (4 KiB each), saved by pippin with
 * both in the side file PATH.data (a at offset 0, b at 4096); returns the
 * model, unpacked for editing. */
static Onnx__ModelProto *two_weights(const char *path) {
    pp_graph *g;
    TU_OK(pp_graph_new("two", &g));
    pp_tensor *ta, *tb;
    TU_OK(pp_tensor_empty(PP_F32, 1, SHAPE(1024), &ta));
    TU_OK(pp_tensor_empty(PP_F32, 1, SHAPE(1024), &tb));
    for (int i = 0; i < 1024; i++) ((float *)ta->data)[i] = (float)i, ((float *)tb->data)[i] = (float)-i;
    int x, a, b, n1, n2;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 1, SHAPE(1024), &x));
    TU_OK(pp_graph_add_initializer(g, "a", PP_VALUE_PARAM, ta, &a));
    TU_OK(pp_graph_add_initializer(g, "b", PP_VALUE_PARAM, tb, &b));
    const char *o1[] = {"xa"}, *o2[] = {"y"};
    TU_OK(pp_graph_add_node(g, "Add", "", "add1", 2, (int[]){x, a}, 1, o1, &n1));
    TU_OK(pp_graph_add_node(g, "Add", "", "add2", 2, (int[]){g->nodes[n1].out[0], b}, 1, o2, &n2));
    TU_OK(pp_graph_add_output(g, g->nodes[n2].out[0]));
    pp_onnx_save_options o;
    pp_onnx_save_options_init(&o);
    o.external_data = PP_ONNX_EXTERNAL_ALWAYS;
    o.external_min_bytes = 0;
    TU_OK(pp_onnx_save_with(g, path, &o));
    pp_graph_free(g);
    size_t len;
    unsigned char *buf = read_all(path, &len);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(m);
    assert_int_equal(m->graph->n_initializer, 2);
    assert_string_equal(m->graph->initializer[0]->name, "a"); /* loaded in this order */
    assert_string_equal(m->graph->initializer[1]->name, "b");
    return m;
}

/* Adds the entry x = 1 (which the loader logs at debug level and ignores)
 * to tp's external data, writes m to path, and takes it out again. */
static void write_with_marker(Onnx__ModelProto *m, Onnx__TensorProto *tp, const char *path) {
    Onnx__StringStringEntryProto marker, *ep[8];
    onnx__string_string_entry_proto__init(&marker);
    marker.key = (char *)"x";
    marker.value = (char *)"1";
    assert_true(tp->n_external_data < 8);
    size_t saved_n = tp->n_external_data;
    Onnx__StringStringEntryProto **saved = tp->external_data;
    for (size_t i = 0; i < saved_n; i++) ep[i] = saved[i];
    ep[saved_n] = &marker;
    tp->n_external_data = saved_n + 1;
    tp->external_data = ep;
    size_t len = onnx__model_proto__get_packed_size(m);
    unsigned char *buf = malloc(len);
    onnx__model_proto__pack(m, buf);
    tp->n_external_data = saved_n;
    tp->external_data = saved;
    write_all(path, buf, len);
    free(buf);
}

/* Another process truncating a file in the middle of a load: when the
 * loader logs the marker entry (it reads an initializer's entries before
 * its bytes, and after the files it has opened so far), the file named by
 * user is cut to nothing. */
static void truncate_on_marker(pp_log_level level, const char *msg, void *user) {
    (void)level;
    if (!strstr(msg, "external data key 'x' ignored")) return;
    int rc = truncate(user, 0);
    (void)rc; /* the load's error tells */
}

/* Loads path in a child process whose log handler truncates victim at the
 * marker; the child must exit normally, the load having failed with
 * PP_ERR_IO and a message holding each part. */
static void expect_cut_short(const char *path, const char *victim, const char *part1, const char *part2) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGBUS, SIG_DFL); /* cmocka's handler would go on running the tests in here */
        signal(SIGSEGV, SIG_DFL);
        pp_log_set_level(PP_LOG_DEBUG);
        pp_log_set_handler(truncate_on_marker, (void *)victim);
        pp_graph *g = NULL;
        pp_status s = pp_onnx_load(path, &g);
        /* a load that wrongly succeeds: its weights are touched (a weight
         * still mapped from the truncated file then raises SIGBUS) */
        volatile unsigned char sum = 0;
        for (int v = 0; s == PP_OK && v < g->n_values; v++)
            for (size_t i = 0; g->values[v].data && i < g->values[v].data->nbytes; i++)
                sum += ((const unsigned char *)g->values[v].data->data)[i];
        const char *e = pp_last_error();
        int ok = s == PP_ERR_IO && !g && strstr(e, path) && strstr(e, part1) && strstr(e, part2);
        if (!ok) fprintf(stderr, "load of %s: status %d: %s\n", path, (int)s, s == PP_OK ? "loaded" : e);
        pp_graph_free(g);
        _exit(ok ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st)) fail_msg("loading %s killed the process with signal %d (%s)", path, WTERMSIG(st),
                                  strsignal(WTERMSIG(st)));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("loading %s did not fail as it should (see above)", path);
}

static void test_truncated_while_loading(void **state) {
    (void)state;
    assert_int_equal(mkdir(tmp_path("cut"), 0777), 0);
    Onnx__ModelProto *m = two_weights(tmp_path("cut/two.onnx"));
    Onnx__TensorProto *ta = m->graph->initializer[0], *tb = m->graph->initializer[1];
    size_t dlen;
    unsigned char *data = read_all(tmp_path("cut/two.onnx.data"), &dlen);
    assert_true(dlen >= 8192);

    /* The side file: a is read, then the side file is cut, then b is read.
     * The former loader had mapped it and b borrowed its bytes: the first
     * use of b past the new end killed the process. */
    write_with_marker(m, tb, tmp_path("cut/side.onnx"));
    expect_cut_short(tmp_path("cut/side.onnx"), tmp_path("cut/two.onnx.data"),
                     "initializer 'b': external data file 'two.onnx.data': expected 4096 bytes at offset 4096, got 0",
                     "truncated");
    write_all(tmp_path("cut/two.onnx.data"), data, dlen); /* whole again */

    /* The model file itself: a (external, carrying the marker) is read,
     * then the model file is cut, then b, whose bytes are in the model.
     * The former loader copied them from its mapping of the file: SIGBUS. */
    size_t saved_n = tb->n_external_data;
    tb->has_data_location = 0;
    tb->n_external_data = 0;
    tb->has_raw_data = 1;
    tb->raw_data.len = 4096;
    tb->raw_data.data = data + 4096;
    write_with_marker(m, ta, tmp_path("cut/inline.onnx"));
    pp_graph *g = NULL;
    TU_OK(pp_onnx_load(tmp_path("cut/inline.onnx"), &g)); /* whole, it loads */
    assert_true(((float *)g->values[pp_graph_find_value(g, "b")].data->data)[5] == -5.0f);
    pp_graph_free(g);
    expect_cut_short(tmp_path("cut/inline.onnx"), tmp_path("cut/inline.onnx"),
                     "initializer 'b': expected 4096 bytes at offset ", ", got 0");
    /* m back as it was unpacked, so that it frees */
    tb->has_data_location = 1;
    tb->n_external_data = saved_n;
    tb->has_raw_data = 0;
    tb->raw_data.len = 0;
    tb->raw_data.data = NULL;
    onnx__model_proto__free_unpacked(m, NULL);
    free(data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_matches_mlp),
        cmocka_unit_test(test_parse_from_memory_refused),
        cmocka_unit_test(test_save_round_trip),
        cmocka_unit_test(test_split_round_trip),
        cmocka_unit_test(test_hostile_references),
        cmocka_unit_test(test_truncated_while_loading),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
