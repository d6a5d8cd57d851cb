/* ONNX import of opsets 7-21 (lib/onnx_upgrade.c): one-node models written
 * in an old or new op version are saved at that opset, loaded back and run;
 * each output is checked against hand-computed values. Versions pippin
 * cannot express are refused with an error naming op, opset and the
 * difference. */
#include <math.h>
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
    snprintf(tmp_model, sizeof tmp_model, "/tmp/pippin-opsets-%d.onnx", (int)getpid());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(tmp_model);
    return 0;
}

/* One node op(x [, constant inputs]) -> n_out outputs, in a model of the
 * given opset. consts[i] (owned) become int64/float initializers. */
typedef struct {
    pp_graph *g;
    int node;
} model;

static model one_node(const char *op, int opset, int x_nd, const int64_t *x_shape, int n_consts,
                      pp_tensor **consts, int n_out) {
    model m;
    TU_OK(pp_graph_new("opsets", &m.g));
    m.g->opset = opset;
    int in[8];
    TU_OK(pp_graph_add_input(m.g, "x", PP_F32, x_nd, x_shape, &in[0]));
    for (int i = 0; i < n_consts; i++) {
        char name[16];
        snprintf(name, sizeof name, "c%d", i);
        in[i + 1] = -1;
        if (consts[i]) TU_OK(pp_graph_add_initializer(m.g, name, PP_VALUE_CONST, consts[i], &in[i + 1]));
    }
    const char *outs[6] = {"y0", "y1", "y2", "y3", "y4", "y5"};
    TU_OK(pp_graph_add_node(m.g, op, "", "n", 1 + n_consts, in, n_out, outs, &m.node));
    return m;
}

/* Saves m at its opset and loads it back (through the upgrade pass). */
static pp_status reload(model *m, pp_graph **out) {
    for (int i = 0; i < m->g->nodes[m->node].n_out; i++)
        TU_OK(pp_graph_add_output(m->g, m->g->nodes[m->node].out[i]));
    TU_OK(pp_onnx_save(m->g, tmp_model));
    pp_graph_free(m->g);
    m->g = NULL;
    return pp_onnx_load(tmp_model, out);
}

/* Loads m, runs it on x (freed) and checks output k against want (freed). */
static void expect_run(model *m, pp_tensor *x, int n_want, pp_tensor **want, const char *what) {
    pp_graph *g = NULL;
    pp_status s = reload(m, &g);
    if (s != PP_OK) fail_msg("%s: load failed: %s", what, pp_last_error());
    pp_tensor *outs[4] = {0};
    s = pp_graph_run(g, &x, outs);
    if (s != PP_OK) fail_msg("%s: run failed: %s", what, pp_last_error());
    for (int k = 0; k < n_want; k++) tu_expect(outs[k], want[k], 1e-5, 1e-6, what);
    pp_tensor_free(x);
    pp_graph_free(g);
}

static void expect_refused(model *m, const char *part1, const char *part2) {
    pp_graph *g = NULL;
    pp_status s = reload(m, &g);
    assert_int_equal(s, PP_ERR_UNSUPPORTED);
    assert_null(g);
    if (!strstr(pp_last_error(), part1) || (part2 && !strstr(pp_last_error(), part2)))
        fail_msg("error '%s' lacks '%s' / '%s'", pp_last_error(), part1, part2 ? part2 : "");
}

static const float v6[] = {1, 2, 3, 4, 5, 6};

