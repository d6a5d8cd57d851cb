/* The inference optimizer (pippin/optimize.h): each pass on a small graph
 * built with the graph API (the rewrite happened, what must stay stayed,
 * and the outputs match the unoptimized graph's within 1e-6), the
 * pippin::MatMulAdd kernel (bit for bit against MatMul then Add, the same
 * bits at 1 and 4 threads), the pass switch, and the PyTorch fixtures run
 * optimized against unoptimized and against PyTorch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "test_filter.h"
typedef pp_graph *(*builder)(void);

static int count_op(const pp_graph *g, const char *op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += strcmp(g->nodes[i].op_type, op) == 0;
    return n;
}

static int rewrites_of(const pp_optimize_report *r, const char *pass) {
    for (int i = 0; i < r->n_passes; i++)
        if (strcmp(r->pass[i], pass) == 0) return r->rewrites[i];
    return -1;
}

static pp_tensor *rand_f32(int nd, const int64_t *shape, uint64_t seed) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    float *d = t->data;
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) d[i] = (float)(2.0 * tu_urand(&seed));
    return t;
}

static int add_param(pp_graph *g, const char *name, pp_value_kind kind, pp_tensor *t) {
    int v;
    TU_OK(pp_graph_add_initializer(g, name, kind, t, &v));
    return v;
}

static int node1(pp_graph *g, const char *op, const char *name, int n_in, const int *in) {
    int id;
    TU_OK(pp_graph_add_node(g, op, "", name, n_in, in, 1, NULL, &id));
    return g->nodes[id].out[0];
}

/* Builds the graph twice: runs one as built and one optimized with
 * `passes` on the same inputs, checks the outputs agree within tol (0: bit
 * for bit), and returns the optimized graph (caller frees) and its report. */
static pp_graph *check_optimized(builder build, unsigned passes, pp_tensor *const *ins, double tol,
                                 pp_optimize_report *r) {
    pp_graph *ref = build(), *opt = build();
    pp_tensor *want[8] = {0}, *got[8] = {0};
    assert_true(ref->n_outputs <= 8);
    TU_OK(pp_graph_run(ref, ins, want));
    TU_OK(pp_graph_optimize(opt, passes, r));
    assert_int_equal(r->nodes_after, opt->n_nodes);
    assert_int_equal(opt->n_inputs, ref->n_inputs);
    assert_int_equal(opt->n_outputs, ref->n_outputs);
    for (int i = 0; i < ref->n_outputs; i++)
        assert_string_equal(opt->values[opt->outputs[i]].name, ref->values[ref->outputs[i]].name);
    TU_OK(pp_graph_run(opt, ins, got));
    for (int i = 0; i < ref->n_outputs; i++) {
        if (tol == 0) {
            assert_int_equal(got[i]->nbytes, want[i]->nbytes);
            assert_memory_equal(got[i]->data, want[i]->data, want[i]->nbytes);
        } else {
            tu_assert_close(got[i], want[i], tol, tol, ref->values[ref->outputs[i]].name);
        }
        pp_tensor_free(got[i]);
        pp_tensor_free(want[i]);
    }
    pp_graph_free(ref);
    return opt;
}

/* ---- fold ---- */

/* y = Reshape(x, Concat(Unsqueeze(Constant 2), Shape(W)[1:], Shape(s)[0:1]))
 *     + Transpose(W) summed... kept small: the shape path is constant
 * (Constant, a weight's shape, a static input's shape); Transpose(W) reads a
 * trainable parameter and stays; Shape(x) of the dynamic input stays. */
static pp_graph *fold_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("fold", &g));
    int x, s, w, axes, c2, cid;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(-1, 6), &x));
    TU_OK(pp_graph_add_input(g, "s", PP_F32, 1, SHAPE(3), &s));
    w = add_param(g, "W", PP_VALUE_PARAM, rand_f32(2, SHAPE(3, 2), 1));
    axes = add_param(g, "axes", PP_VALUE_CONST, I64(1, SHAPE(1), 0));
    TU_OK(pp_graph_add_node(g, "Constant", "", "two", 0, NULL, 1, NULL, &cid));
    TU_OK(pp_node_set_tensor(g, cid, "value", I64(0, SHAPE(0), -1)));
    c2 = g->nodes[cid].out[0];
    int u = node1(g, "Unsqueeze", "unsq", 2, (int[]){c2, axes});
    int sw = node1(g, "Shape", "shape_w", 1, &w); /* [3, 2] */
    int ss = node1(g, "Shape", "shape_s", 1, &s); /* [3] */
    int sx = node1(g, "Shape", "shape_x", 1, &x); /* dynamic */
    int cat;
    TU_OK(pp_graph_add_node(g, "Concat", "", "cat", 3, (int[]){u, sw, ss}, 1, NULL, &cat));
    TU_OK(pp_node_set_int(g, cat, "axis", 0));
    /* [-1, 3, 2, 3] -> product of the last three 18: x [b, 6] needs b*6 % 18 */
    int sl_start = add_param(g, "st", PP_VALUE_CONST, I64(1, SHAPE(1), 1));
    int sl_end = add_param(g, "en", PP_VALUE_CONST, I64(1, SHAPE(1), 3));
    int shp = node1(g, "Slice", "slice", 3, (int[]){g->nodes[cat].out[0], sl_start, sl_end}); /* [3, 2] */
    int m1 = add_param(g, "m1", PP_VALUE_CONST, I64(1, SHAPE(1), -1));
    int cat2;
    TU_OK(pp_graph_add_node(g, "Concat", "", "cat2", 2, (int[]){m1, shp}, 1, NULL, &cat2));
    TU_OK(pp_node_set_int(g, cat2, "axis", 0));
    int r = node1(g, "Reshape", "reshape", 2, (int[]){x, g->nodes[cat2].out[0]}); /* [b, 3, 2] */
    int wt = node1(g, "Identity", "w_copy", 1, &w);
    int y = node1(g, "Add", "add", 2, (int[]){r, wt});
    TU_OK(pp_graph_add_output(g, y));
    TU_OK(pp_graph_add_output(g, sx));
    return g;
}

static void test_fold_constants_and_static_shapes(void **state) {
    (void)state;
    pp_tensor *ins[2] = {rand_f32(2, SHAPE(3, 6), 7), rand_f32(1, SHAPE(3), 8)};
    pp_optimize_report r;
    pp_graph *g = check_optimized(fold_graph, PP_OPT_FOLD | PP_OPT_DEAD, ins, 0, &r);
    /* Constant, Unsqueeze, Shape(W), Shape(s), Concat, Slice, Concat folded */
    assert_int_equal(rewrites_of(&r, "fold"), 7);
    assert_int_equal(count_op(g, "Constant"), 0);
    assert_int_equal(count_op(g, "Concat"), 0);
    assert_int_equal(count_op(g, "Unsqueeze"), 0);
    assert_int_equal(count_op(g, "Shape"), 1); /* of the dynamic input */
    assert_int_equal(count_op(g, "Identity"), 1); /* reads a trainable parameter */
    assert_int_equal(g->n_nodes, 4);
    int v = pp_graph_find_value(g, "cat2_out0");
    assert_true(v >= 0);
    assert_int_equal(g->values[v].kind, PP_VALUE_CONST);
    assert_non_null(g->values[v].data);
    pp_graph_free(g);
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
}

/* ---- identity and dead ---- */

static pp_graph *identity_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("identity", &g));
    int x, split;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 1, SHAPE(4), &x));
    int a = node1(g, "Identity", "id_a", 1, &x);
    TU_OK(pp_graph_add_node(g, "PipeSplit", "pippin", "marker", 1, &a, 1, NULL, &split));
    int b = node1(g, "Relu", "relu", 1, &g->nodes[split].out[0]);
    int unused = node1(g, "Exp", "unused_exp", 1, &b);
    (void)node1(g, "Neg", "unused_neg", 1, &unused);
    int out = node1(g, "Identity", "id_out", 1, &b); /* a graph output: kept */
    TU_OK(pp_graph_add_output(g, out));
    TU_OK(pp_graph_add_output(g, b));
    return g;
}

