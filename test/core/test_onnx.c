/* ONNX import/export: round trip, and every kind of bad model gives an error
 * naming the node or file, never a crash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "onnx.pb-c.h"
#include "test_util.h"

#include "test_filter.h"
static char tmp_model[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmp_model, sizeof tmp_model, "/tmp/pippin-onnx-%d.onnx", (int)getpid());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(tmp_model);
    return 0;
}

/* y = x + w, with x [batch, 3]. op lets a test swap in another op type. */
static pp_graph *small_graph(const char *op) {
    pp_graph *g;
    TU_OK(pp_graph_new("small", &g));
    int64_t xs[] = {-1, 3}, ws[] = {3};
    float wv[] = {1, 2, 3};
    int x, w, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, xs, &x));
    g->values[x].dim_names[0] = strdup("batch");
    TU_OK(pp_graph_add_initializer(g, "w", PP_VALUE_PARAM, tu_f32(1, ws, wv), &w));
    int in[] = {x, w};
    const char *outs[] = {"y"};
    TU_OK(pp_graph_add_node(g, op, "", "/layer/add", 2, in, 1, outs, &n));
    TU_OK(pp_node_set_int(g, n, "some_attr", 7));
    TU_OK(pp_graph_add_output(g, g->nodes[n].out[0]));
    return g;
}

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*len);
    assert_int_equal(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

static void test_round_trip(void **state) {
    (void)state;
    pp_graph *g = small_graph("Add");
    g->nodes[0].region = PP_REGION_BACKWARD_WEIGHT;
    TU_OK(pp_onnx_save(g, tmp_model));
    pp_graph_free(g);
    pp_graph *h;
    pp_status s = pp_onnx_load(tmp_model, &h);
    if (s == PP_ERR_UNSUPPORTED) skip(); /* Add kernel not built */
    TU_OK(s);
    assert_int_equal(h->n_inputs, 1);
    assert_int_equal(h->n_nodes, 1);
    assert_string_equal(h->nodes[0].name, "/layer/add");
    assert_int_equal(pp_node_attr_int(&h->nodes[0], "some_attr", 0), 7);
    assert_int_equal(h->nodes[0].region, PP_REGION_BACKWARD_WEIGHT);
    const pp_value *x = &h->values[h->inputs[0]];
    assert_string_equal(x->dim_names[0], "batch");
    assert_int_equal(x->shape[1], 3);
    int w = pp_graph_find_value(h, "w");
    assert_int_equal(h->values[w].kind, PP_VALUE_PARAM);
    int64_t count, bytes;
    pp_graph_param_stats(h, &count, &bytes);
    assert_int_equal(count, 3);
    assert_int_equal(bytes, 12);
    pp_graph_free(h);
}

static void expect_load_error(const void *bytes, size_t len, pp_status code, const char *n1,
                              const char *n2) {
    pp_graph *g = NULL;
    pp_status s = pp_onnx_parse(bytes, len, "bad.onnx", &g);
    assert_null(g);
    if (s != code) fail_msg("expected %d, got %d: %s", code, s, pp_last_error());
    if (n1 && !strstr(pp_last_error(), n1)) fail_msg("'%s' lacks '%s'", pp_last_error(), n1);
    if (n2 && !strstr(pp_last_error(), n2)) fail_msg("'%s' lacks '%s'", pp_last_error(), n2);
    assert_non_null(strstr(pp_last_error(), "bad.onnx"));
}

static void test_unknown_op(void **state) {
    (void)state;
    pp_graph *g = small_graph("FooBar");
    TU_OK(pp_onnx_save(g, tmp_model));
    pp_graph_free(g);
    size_t len;
    unsigned char *buf = read_all(tmp_model, &len);
    expect_load_error(buf, len, PP_ERR_UNSUPPORTED, "/layer/add", "FooBar");
    free(buf);
}

/* Rewrites the saved model through protobuf-c to make it bad in one way. */
typedef void (*mutator)(Onnx__ModelProto *m);

/* The model file at path, rewritten by fn. */
static unsigned char *mutated_file(const char *path, mutator fn, size_t *len) {
    unsigned char *buf = read_all(path, len);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, *len, buf);
    assert_non_null(m);
    free(buf);
    fn(m);
    *len = onnx__model_proto__get_packed_size(m);
    buf = malloc(*len);
    onnx__model_proto__pack(m, buf);
    onnx__model_proto__free_unpacked(m, NULL);
    return buf;
}

static unsigned char *mutated(mutator fn, size_t *len) {
    pp_graph *g = small_graph("Add");
    TU_OK(pp_onnx_save(g, tmp_model));
    pp_graph_free(g);
    return mutated_file(tmp_model, fn, len);
}

