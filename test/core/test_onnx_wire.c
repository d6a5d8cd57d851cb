/* Loading without the weights' copies (lib/onnx_wire.c): a model decoded
 * from its stripped bytes gives every fixture's initializers exactly as
 * protobuf-c's own decoding of the whole file does, and inputs the rewrite
 * must not change the meaning of (raw_data twice, the graph twice, the
 * reserved field already used, length prefixes protobuf-c refuses,
 * truncation) load, or fail, as they did before, from memory and from a
 * file (which is read, never mapped: a file cut short while it is read
 * gives an error naming it, bytes and offset). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_io.h"
#include "onnx.pb-c.h"
#include "onnx_tensor.h"
#include "onnx_wire.h"
#include "test_util.h"

#include "test_filter.h"

/* The former loader's view: protobuf-c on the whole input, then each
 * initializer's tensor. NULL if either fails. */
static pp_tensor **reference(const unsigned char *buf, size_t len, size_t *n, char ***names) {
    *n = 0;
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
    if (!m) return NULL;
    if (!m->graph) {
        onnx__model_proto__free_unpacked(m, NULL);
        return NULL;
    }
    size_t k = m->graph->n_initializer;
    pp_tensor **t = calloc(k + 1, sizeof *t);
    *names = calloc(k + 1, sizeof **names);
    assert_non_null(t);
    assert_non_null(*names);
    for (size_t i = 0; i < k; i++) {
        const Onnx__TensorProto *tp = m->graph->initializer[i];
        if (pp_onnx_tensor_from_proto(tp, "ref", &t[i]) != PP_OK) {
            for (size_t j = 0; j < i; j++) pp_tensor_free(t[j]), free((*names)[j]);
            free(t);
            free(*names);
            onnx__model_proto__free_unpacked(m, NULL);
            return NULL;
        }
        (*names)[i] = strdup(tp->name ? tp->name : "");
    }
    *n = k;
    onnx__model_proto__free_unpacked(m, NULL);
    return t;
}

/* A scratch file holding len bytes of buf; its path. */
static const char *scratch_file(const unsigned char *buf, size_t len) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/pippin-wire-%ld.onnx", (long)getpid());
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* g's initializers against the reference's. */
static void expect_reference(const pp_graph *g, pp_tensor **ref, char **names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int v = pp_graph_find_value(g, names[i]);
        if (v < 0) fail_msg("initializer '%s' missing", names[i]);
        const pp_tensor *a = g->values[v].data, *b = ref[i];
        assert_non_null(a);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->nbytes, b->nbytes);
        if (a->nbytes) assert_memory_equal(a->data, b->data, a->nbytes);
    }
}

/* pp_onnx_parse and pp_onnx_load of the bytes written to a file (the
 * stripped paths, from memory and from a file) against the reference,
 * initializer by initializer; returns how many were compared (-1: all
 * refused). */
static int same_as_reference(const unsigned char *buf, size_t len) {
    size_t n;
    char **names = NULL;
    pp_tensor **ref = reference(buf, len, &n, &names);
    pp_graph *g = NULL, *h = NULL;
    pp_status s = pp_onnx_parse(buf, len, "wire.onnx", &g);
    const char *path = scratch_file(buf, len);
    pp_status t = pp_onnx_load(path, &h);
    unlink(path);
    /* the same verdict from memory and from the file */
    assert_int_equal(s, t);
    if (!ref) {
        assert_int_not_equal(s, PP_OK);
        return -1;
    }
    if (s == PP_OK) {
        expect_reference(g, ref, names, n);
        expect_reference(h, ref, names, n);
    } /* else the graph may be refused beyond the initializers (both ways) */
    for (size_t i = 0; i < n; i++) pp_tensor_free(ref[i]), free(names[i]);
    free(ref);
    free(names);
    pp_graph_free(g);
    pp_graph_free(h);
    return s == PP_OK ? (int)n : 0;
}