static void test_identity_and_dead(void **state) {
    (void)state;
    pp_tensor *x = F32(1, SHAPE(4), -1, 2, -3, 4);
    pp_optimize_report r;
    pp_graph *g = check_optimized(identity_graph, PP_OPT_IDENTITY, &x, 0, &r);
    assert_int_equal(rewrites_of(&r, "identity"), 2);
    assert_int_equal(count_op(g, "PipeSplit"), 0);
    assert_int_equal(count_op(g, "Identity"), 1);
    assert_int_equal(count_op(g, "Exp"), 1); /* dead is off */
    pp_graph_free(g);
    g = check_optimized(identity_graph, PP_OPT_DEAD, &x, 0, &r);
    assert_int_equal(rewrites_of(&r, "dead"), 2);
    assert_int_equal(count_op(g, "Exp"), 0);
    assert_int_equal(count_op(g, "Neg"), 0);
    assert_int_equal(count_op(g, "Identity"), 2);
    assert_int_equal(g->n_nodes, 4);
    pp_graph_free(g);
    pp_tensor_free(x);
}

/* ---- gelu ---- */

static int scalar(pp_graph *g, const char *name, float v) {
    pp_tensor *t;
    TU_OK(pp_tensor_scalar_f32(v, &t));
    return add_param(g, name, PP_VALUE_CONST, t);
}

/* PyTorch 1.13's erf form: 0.5 * (x * (1 + erf(x / sqrt 2))), with x from
 * a Relu so the pattern's input is a node output; y = gelu + 1. */
static pp_graph *gelu_erf_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("gelu_erf", &g));
    int x;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(-1, 5), &x));
    int h = node1(g, "Neg", "neg", 1, &x);
    int d = node1(g, "Div", "div", 2, (int[]){h, scalar(g, "sqrt2", 1.4142135f)});
    int e = node1(g, "Erf", "erf", 1, &d);
    int a = node1(g, "Add", "add1", 2, (int[]){e, scalar(g, "one", 1.0f)});
    int m = node1(g, "Mul", "mul_x", 2, (int[]){h, a});
    int y = node1(g, "Mul", "mul_half", 2, (int[]){m, scalar(g, "half", 0.5f)});
    int z = node1(g, "Add", "after", 2, (int[]){y, scalar(g, "one2", 1.0f)});
    TU_OK(pp_graph_add_output(g, z));
    return g;
}

/* The tanh form, as the example GPT's NewGELU exports it. */
static pp_graph *gelu_tanh_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("gelu_tanh", &g));
    int x;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(-1, 5), &x));
    int x2 = node1(g, "Mul", "sq", 2, (int[]){x, x});
    int x3 = node1(g, "Mul", "cube", 2, (int[]){x, x2});
    int c = node1(g, "Mul", "c", 2, (int[]){scalar(g, "k", 0.044715f), x3});
    int s = node1(g, "Add", "s", 2, (int[]){x, c});
    int t = node1(g, "Mul", "t", 2, (int[]){scalar(g, "k2", 0.7978845608f), s});
    int th = node1(g, "Tanh", "tanh", 1, &t);
    int a = node1(g, "Add", "a", 2, (int[]){scalar(g, "one", 1.0f), th});
    int m = node1(g, "Mul", "m", 2, (int[]){x, a});
    int y = node1(g, "Mul", "y", 2, (int[]){scalar(g, "half", 0.5f), m});
    TU_OK(pp_graph_add_output(g, y));
    return g;
}

/* The erf form with Erf's output also a graph output: not fused. */
static pp_graph *gelu_shared_graph(void) {
    pp_graph *g = gelu_erf_graph();
    TU_OK(pp_graph_add_output(g, pp_graph_find_value(g, "erf_out0")));
    return g;
}

static void test_gelu_fusion(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(2, SHAPE(7, 5), 3);
    float *d = x->data;
    d[0] = 4.0f, d[1] = -4.0f, d[2] = 0.0f; /* tails and 0 */
    pp_optimize_report r;
    pp_graph *g = check_optimized(gelu_erf_graph, PP_OPT_GELU, &x, 1e-6, &r);
    assert_int_equal(rewrites_of(&r, "gelu"), 1);
    assert_int_equal(count_op(g, "Gelu"), 1);
    assert_int_equal(count_op(g, "Erf"), 0);
    assert_int_equal(count_op(g, "Mul"), 0);
    assert_int_equal(g->n_nodes, 3); /* Neg, Gelu, Add */
    int gl = pp_graph_find_node(g, "mul_half"); /* keeps the root's name */
    assert_true(gl >= 0);
    assert_string_equal(pp_node_attr_string(&g->nodes[gl], "approximate", "none"), "none");
    pp_graph_free(g);

    g = check_optimized(gelu_tanh_graph, PP_OPT_GELU, &x, 1e-6, &r);
    assert_int_equal(g->n_nodes, 1);
    assert_string_equal(g->nodes[0].op_type, "Gelu");
    assert_string_equal(pp_node_attr_string(&g->nodes[0], "approximate", "none"), "tanh");
    pp_graph_free(g);

    g = check_optimized(gelu_shared_graph, PP_OPT_GELU, &x, 0, &r);
    assert_int_equal(rewrites_of(&r, "gelu"), 0);
    assert_int_equal(count_op(g, "Erf"), 1);
    pp_graph_free(g);
    pp_tensor_free(x);
}

/* ---- matmul ---- */

/* torch's Linear: Add(b, MatMul(x, Transpose(W))), then act. x [2, 3, 4],
 * W [5, 4], b [5]. */
static pp_graph *linear_graph(const char *act, int transpose, int bias_ndim) {
    pp_graph *g;
    TU_OK(pp_graph_new("linear", &g));
    int x;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, -1, NULL, &x));
    int w = add_param(g, "W", PP_VALUE_PARAM, transpose ? rand_f32(2, SHAPE(5, 4), 11) : rand_f32(2, SHAPE(4, 5), 11));
    int b = add_param(g, "b", PP_VALUE_PARAM,
                      bias_ndim == 1 ? rand_f32(1, SHAPE(5), 12) : rand_f32(2, SHAPE(1, 5), 12));
    int wt = transpose ? node1(g, "Transpose", "wt", 1, &w) : w;
    if (transpose) TU_OK(pp_node_set_ints(g, g->values[wt].producer, "perm", 2, (int64_t[]){1, 0}));
    int m = node1(g, "MatMul", "mm", 2, (int[]){x, wt});
    int y = node1(g, "Add", "add", 2, (int[]){b, m});
    if (act) {
        int id;
        TU_OK(pp_graph_add_node(g, act, "", "act", 1, &y, 1, NULL, &id));
        if (strcmp(act, "Gelu") == 0) TU_OK(pp_node_set_string(g, id, "approximate", "tanh"));
        y = g->nodes[id].out[0];
    }
    TU_OK(pp_graph_add_output(g, y));
    return g;
}

static pp_graph *linear_relu(void) { return linear_graph("Relu", 1, 1); }
static pp_graph *linear_gelu(void) { return linear_graph("Gelu", 1, 1); }
static pp_graph *linear_plain_w(void) { return linear_graph(NULL, 0, 1); }
static pp_graph *linear_2d_bias(void) { return linear_graph(NULL, 1, 2); }