/* Strings are edited in place: protobuf-c frees what it allocated. */
static void drop_initializer(Onnx__ModelProto *m) { m->graph->node[0]->input[1][0] = 'q'; }
/* regression (review): 2^32 + 13 used to be read as opset 13 */
static void huge_opset(Onnx__ModelProto *m) {
    for (size_t i = 0; i < m->n_opset_import; i++)
        if (!m->opset_import[i]->domain || !m->opset_import[i]->domain[0])
            m->opset_import[i]->version = ((int64_t)1 << 32) + 13;
}

static void old_opset(Onnx__ModelProto *m) {
    for (size_t i = 0; i < m->n_opset_import; i++)
        if (!m->opset_import[i]->domain || !m->opset_import[i]->domain[0]) m->opset_import[i]->version = 6;
}
static void bad_tensor(Onnx__ModelProto *m) { m->graph->initializer[0]->raw_data.len = 5; }
static void bad_dtype(Onnx__ModelProto *m) { m->graph->initializer[0]->data_type = 8; /* string */ }
static void bad_output(Onnx__ModelProto *m) { m->graph->output[0]->name[0] = 'z'; }

static void test_bad_models(void **state) {
    (void)state;
    size_t len;
    unsigned char *buf;
    buf = mutated(drop_initializer, &len);
    expect_load_error(buf, len, PP_ERR_NOT_FOUND, "input 'q'", "/layer/add");
    free(buf);
    buf = mutated(old_opset, &len);
    expect_load_error(buf, len, PP_ERR_UNSUPPORTED, "opset 6", NULL);
    free(buf);
    buf = mutated(huge_opset, &len);
    expect_load_error(buf, len, PP_ERR_UNSUPPORTED, "is not supported", NULL);
    free(buf);
    buf = mutated(bad_tensor, &len);
    expect_load_error(buf, len, PP_ERR_PARSE, "initializer 'w'", "bytes");
    free(buf);
    buf = mutated(bad_dtype, &len);
    expect_load_error(buf, len, PP_ERR_UNSUPPORTED, "initializer 'w'", "data type");
    free(buf);
    buf = mutated(bad_output, &len);
    expect_load_error(buf, len, PP_ERR_NOT_FOUND, "output 'z'", NULL);
    free(buf);
}

/* Regression: float buffers (a causal mask, a gain) and requires_grad=False
 * parameters were trained as parameters. The exporter's pippin.trainable
 * list decides; pp_onnx_save keeps it; a model without the list trains
 * every float initializer unless frozen by pattern. */
static int kind_of(const pp_graph *g, const char *name) {
    int v = pp_graph_find_value(g, name);
    assert_true(v >= 0);
    return g->values[v].kind;
}

static void expect_buffer_kinds(const pp_graph *g) {
    assert_int_equal(kind_of(g, "fc1.weight"), PP_VALUE_PARAM);
    assert_int_equal(kind_of(g, "fc1.bias"), PP_VALUE_PARAM);
    assert_int_equal(kind_of(g, "fc2.bias"), PP_VALUE_PARAM);
    assert_int_equal(kind_of(g, "fc2.weight"), PP_VALUE_CONST); /* requires_grad=False */
    assert_int_equal(kind_of(g, "gain"), PP_VALUE_CONST);       /* float buffers */
    assert_int_equal(kind_of(g, "mask"), PP_VALUE_CONST);
    int64_t count, frozen;
    pp_graph_param_stats(g, &count, NULL);
    pp_graph_frozen_stats(g, &frozen, NULL);
    assert_int_equal(count, 8 * 8 + 8 + 4);
    assert_int_equal(frozen, 4 * 8 + 8 + 6 * 6);
}

static void drop_metadata(Onnx__ModelProto *m) {
    for (size_t i = 0; i < m->n_metadata_props; i++) m->metadata_props[i]->key[0] = 'x';
}
static void bad_trainable_list(Onnx__ModelProto *m) {
    for (size_t i = 0; i < m->n_metadata_props; i++) m->metadata_props[i]->value[0] = '{';
}

static void test_trainable_metadata(void **state) {
    (void)state;
    char fx[4096];
    snprintf(fx, sizeof fx, "%s", tu_src_path("test/fixtures/buffer/model.onnx"));
    pp_graph *g = tu_fixture_onnx("buffer", "model.onnx");
    expect_buffer_kinds(g);
    TU_OK(pp_onnx_save(g, tmp_model));
    pp_graph_free(g);
    TU_OK(pp_onnx_load(tmp_model, &g));
    expect_buffer_kinds(g);
    pp_graph_free(g);

    /* Without the list every float initializer trains; freezing by pattern
     * gives the exporter's answer back. */
    size_t len;
    unsigned char *buf = mutated_file(fx, drop_metadata, &len);
    TU_OK(pp_onnx_parse(buf, len, "nolist.onnx", &g));
    free(buf);
    assert_int_equal(kind_of(g, "mask"), PP_VALUE_PARAM);
    assert_int_equal(kind_of(g, "gain"), PP_VALUE_PARAM);
    assert_int_equal(pp_graph_freeze(g, "fc2.w*"), 1);
    assert_int_equal(pp_graph_freeze(g, "[gm]a[is][nk]"), 2);
    assert_int_equal(pp_graph_freeze(g, "mask"), 0); /* already frozen */
    expect_buffer_kinds(g);
    pp_graph_free(g);

    buf = mutated_file(fx, bad_trainable_list, &len);
    expect_load_error(buf, len, PP_ERR_PARSE, "pippin.trainable", "JSON list");
    free(buf);
}

