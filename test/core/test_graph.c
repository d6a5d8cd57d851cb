/* Graph IR: builder, names, attributes, resolution errors, node copies. */
#include <string.h>

#include "test_util.h"

#include "test_filter.h"
#include "op.h"
static void test_builder_and_lookup(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int64_t shape[] = {-1, 4};
    int x, w, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, shape, &x));
    pp_tensor *wt;
    TU_OK(pp_tensor_new(PP_F32, 1, (int64_t[]){4}, &wt));
    TU_OK(pp_graph_add_initializer(g, "w", PP_VALUE_PARAM, wt, &w));
    TU_OK(pp_graph_add_node(g, "Add", "", NULL, 2, (int[]){x, w}, 1, NULL, &n));
    assert_int_equal(g->n_nodes, 1);
    assert_non_null(g->nodes[n].name); /* made up from the op */
    int y = g->nodes[n].out[0];
    assert_int_equal(g->values[y].producer, n);
    assert_int_equal(pp_graph_find_value(g, g->values[y].name), y);
    assert_int_equal(pp_graph_find_value(g, "x"), x);
    assert_int_equal(pp_graph_find_value(g, "nope"), -1);
    assert_int_equal(pp_graph_find_node(g, g->nodes[n].name), n);
    /* names are unique: a second "x" is refused */
    assert_int_equal(pp_graph_add_input(g, "x", PP_F32, 0, NULL, NULL), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "'x'"));
    /* many values keep the name index working through rehashes */
    for (int i = 0; i < 500; i++) {
        char name[32];
        snprintf(name, sizeof name, "v%d", i);
        TU_OK(pp_graph_add_input(g, name, PP_F32, 0, NULL, NULL));
    }
    assert_int_equal(pp_graph_find_value(g, "v377"), x + 3 + 377 - 1 + 1);
    const char *u = pp_graph_unique_name(g, "x");
    assert_int_equal(pp_graph_find_value(g, u), -1);
    int64_t count, bytes;
    pp_graph_param_stats(g, &count, &bytes);
    assert_int_equal(count, 4);
    assert_int_equal(bytes, 16);
    pp_graph_free(g);
}

static void test_attributes(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int n;
    TU_OK(pp_graph_add_node(g, "Foo", "", "n", 0, NULL, 1, NULL, &n));
    TU_OK(pp_node_set_int(g, n, "axis", -1));
    TU_OK(pp_node_set_float(g, n, "eps", 1e-5f));
    TU_OK(pp_node_set_string(g, n, "mode", "tanh"));
    TU_OK(pp_node_set_ints(g, n, "perm", 3, (int64_t[]){0, 2, 1}));
    TU_OK(pp_node_set_floats(g, n, "scales", 2, (float[]){1.5f, 2.5f}));
    TU_OK(pp_node_set_int(g, n, "axis", 2)); /* replaces */
    const pp_node *node = &g->nodes[n];
    assert_int_equal(node->n_attr, 5);
    assert_int_equal(pp_node_attr_int(node, "axis", 0), 2);
    assert_true(pp_node_attr_float(node, "eps", 0) == 1e-5f);
    assert_true(pp_node_attr_float(node, "axis", 0) == 2.0f); /* int read as float */
    assert_string_equal(pp_node_attr_string(node, "mode", ""), "tanh");
    const int64_t *perm;
    assert_int_equal(pp_node_attr_ints(node, "perm", &perm), 3);
    assert_int_equal(perm[1], 2);
    assert_int_equal(pp_node_attr_ints(node, "missing", &perm), -1);
    assert_int_equal(pp_node_attr_int(node, "missing", 7), 7);
    /* a node copied into another graph keeps its attributes */
    pp_graph *h;
    TU_OK(pp_graph_new("h", &h));
    int m;
    TU_OK(pp_graph_copy_node(h, g, n, NULL, &m));
    assert_int_equal(pp_node_attr_ints(&h->nodes[m], "perm", &perm), 3);
    assert_string_equal(pp_node_attr_string(&h->nodes[m], "mode", ""), "tanh");
    assert_string_equal(h->values[h->nodes[m].out[0]].name, g->values[node->out[0]].name);
    pp_graph_free(h);
    pp_graph_free(g);
}

static void test_resolve_errors(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int x, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 0, NULL, &x));
    TU_OK(pp_graph_add_node(g, "Relu", "", "too_many", 2, (int[]){x, x}, 1, NULL, &n));
    assert_int_equal(pp_graph_resolve(g), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "'too_many'"));
    assert_non_null(strstr(pp_last_error(), "2 inputs"));
    pp_graph_free(g);
    TU_OK(pp_graph_new("g", &g));
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 0, NULL, &x));
    TU_OK(pp_graph_add_node(g, "NoSuchOp", "com.example", "strange", 1, &x, 1, NULL, &n));
    assert_int_equal(pp_graph_resolve(g), PP_ERR_UNSUPPORTED);
    assert_non_null(strstr(pp_last_error(), "com.example::NoSuchOp"));
    pp_graph_free(g);
    /* out-of-range inputs are refused when the node is added */
    TU_OK(pp_graph_new("g", &g));
    assert_int_equal(pp_graph_add_node(g, "Relu", "", "bad", 1, (int[]){42}, 1, NULL, &n), PP_ERR_INVALID);
    pp_graph_free(g);
}

static void test_registry(void **state) {
    (void)state;
    assert_non_null(pp_op_find("", "MatMul"));
    assert_ptr_equal(pp_op_find("ai.onnx", "MatMul"), pp_op_find("", "MatMul"));
    assert_non_null(pp_op_find("pippin", "PipeSplit"));
    assert_null(pp_op_find("", "PipeSplit"));
    int n = 0;
    while (pp_op_at(n)) n++;
    assert_true(n > 60);
    /* every op the issue lists is there */
    const char *ops[] = {"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Sqrt", "Exp", "Log", "Erf", "Tanh",
                         "Sigmoid", "Relu", "LeakyRelu", "Gelu", "MatMul", "Gemm", "Softmax", "LogSoftmax",
                         "LayerNormalization", "ReduceMean", "ReduceSum", "Reshape", "Transpose", "Concat",
                         "Split", "Slice", "Gather", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Where",
                         "Equal", "Cast", "Shape", "Range", "ConstantOfShape", "Dropout", "Identity",
                         "Constant", "SoftmaxCrossEntropyLoss"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!pp_op_find("", ops[i])) fail_msg("op %s is not registered", ops[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_and_lookup),
        cmocka_unit_test(test_attributes),
        cmocka_unit_test(test_resolve_errors),
        cmocka_unit_test(test_registry),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