static void test_matmul_bias_activation(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(3, SHAPE(2, 3, 4), 5), *x1 = rand_f32(1, SHAPE(4), 6);
    pp_optimize_report r;
    /* the transposed weight read by this MatMul alone: packed once
     * (PackWeight), the MatMulAdd reading the panels */
    pp_graph *g = check_optimized(linear_relu, PP_OPT_ALL, &x, 1e-6, &r);
    assert_int_equal(rewrites_of(&r, "matmul"), 1);
    assert_int_equal(g->n_nodes, 2);
    assert_string_equal(g->nodes[0].op_type, "PackWeight");
    assert_int_equal(pp_node_attr_int(&g->nodes[0], "transB", 0), 1);
    assert_string_equal(g->nodes[1].op_type, "MatMulAdd");
    assert_string_equal(g->nodes[1].domain, "pippin");
    assert_int_equal(pp_node_attr_int(&g->nodes[1], "packed_n", 0), 5);
    assert_string_equal(pp_node_attr_string(&g->nodes[1], "activation", ""), "relu");
    assert_int_equal(g->values[g->outputs[0]].producer, 1);
    pp_graph_free(g);
    g = check_optimized(linear_relu, PP_OPT_ALL, &x1, 1e-6, &r); /* a 1-D x: one row */
    pp_graph_free(g);
    g = check_optimized(linear_gelu, PP_OPT_ALL, &x, 1e-6, &r);
    assert_int_equal(g->n_nodes, 2);
    assert_string_equal(pp_node_attr_string(&g->nodes[1], "activation", ""), "gelu_tanh");
    pp_graph_free(g);
    /* W used as it is: the same GEMM call as MatMul's and the same add, bit for bit */
    g = check_optimized(linear_plain_w, PP_OPT_ALL, &x, 0, &r);
    assert_int_equal(g->n_nodes, 1);
    assert_int_equal(pp_node_attr_int(&g->nodes[0], "transB", 0), 0);
    pp_graph_free(g);
    /* a [1, 5] bias is not fused; the transpose still is */
    g = check_optimized(linear_2d_bias, PP_OPT_ALL, &x, 1e-6, &r);
    assert_int_equal(g->n_nodes, 3);
    assert_int_equal(count_op(g, "MatMulAdd"), 1);
    assert_int_equal(count_op(g, "PackWeight"), 1);
    assert_int_equal(count_op(g, "Add"), 1);
    assert_int_equal(count_op(g, "Transpose"), 0);
    pp_graph_free(g);
    pp_tensor_free(x);
    pp_tensor_free(x1);
}

/* The MatMul's output is also a graph output: the Add stays apart. */
static pp_graph *linear_shared(void) {
    pp_graph *g = linear_graph(NULL, 0, 1);
    TU_OK(pp_graph_add_output(g, pp_graph_find_value(g, "mm_out0")));
    return g;
}

static void test_matmul_keeps_read_values(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(3, SHAPE(2, 3, 4), 5);
    pp_optimize_report r;
    pp_graph *g = check_optimized(linear_shared, PP_OPT_ALL, &x, 0, &r);
    assert_int_equal(rewrites_of(&r, "matmul"), 0);
    assert_int_equal(count_op(g, "MatMul"), 1);
    assert_int_equal(count_op(g, "Add"), 1);
    pp_graph_free(g);
    pp_tensor_free(x);
}

/* torch's Linear on 2-D inputs: Gemm(x, W, b, transB=1), then Relu (or
 * nothing). */
static pp_graph *gemm_graph(int relu) {
    pp_graph *g;
    TU_OK(pp_graph_new("gemm", &g));
    int x, id;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(-1, 4), &x));
    int w = add_param(g, "W", PP_VALUE_PARAM, rand_f32(2, SHAPE(5, 4), 11));
    int b = add_param(g, "b", PP_VALUE_PARAM, rand_f32(1, SHAPE(5), 12));
    TU_OK(pp_graph_add_node(g, "Gemm", "", "gemm", 3, (int[]){x, w, b}, 1, NULL, &id));
    TU_OK(pp_node_set_int(g, id, "transB", 1));
    int y = g->nodes[id].out[0];
    if (relu) y = node1(g, "Relu", "relu", 1, &y);
    TU_OK(pp_graph_add_output(g, y));
    return g;
}

static pp_graph *gemm_relu(void) { return gemm_graph(1); }
static pp_graph *gemm_alone(void) { return gemm_graph(0); }

static void test_gemm_activation(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(2, SHAPE(6, 4), 5);
    pp_optimize_report r;
    pp_graph *g = check_optimized(gemm_relu, PP_OPT_ALL, &x, 1e-6, &r);
    assert_int_equal(rewrites_of(&r, "matmul"), 1);
    assert_int_equal(g->n_nodes, 1);
    assert_string_equal(g->nodes[0].op_type, "MatMulAdd");
    assert_string_equal(g->nodes[0].name, "gemm");
    assert_int_equal(pp_node_attr_int(&g->nodes[0], "transB", 0), 1);
    assert_string_equal(pp_node_attr_string(&g->nodes[0], "activation", ""), "relu");
    pp_graph_free(g);
    g = check_optimized(gemm_alone, PP_OPT_ALL, &x, 0, &r); /* nothing to gain */
    assert_int_equal(rewrites_of(&r, "matmul"), 0);
    assert_string_equal(g->nodes[0].op_type, "Gemm");
    pp_graph_free(g);
    pp_tensor_free(x);
}

/* MatMulAdd's bias and activation pass: the same bits at 1 and 4 threads
 * of pippin's pool (rows split between threads, never inside one). */
static void test_matmul_add_threads(void **state) {
    (void)state;
    pp_tensor *a = rand_f32(2, SHAPE(2048, 64), 21), *w = rand_f32(2, SHAPE(96, 64), 22), *b = rand_f32(1, SHAPE(96), 23);
    const char *acts[] = {"", "relu", "gelu", "gelu_tanh"};
    int before = pp_get_threads();
    for (int k = 0; k < 4; k++) {
        pp_tensor *y[2];
        for (int t = 0; t < 2; t++) {
            pp_set_threads(t ? 4 : 1);
            pp_set_blas_threads(1); /* the GEMM's bits are OpenBLAS's, which depend on its threads */
            tu_node n;
            tu_node_init_dom(&n, "MatMulAdd", "pippin", 3,
                             (pp_tensor *[]){pp_tensor_retain(a), pp_tensor_retain(w), pp_tensor_retain(b)}, 1, NULL);
            TU_OK(pp_node_set_int(n.g, n.node, "transB", 1));
            TU_OK(pp_node_set_string(n.g, n.node, "activation", acts[k]));
            y[t] = tu_node_run_one(&n);
            tu_node_free(&n);
        }
        tu_assert_shape(y[0], 2, SHAPE(2048, 96));
        assert_memory_equal(y[0]->data, y[1]->data, y[0]->nbytes);
        pp_tensor_free(y[0]);
        pp_tensor_free(y[1]);
    }
    pp_set_threads(before);
    pp_tensor_free(a);
    pp_tensor_free(w);
    pp_tensor_free(b);
}

/* A Linear (x [2, 7, 20], W 37 x 20: 7 rows of 6 and a partial panel of 5
 * columns; res_packed: W [37, 20] read through Transpose, packed; else W
 * [20, 37] as it is, OpenBLAS's GEMM), then Gelu (tanh) when res_act, then
 * Add(r, y) or (r_first 0) Add(y, r). r is an input, or (late) Relu(r)
 * made after the MatMul; keep_y also makes y a graph output (nothing taken
 * in: the unfused reference, whose Add output comes first). */
