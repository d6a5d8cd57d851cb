/* The ONNX function bodies written beside pippin's own ops
 * (lib/onnx_functions.h): the body text's subgraph blocks (Loop bodies),
 * one function per distinct body ("op", "op__2": SplitLike's piece counts,
 * an LSTM's direction), absent inputs written as pippin.absent and all of
 * it read back by pippin as the ops it wrote, and every pippin::MatMulAdd
 * form the optimizer makes written with a body. ONNX Runtime and
 * onnx.checker run the files in test/tools/ort_train.sh and
 * ort_optimized.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log_internal.h"
#include "onnx.pb-c.h"
#include "onnx_function_text.h"
#include "onnx_functions.h"
#include "test_util.h"

#include "test_filter.h"

static char tmp_model[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmp_model, sizeof tmp_model, "/tmp/pippin-onnx-fn-%d.onnx", (int)getpid());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(tmp_model);
    return 0;
}

/* A test arena: every block kept to be freed at the end. */
typedef struct arena {
    void *blocks[4096];
    int n;
} arena;

static void *arena_alloc(void *ctx, size_t size) {
    arena *a = ctx;
    if (a->n == 4096) return NULL;
    return a->blocks[a->n++] = calloc(1, size ? size : 1);
}

static void arena_free(arena *a) {
    for (int i = 0; i < a->n; i++) free(a->blocks[i]);
    a->n = 0;
}

static const Onnx__AttributeProto *attr_of(const Onnx__NodeProto *n, const char *name) {
    for (size_t i = 0; i < n->n_attribute; i++)
        if (!strcmp(n->attribute[i]->name, name)) return n->attribute[i];
    return NULL;
}

static void test_text_subgraph(void **state) {
    (void)state;
    static arena a;
    const char *text = "m = Constant<value_int=3>()\n"
                       "graph body(s:int64[], c:bool[], h:float) -> (c2:bool[], h2:float, y:float)\n"
                       "c2 = Identity(c)\n"
                       "h2 = Add(h, h)\n"
                       "y = Identity(h2)\n"
                       "end\n"
                       "hT, ys = Loop<body=%body>(m, , h0)\n";
    Onnx__NodeProto **nodes;
    size_t n;
    TU_OK(pp_onnx_nodes_from_text(text, "Test", arena_alloc, &a, &nodes, &n));
    assert_int_equal(n, 2); /* the block's nodes go into the graph */
    assert_string_equal(nodes[1]->op_type, "Loop");
    assert_int_equal(nodes[1]->n_input, 3);
    assert_string_equal(nodes[1]->input[1], "");
    const Onnx__AttributeProto *body = attr_of(nodes[1], "body");
    assert_non_null(body);
    assert_int_equal(body->type, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__GRAPH);
    const Onnx__GraphProto *g = body->g;
    assert_non_null(g);
    assert_string_equal(g->name, "body");
    assert_int_equal(g->n_node, 3);
    assert_string_equal(g->node[1]->op_type, "Add");
    assert_int_equal(g->n_input, 3);
    assert_int_equal(g->n_output, 3);
    /* s: an int64 scalar; h: float of unknown shape */
    const Onnx__TypeProto__Tensor *s = g->input[0]->type->tensor_type;
    assert_string_equal(g->input[0]->name, "s");
    assert_int_equal(s->elem_type, 7);
    assert_non_null(s->shape);
    assert_int_equal(s->shape->n_dim, 0);
    assert_int_equal(g->input[1]->type->tensor_type->elem_type, 9);
    assert_int_equal(g->input[2]->type->tensor_type->elem_type, 1);
    assert_null(g->input[2]->type->tensor_type->shape);
    assert_string_equal(g->output[2]->name, "y");
    arena_free(&a);
}

static void expect_text_error(const char *text, const char *part) {
    static arena a;
    Onnx__NodeProto **nodes;
    size_t n;
    pp_status s = pp_onnx_nodes_from_text(text, "Bad", arena_alloc, &a, &nodes, &n);
    arena_free(&a);
    if (s == PP_OK) fail_msg("'%s' was accepted", text);
    if (!strstr(pp_last_error(), "Bad") || !strstr(pp_last_error(), part))
        fail_msg("'%s' lacks the function or '%s'", pp_last_error(), part);
}