static void test_fixtures_load_the_same(void **state) {
    (void)state;
    static const char *models[] = {"mlp/model.onnx", "gpt/model.onnx", "cnn/model.onnx", "rnn/model.onnx",
                                   "skip/model.onnx", "buffer/model.onnx", "unet/model.onnx"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "test/fixtures/%s", models[i]);
        snprintf(path, sizeof path, "%s", tu_src_path(path));
        unsigned char *buf;
        size_t len;
        if (pp_read_file(path, (size_t)1 << 30, &buf, &len) != PP_OK) fail_msg("%s", pp_last_error());
        unsigned char *st;
        size_t st_len;
        assert_int_equal(pp_onnx_wire_strip(buf, len, 64, &st, &st_len), PP_OK);
        assert_true(st_len <= len);
        /* from the file, read in chunks as walked: the same bytes */
        int fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        unsigned char *st2;
        size_t st2_len;
        TU_OK(pp_onnx_wire_strip_fd(fd, len, path, 64, &st2, &st2_len));
        close(fd);
        assert_int_equal(st2_len, st_len);
        assert_memory_equal(st2, st, st_len);
        free(st);
        free(st2);
        assert_true(same_as_reference(buf, len) > 0);
        free(buf);
    }
}

/* Protobuf writing, enough for hand-made models. */
typedef struct wbuf {
    unsigned char b[8192];
    size_t n;
} wbuf;