static int res_act = 1, res_packed = 1, res_first = 1;
static pp_graph *residual_graph(int late, int keep_y) {
    pp_graph *g;
    TU_OK(pp_graph_new("residual", &g));
    int x, r;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, -1, NULL, &x));
    TU_OK(pp_graph_add_input(g, "r", PP_F32, -1, NULL, &r));
    int w = add_param(g, "W", PP_VALUE_PARAM, res_packed ? rand_f32(2, SHAPE(37, 20), 61) : rand_f32(2, SHAPE(20, 37), 61));
    int b = add_param(g, "b", PP_VALUE_PARAM, rand_f32(1, SHAPE(37), 62));
    int wt = w;
    if (res_packed) {
        wt = node1(g, "Transpose", "wt", 1, &w);
        TU_OK(pp_node_set_ints(g, g->values[wt].producer, "perm", 2, (int64_t[]){1, 0}));
    }
    int m = node1(g, "MatMul", "mm", 2, (int[]){x, wt});
    int y = node1(g, "Add", "add_bias", 2, (int[]){m, b}), id;
    if (res_act) {
        TU_OK(pp_graph_add_node(g, "Gelu", "", "act", 1, &y, 1, NULL, &id));
        TU_OK(pp_node_set_string(g, id, "approximate", "tanh"));
        y = g->nodes[id].out[0];
    }
    if (late) r = node1(g, "Relu", "late", 1, &r);
    int out = node1(g, "Add", "residual", 2, res_first ? (int[]){r, y} : (int[]){y, r});
    TU_OK(pp_graph_add_output(g, out));
    if (keep_y) TU_OK(pp_graph_add_output(g, y));
    return g;
}

static pp_graph *residual_fused(void) { return residual_graph(0, 0); }
static pp_graph *residual_kept(void) { return residual_graph(0, 1); }
static pp_graph *residual_late(void) { return residual_graph(1, 0); }

/* Inference takes the residual Add into MatMulAdd (input 3), the same bits
 * as the Add after it at 1 and 4 threads: added to each tile as the packed
 * GEMM stores it (no activation), in the activation's pass after the GEMM,
 * or after OpenBLAS's GEMM (W not packed); an r of another shape is added
 * by the Add kernel (broadcast); no rows at all; an r made after the
 * MatMul, or a training graph, is left alone. */
static void test_matmul_residual(void **state) {
    (void)state;
    pp_tensor *in[2] = {rand_f32(3, SHAPE(2, 7, 20), 63), rand_f32(3, SHAPE(2, 7, 37), 64)};
    pp_tensor *in_b[2] = {in[0], rand_f32(1, SHAPE(37), 65)};
    pp_tensor *in_0[2] = {rand_f32(3, SHAPE(2, 0, 20), 66), rand_f32(3, SHAPE(2, 0, 37), 67)};
    pp_optimize_report r;
    for (int k = 0; k < 3; k++) /* r [2,7,37], r [37], no rows */
        for (int v = 0; v < 8; v++) {
            pp_tensor *const *ins = k == 0 ? in : k == 1 ? in_b : in_0;
            res_act = v & 1, res_packed = v >> 1 & 1, res_first = v >> 2 & 1;
            pp_graph *g = check_optimized(residual_fused, PP_OPT_ALL, ins, 1e-5, &r);
            assert_int_equal(g->n_nodes, res_packed ? 2 : 1);
            const pp_node *mm = &g->nodes[g->n_nodes - 1];
            assert_string_equal(mm->op_type, "MatMulAdd");
            assert_int_equal(mm->n_in, 4);
            assert_int_equal(mm->in[3], pp_graph_find_value(g, "r"));
            assert_int_equal(g->values[g->outputs[0]].producer, g->n_nodes - 1);
            pp_graph *ref = residual_kept();
            TU_OK(pp_graph_optimize(ref, PP_OPT_ALL, &r));
            assert_int_equal(count_op(ref, "Add"), 1);
            pp_tensor *want[2], *got;
            TU_OK(pp_graph_run(ref, ins, want));
            int before = pp_get_threads();
            for (int t = 1; t <= 4; t += 3) {
                pp_set_threads(t);
                TU_OK(pp_graph_run(g, ins, &got));
                assert_int_equal(got->nbytes, want[0]->nbytes);
                assert_memory_equal(got->data, want[0]->data, want[0]->nbytes);
                pp_tensor_free(got);
            }
            pp_set_threads(before);
            pp_tensor_free(want[0]);
            pp_tensor_free(want[1]);
            pp_graph_free(ref);
            pp_graph_free(g);
        }
    res_act = res_packed = res_first = 1;
    pp_graph *g = check_optimized(residual_late, PP_OPT_ALL, in, 1e-5, &r); /* r made after the MatMul */
    assert_int_equal(count_op(g, "Add"), 1);
    assert_int_equal(count_op(g, "MatMulAdd"), 1);
    pp_graph_free(g);
    g = residual_fused();
    TU_OK(pp_graph_optimize_for_training(g, &r));
    for (int i = 0; i < g->n_nodes; i++) assert_true(g->nodes[i].n_in <= 3);
    assert_int_equal(count_op(g, "Add"), 1);
    pp_graph_free(g);
    pp_tensor_free(in[0]);
    pp_tensor_free(in[1]);
    pp_tensor_free(in_b[1]);
    pp_tensor_free(in_0[0]);
    pp_tensor_free(in_0[1]);
}

/* A Linear (x [2, 7, 20], W [80, 20], bias) whose output a Split cuts:
 * along axis 2 into 32/16/32 (the panels' multiples: stored straight into
 * the parts), 32/16/5 of W [53, 20] (the same, a partial last panel),
 * 30/50 (not), or along axis 1 into 3/4 (not the last axis);
 * the sizes as a constant input or (sizes_attr) an attribute; keep_y also
 * makes the product a graph output (nothing taken in: the reference). */
static pp_graph *split_graph(int kind, int sizes_attr, int keep_y) {
    pp_graph *g;
    TU_OK(pp_graph_new("split", &g));
    int x, id, nw = kind == 3 ? 53 : 80;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, -1, NULL, &x));
    int w = add_param(g, "W", PP_VALUE_PARAM, rand_f32(2, SHAPE(nw, 20), 71));
    int b = add_param(g, "b", PP_VALUE_PARAM, rand_f32(1, SHAPE(nw), 72));
    int wt = node1(g, "Transpose", "wt", 1, &w);
    TU_OK(pp_node_set_ints(g, g->values[wt].producer, "perm", 2, (int64_t[]){1, 0}));
    int m = node1(g, "MatMul", "mm", 2, (int[]){x, wt});
    int y = node1(g, "Add", "add_bias", 2, (int[]){b, m});
    int64_t sizes[4][3] = {{32, 16, 32}, {30, 50}, {3, 4}, {32, 16, 5}};
    int n = kind == 0 || kind == 3 ? 3 : 2;
    pp_tensor *st = NULL;
    if (!sizes_attr) TU_OK(pp_tensor_empty(PP_I64, 1, SHAPE(n), &st));
    int in[2] = {y, sizes_attr ? -1 : add_param(g, "sizes", PP_VALUE_CONST, st)};
    if (!sizes_attr) memcpy(g->values[in[1]].data->data, sizes[kind], sizeof(int64_t) * (size_t)n);
    TU_OK(pp_graph_add_node(g, "Split", "", "split", sizes_attr ? 1 : 2, in, n, NULL, &id));
    TU_OK(pp_node_set_int(g, id, "axis", kind == 2 ? 1 : 2));
    if (sizes_attr) TU_OK(pp_node_set_ints(g, id, "split", n, sizes[kind]));
    for (int k = 0; k < n; k++) TU_OK(pp_graph_add_output(g, g->nodes[id].out[k]));
    if (keep_y) TU_OK(pp_graph_add_output(g, y));
    return g;
}

static int split_kind, split_attr;
static pp_graph *split_fused(void) { return split_graph(split_kind, split_attr, 0); }
static pp_graph *split_kept(void) { return split_graph(split_kind, split_attr, 1); }