static void test_text_errors(void **state) {
    (void)state;
    expect_text_error("y = Loop<body=%nowhere>(m, , h)\n", "%nowhere");
    expect_text_error("graph b(s:int64[]) -> (c:bool[])\nc = Identity(s)\n", "no 'end'");
    expect_text_error("end\n", "'end' without 'graph'");
    expect_text_error("graph b(s:int64[]) -> (c:bool[])\ngraph d(s:int64[]) -> (c:bool[])\nend\nend\n",
                      "do not nest");
    expect_text_error("graph b(s:double) -> (c:bool[])\nend\n", "a type (float int64 bool)");
    expect_text_error("graph b(s) -> (c:bool[])\nend\n", "name:type");
    expect_text_error("graph b(s:float) (c:bool[])\nend\n", "'-> ('");
}

/* x [6, 4]; SplitLike of x into two and into three pieces along axis 0;
 * two LSTMTrain nodes that differ only in direction, with B absent and
 * initial_h given after it. */
static pp_graph *variants_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("variants", &g));
    int x, s[3], lx, w, r, h0, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(6, 4), &x));
    for (int k = 0; k < 3; k++) {
        char name[8];
        snprintf(name, sizeof name, "s%d", k);
        TU_OK(pp_graph_add_input(g, name, PP_I64, 1, SHAPE(2), &s[k]));
    }
    TU_OK(pp_graph_add_node(g, "SplitLike", "pippin", "split2", 3, (int[]){x, s[0], s[1]}, 2,
                            (const char *[]){"a0", "a1"}, &n));
    TU_OK(pp_graph_add_node(g, "SplitLike", "pippin", "split3", 4, (int[]){x, s[0], s[1], s[2]}, 3,
                            (const char *[]){"b0", "b1", "b2"}, &n));
    TU_OK(pp_graph_add_input(g, "lx", PP_F32, 3, SHAPE(5, 2, 3), &lx));
    TU_OK(pp_graph_add_input(g, "w", PP_F32, 3, SHAPE(1, 16, 3), &w));
    TU_OK(pp_graph_add_input(g, "r", PP_F32, 3, SHAPE(1, 16, 4), &r));
    TU_OK(pp_graph_add_input(g, "h0", PP_F32, 3, SHAPE(1, 2, 4), &h0));
    const char *dirs[2] = {"forward", "reverse"};
    for (int k = 0; k < 2; k++) {
        char name[16], y[8], yh[8], yc[8], st[8];
        snprintf(name, sizeof name, "lstm_%s", dirs[k]);
        snprintf(y, sizeof y, "y%d", k);
        snprintf(yh, sizeof yh, "yh%d", k);
        snprintf(yc, sizeof yc, "yc%d", k);
        snprintf(st, sizeof st, "st%d", k);
        TU_OK(pp_graph_add_node(g, "LSTMTrain", "pippin", name, 6, (int[]){lx, w, r, -1, -1, h0}, 4,
                                (const char *[]){y, yh, yc, st}, &n));
        TU_OK(pp_node_set_int(g, n, "hidden_size", 4));
        TU_OK(pp_node_set_string(g, n, "direction", dirs[k]));
    }
    for (int i = 0; i < g->n_nodes; i++)
        for (int o = 0; o < g->nodes[i].n_out; o++) TU_OK(pp_graph_add_output(g, g->nodes[i].out[o]));
    return g;
}

static const Onnx__FunctionProto *function_named(const Onnx__ModelProto *m, const char *name) {
    for (size_t i = 0; i < m->n_functions; i++)
        if (!strcmp(m->functions[i]->name, name)) return m->functions[i];
    return NULL;
}

static const Onnx__NodeProto *node_named(const Onnx__ModelProto *m, const char *name) {
    for (size_t i = 0; i < m->graph->n_node; i++)
        if (!strcmp(m->graph->node[i]->name, name)) return m->graph->node[i];
    return NULL;
}

static Onnx__ModelProto *read_model(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(len);
    assert_int_equal(fread(buf, 1, len, f), len);
    fclose(f);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(m);
    return m;
}