static void test_axes_attribute_ops(void **state) {
    (void)state;
    int64_t s131[] = {1, 3, 1}, s3[] = {3}, s23[] = {2, 3}, s13[] = {1, 3}, s2[] = {2}, s21[] = {2, 1};
    const int64_t ax0[] = {0}, ax02[] = {0, 2}, ax1[] = {1};
    /* Squeeze 11: axes attribute. */
    model m = one_node("Squeeze", 11, 3, s131, 0, NULL, 1);
    TU_OK(pp_node_set_ints(m.g, m.node, "axes", 2, ax02));
    pp_tensor *w = tu_f32(1, s3, v6);
    expect_run(&m, tu_f32(3, s131, v6), 1, &w, "Squeeze-11");
    /* Unsqueeze 11: axes attribute. */
    m = one_node("Unsqueeze", 11, 1, s3, 0, NULL, 1);
    TU_OK(pp_node_set_ints(m.g, m.node, "axes", 1, ax0));
    w = tu_f32(2, s13, v6);
    expect_run(&m, tu_f32(1, s3, v6), 1, &w, "Unsqueeze-11");
    /* ReduceSum 11: axes attribute, keepdims. */
    m = one_node("ReduceSum", 11, 2, s23, 0, NULL, 1);
    TU_OK(pp_node_set_ints(m.g, m.node, "axes", 1, ax1));
    const float sums[] = {6, 15};
    w = tu_f32(2, s21, sums);
    expect_run(&m, tu_f32(2, s23, v6), 1, &w, "ReduceSum-11");
    /* ReduceMean 17: attribute; 18: input. */
    const float means[] = {2.5f, 3.5f, 4.5f};
    m = one_node("ReduceMean", 17, 2, s23, 0, NULL, 1);
    TU_OK(pp_node_set_ints(m.g, m.node, "axes", 1, ax0));
    TU_OK(pp_node_set_int(m.g, m.node, "keepdims", 0));
    w = tu_f32(1, s3, means);
    expect_run(&m, tu_f32(2, s23, v6), 1, &w, "ReduceMean-17");
    pp_tensor *axes = tu_i64_vec(1, ax0);
    m = one_node("ReduceMean", 18, 2, s23, 1, &axes, 1);
    TU_OK(pp_node_set_int(m.g, m.node, "keepdims", 0));
    w = tu_f32(1, s3, means);
    expect_run(&m, tu_f32(2, s23, v6), 1, &w, "ReduceMean-18");
    /* ReduceMax 12: axes attribute. */
    const float maxes[] = {3, 6};
    m = one_node("ReduceMax", 12, 2, s23, 0, NULL, 1);
    TU_OK(pp_node_set_ints(m.g, m.node, "axes", 1, ax1));
    TU_OK(pp_node_set_int(m.g, m.node, "keepdims", 0));
    w = tu_f32(1, s2, maxes);
    expect_run(&m, tu_f32(2, s23, v6), 1, &w, "ReduceMax-12");
}

static void test_split(void **state) {
    (void)state;
    int64_t s6[] = {6}, s1[] = {1}, s5[] = {5};
    const int64_t parts[] = {1, 5};
    /* Split 11: split attribute. */
    model m = one_node("Split", 11, 1, s6, 0, NULL, 2);
    TU_OK(pp_node_set_ints(m.g, m.node, "split", 2, parts));
    pp_tensor *w[2] = {tu_f32(1, s1, v6), tu_f32(1, s5, v6 + 1)};
    expect_run(&m, tu_f32(1, s6, v6), 2, w, "Split-11");
    /* Split 18: num_outputs, a smaller last chunk. */
    m = one_node("Split", 18, 1, s6, 0, NULL, 2);
    TU_OK(pp_node_set_int(m.g, m.node, "num_outputs", 2));
    w[0] = tu_f32(1, (int64_t[]){3}, v6);
    w[1] = tu_f32(1, (int64_t[]){3}, v6 + 3);
    expect_run(&m, tu_f32(1, s6, v6), 2, w, "Split-18");
}

static void test_clip_pad_slice(void **state) {
    (void)state;
    int64_t s6[] = {6}, s8[] = {8}, s3[] = {3};
    /* Clip 10: min/max attributes. */
    model m = one_node("Clip", 10, 1, s6, 0, NULL, 1);
    TU_OK(pp_node_set_float(m.g, m.node, "min", 2.5f));
    TU_OK(pp_node_set_float(m.g, m.node, "max", 4.5f));
    const float clipped[] = {2.5f, 2.5f, 3, 4, 4.5f, 4.5f};
    pp_tensor *w = tu_f32(1, s6, clipped);
    expect_run(&m, tu_f32(1, s6, v6), 1, &w, "Clip-10");
    /* Pad 10: pads/value attributes. */
    m = one_node("Pad", 10, 1, s6, 0, NULL, 1);
    const int64_t pads[] = {1, 1};
    TU_OK(pp_node_set_ints(m.g, m.node, "pads", 2, pads));
    TU_OK(pp_node_set_float(m.g, m.node, "value", -1));
    const float padded[] = {-1, 1, 2, 3, 4, 5, 6, -1};
    w = tu_f32(1, s8, padded);
    expect_run(&m, tu_f32(1, s6, v6), 1, &w, "Pad-10");
    /* Slice 9: starts/ends/axes attributes. */
    m = one_node("Slice", 9, 1, s6, 0, NULL, 1);
    const int64_t st[] = {1}, en[] = {-2}, ax[] = {0};
    TU_OK(pp_node_set_ints(m.g, m.node, "starts", 1, st));
    TU_OK(pp_node_set_ints(m.g, m.node, "ends", 1, en));
    TU_OK(pp_node_set_ints(m.g, m.node, "axes", 1, ax));
    w = tu_f32(1, s3, v6 + 1);
    expect_run(&m, tu_f32(1, s6, v6), 1, &w, "Slice-9");
}