/* Inference takes a Split of a packed Linear's product into its MatMulAdd:
 * the parts are the Split's to the bit, at 1 and 4 threads, whether the
 * GEMM stores them straight (32/16/32 along the last axis) or the Split
 * kernel cuts the product (30/50, or along axis 1). */
static void test_matmul_split(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(3, SHAPE(2, 7, 20), 73);
    pp_optimize_report r;
    for (split_kind = 0; split_kind < 4; split_kind++)
        for (split_attr = 0; split_attr < 2; split_attr++) {
            int n = split_kind == 0 || split_kind == 3 ? 3 : 2;
            pp_graph *g = check_optimized(split_fused, PP_OPT_ALL, &x, 1e-5, &r);
            assert_int_equal(g->n_nodes, 2);
            assert_string_equal(g->nodes[1].op_type, "MatMulAdd");
            assert_int_equal(g->nodes[1].n_out, n);
            for (int k = 0; k < n; k++) assert_int_equal(g->values[g->outputs[k]].producer, 1);
            pp_graph *ref = split_kept();
            TU_OK(pp_graph_optimize(ref, PP_OPT_ALL, &r));
            assert_int_equal(count_op(ref, "Split"), 1);
            pp_tensor *want[4] = {0}, *got[3] = {0};
            TU_OK(pp_graph_run(ref, &x, want));
            int before = pp_get_threads();
            for (int t = 1; t <= 4; t += 3) {
                pp_set_threads(t);
                TU_OK(pp_graph_run(g, &x, got));
                for (int k = 0; k < n; k++) {
                    assert_int_equal(got[k]->ndim, 3);
                    assert_int_equal(got[k]->nbytes, want[k]->nbytes);
                    assert_memory_equal(got[k]->data, want[k]->data, want[k]->nbytes);
                    pp_tensor_free(got[k]);
                }
            }
            pp_set_threads(before);
            for (int k = 0; k <= n; k++) pp_tensor_free(want[k]);
            pp_graph_free(ref);
            pp_graph_free(g);
        }
    pp_tensor_free(x);
}

static void test_matmul_add_errors(void **state) {
    (void)state;
    pp_tensor *a = rand_f32(2, SHAPE(3, 4), 1), *w = rand_f32(2, SHAPE(5, 4), 2), *b = rand_f32(1, SHAPE(4), 3);
    tu_node n;
    tu_node_init_dom(&n, "MatMulAdd", "pippin", 2, (pp_tensor *[]){pp_tensor_retain(a), pp_tensor_retain(w)}, 1,
                     NULL); /* [3,4] x [5,4] */
    tu_node_expect_error(&n, PP_ERR_SHAPE, "inner dims 4 and 5");
    tu_node_free(&n);
    tu_node_init_dom(&n, "MatMulAdd", "pippin", 3,
                     (pp_tensor *[]){pp_tensor_retain(a), pp_tensor_retain(w), pp_tensor_retain(b)}, 1, NULL);
    TU_OK(pp_node_set_int(n.g, n.node, "transB", 1));
    tu_node_expect_error(&n, PP_ERR_SHAPE, "bias [4] is not [5]");
    tu_node_free(&n);
    pp_graph *g;
    int x, wv, id;
    TU_OK(pp_graph_new("bad", &g));
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(3, 4), &x));
    wv = add_param(g, "W", PP_VALUE_PARAM, rand_f32(2, SHAPE(4, 5), 4));
    TU_OK(pp_graph_add_node(g, "MatMulAdd", "pippin", "fused", 2, (int[]){x, wv}, 1, NULL, &id));
    TU_OK(pp_node_set_string(g, id, "activation", "swish"));
    assert_int_equal(pp_graph_resolve(g), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "node 'fused'"));
    assert_non_null(strstr(pp_last_error(), "activation"));
    pp_graph_free(g);
    pp_tensor_free(a);
    pp_tensor_free(w);
    pp_tensor_free(b);
}

/* ---- layernorm ---- */

/* LayerNorm decomposed as PyTorch exports it below opset 17: over the last
 * dim (axes attribute, Pow, gamma then beta), or (two) over the last two
 * (axes as an input, positive, Mul(d, d), gamma first, no beta); leak:
 * the centred value is also a graph output (nothing fused). */
static pp_graph *layernorm_graph(int two, int leak) {
    pp_graph *g;
    TU_OK(pp_graph_new("layernorm", &g));
    int x, id;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 3, SHAPE(-1, 3, 8), &x));
    int axes = -1;
    if (two) axes = add_param(g, "axes", PP_VALUE_CONST, I64(1, SHAPE(2), 1, 2));
    int m_in[2] = {x, axes};
    TU_OK(pp_graph_add_node(g, "ReduceMean", "", "mean", two ? 2 : 1, m_in, 1, NULL, &id));
    if (!two) TU_OK(pp_node_set_ints(g, id, "axes", 1, SHAPE(-1)));
    int d = node1(g, "Sub", "sub", 2, (int[]){x, g->nodes[id].out[0]});
    int sq;
    if (two) {
        sq = node1(g, "Mul", "square", 2, (int[]){d, d});
    } else {
        int e2 = add_param(g, "two", PP_VALUE_CONST, F32(0, SHAPE(0), 2.0f));
        sq = node1(g, "Pow", "pow", 2, (int[]){d, e2});
    }
    int v_in[2] = {sq, axes};
    TU_OK(pp_graph_add_node(g, "ReduceMean", "", "var", two ? 2 : 1, v_in, 1, NULL, &id));
    if (!two) TU_OK(pp_node_set_ints(g, id, "axes", 1, SHAPE(-1)));
    int eps = add_param(g, "eps", PP_VALUE_CONST, F32(0, SHAPE(0), 1e-5f));
    int ve = node1(g, "Add", "add_eps", 2, (int[]){g->nodes[id].out[0], eps});
    int sd = node1(g, "Sqrt", "sqrt", 1, &ve);
    int n = node1(g, "Div", "div", 2, (int[]){d, sd});
    int gamma = add_param(g, "gamma", PP_VALUE_PARAM, two ? rand_f32(2, SHAPE(3, 8), 51) : rand_f32(1, SHAPE(8), 51));
    int y = node1(g, "Mul", "mul_gamma", 2, two ? (int[]){gamma, n} : (int[]){n, gamma});
    if (!two) {
        int beta = add_param(g, "beta", PP_VALUE_PARAM, rand_f32(1, SHAPE(8), 52));
        y = node1(g, "Add", "add_beta", 2, (int[]){y, beta});
    }
    TU_OK(pp_graph_add_output(g, y));
    if (leak) TU_OK(pp_graph_add_output(g, d));
    return g;
}

static pp_graph *layernorm_last(void) { return layernorm_graph(0, 0); }
static pp_graph *layernorm_two(void) { return layernorm_graph(1, 0); }
static pp_graph *layernorm_leak(void) { return layernorm_graph(0, 1); }

static void test_layernorm_fusion(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(3, SHAPE(4, 3, 8), 53);
    pp_optimize_report r;
    pp_graph *g = check_optimized(layernorm_last, PP_OPT_ALL, &x, 1e-5, &r);
    assert_int_equal(rewrites_of(&r, "layernorm"), 1);
    assert_int_equal(g->n_nodes, 1);
    assert_string_equal(g->nodes[0].op_type, "LayerNormalization");
    assert_string_equal(g->nodes[0].name, "add_beta");
    assert_int_equal(g->nodes[0].n_in, 3);
    assert_int_equal(pp_node_attr_int(&g->nodes[0], "axis", 0), -1);
    assert_true(pp_node_attr_float(&g->nodes[0], "epsilon", 0) == 1e-5f);
    pp_graph_free(g);
    g = check_optimized(layernorm_two, PP_OPT_ALL, &x, 1e-5, &r);
    assert_int_equal(g->n_nodes, 1);
    assert_int_equal(g->nodes[0].n_in, 2);
    assert_int_equal(pp_node_attr_int(&g->nodes[0], "axis", 0), -2);
    pp_graph_free(g);
    g = check_optimized(layernorm_leak, PP_OPT_ALL, &x, 0, &r);
    assert_int_equal(rewrites_of(&r, "layernorm"), 0);
    assert_int_equal(count_op(g, "LayerNormalization"), 0);
    pp_graph_free(g);
    pp_tensor_free(x);
}