static void test_variants_and_absent_inputs(void **state) {
    (void)state;
    pp_graph *g = variants_graph();
    TU_OK(pp_onnx_save(g, tmp_model));
    pp_graph_free(g);
    Onnx__ModelProto *m = read_model(tmp_model);
    /* one function per body: the piece counts, the directions */
    const Onnx__FunctionProto *f2 = function_named(m, "SplitLike"), *f3 = function_named(m, "SplitLike__2");
    assert_non_null(f2);
    assert_non_null(f3);
    assert_int_equal(f2->n_output, 2);
    assert_int_equal(f3->n_output, 3);
    assert_string_equal(node_named(m, "split2")->op_type, "SplitLike");
    assert_string_equal(node_named(m, "split3")->op_type, "SplitLike__2");
    assert_non_null(function_named(m, "LSTMTrain"));
    assert_non_null(function_named(m, "LSTMTrain__2"));
    assert_null(function_named(m, "LSTMTrain__3"));
    assert_string_equal(node_named(m, "lstm_reverse")->op_type, "LSTMTrain__2");
    /* each LSTMTrain body runs one Loop whose body is a graph */
    const Onnx__FunctionProto *lf = function_named(m, "LSTMTrain");
    int loops = 0;
    for (size_t i = 0; i < lf->n_node; i++)
        if (!strcmp(lf->node[i]->op_type, "Loop")) {
            loops++;
            assert_non_null(attr_of(lf->node[i], "body")->g);
        }
    assert_int_equal(loops, 1);
    /* B and sequence_lens: the typed placeholder, once */
    const Onnx__NodeProto *ln = node_named(m, "lstm_forward");
    assert_int_equal(ln->n_input, 6);
    assert_string_equal(ln->input[3], PP_ONNX_ABSENT);
    assert_string_equal(ln->input[4], PP_ONNX_ABSENT);
    int placeholders = 0;
    for (size_t i = 0; i < m->graph->n_initializer; i++)
        if (!strcmp(m->graph->initializer[i]->name, PP_ONNX_ABSENT)) {
            placeholders++;
            assert_int_equal(m->graph->initializer[i]->n_dims, 1);
            assert_int_equal(m->graph->initializer[i]->dims[0], 0);
        }
    assert_int_equal(placeholders, 1);
    onnx__model_proto__free_unpacked(m, NULL);

    /* pippin reads back the ops it wrote: variants by their op, the
     * placeholder as an absent input and no value */
    pp_graph *h;
    TU_OK(pp_onnx_load(tmp_model, &h));
    int seen = 0;
    for (int i = 0; i < h->n_nodes; i++) {
        const pp_node *n = &h->nodes[i];
        assert_string_equal(n->domain, "pippin");
        if (!strcmp(n->name, "split3")) assert_string_equal(n->op_type, "SplitLike"), seen++;
        if (!strcmp(n->name, "lstm_reverse")) {
            assert_string_equal(n->op_type, "LSTMTrain");
            assert_int_equal(n->in[3], -1);
            assert_int_equal(n->in[4], -1);
            assert_true(n->in[5] >= 0);
            seen++;
        }
    }
    assert_int_equal(seen, 2);
    assert_int_equal(pp_graph_find_value(h, PP_ONNX_ABSENT), -1);
    /* and writes the same file again */
    TU_OK(pp_onnx_save(h, tmp_model));
    pp_graph_free(h);
    m = read_model(tmp_model);
    assert_string_equal(node_named(m, "lstm_reverse")->op_type, "LSTMTrain__2");
    onnx__model_proto__free_unpacked(m, NULL);
}

static int warnings;
static char last_warning[1024];

static void keep_warning(pp_log_level level, const char *msg, void *user) {
    (void)user;
    if (level != PP_LOG_WARN) return;
    warnings++;
    snprintf(last_warning, sizeof last_warning, "%s", msg);
}

/* Saves g to tmp_model and frees it, counting the warnings logged. */
static void save_counting_warnings(pp_graph *g) {
    warnings = 0;
    pp_log_level old = pp_log_get_level();
    pp_log_set_level(PP_LOG_WARN);
    pp_log_set_handler(keep_warning, NULL);
    pp_status s = pp_onnx_save(g, tmp_model);
    pp_log_set_handler(NULL, NULL);
    pp_log_set_level(old);
    pp_graph_free(g);
    TU_OK(s);
}

/* An LSTMGrad without the stash (a hand-made graph; the gradient rule
 * always passes one) is a configuration the bodies do not write: the
 * export names the node and writes no function for the op, so ONNX Runtime
 * refuses it rather than run something else. */
static void test_unexpressed_configuration_is_named(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("nostash", &g));
    int x, w, r, dy, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 3, SHAPE(5, 2, 3), &x));
    TU_OK(pp_graph_add_input(g, "w", PP_F32, 3, SHAPE(1, 16, 3), &w));
    TU_OK(pp_graph_add_input(g, "r", PP_F32, 3, SHAPE(1, 16, 4), &r));
    TU_OK(pp_graph_add_input(g, "dy", PP_F32, 4, SHAPE(5, 1, 2, 4), &dy));
    TU_OK(pp_graph_add_node(g, "LSTMGrad", "pippin", "grad_without_stash", 9,
                            (int[]){x, w, r, -1, -1, -1, -1, -1, dy}, 1, (const char *[]){"dx"}, &n));
    TU_OK(pp_graph_add_output(g, g->nodes[n].out[0]));
    save_counting_warnings(g);
    assert_int_equal(warnings, 1);
    assert_non_null(strstr(last_warning, "grad_without_stash"));
    assert_non_null(strstr(last_warning, "stash"));
    Onnx__ModelProto *m = read_model(tmp_model);
    assert_int_equal(m->n_functions, 0);
    onnx__model_proto__free_unpacked(m, NULL);
}