/* Softmax/Hardmax before 13 coerce [2,2,2] at axis 1 to [2,4]. */
static void test_softmax_2d(void **state) {
    (void)state;
    int64_t s222[] = {2, 2, 2};
    const float x[] = {0, 1, 2, 3, 3, 2, 1, 0};
    float sm[8];
    for (int r = 0; r < 2; r++) {
        double z = 0;
        for (int j = 0; j < 4; j++) z += exp(x[4 * r + j]);
        for (int j = 0; j < 4; j++) sm[4 * r + j] = (float)(exp(x[4 * r + j]) / z);
    }
    model m = one_node("Softmax", 11, 3, s222, 0, NULL, 1);
    pp_tensor *w = tu_f32(3, s222, sm);
    expect_run(&m, tu_f32(3, s222, x), 1, &w, "Softmax-11");
    float lsm[8];
    for (int i = 0; i < 8; i++) lsm[i] = logf(sm[i]);
    m = one_node("LogSoftmax", 12, 3, s222, 0, NULL, 1);
    TU_OK(pp_node_set_int(m.g, m.node, "axis", 1));
    w = tu_f32(3, s222, lsm);
    expect_run(&m, tu_f32(3, s222, x), 1, &w, "LogSoftmax-12");
    const float hm[] = {0, 0, 0, 1, 1, 0, 0, 0};
    m = one_node("Hardmax", 11, 3, s222, 0, NULL, 1);
    w = tu_f32(3, s222, hm);
    expect_run(&m, tu_f32(3, s222, x), 1, &w, "Hardmax-11");
    /* Opset 13: axis -1 only. */
    const float hm13[] = {0, 1, 0, 1, 1, 0, 1, 0};
    m = one_node("Hardmax", 13, 3, s222, 0, NULL, 1);
    w = tu_f32(3, s222, hm13);
    expect_run(&m, tu_f32(3, s222, x), 1, &w, "Hardmax-13");
}

static pp_tensor *vec2(float a, float b) {
    const float v[] = {a, b};
    return tu_f32(1, (int64_t[]){2}, v);
}

static model batchnorm(int opset, int n_out) {
    int64_t xs[] = {1, 2, 1, 1};
    pp_tensor *c[4] = {vec2(1, 2), vec2(0, 1), vec2(1, 1), vec2(4, 1)};
    return one_node("BatchNormalization", opset, 4, xs, 4, c, n_out);
}

static void test_batchnorm(void **state) {
    (void)state;
    int64_t xs[] = {1, 2, 1, 1};
    const float x[] = {3, 5}, y[] = {(3 - 1) / sqrtf(4 + 1e-5f), 2 * (5 - 1) / sqrtf(1 + 1e-5f) + 1};
    /* 8: spatial = 1 is what later versions do. */
    model m = batchnorm(8, 1);
    TU_OK(pp_node_set_int(m.g, m.node, "spatial", 1));
    pp_tensor *w = tu_f32(4, xs, y);
    expect_run(&m, tu_f32(4, xs, x), 1, &w, "BatchNormalization-8");
    m = batchnorm(9, 1);
    w = tu_f32(4, xs, y);
    expect_run(&m, tu_f32(4, xs, x), 1, &w, "BatchNormalization-9");
    m = batchnorm(8, 1);
    TU_OK(pp_node_set_int(m.g, m.node, "spatial", 0));
    expect_refused(&m, "opset 8", "spatial");
    m = batchnorm(12, 5);
    expect_refused(&m, "opset 12", "training-mode outputs");
}