/* ---- transpose ---- */

/* x [2, 3, 4]: a Transpose pair that cancels (then Relu), a pair that
 * composes (0,2,1 then 2,0,1: one Transpose 1,0,2), and a Reshape
 * chain [6, 4] -> [4, -1]; the last Transpose makes a graph output. */
static pp_graph *transpose_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("transpose", &g));
    int x;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 3, SHAPE(2, 3, 4), &x));
    int a = node1(g, "Transpose", "t1", 1, &x);
    TU_OK(pp_node_set_ints(g, g->values[a].producer, "perm", 3, SHAPE(1, 0, 2)));
    a = node1(g, "Transpose", "t2", 1, &a);
    TU_OK(pp_node_set_ints(g, g->values[a].producer, "perm", 3, SHAPE(1, 0, 2)));
    a = node1(g, "Relu", "relu", 1, &a);
    int b = node1(g, "Transpose", "t3", 1, &x);
    TU_OK(pp_node_set_ints(g, g->values[b].producer, "perm", 3, SHAPE(0, 2, 1)));
    b = node1(g, "Transpose", "t4", 1, &b);
    TU_OK(pp_node_set_ints(g, g->values[b].producer, "perm", 3, SHAPE(2, 0, 1)));
    int s1 = add_param(g, "s1", PP_VALUE_CONST, I64(1, SHAPE(2), 6, 4));
    int s2 = add_param(g, "s2", PP_VALUE_CONST, I64(1, SHAPE(2), 4, -1));
    int r = node1(g, "Reshape", "r1", 2, (int[]){x, s1});
    r = node1(g, "Reshape", "r2", 2, (int[]){r, s2});
    TU_OK(pp_graph_add_output(g, a));
    TU_OK(pp_graph_add_output(g, b));
    TU_OK(pp_graph_add_output(g, r));
    return g;
}

static void test_transpose_elimination(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(3, SHAPE(2, 3, 4), 61);
    pp_optimize_report r;
    pp_graph *g = check_optimized(transpose_graph, PP_OPT_ALL, &x, 0, &r);
    assert_int_equal(rewrites_of(&r, "transpose"), 3);
    assert_int_equal(g->n_nodes, 3); /* Relu, one Transpose, one Reshape */
    assert_int_equal(count_op(g, "Transpose"), 1);
    assert_int_equal(count_op(g, "Reshape"), 1);
    const int64_t *perm;
    int t = g->values[g->outputs[1]].producer;
    assert_int_equal(pp_node_attr_ints(&g->nodes[t], "perm", &perm), 3);
    assert_true(perm[0] == 1 && perm[1] == 0 && perm[2] == 2);
    assert_int_equal(g->nodes[g->values[g->outputs[0]].producer].in[0], g->inputs[0]);
    pp_graph_free(g);
    pp_tensor_free(x);
}

/* ---- attention ---- */

#define AT_T 8 /* the mask buffer's size (block_size); inputs may be shorter */

/* A [1, 1, AT_T, AT_T] float mask: tril of ones (kind 0), the same with
 * the diagonal masked too (1: not causal), 0 / -inf for Add (2). */
static pp_tensor *mask_const(int kind) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, 4, SHAPE(1, 1, AT_T, AT_T), &t));
    float *d = t->data;
    for (int i = 0; i < AT_T; i++)
        for (int j = 0; j < AT_T; j++) {
            int keep = kind == 1 ? j < i : j <= i;
            d[i * AT_T + j] = kind == 2 ? (keep ? 0.0f : -INFINITY) : (float)keep;
        }
    return t;
}

/* GPT attention as PyTorch 1.13 exports it: q, k, v [B, T, H, D] in,
 * Transposes to [B, H, T, D] (K to [B, H, D, T]), MatMul, Mul by 1/sqrt(D)
 * (Div with `div`), the mask sliced to [T, T] by Shape(q)[1], Equal 0, Cast,
 * Where(-inf), Softmax, MatMul by V, Transpose back. add: the mask added
 * (0 / -inf) instead; plain: q, k, v given as [B, H, T, D] (K^T by
 * Transpose 0,1,3,2) and no Transposes around. */
static pp_graph *attention_graph(int mask_kind, int add, int div, int plain) {
    pp_graph *g;
    TU_OK(pp_graph_new("attention", &g));
    int q, k, v, id;
    TU_OK(pp_graph_add_input(g, "q", PP_F32, 4, SHAPE(-1, -1, -1, 4), &q));
    TU_OK(pp_graph_add_input(g, "k", PP_F32, 4, SHAPE(-1, -1, -1, 4), &k));
    TU_OK(pp_graph_add_input(g, "v", PP_F32, 4, SHAPE(-1, -1, -1, 5), &v));
    int qt = q, kt, vt = v;
    if (plain) {
        kt = node1(g, "Transpose", "kt", 1, &k);
        TU_OK(pp_node_set_ints(g, g->values[kt].producer, "perm", 4, SHAPE(0, 1, 3, 2)));
    } else {
        qt = node1(g, "Transpose", "qt", 1, &q);
        TU_OK(pp_node_set_ints(g, g->values[qt].producer, "perm", 4, SHAPE(0, 2, 1, 3)));
        kt = node1(g, "Transpose", "kt", 1, &k);
        TU_OK(pp_node_set_ints(g, g->values[kt].producer, "perm", 4, SHAPE(0, 2, 3, 1)));
        vt = node1(g, "Transpose", "vt", 1, &v);
        TU_OK(pp_node_set_ints(g, g->values[vt].producer, "perm", 4, SHAPE(0, 2, 1, 3)));
    }
    int s = node1(g, "MatMul", "qk", 2, (int[]){qt, kt});
    int scale = add_param(g, div ? "two" : "half", PP_VALUE_CONST, F32(0, SHAPE(0), div ? 2.0f : 0.5f));
    s = node1(g, div ? "Div" : "Mul", "scale", 2, (int[]){s, scale});
    /* the mask's end: the time dim of q (dim 1, or 2 when plain) */
    int shp = node1(g, "Shape", "shape", 1, &q);
    int idx = add_param(g, "tdim", PP_VALUE_CONST, I64(0, SHAPE(0), plain ? 2 : 1));
    int t = node1(g, "Gather", "t", 2, (int[]){shp, idx});
    int ax0 = add_param(g, "ax0", PP_VALUE_CONST, I64(1, SHAPE(1), 0));
    int end = node1(g, "Unsqueeze", "end", 2, (int[]){t, ax0});
    int zero = add_param(g, "zero", PP_VALUE_CONST, I64(1, SHAPE(1), 0));
    int a2 = add_param(g, "a2", PP_VALUE_CONST, I64(1, SHAPE(1), 2));
    int a3 = add_param(g, "a3", PP_VALUE_CONST, I64(1, SHAPE(1), 3));
    int one = add_param(g, "one", PP_VALUE_CONST, I64(1, SHAPE(1), 1));
    int m = add_param(g, "mask", PP_VALUE_CONST, mask_const(add ? 2 : mask_kind));
    m = node1(g, "Slice", "slice_rows", 5, (int[]){m, zero, end, a2, one});
    m = node1(g, "Slice", "slice_cols", 5, (int[]){m, zero, end, a3, one});
    if (add) {
        s = node1(g, "Add", "mask_add", 2, (int[]){s, m});
    } else {
        int fz = add_param(g, "fzero", PP_VALUE_CONST, F32(0, SHAPE(0), 0.0f));
        int eq = node1(g, "Equal", "eq", 2, (int[]){m, fz});
        int cast = node1(g, "Cast", "cast", 1, &eq);
        TU_OK(pp_node_set_int(g, g->values[cast].producer, "to", PP_BOOL));
        int ninf = add_param(g, "ninf", PP_VALUE_CONST, F32(0, SHAPE(0), -INFINITY));
        s = node1(g, "Where", "where", 3, (int[]){cast, ninf, s});
    }
    TU_OK(pp_graph_add_node(g, "Softmax", "", "softmax", 1, &s, 1, NULL, &id));
    TU_OK(pp_node_set_int(g, id, "axis", -1));
    int y = node1(g, "MatMul", "pv", 2, (int[]){g->nodes[id].out[0], vt});
    if (!plain) {
        y = node1(g, "Transpose", "yt", 1, &y);
        TU_OK(pp_node_set_ints(g, g->values[y].producer, "perm", 4, SHAPE(0, 2, 1, 3)));
    }
    TU_OK(pp_graph_add_output(g, y));
    return g;
}