/* Before opset 13 Split, Squeeze and ReduceSum take their axes as
 * attributes: the RNN bodies are not written, and the export says why. */
static void test_rnn_body_needs_opset_13(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("old", &g));
    g->opset = 12;
    int x, w, r, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 3, SHAPE(5, 2, 3), &x));
    TU_OK(pp_graph_add_input(g, "w", PP_F32, 3, SHAPE(1, 12, 3), &w));
    TU_OK(pp_graph_add_input(g, "r", PP_F32, 3, SHAPE(1, 12, 4), &r));
    TU_OK(pp_graph_add_node(g, "GRUTrain", "pippin", "old_gru", 3, (int[]){x, w, r}, 3,
                            (const char *[]){"y", "yh", "st"}, &n));
    TU_OK(pp_graph_add_output(g, g->nodes[n].out[0]));
    save_counting_warnings(g);
    assert_int_equal(warnings, 1);
    assert_non_null(strstr(last_warning, "old_gru"));
    assert_non_null(strstr(last_warning, "opset 12"));
    Onnx__ModelProto *m = read_model(tmp_model);
    assert_int_equal(m->n_functions, 0);
    onnx__model_proto__free_unpacked(m, NULL);
}

/* ---- pippin::MatMulAdd's forms, optimized and exported ---- */

static pp_tensor *rand_f32(int nd, const int64_t *shape, uint64_t seed) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    float *d = t->data;
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) d[i] = (float)(2.0 * tu_urand(&seed) - 1.0);
    return t;
}

static int node1(pp_graph *g, const char *op, const char *name, int n_in, const int *in) {
    int id;
    TU_OK(pp_graph_add_node(g, op, "", name, n_in, in, 1, NULL, &id));
    return g->nodes[id].out[0];
}

/* One Linear x @ W_tag^T (+ b_tag): what torch exports, packed by the
 * optimizer (PackWeight). */
static int linear(pp_graph *g, int x, const char *tag, int bias, uint64_t seed) {
    char name[32];
    int v;
    snprintf(name, sizeof name, "W_%s", tag);
    TU_OK(pp_graph_add_initializer(g, name, PP_VALUE_PARAM, rand_f32(2, SHAPE(40, 24), seed), &v));
    snprintf(name, sizeof name, "wt_%s", tag);
    int wt = node1(g, "Transpose", name, 1, &v);
    TU_OK(pp_node_set_ints(g, g->values[wt].producer, "perm", 2, (int64_t[]){1, 0}));
    snprintf(name, sizeof name, "mm_%s", tag);
    int y = node1(g, "MatMul", name, 2, (int[]){x, wt});
    if (!bias) return y;
    snprintf(name, sizeof name, "b_%s", tag);
    TU_OK(pp_graph_add_initializer(g, name, PP_VALUE_PARAM, rand_f32(1, SHAPE(40), seed + 1), &v));
    snprintf(name, sizeof name, "add_%s", tag);
    return node1(g, "Add", name, 2, (int[]){v, y});
}

static int gelu(pp_graph *g, int x, const char *name, const char *approx) {
    int y = node1(g, "Gelu", name, 1, &x);
    TU_OK(pp_node_set_string(g, g->values[y].producer, "approximate", approx));
    return y;
}

/* x [2, 3, 24], r [2, 3, 40]; five Linears whose fused forms differ:
 * Relu; erf Gelu; tanh Gelu then the residual r (added after it); the
 * residual without a bias; a Split of the product into 16 and 24 along
 * the last axis. */