static void w_varint(wbuf *w, uint64_t v) {
    while (v >= 0x80) {
        w->b[w->n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    w->b[w->n++] = (unsigned char)v;
}

static void w_bytes(wbuf *w, int field, const void *p, size_t n) {
    w_varint(w, (uint64_t)field << 3 | 2);
    w_varint(w, n);
    memcpy(w->b + w->n, p, n);
    w->n += n;
}

static void w_int(wbuf *w, int field, uint64_t v) {
    w_varint(w, (uint64_t)field << 3);
    w_varint(w, v);
}

/* A float tensor [n] named name; raw data given by the caller after. */
static void tensor_head(wbuf *t, const char *name, int n) {
    t->n = 0;
    w_int(t, 1, (uint64_t)n); /* dims */
    w_int(t, 2, 1);           /* data_type FLOAT */
    w_bytes(t, 8, name, strlen(name));
}

/* A model: opset 17, graph (initializers t[0..k), input x, node Add(x, w0)
 * -> y, output y). */
static size_t model(unsigned char *out, const wbuf *t, int k, int graph_twice) {
    wbuf g = {{0}, 0}, m = {{0}, 0}, node = {{0}, 0}, vi = {{0}, 0}, op = {{0}, 0};
    for (int i = 0; i < k; i++) w_bytes(&g, 5, t[i].b, t[i].n);
    w_bytes(&node, 1, "x", 1);
    w_bytes(&node, 1, "w0", 2);
    w_bytes(&node, 2, "y", 1);
    w_bytes(&node, 4, "Add", 3);
    w_bytes(&g, 1, node.b, node.n);
    w_bytes(&g, 2, "g", 1);
    w_bytes(&vi, 1, "x", 1);
    w_bytes(&g, 11, vi.b, vi.n);
    vi.n = 0;
    w_bytes(&vi, 1, "y", 1);
    w_bytes(&g, 12, vi.b, vi.n);
    w_int(&m, 1, 8); /* ir_version */
    w_int(&op, 2, 17);
    w_bytes(&m, 8, op.b, op.n);
    if (graph_twice) { /* protobuf merges: the initializers of both, in order */
        wbuf g1 = {{0}, 0}, t9;
        float c[20] = {9};
        tensor_head(&t9, "w9", 20);
        w_bytes(&t9, 9, c, sizeof c);
        w_bytes(&g1, 5, t9.b, t9.n);
        w_bytes(&m, 7, g1.b, g1.n);
    }
    w_bytes(&m, 7, g.b, g.n);
    memcpy(out, m.b, m.n);
    return m.n;
}

static void test_tricky_inputs_load_as_before(void **state) {
    (void)state;
    float a[32], b[32];
    for (int i = 0; i < 32; i++) a[i] = (float)i, b[i] = (float)-i;
    wbuf t[3];
    unsigned char buf[16384];
    /* raw_data twice: the last one counts, large or small */
    tensor_head(&t[0], "w0", 32);
    w_bytes(&t[0], 9, a, sizeof a);
    w_bytes(&t[0], 9, b, sizeof b);
    tensor_head(&t[1], "w1", 2);
    w_bytes(&t[1], 9, a, sizeof a); /* 128 bytes, stripped, then... */
    w_bytes(&t[1], 9, b, 8);        /* ...8, kept: this one is the value */
    assert_int_equal(same_as_reference(buf, model(buf, t, 2, 0)), 2);
    /* the graph twice: initializers merged, the first graph's first */
    assert_int_equal(same_as_reference(buf, model(buf, t, 2, 1)), 3);
    /* the reserved field already there: no rewrite, the same result */
    tensor_head(&t[2], "w2", 32);
    w_bytes(&t[2], 9, a, sizeof a);
    w_varint(&t[2], (uint64_t)536870911 << 3 | 1);
    memset(t[2].b + t[2].n, 7, 8);
    t[2].n += 8;
    size_t len = model(buf, t, 3, 0);
    unsigned char *st;
    size_t st_len;
    assert_int_equal(pp_onnx_wire_strip(buf, len, 64, &st, &st_len), PP_ERR_PARSE);
    assert_int_equal(same_as_reference(buf, len), 3);
    /* a length prefix of 6 bytes: protobuf-c refuses it, so must the load */
    tensor_head(&t[2], "w2", 32);
    w_varint(&t[2], 9 << 3 | 2);
    memcpy(t[2].b + t[2].n, "\x80\x81\x80\x80\x80\x00", 6); /* 128, overlong */
    t[2].n += 6;
    memcpy(t[2].b + t[2].n, a, sizeof a);
    t[2].n += sizeof a;
    assert_int_equal(same_as_reference(buf, model(buf, t, 3, 0)), -1);
    /* every truncation of a good model fails or loads as before */
    len = model(buf, t, 2, 0);
    for (size_t cut = 0; cut < len; cut++) same_as_reference(buf, cut);
    /* a record that points outside the input is refused, not followed */
    Onnx__TensorProto tp = ONNX__TENSOR_PROTO__INIT;
    ProtobufCMessageUnknownField u = {536870911, PROTOBUF_C_WIRE_TYPE_64BIT, 8, (uint8_t *)"\x10\0\0\0\x20\0\0\0"};
    tp.base.n_unknown_fields = 1;
    tp.base.unknown_fields = &u;
    size_t off, n;
    assert_int_equal(pp_onnx_wire_raw_data(&tp, 0x2f, &off, &n), -1);
    assert_int_equal(pp_onnx_wire_raw_data(&tp, 0x30, &off, &n), 1);
    assert_int_equal(off, 0x10);
    assert_int_equal(n, 0x20);
}

/* The file measured at len bytes, then cut to cut bytes (truncated by
 * another process while it is read): every read of what is gone is an
 * error naming the file, the bytes wanted, the offset and the bytes got. */
static void test_file_cut_short_is_an_error(void **state) {
    (void)state;
    const char *src = tu_src_path("test/fixtures/mlp/model.onnx");
    unsigned char *buf;
    size_t len;
    if (pp_read_file(src, (size_t)1 << 30, &buf, &len) != PP_OK) fail_msg("%s", pp_last_error());
    const char *path = scratch_file(buf, len);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_true(len > 5000);
    assert_int_equal(ftruncate(fd, 1000), 0);
    /* the walk needs bytes past the cut */
    unsigned char *st;
    size_t st_len;
    assert_int_equal(pp_onnx_wire_strip_fd(fd, len, path, 64, &st, &st_len), PP_ERR_IO);
    assert_null(st);
    const char *e = pp_last_error();
    if (!strstr(e, path) || !strstr(e, "at offset 0, got 1000") || !strstr(e, "expected"))
        fail_msg("message: %s", e);
    /* a payload read past the cut */
    Onnx__TensorProto tp = ONNX__TENSOR_PROTO__INIT;
    int64_t dims[1] = {256};
    tp.n_dims = 1;
    tp.dims = dims;
    tp.has_data_type = 1;
    tp.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    pp_tensor *t = NULL;
    assert_int_equal(pp_onnx_tensor_read_raw(&tp, "m.onnx: initializer 'w'", fd, 900, 1024, &t), PP_ERR_IO);
    assert_null(t);
    assert_string_equal(pp_last_error(), "m.onnx: initializer 'w': expected 1024 bytes at offset 900, got 100 (the "
                                         "file is shorter than when it was opened: truncated or rewritten while it "
                                         "was read?)");
    dims[0] = 64; /* what is left reads */
    TU_OK(pp_onnx_tensor_read_raw(&tp, "w", fd, 700, 256, &t));
    assert_memory_equal(t->data, buf + 700, 256);
    pp_tensor_free(t);
    /* whole-file reads (safetensors, checkpoints, .npy, configs) check as well */
    unsigned char *part = malloc(len);
    assert_int_equal(pp_read_at(fd, part, len, 0, path), PP_ERR_IO);
    assert_non_null(strstr(pp_last_error(), "got 1000"));
    free(part);
    close(fd);
    unlink(path);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_load_the_same),
        cmocka_unit_test(test_tricky_inputs_load_as_before),
        cmocka_unit_test(test_file_cut_short_is_an_error),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