static pp_graph *attention_where(void) { return attention_graph(0, 0, 0, 0); }
static pp_graph *attention_add_div_plain(void) { return attention_graph(0, 1, 1, 1); }
static pp_graph *attention_not_causal(void) { return attention_graph(1, 0, 0, 0); }

static void test_attention_fusion(void **state) {
    (void)state;
    /* T 7 of the buffer's 8: the sliced mask is read by its shape */
    pp_tensor *ins[3] = {rand_f32(4, SHAPE(2, 7, 3, 4), 31), rand_f32(4, SHAPE(2, 7, 3, 4), 32),
                         rand_f32(4, SHAPE(2, 7, 3, 5), 33)};
    pp_optimize_report r;
    pp_graph *g = check_optimized(attention_where, PP_OPT_ALL, ins, 1e-6, &r);
    assert_int_equal(rewrites_of(&r, "attention"), 1);
    assert_int_equal(count_op(g, "CausalAttention"), 1);
    assert_int_equal(count_op(g, "Transpose") + count_op(g, "Softmax") + count_op(g, "MatMul") + count_op(g, "Where"), 0);
    int f = g->values[g->outputs[0]].producer;
    assert_string_equal(g->nodes[f].name, "pv");
    assert_string_equal(pp_node_attr_string(&g->nodes[f], "q_layout", ""), "bthd");
    assert_string_equal(pp_node_attr_string(&g->nodes[f], "k_layout", ""), "bthd");
    assert_string_equal(pp_node_attr_string(&g->nodes[f], "out_layout", ""), "bthd");
    pp_graph_free(g);
    for (int i = 0; i < 3; i++) pp_tensor_free(ins[i]);
    /* [B, H, T, D] inputs, K^T by a Transpose of the last two, Div, Add mask */
    pp_tensor *plain[3] = {rand_f32(4, SHAPE(2, 3, 8, 4), 34), rand_f32(4, SHAPE(2, 3, 8, 4), 35),
                           rand_f32(4, SHAPE(2, 3, 8, 5), 36)};
    g = check_optimized(attention_add_div_plain, PP_OPT_ALL, plain, 1e-6, &r);
    assert_int_equal(count_op(g, "CausalAttention"), 1);
    f = g->values[g->outputs[0]].producer;
    assert_string_equal(pp_node_attr_string(&g->nodes[f], "k_layout", ""), "bhtd");
    assert_string_equal(pp_node_attr_string(&g->nodes[f], "out_layout", ""), "bhtd");
    assert_int_equal(pp_node_attr_int(&g->nodes[f], "scale_div", 0), 1);
    pp_graph_free(g);
    for (int i = 0; i < 3; i++) pp_tensor_free(plain[i]);
    /* the diagonal masked too: not causal, left alone */
    pp_tensor *t1[3] = {rand_f32(4, SHAPE(1, 5, 3, 4), 37), rand_f32(4, SHAPE(1, 5, 3, 4), 38),
                        rand_f32(4, SHAPE(1, 5, 3, 5), 39)};
    g = check_optimized(attention_not_causal, PP_OPT_ALL, t1, 0, &r);
    assert_int_equal(rewrites_of(&r, "attention"), 0);
    assert_int_equal(count_op(g, "Softmax"), 1);
    pp_graph_free(g);
    for (int i = 0; i < 3; i++) pp_tensor_free(t1[i]);
}

/* The kernel on its own: the mask's shape as Where would broadcast it (a
 * [1, T] mask: row 0 of the tril for every query, key 0 alone), long
 * sequences in several row blocks, the same bits at 1 and 4 threads, and
 * its shape errors. */
static void test_attention_kernel(void **state) {
    (void)state;
    int before = pp_get_threads();
    pp_tensor *q = rand_f32(4, SHAPE(2, 3, 300, 16), 41), *k = rand_f32(4, SHAPE(2, 3, 16, 300), 42),
              *v = rand_f32(4, SHAPE(2, 3, 300, 8), 43), *m = rand_f32(4, SHAPE(1, 1, 300, 300), 44);
    pp_tensor *y[2];
    for (int t = 0; t < 2; t++) {
        pp_set_threads(t ? 4 : 1);
        pp_set_blas_threads(1);
        tu_node n;
        tu_node_init_dom(&n, "CausalAttention", "pippin", 4,
                         (pp_tensor *[]){pp_tensor_retain(q), pp_tensor_retain(k), pp_tensor_retain(v),
                                         pp_tensor_retain(m)}, 1, NULL);
        TU_OK(pp_node_set_float(n.g, n.node, "scale", 0.25f));
        y[t] = tu_node_run_one(&n);
        tu_node_free(&n);
    }
    pp_set_threads(before);
    tu_assert_shape(y[0], 4, SHAPE(2, 3, 300, 8));
    assert_memory_equal(y[0]->data, y[1]->data, y[0]->nbytes);
    /* row 0 sees key 0 alone: its output is V's row 0 */
    const float *yd = y[0]->data, *vd = v->data;
    for (int d = 0; d < 8; d++) assert_true(yd[d] == vd[d]);
    /* the last row is the plain softmax over every key */
    {
        const float *qd = q->data, *kd = k->data;
        double s[300], mx = -1e30, sum = 0, want[8] = {0};
        for (int j = 0; j < 300; j++) {
            s[j] = 0;
            for (int d = 0; d < 16; d++) s[j] += (double)qd[299 * 16 + d] * kd[d * 300 + j];
            s[j] *= 0.25;
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j < 300; j++) sum += s[j] = exp(s[j] - mx);
        for (int j = 0; j < 300; j++)
            for (int d = 0; d < 8; d++) want[d] += s[j] / sum * vd[j * 8 + d];
        for (int d = 0; d < 8; d++) assert_true(fabs(yd[299 * 8 + d] - want[d]) < 1e-4);
    }
    pp_tensor_free(y[0]);
    pp_tensor_free(y[1]);
    pp_tensor_free(m);
    /* a [1, T] mask broadcast: row 0 of the causal mask for every query */
    m = rand_f32(2, SHAPE(1, 300), 45);
    tu_node n;
    tu_node_init_dom(&n, "CausalAttention", "pippin", 4,
                     (pp_tensor *[]){pp_tensor_retain(q), pp_tensor_retain(k), pp_tensor_retain(v), pp_tensor_retain(m)},
                     1, NULL);
    pp_tensor *y1 = tu_node_run_one(&n);
    tu_node_free(&n);
    yd = y1->data;
    for (int d = 0; d < 8; d++) assert_true(yd[299 * 8 + d] == vd[d]);
    pp_tensor_free(y1);
    pp_tensor_free(m);
    /* one key, K given as K^T [D, 1] (a leading dim of 1 the GEMM must not take for K's): Y is V */
    {
        pp_tensor *q1 = rand_f32(4, SHAPE(1, 2, 1, 4), 47), *k1 = rand_f32(4, SHAPE(1, 2, 4, 1), 48),
                  *v1 = rand_f32(4, SHAPE(1, 2, 1, 3), 49);
        tu_node_init_dom(&n, "CausalAttention", "pippin", 3,
                         (pp_tensor *[]){pp_tensor_retain(q1), pp_tensor_retain(k1), pp_tensor_retain(v1)}, 1, NULL);
        pp_tensor *y2 = tu_node_run_one(&n);
        tu_node_free(&n);
        assert_memory_equal(y2->data, v1->data, v1->nbytes);
        pp_tensor_free(y2);
        pp_tensor_free(q1);
        pp_tensor_free(k1);
        pp_tensor_free(v1);
    }
    /* a mask that does not broadcast, and K that does not fit Q */
    m = rand_f32(2, SHAPE(5, 300), 46);
    tu_node_init_dom(&n, "CausalAttention", "pippin", 4,
                     (pp_tensor *[]){pp_tensor_retain(q), pp_tensor_retain(k), pp_tensor_retain(v), pp_tensor_retain(m)},
                     1, NULL);
    tu_node_expect_error(&n, PP_ERR_SHAPE, "does not broadcast");
    tu_node_free(&n);
    tu_node_init_dom(&n, "CausalAttention", "pippin", 3,
                     (pp_tensor *[]){pp_tensor_retain(q), pp_tensor_retain(v), pp_tensor_retain(v)}, 1, NULL);
    tu_node_expect_error(&n, PP_ERR_SHAPE, "are not one attention's");
    tu_node_free(&n);
    pp_tensor_free(m);
    pp_tensor_free(q);
    pp_tensor_free(k);
    pp_tensor_free(v);
}