static void test_dropout(void **state) {
    (void)state;
    int64_t s6[] = {6};
    model m = one_node("Dropout", 10, 1, s6, 0, NULL, 1);
    TU_OK(pp_node_set_float(m.g, m.node, "ratio", 0.3f));
    pp_tensor *w = tu_f32(1, s6, v6);
    expect_run(&m, tu_f32(1, s6, v6), 1, &w, "Dropout-10");
    m = one_node("Dropout", 9, 1, s6, 0, NULL, 2);
    expect_refused(&m, "opset 9", "mask");
}

static void test_refused_versions(void **state) {
    (void)state;
    int64_t s6[] = {6};
    model m = one_node("Relu", 6, 1, s6, 0, NULL, 1);
    expect_refused(&m, "opset 6", "7 to 21");
    m = one_node("Relu", 22, 1, s6, 0, NULL, 1);
    expect_refused(&m, "opset 22", "7 to 21");
    /* Pad 19's wrap mode runs (it was refused before pippin had it). */
    const int64_t p21[] = {2, 1}, s9[] = {9}, s12[] = {12};
    m = one_node("Pad", 19, 1, s6, 1, (pp_tensor *[]){tu_i64(1, (int64_t[]){2}, p21)}, 1);
    TU_OK(pp_node_set_string(m.g, m.node, "mode", "wrap"));
    const float wrapped[] = {5, 6, 1, 2, 3, 4, 5, 6, 1};
    pp_tensor *ww = tu_f32(1, s9, wrapped);
    expect_run(&m, tu_f32(1, s6, v6), 1, &ww, "Pad-19 wrap");
    /* Resize 10 (X, scales) and Upsample 7 (scales attribute): asymmetric,
     * nearest rounds down. */
    const float x2[] = {1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6};
    m = one_node("Resize", 10, 1, s6, 1, (pp_tensor *[]){tu_f32(1, (int64_t[]){1}, (float[]){2})}, 1);
    ww = tu_f32(1, s12, x2);
    expect_run(&m, tu_f32(1, s6, v6), 1, &ww, "Resize-10");
    m = one_node("Upsample", 7, 1, s6, 0, NULL, 1);
    TU_OK(pp_node_set_floats(m.g, m.node, "scales", 1, (float[]){2}));
    ww = tu_f32(1, s12, x2);
    expect_run(&m, tu_f32(1, s6, v6), 1, &ww, "Upsample-7");
    /* Relu at opsets 7 and 21 runs. */
    const float neg[] = {-1, 2, -3, 4, -5, 6}, pos[] = {0, 2, 0, 4, 0, 6};
    for (int opset = 7; opset <= 21; opset += 14) {
        m = one_node("Relu", opset, 1, s6, 0, NULL, 1);
        pp_tensor *w = tu_f32(1, s6, pos);
        expect_run(&m, tu_f32(1, s6, neg), 1, &w, "Relu");
    }
}

static void ir_version_11(Onnx__ModelProto *m) { m->ir_version = 11; }

static void test_ir_version(void **state) {
    (void)state;
    int64_t s6[] = {6};
    model m = one_node("Relu", 13, 1, s6, 0, NULL, 1);
    pp_graph *g = NULL;
    TU_OK(reload(&m, &g));
    pp_graph_free(g);
    FILE *f = fopen(tmp_model, "rb");
    assert_non_null(f);
    unsigned char buf[4096];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, buf);
    assert_non_null(mp);
    ir_version_11(mp);
    unsigned char out[4096];
    size_t n = onnx__model_proto__pack(mp, out);
    onnx__model_proto__free_unpacked(mp, NULL);
    assert_int_equal(pp_onnx_parse(out, n, "ir11.onnx", &g), PP_ERR_UNSUPPORTED);
    assert_non_null(strstr(pp_last_error(), "IR version 11"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_axes_attribute_ops),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_clip_pad_slice),
        cmocka_unit_test(test_softmax_2d),
        cmocka_unit_test(test_batchnorm),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_refused_versions),
        cmocka_unit_test(test_ir_version),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