static pp_graph *forms_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("forms", &g));
    g->opset = 17;
    int x, r, id;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 3, SHAPE(2, 3, 24), &x));
    TU_OK(pp_graph_add_input(g, "r", PP_F32, 3, SHAPE(2, 3, 40), &r));
    int y = linear(g, x, "relu", 1, 101);
    TU_OK(pp_graph_add_output(g, node1(g, "Relu", "relu", 1, &y)));
    TU_OK(pp_graph_add_output(g, gelu(g, linear(g, x, "gelu", 1, 103), "gelu", "none")));
    y = gelu(g, linear(g, x, "tanh", 1, 105), "gelu_tanh", "tanh");
    TU_OK(pp_graph_add_output(g, node1(g, "Add", "res_tanh", 2, (int[]){y, r})));
    y = linear(g, x, "res", 0, 107);
    TU_OK(pp_graph_add_output(g, node1(g, "Add", "res_nobias", 2, (int[]){r, y})));
    y = linear(g, x, "split", 1, 109);
    pp_tensor *sizes;
    TU_OK(pp_tensor_empty(PP_I64, 1, SHAPE(2), &sizes));
    memcpy(sizes->data, (int64_t[]){16, 24}, 2 * sizeof(int64_t));
    int sv;
    TU_OK(pp_graph_add_initializer(g, "sizes", PP_VALUE_CONST, sizes, &sv));
    TU_OK(pp_graph_add_node(g, "Split", "", "split", 2, (int[]){y, sv}, 2, (const char *[]){"s0", "s1"}, &id));
    TU_OK(pp_node_set_int(g, id, "axis", -1));
    TU_OK(pp_graph_add_output(g, g->nodes[id].out[0]));
    TU_OK(pp_graph_add_output(g, g->nodes[id].out[1]));
    return g;
}

/* Regression: an optimized graph's MatMulAdd with a fused activation,
 * residual or Split had no ONNX function body: the export warned and the
 * file had no function for pippin::MatMulAdd (ONNX Runtime refused it).
 * Every form now gets one, a function per distinct body (PackWeight's
 * too), no warning; pippin reads the file back and gives the unoptimized
 * graph's outputs (within float rounding: the fused kernel). ONNX Runtime
 * runs the bodies in test/tools/ort_optimized.sh. */
static void test_matmul_add_forms(void **state) {
    (void)state;
    pp_tensor *ins[2] = {rand_f32(3, SHAPE(2, 3, 24), 1), rand_f32(3, SHAPE(2, 3, 40), 2)};
    pp_tensor *want[6] = {0}, *got[6] = {0};
    pp_graph *g = forms_graph();
    TU_OK(pp_graph_run(g, ins, want));
    pp_optimize_report rep;
    TU_OK(pp_graph_optimize(g, PP_OPT_ALL, &rep));
    int fused = 0, packs = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        fused += !strcmp(g->nodes[i].op_type, "MatMulAdd");
        packs += !strcmp(g->nodes[i].op_type, "PackWeight");
    }
    assert_int_equal(fused, 5);
    assert_int_equal(packs, 5);
    assert_int_equal(g->n_nodes, 10); /* every Relu, Gelu, Add and the Split taken in */
    save_counting_warnings(g);
    assert_int_equal(warnings, 0);
    Onnx__ModelProto *m = read_model(tmp_model);
    assert_int_equal(m->n_functions, 6); /* PackWeight and five MatMulAdd bodies */
    for (size_t i = 0; i < m->graph->n_node; i++) {
        const Onnx__NodeProto *n = m->graph->node[i];
        if (!n->domain || strcmp(n->domain, "pippin") != 0) continue;
        const Onnx__FunctionProto *f = function_named(m, n->op_type);
        assert_non_null(f);
        assert_int_equal(f->n_input, n->n_input);
        assert_int_equal(f->n_output, n->n_output);
    }
    /* the tanh Gelu's body: the kernel's constants, and no Gelu op */
    const Onnx__NodeProto *tanh_node = node_named(m, "mm_tanh");
    assert_non_null(tanh_node);
    const Onnx__FunctionProto *tf = function_named(m, tanh_node->op_type);
    int tanhs = 0, adds = 0;
    for (size_t i = 0; i < tf->n_node; i++) {
        assert_string_not_equal(tf->node[i]->op_type, "Gelu");
        tanhs += !strcmp(tf->node[i]->op_type, "Tanh");
        adds += !strcmp(tf->node[i]->op_type, "Add");
    }
    assert_int_equal(tanhs, 1);
    assert_int_equal(adds, 3); /* x + 0.044715 x^3, 1 + tanh, then the residual */
    onnx__model_proto__free_unpacked(m, NULL);

    pp_graph *h;
    TU_OK(pp_onnx_load(tmp_model, &h));
    TU_OK(pp_graph_run(h, ins, got));
    for (int i = 0; i < 6; i++) {
        tu_assert_close(got[i], want[i], 1e-5, 1e-5, h->values[h->outputs[i]].name);
        pp_tensor_free(got[i]);
        pp_tensor_free(want[i]);
    }
    pp_graph_free(h);
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_subgraph),
        cmocka_unit_test(test_text_errors),
        cmocka_unit_test(test_variants_and_absent_inputs),
        cmocka_unit_test(test_unexpressed_configuration_is_named),
        cmocka_unit_test(test_rnn_body_needs_opset_13),
        cmocka_unit_test(test_matmul_add_forms),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