/* ---- the switch ---- */

static void test_pass_names_and_switch(void **state) {
    (void)state;
    unsigned bits;
    TU_OK(pp_optimize_parse("fold,gelu", &bits));
    assert_int_equal(bits, PP_OPT_FOLD | PP_OPT_GELU);
    TU_OK(pp_optimize_parse("all", &bits));
    assert_int_equal(bits, PP_OPT_ALL);
    TU_OK(pp_optimize_parse("0", &bits));
    assert_int_equal(bits, 0);
    assert_int_equal(pp_optimize_parse("fold,fuse_everything", &bits), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "'fuse_everything'"));
    for (int i = 0; pp_optimize_pass_name(i); i++) {
        TU_OK(pp_optimize_parse(pp_optimize_pass_name(i), &bits));
        assert_int_equal(bits, 1u << i);
    }
    setenv("PIPPIN_OPTIMIZE", "0", 1);
    assert_int_equal(pp_optimize_default(), 0);
    setenv("PIPPIN_OPTIMIZE", "matmul,dead", 1);
    assert_int_equal(pp_optimize_default(), PP_OPT_MATMUL | PP_OPT_DEAD);
    pp_optimize_set_default(PP_OPT_FOLD); /* wins over the environment */
    assert_int_equal(pp_optimize_default(), PP_OPT_FOLD);
    unsetenv("PIPPIN_OPTIMIZE");
    pp_optimize_set_default(PP_OPT_ALL);
    /* no passes: the graph is left as it is */
    pp_graph *g = linear_relu();
    pp_optimize_report r;
    TU_OK(pp_graph_optimize(g, 0, &r));
    assert_int_equal(r.n_passes, 0);
    assert_int_equal(g->n_nodes, 4);
    pp_graph_free(g);
}

/* ---- the PyTorch fixtures ---- */

/* Every fixture model, run for inference as loaded and optimized: the
 * outputs agree within float rounding, and with PyTorch's where the
 * fixture has them. */
static void test_fixtures_optimized(void **state) {
    (void)state;
    static const char *const fixtures[] = {"gpt",       "mlp",       "cnn",
                                           "unet",      "rnn",       "bn",
                                           "dropout",   "tv_vit",    "tv_resnet",
                                           "tv_mobilenet_v2", "tv_mobilenet_v3_small"};
    for (size_t k = 0; k < sizeof fixtures / sizeof fixtures[0]; k++) {
        pp_graph *ref = tu_fixture_onnx(fixtures[k], "model.onnx"), *opt = tu_fixture_onnx(fixtures[k], "model.onnx");
        pp_tensor *ins[8] = {0}, *want[8] = {0}, *got[8] = {0};
        assert_true(ref->n_inputs <= 8 && ref->n_outputs <= 8);
        for (int i = 0; i < ref->n_inputs; i++) {
            char file[256];
            snprintf(file, sizeof file, "%s.npy", ref->values[ref->inputs[i]].name);
            ins[i] = tu_fixture_npy(fixtures[k], file);
        }
        pp_optimize_set_default(0);
        TU_OK(pp_graph_prepare_inference(ref));
        TU_OK(pp_graph_prepare_inference(opt));
        pp_optimize_set_default(PP_OPT_ALL);
        pp_optimize_report r;
        TU_OK(pp_graph_optimize(opt, PP_OPT_ALL, &r));
        assert_true(r.nodes_after <= r.nodes_before);
        TU_OK(pp_graph_run(ref, ins, want));
        TU_OK(pp_graph_run(opt, ins, got));
        for (int o = 0; o < ref->n_outputs; o++) {
            char what[256];
            snprintf(what, sizeof what, "%s output '%s' optimized", fixtures[k], ref->values[ref->outputs[o]].name);
            tu_assert_close(got[o], want[o], 1e-5, 1e-5, what);
            char file[256], path[512];
            snprintf(file, sizeof file, "out_%s.npy", ref->values[ref->outputs[o]].name);
            snprintf(path, sizeof path, "test/fixtures/%s/%s", fixtures[k], file);
            if (access(tu_src_path(path), R_OK) == 0) { /* PyTorch's, as test_pipeline checks the unoptimized */
                pp_tensor *torch = tu_fixture_npy(fixtures[k], file);
                tu_assert_close(got[o], torch, 1e-4, 1e-5, what);
                pp_tensor_free(torch);
            }
            pp_tensor_free(got[o]);
            pp_tensor_free(want[o]);
        }
        if (strcmp(fixtures[k], "gpt") == 0) {
            assert_true(r.nodes_after < r.nodes_before);
            assert_int_equal(count_op(opt, "MatMulAdd"), 4 * 4 + 1); /* 4 blocks: qkv, proj, fc+gelu, proj; head */
            assert_int_equal(count_op(opt, "Tanh"), 0);
            assert_int_equal(count_op(opt, "Constant"), 0);
        }
        for (int i = 0; i < ref->n_inputs; i++) pp_tensor_free(ins[i]);
        pp_graph_free(ref);
        pp_graph_free(opt);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fold_constants_and_static_shapes),
        cmocka_unit_test(test_identity_and_dead),
        cmocka_unit_test(test_gelu_fusion),
        cmocka_unit_test(test_matmul_bias_activation),
        cmocka_unit_test(test_matmul_keeps_read_values),
        cmocka_unit_test(test_gemm_activation),
        cmocka_unit_test(test_matmul_add_threads),
        cmocka_unit_test(test_matmul_add_errors),
        cmocka_unit_test(test_matmul_residual),
        cmocka_unit_test(test_matmul_split),
        cmocka_unit_test(test_layernorm_fusion),
        cmocka_unit_test(test_transpose_elimination),
        cmocka_unit_test(test_attention_fusion),
        cmocka_unit_test(test_attention_kernel),
        cmocka_unit_test(test_pass_names_and_switch),
        cmocka_unit_test(test_fixtures_optimized),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