static void test_garbage_and_truncation(void **state) {
    (void)state;
    const char garbage[] = "\xff\xff\xff\xff this is not protobuf \x00\x01";
    expect_load_error(garbage, sizeof garbage, PP_ERR_PARSE, "not an ONNX model", NULL);
    pp_graph *g = small_graph("Add");
    TU_OK(pp_onnx_save(g, tmp_model));
    pp_graph_free(g);
    size_t len;
    unsigned char *buf = read_all(tmp_model, &len);
    /* Every prefix either fails cleanly or is a valid smaller model. */
    for (size_t cut = 0; cut < len; cut++) {
        pp_graph *h = NULL;
        pp_status s = pp_onnx_parse(buf, cut, "cut.onnx", &h);
        if (s == PP_OK) pp_graph_free(h);
        else assert_null(h);
    }
    free(buf);
    assert_int_equal(pp_onnx_load("/nonexistent/model.onnx", &g), PP_ERR_IO);
    /* Regression (fuzz_pipe_json): a directory opened as a model asked
     * malloc for LONG_MAX bytes. */
    assert_int_equal(pp_onnx_load("/tmp", &g), PP_ERR_IO);
    assert_non_null(strstr(pp_last_error(), "not a regular file"));
}

static void test_dtype_mismatch_names_node(void **state) {
    (void)state;
    pp_graph *g = small_graph("Add");
    if (pp_graph_resolve(g) != PP_OK) {
        pp_graph_free(g);
        skip();
    }
    int64_t xs[] = {2, 3};
    pp_tensor *x, *y = NULL;
    TU_OK(pp_tensor_new(PP_I64, 2, xs, &x));
    /* The declared input type catches it first... */
    assert_int_equal(pp_graph_run(g, &x, &y), PP_ERR_SHAPE);
    assert_non_null(strstr(pp_last_error(), "'x'"));
    /* ...and without a declared type the kernel does, naming the node. */
    g->values[g->inputs[0]].dtype = PP_DTYPE_UNDEFINED;
    assert_int_not_equal(pp_graph_run(g, &x, &y), PP_OK);
    assert_non_null(strstr(pp_last_error(), "/layer/add"));
    assert_null(y);
    pp_tensor_free(x);
    pp_graph_free(g);
}

static void test_missing_and_misshaped_inputs(void **state) {
    (void)state;
    pp_graph *g = small_graph("Add");
    if (pp_graph_resolve(g) != PP_OK) {
        pp_graph_free(g);
        skip();
    }
    int64_t xs[] = {2, 4};
    pp_tensor *x, *y = NULL, *none = NULL;
    TU_OK(pp_tensor_new(PP_F32, 2, xs, &x));
    assert_int_equal(pp_graph_run(g, &x, &y), PP_ERR_SHAPE);
    assert_non_null(strstr(pp_last_error(), "[2,4]"));
    assert_int_equal(pp_graph_run(g, &none, &y), PP_ERR_INVALID);
    pp_tensor_free(x);
    pp_graph_free(g);
}

/* An attribute value pippin does not handle is refused at load, naming the
 * node, the attribute and the value. */
static void test_unsupported_attribute_value(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int x, y, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, (int64_t[]){2, 3}, &x));
    TU_OK(pp_graph_add_input(g, "y", PP_I64, 1, (int64_t[]){2}, &y));
    TU_OK(pp_graph_add_node(g, "SoftmaxCrossEntropyLoss", "", "/loss", 2, (int[]){x, y}, 1, NULL, &n));
    TU_OK(pp_node_set_string(g, n, "reduction", "median"));
    TU_OK(pp_graph_add_output(g, g->nodes[n].out[0]));
    TU_OK(pp_onnx_save(g, tmp_model));
    pp_graph_free(g);
    size_t len;
    unsigned char *buf = read_all(tmp_model, &len);
    pp_graph *h = NULL;
    pp_status s = pp_onnx_parse(buf, len, "bad.onnx", &h);
    assert_int_not_equal(s, PP_OK);
    assert_null(h);
    assert_non_null(strstr(pp_last_error(), "/loss"));
    assert_non_null(strstr(pp_last_error(), "median"));
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_unknown_op),
        cmocka_unit_test(test_bad_models),
        cmocka_unit_test(test_trainable_metadata),
        cmocka_unit_test(test_garbage_and_truncation),
        cmocka_unit_test(test_dtype_mismatch_names_node),
        cmocka_unit_test(test_missing_and_misshaped_inputs),
        cmocka_unit_test(test_unsupported_attribute_value),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
