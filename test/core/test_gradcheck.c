/* Finite-difference checks of every gradient rule.
 *
 * Each case is one op. Its float outputs y_k are seeded with random R_k, so
 * autodiff computes the gradient of L = sum_k <y_k, R_k>; central
 * differences of L (summed in double from the float32 forward) check it for
 * every element of every differentiable input, graph inputs ('x') and
 * parameters ('p') alike. Constants ('c') get no gradient. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "test_util.h"

#include "test_filter.h"
#include "op.h"
#define MAX_IN 6
#define MAX_OUT 4

typedef struct gc_case {
    const char *op;
    const char *kinds;   /* per input: x (graph input), p (parameter), c (constant), - (omitted) */
    pp_tensor *in[MAX_IN];
    int n_out;
    const char *attrs;   /* "axis=1 perm=1,0 alpha=f:0.5 reduction=s:sum" */
    const char *domain;
    double tol;          /* 0: 2e-3 */
    int transposed;      /* k + 1: input k goes through Transpose(perm 1,0) first */
} gc_case;

static unsigned rng_state = 12345;
static float frand(float lo, float hi) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(rng_state >> 8) / 16777216.0f;
}

/* Random f32 tensor in [lo, hi], entries kept at least `gap` away from 0. */
static pp_tensor *rnd(int ndim, const int64_t *shape, float lo, float hi, float gap) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, ndim, shape, &t));
    float *d = t->data;
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) {
        float v;
        do v = frand(lo, hi);
        while (fabsf(v) < gap);
        d[i] = v;
    }
    return t;
}
#define R(...) rnd(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__}, -1, 1, 0)
#define RPOS(...) rnd(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__}, 0.5f, 2, 0)
#define RGAP(...) rnd(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__}, -1, 1, 0.1f)
/* 1-D i64 tensor of the values (test_util's I64 takes a shape). */
#define I64V(...) tu_i64_vec(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})

/* Parses "name=value ..." into node attributes. */
static void set_attrs(pp_graph *g, int node, const char *spec) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        assert_non_null(eq);
        *eq = 0;
        const char *v = eq + 1;
        if (strncmp(v, "f:", 2) == 0) TU_OK(pp_node_set_float(g, node, tok, strtof(v + 2, NULL)));
        else if (strncmp(v, "s:", 2) == 0) TU_OK(pp_node_set_string(g, node, tok, v + 2));
        else if (strchr(v, ',') || strncmp(v, "l:", 2) == 0) {
            int64_t ints[8];
            int n = 0;
            char copy[64];
            snprintf(copy, sizeof copy, "%s", strncmp(v, "l:", 2) == 0 ? v + 2 : v);
            for (char *s = copy; *s && n < 8;) {
                ints[n++] = strtoll(s, &s, 10);
                if (*s == ',') s++;
            }
            TU_OK(pp_node_set_ints(g, node, tok, n, ints));
        } else TU_OK(pp_node_set_int(g, node, tok, strtoll(v, NULL, 10)));
    }
}

typedef struct built {
    pp_graph *g;
    int node;
    int in_ids[MAX_IN];
    int n_x;
    pp_tensor *feed[MAX_IN + MAX_OUT]; /* borrowed */
} built;

/* The case as a graph; x inputs come first among the graph inputs. */
static void build(const gc_case *c, built *b) {
    memset(b, 0, sizeof *b);
    TU_OK(pp_graph_new(c->op, &b->g));
    int n_in = (int)strlen(c->kinds);
    char name[32];
    for (int k = 0; k < n_in; k++) {
        snprintf(name, sizeof name, "in%d", k);
        pp_tensor *t = c->in[k];
        switch (c->kinds[k]) {
        case 'x':
            TU_OK(pp_graph_add_input(b->g, name, t->dtype, t->ndim, t->shape, &b->in_ids[k]));
            b->feed[b->n_x++] = t;
            break;
        case 'p':
        case 'c': {
            pp_tensor *copy;
            TU_OK(pp_tensor_clone(t, &copy));
            TU_OK(pp_graph_add_initializer(b->g, name,
                                           c->kinds[k] == 'p' ? PP_VALUE_PARAM : PP_VALUE_CONST, copy,
                                           &b->in_ids[k]));
            break;
        }
        default:
            b->in_ids[k] = -1;
        }
    }
    int op_in[MAX_IN];
    memcpy(op_in, b->in_ids, sizeof op_in);
    if (c->transposed) { /* as torch exports nn.Linear on 3-D inputs */
        int t;
        TU_OK(pp_graph_add_node(b->g, "Transpose", "", "t", 1, &b->in_ids[c->transposed - 1], 1,
                                NULL, &t));
        TU_OK(pp_node_set_ints(b->g, t, "perm", 2, (int64_t[]){1, 0}));
        op_in[c->transposed - 1] = b->g->nodes[t].out[0];
    }
    TU_OK(pp_graph_add_node(b->g, c->op, c->domain ? c->domain : "", "op", n_in, op_in,
                            c->n_out, NULL, &b->node));
    set_attrs(b->g, b->node, c->attrs);
    for (int k = 0; k < c->n_out; k++) TU_OK(pp_graph_add_output(b->g, b->g->nodes[b->node].out[k]));
}

/* L = sum_k <y_k, R_k> in double (R_k NULL: output not float, skipped). */
static double loss_of(built *b, int n_out, pp_tensor *const *r) {
    pp_tensor *outs[MAX_OUT] = {0};
    TU_OK(pp_graph_run(b->g, b->feed, outs));
    double l = 0;
    for (int k = 0; k < n_out; k++) {
        for (int64_t i = 0; r[k] && i < pp_tensor_numel(r[k]); i++)
            l += (double)((float *)outs[k]->data)[i] * ((float *)r[k]->data)[i];
        pp_tensor_free(outs[k]);
    }
    return l;
}

static void gradcheck(const gc_case *c) {
    if (!pp_op_find(c->domain ? c->domain : "", c->op)) {
        print_message("# %s: no kernel in this build, skipped\n", c->op);
        return;
    }
    double tol = c->tol > 0 ? c->tol : 2e-3;
    int n_in = (int)strlen(c->kinds);
    /* Forward once for the output shapes, then the seeds R_k. */
    built fwd;
    build(c, &fwd);
    pp_tensor *outs[MAX_OUT] = {0}, *r[MAX_OUT] = {0};
    TU_OK(pp_graph_run(fwd.g, fwd.feed, outs));
    for (int k = 0; k < c->n_out; k++) {
        if (outs[k]->dtype == PP_F32) r[k] = rnd(outs[k]->ndim, outs[k]->shape, -1, 1, 0);
        pp_tensor_free(outs[k]);
    }
    /* Analytic gradients. */
    built bw;
    build(c, &bw);
    int seeds[MAX_OUT], n_seeds = 0, wrt[MAX_IN], n_wrt = 0;
    for (int k = 0; k < c->n_out; k++)
        if (r[k]) seeds[n_seeds++] = bw.g->nodes[bw.node].out[k];
    for (int k = 0; k < n_in; k++)
        if (c->kinds[k] == 'x' && c->in[k]->dtype == PP_F32) wrt[n_wrt++] = bw.in_ids[k];
    pp_backward_spec spec = {-1, n_seeds, seeds, n_wrt, wrt};
    pp_backward *b;
    TU_OK(pp_autodiff(bw.g, &spec, &b));
    int nf = bw.n_x;
    for (int k = 0, j = 0; k < c->n_out; k++)
        if (r[k]) bw.feed[nf + j++] = r[k];
    pp_tensor **all = calloc((size_t)bw.g->n_outputs, sizeof *all);
    TU_OK(pp_graph_run(bw.g, bw.feed, all));
    /* Numeric gradients, input by input. */
    int checked = 0;
    for (int k = 0; k < n_in; k++) {
        char kind = c->kinds[k];
        if ((kind != 'x' && kind != 'p') || c->in[k]->dtype != PP_F32) continue;
        int grad_v = -1;
        for (int i = 0; i < b->n_wrt; i++)
            if (b->wrt_values[i] == bw.in_ids[k]) grad_v = b->wrt_grads[i];
        for (int i = 0; i < b->n_params; i++)
            if (b->params[i] == bw.in_ids[k]) grad_v = b->param_grads[i];
        if (grad_v < 0) fail_msg("%s: input %d got no gradient", c->op, k);
        const pp_tensor *ga = NULL;
        for (int i = 0; i < bw.g->n_outputs; i++)
            if (bw.g->outputs[i] == grad_v) ga = all[i];
        assert_non_null(ga);
        pp_tensor *t = kind == 'x' ? c->in[k] : fwd.g->values[fwd.in_ids[k]].data;
        if (pp_tensor_numel(ga) != pp_tensor_numel(t))
            fail_msg("%s: gradient of input %d has %lld elements, input %lld", c->op, k,
                     (long long)pp_tensor_numel(ga), (long long)pp_tensor_numel(t));
        float *d = t->data;
        for (int64_t e = 0; e < pp_tensor_numel(t); e++) {
            float keep = d[e], eps = 1e-3f * fmaxf(1.0f, fabsf(keep));
            d[e] = keep + eps;
            double lp = loss_of(&fwd, c->n_out, r);
            d[e] = keep - eps;
            double lm = loss_of(&fwd, c->n_out, r);
            d[e] = keep;
            double num = (lp - lm) / (2.0 * (double)eps), an = ((const float *)ga->data)[e];
            if (fabs(an - num) > tol * (1 + fabs(num)))
                fail_msg("%s [%s]: d/d input %d [%lld]: autodiff %.6f, finite difference %.6f",
                         c->op, c->attrs ? c->attrs : "", k, (long long)e, an, num);
            checked++;
        }
    }
    assert_true(checked > 0);
    for (int i = 0; i < bw.g->n_outputs; i++) pp_tensor_free(all[i]);
    free(all);
    pp_backward_free(b);
    pp_graph_free(bw.g);
    pp_graph_free(fwd.g);
    for (int k = 0; k < MAX_OUT; k++) pp_tensor_free(r[k]);
}

/* Runs the case and frees its tensors. */
static void check(gc_case c) {
    gradcheck(&c);
    for (int k = 0; k < MAX_IN; k++) pp_tensor_free(c.in[k]);
}

static void test_arithmetic(void **state) {
    (void)state;
    check((gc_case){"Add", "xx", {R(2, 3), R(3)}, 1});
    check((gc_case){"Add", "px", {R(4, 1, 3), R(2, 1)}, 1});
    check((gc_case){"Sub", "xp", {R(2, 1), R(2, 3)}, 1});
    check((gc_case){"Mul", "xx", {R(2, 3), R(2, 3)}, 1});
    check((gc_case){"Mul", "xc", {R(2, 3), R(1)}, 1});
    check((gc_case){"Mul", "px", {R(3), R(2, 2, 3)}, 1});
    check((gc_case){"Div", "xx", {R(2, 3), RPOS(3)}, 1});
    check((gc_case){"Pow", "xx", {RPOS(2, 3), RPOS(3)}, 1});
    check((gc_case){"Pow", "xc", {RPOS(4), tu_f32(0, NULL, (float[]){3})}, 1});
    check((gc_case){"Neg", "x", {R(5)}, 1});
}

static void test_unary(void **state) {
    (void)state;
    check((gc_case){"Sqrt", "x", {RPOS(2, 3)}, 1});
    check((gc_case){"Exp", "x", {R(2, 3)}, 1});
    check((gc_case){"Log", "x", {RPOS(2, 3)}, 1});
    check((gc_case){"Erf", "x", {R(2, 3)}, 1});
    check((gc_case){"Tanh", "x", {R(2, 3)}, 1});
    check((gc_case){"Sigmoid", "x", {R(2, 3)}, 1});
    check((gc_case){"Relu", "x", {RGAP(2, 4)}, 1});
    check((gc_case){"LeakyRelu", "x", {RGAP(2, 4)}, 1, "alpha=f:0.2"});
    check((gc_case){"Gelu", "x", {R(2, 4)}, 1});
    check((gc_case){"Gelu", "x", {R(2, 4)}, 1, "approximate=s:tanh"});
}

static void test_matmul(void **state) {
    (void)state;
    check((gc_case){"MatMul", "xp", {R(2, 3, 4), R(4, 5)}, 1});
    check((gc_case){"MatMul", "xx", {R(4), R(4, 5)}, 1});
    check((gc_case){"MatMul", "xx", {R(3, 4), R(4)}, 1});
    check((gc_case){"MatMul", "xx", {R(2, 1, 3, 4), R(2, 4, 2)}, 1});
    check((gc_case){"MatMul", "xx", {R(2, 3, 4), R(2, 4, 5)}, 1});
    /* b = W^T: the gradient goes to W without a Transpose */
    check((gc_case){"MatMul", "xp", {R(2, 3, 4), R(5, 4)}, 1, .transposed = 2});
    check((gc_case){"MatMul", "xx", {R(3, 4), R(5, 4)}, 1, .transposed = 2});
    check((gc_case){"MatMul", "xp", {R(4), R(5, 4)}, 1, .transposed = 2});
    check((gc_case){"Gemm", "xpp", {R(3, 4), R(5, 4), R(5)}, 1, "transB=1"});
    check((gc_case){"Gemm", "xpp", {R(4, 3), R(4, 5), R(3, 1)}, 1, "transA=1 alpha=f:0.5 beta=f:2"});
    check((gc_case){"Gemm", "xx", {R(4, 3), R(5, 4)}, 1, "transA=1 transB=1"});
    check((gc_case){"Gemm", "xxx", {R(3, 4), R(4, 5), R(3, 5)}, 1});
}

static void test_normalization(void **state) {
    (void)state;
    check((gc_case){"Softmax", "x", {R(3, 5)}, 1});
    check((gc_case){"Softmax", "x", {R(2, 3, 4)}, 1, "axis=1"});
    check((gc_case){"LogSoftmax", "x", {R(3, 5)}, 1});
    check((gc_case){"LogSoftmax", "x", {R(2, 3, 2)}, 1, "axis=0"});
    check((gc_case){"LayerNormalization", "xpp", {R(2, 3, 4), R(4), R(4)}, 1});
    check((gc_case){"LayerNormalization", "xp", {R(2, 3, 2), R(3, 2)}, 1, "axis=1 epsilon=f:0.01"});
    /* through the batch statistics; eval mode: the given ones */
    check((gc_case){"BatchNormalization", "xppcc", {R(3, 2, 4), RPOS(2), R(2), R(2), RPOS(2)}, 1,
                    "training_mode=1 epsilon=f:0.01"});
    check((gc_case){"BatchNormalization", "xppcc", {R(4, 3), RPOS(3), R(3), R(3), RPOS(3)}, 1, "training_mode=1"});
    check((gc_case){"BatchNormalization", "xppcc", {R(2, 3, 2, 2), RPOS(3), R(3), R(3), RPOS(3)}, 1});
    /* training-mode Dropout: the forward's mask (the same draw each run) */
    check((gc_case){"Dropout", "xcc", {R(40), T(PP_F32, 1, SHAPE(1), 0.3), T(PP_BOOL, 1, SHAPE(1), 1)}, 1});
    check((gc_case){"Dropout", "xcc", {R(2, 5), T(PP_F32, 1, SHAPE(1), 0.0), T(PP_BOOL, 1, SHAPE(1), 1)}, 1});
    check((gc_case){"SoftmaxCrossEntropyLoss", "xc", {R(4, 5), I64V(1, 0, 4, 2)}, 1});
    check((gc_case){"SoftmaxCrossEntropyLoss", "xc", {R(4, 5), I64V(1, 0, 4, 2)}, 2,
                    "reduction=s:sum"});
    check((gc_case){"SoftmaxCrossEntropyLoss", "xcc", {R(3, 4, 2), tu_i64(2, (int64_t[]){3, 2},
                    (int64_t[]){0, 3, 1, 1, 2, 0}), RPOS(4)}, 1, "ignore_index=1"});
    check((gc_case){"SoftmaxCrossEntropyLoss", "xc", {R(3, 4), I64V(0, 3, 1)}, 1,
                    "reduction=s:none"});
}

static void test_reductions(void **state) {
    (void)state;
    check((gc_case){"ReduceMean", "x", {R(2, 3, 4)}, 1, "axes=l:1 keepdims=0"});
    check((gc_case){"ReduceMean", "x", {R(2, 3)}, 1, "keepdims=0"});
    check((gc_case){"ReduceMean", "x", {R(2, 3, 2)}, 1, "axes=0,-1"});
    check((gc_case){"ReduceSum", "xc", {R(2, 3, 4), I64V(-1)}, 1, "keepdims=0"});
    check((gc_case){"ReduceSum", "x", {R(2, 3)}, 1});
    check((gc_case){"ReduceSum", "xc", {R(2, 3), I64V(0)}, 1});
}

static void test_shape_ops(void **state) {
    (void)state;
    check((gc_case){"Reshape", "xc", {R(2, 6), I64V(3, -1)}, 1});
    check((gc_case){"Transpose", "x", {R(2, 3, 4)}, 1, "perm=1,2,0"});
    check((gc_case){"Transpose", "x", {R(2, 3)}, 1});
    check((gc_case){"Concat", "xcx", {R(2, 1), R(2, 3), R(2, 2)}, 1, "axis=1"});
    check((gc_case){"Split", "xc", {R(2, 6), I64V(1, 2, 3)}, 3, "axis=1"});
    check((gc_case){"Slice", "xccc", {R(4, 5), I64V(1, 0), I64V(4, 5), I64V(0, 1)}, 1});
    check((gc_case){"Slice", "xcccc", {R(4, 6), I64V(-1, 1), I64V(0, 1000), I64V(0, 1), I64V(-2, 2)}, 1});
    check((gc_case){"Gather", "pc", {R(5, 3), tu_i64(2, (int64_t[]){2, 2}, (int64_t[]){1, 4, 1, -1})}, 1});
    check((gc_case){"Gather", "xc", {R(2, 4, 3), I64V(3, 0, 3)}, 1, "axis=1"});
    check((gc_case){"Unsqueeze", "xc", {R(2, 3), I64V(0, 3)}, 1});
    check((gc_case){"Squeeze", "xc", {R(2, 1, 3), I64V(1)}, 1});
    check((gc_case){"Flatten", "x", {R(2, 3, 2)}, 1, "axis=2"});
    check((gc_case){"Expand", "xc", {R(3, 1), I64V(2, 3, 4)}, 1});
    check((gc_case){"Identity", "x", {R(3)}, 1});
    check((gc_case){"Dropout", "x", {R(3, 2)}, 1});
    check((gc_case){"Cast", "x", {R(3)}, 1, "to=1"});
    check((gc_case){"PipeSplit", "xx", {R(3), R(2, 2)}, 2, NULL, "pippin"});
}

/* Where's condition is boolean: build it separately (the helpers make
 * float and int64 tensors). */
static void test_where_mask(void **state) {
    (void)state;
    pp_tensor *cond;
    TU_OK(pp_tensor_empty(PP_BOOL, 2, (int64_t[]){2, 3}, &cond));
    uint8_t m[6] = {1, 0, 1, 1, 0, 0};
    memcpy(cond->data, m, 6);
    check((gc_case){"Where", "cxp", {cond, R(2, 3), R(1, 3)}, 1});
}

/* A decomposed GELU, as PyTorch exports F.gelu: the backward is one fused
 * pippin::GeluGrad (unless an intermediate is used elsewhere) and equals
 * the exact derivative. */
static int add_op(pp_graph *g, const char *op, int a, int b) {
    int id, in[2] = {a, b};
    TU_OK(pp_graph_add_node(g, op, "", NULL, b < 0 ? 1 : 2, in, 1, NULL, &id));
    return g->nodes[id].out[0];
}

static int scalar_const(pp_graph *g, float v) {
    int id;
    TU_OK(pp_graph_add_initializer(g, pp_graph_unique_name(g, "c"), PP_VALUE_CONST,
                                   tu_f32(0, NULL, (float[]){v}), &id));
    return id;
}

static void check_gelu(int tanh_form, int expose_intermediate) {
    pp_graph *g;
    TU_OK(pp_graph_new("gelu", &g));
    int x, y, inner;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 1, (int64_t[]){7}, &x));
    if (tanh_form) {
        int x3 = add_op(g, "Mul", x, add_op(g, "Mul", x, x));
        int u = add_op(g, "Add", x, add_op(g, "Mul", scalar_const(g, 0.044715f), x3));
        inner = add_op(g, "Tanh", add_op(g, "Mul", scalar_const(g, 0.7978846f), u), -1);
    } else {
        inner = add_op(g, "Erf", add_op(g, "Div", x, scalar_const(g, 1.4142135f)), -1);
    }
    y = add_op(g, "Mul", add_op(g, "Mul", x, add_op(g, "Add", scalar_const(g, 1.0f), inner)),
               scalar_const(g, 0.5f));
    TU_OK(pp_graph_add_output(g, y));
    if (expose_intermediate) TU_OK(pp_graph_add_output(g, inner));
    pp_backward_spec spec = {-1, 1, &y, 1, &x};
    pp_backward *b;
    TU_OK(pp_autodiff(g, &spec, &b));
    int fused = 0;
    for (int j = 0; j < g->n_nodes; j++) fused += strcmp(g->nodes[j].op_type, "GeluGrad") == 0;
    assert_int_equal(fused, !expose_intermediate);
    pp_tensor *xs = tu_f32(1, (int64_t[]){7}, (float[]){-3, -1.5f, -0.3f, 0, 0.2f, 1.1f, 2.5f});
    pp_tensor *ones = tu_f32(1, (int64_t[]){7}, (float[]){1, 1, 1, 1, 1, 1, 1});
    pp_tensor *outs[4] = {0};
    TU_OK(pp_graph_run(g, (pp_tensor *[]){xs, ones}, outs));
    const float *dx = outs[g->n_outputs - 1]->data, *xv = xs->data;
    for (int i = 0; i < 7; i++) {
        double v = xv[i], want;
        if (tanh_form) {
            double k = 0.7978845608, t = tanh(k * (v + 0.044715 * v * v * v));
            want = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
        } else {
            want = 0.5 * (1 + erf(v / sqrt(2))) + v * exp(-v * v / 2) / sqrt(2 * M_PI);
        }
        assert_float_equal(dx[i], want, 2e-6);
    }
    for (int i = 0; i < g->n_outputs; i++) pp_tensor_free(outs[i]);
    pp_tensor_free(xs);
    pp_tensor_free(ones);
    pp_backward_free(b);
    pp_graph_free(g);
}

static void test_gelu_patterns(void **state) {
    (void)state;
    for (int t = 0; t < 2; t++)
        for (int e = 0; e < 2; e++) check_gelu(t, e);
}

/* Pooling and activations (lib/grad_rules_pool.c). */

/* Distinct values, shuffled, at least 0.02 apart: a max pool's argmax does
 * not move under the finite-difference step. */
static pp_tensor *distinct(int ndim, const int64_t *shape) {
    pp_tensor *t = rnd(ndim, shape, 0, 1, 0);
    int64_t n = pp_tensor_numel(t);
    float *d = t->data;
    for (int64_t i = 0; i < n; i++) d[i] = -1.0f + 0.02f * (float)i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(frand(0, 1) * (float)(i + 1)) % (i + 1);
        float v = d[i];
        d[i] = d[j];
        d[j] = v;
    }
    return t;
}
#define RD(...) distinct(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})
#define F32V(...) tu_f32(1, (int64_t[]){sizeof((float[]){__VA_ARGS__}) / sizeof(float)}, (float[]){__VA_ARGS__})

static void test_pooling(void **state) {
    (void)state;
    check((gc_case){"MaxPool", "x", {RD(1, 2, 5, 5)}, 1, "kernel_shape=2,2"});
    check((gc_case){"MaxPool", "x", {RD(2, 2, 6, 6)}, 1, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1"});
    check((gc_case){"MaxPool", "x", {RD(1, 2, 5, 5)}, 1, "kernel_shape=2,2 strides=2,2 ceil_mode=1"});
    check((gc_case){"MaxPool", "x", {RD(2, 3, 7)}, 1, "kernel_shape=l:3 strides=l:2"});
    check((gc_case){"MaxPool", "x", {RD(1, 2, 6, 6)}, 1,
                    "kernel_shape=2,2 dilations=2,2 auto_pad=s:SAME_UPPER"});
    /* with the Indices output (int64, no seed), and column-major indices */
    check((gc_case){"MaxPool", "x", {RD(1, 2, 5, 5)}, 2, "kernel_shape=3,3 strides=2,2"});
    check((gc_case){"MaxPool", "x", {RD(1, 2, 5, 4)}, 2, "kernel_shape=2,2 storage_order=1"});
    check((gc_case){"MaxPool", "x", {RD(1, 1, 4, 4, 4)}, 1, "kernel_shape=2,2,2 strides=2,1,2"});
    for (int cip = 0; cip < 2; cip++) {
        char a[160];
        snprintf(a, sizeof a, "kernel_shape=3,3 strides=2,2 pads=1,1,1,1 count_include_pad=%d", cip);
        check((gc_case){"AveragePool", "x", {R(2, 2, 5, 5)}, 1, a});
        snprintf(a, sizeof a, "kernel_shape=2,2 strides=2,2 ceil_mode=1 count_include_pad=%d", cip);
        check((gc_case){"AveragePool", "x", {R(1, 2, 5, 5)}, 1, a});
        snprintf(a, sizeof a, "kernel_shape=l:3 strides=l:2 pads=1,0 count_include_pad=%d", cip);
        check((gc_case){"AveragePool", "x", {R(2, 2, 8)}, 1, a});
        snprintf(a, sizeof a, "kernel_shape=3,2 auto_pad=s:SAME_LOWER count_include_pad=%d", cip);
        check((gc_case){"AveragePool", "x", {R(1, 2, 4, 5)}, 1, a});
    }
    check((gc_case){"AveragePool", "x", {R(1, 1, 4, 4, 4)}, 1, "kernel_shape=2,2,2 strides=2,2,2"});
    check((gc_case){"GlobalAveragePool", "x", {R(2, 3, 4, 4)}, 1});
    check((gc_case){"GlobalAveragePool", "x", {R(2, 3, 5)}, 1});
    check((gc_case){"GlobalMaxPool", "x", {RD(2, 3, 3, 3)}, 1});
    check((gc_case){"GlobalMaxPool", "x", {RD(2, 2, 6)}, 1});
}

static void test_activations(void **state) {
    (void)state;
    /* kinks kept away from the finite-difference step */
    float v[] = {-4, -2.9f, -1.2f, -0.45f, -0.1f, 0.2f, 0.7f, 1.4f, 2.6f, 3.5f};
    int64_t n = 10;
    check((gc_case){"Clip", "xcc", {tu_f32(1, &n, v), F32V(-1), F32V(1.5f)}, 1});
    check((gc_case){"Clip", "xc", {tu_f32(1, &n, v), F32V(0)}, 1});
    check((gc_case){"Clip", "x-c", {tu_f32(1, &n, v), NULL, F32V(6)}, 1});
    check((gc_case){"HardSigmoid", "x", {tu_f32(1, &n, v)}, 1});
    check((gc_case){"HardSigmoid", "x", {tu_f32(1, &n, v)}, 1, "alpha=f:0.25 beta=f:0.55"});
    check((gc_case){"HardSwish", "x", {tu_f32(1, &n, v)}, 1});
    check((gc_case){"Elu", "x", {RGAP(2, 5)}, 1});
    check((gc_case){"Elu", "x", {RGAP(2, 5)}, 1, "alpha=f:0.5"});
    check((gc_case){"Selu", "x", {RGAP(2, 5)}, 1});
    check((gc_case){"Selu", "x", {RGAP(2, 5)}, 1, "alpha=f:2 gamma=f:1.5"});
    check((gc_case){"Softplus", "x", {R(2, 5)}, 1});
    check((gc_case){"Softsign", "x", {R(2, 5)}, 1});
    check((gc_case){"LeakyRelu", "x", {RGAP(2, 4)}, 1});
    check((gc_case){"PRelu", "xp", {RGAP(2, 3, 2, 2), RGAP(3, 1, 1)}, 1});
    check((gc_case){"PRelu", "xp", {RGAP(2, 4), RGAP(1)}, 1});
    check((gc_case){"PRelu", "xx", {RGAP(3, 4), RGAP(3, 4)}, 1});
}

/* Conv: dx through pippin::ConvGradInput, dW and dB through ConvGradWeight. */
static void test_conv(void **state) {
    (void)state;
    check((gc_case){"Conv", "xp", {R(2, 2, 5, 5), R(3, 2, 3, 3)}, 1});
    check((gc_case){"Conv", "xpp", {R(2, 2, 5, 4), R(3, 2, 3, 2), R(3)}, 1});
    check((gc_case){"Conv", "xpp", {R(1, 2, 7, 6), R(2, 2, 3, 3), R(2)}, 1, "strides=2,2"});
    check((gc_case){"Conv", "xp", {R(2, 1, 4, 5), R(2, 1, 3, 3)}, 1, "pads=1,1,1,1"});
    check((gc_case){"Conv", "xpp", {R(1, 2, 7, 7), R(2, 2, 3, 3), R(2)}, 1,
                    "strides=2,2 pads=1,0,1,1"});
    check((gc_case){"Conv", "xpp", {R(2, 4, 5, 5), R(4, 2, 3, 3), R(4)}, 1, "group=2 pads=1,1,1,1"});
    check((gc_case){"Conv", "xp", {R(1, 3, 5, 5), R(3, 1, 3, 3)}, 1, "group=3"}); /* depthwise */
    check((gc_case){"Conv", "xp", {R(1, 2, 7, 7), R(2, 2, 3, 2)}, 1, "dilations=2,2"});
    check((gc_case){"Conv", "xpp", {R(2, 2, 9), R(3, 2, 3), R(3)}, 1});                 /* 1-D */
    check((gc_case){"Conv", "xp", {R(2, 2, 9), R(2, 1, 3)}, 1, "strides=l:2 pads=1,1 group=2"});
    check((gc_case){"Conv", "xp", {R(1, 2, 6, 5), R(2, 2, 2, 3)}, 1, "auto_pad=s:SAME_UPPER strides=2,1"});
    check((gc_case){"Conv", "xp", {R(1, 1, 6, 5), R(2, 1, 2, 2)}, 1, "auto_pad=s:SAME_LOWER"});
    check((gc_case){"Conv", "xpp", {R(1, 3, 4, 4), R(2, 3, 1, 1), R(2)}, 1});           /* 1x1 */
}

/* ConvTranspose: dx through pippin::ConvTransposeGradInput (a Conv forward),
 * dW and dB through ConvTransposeGradWeight. */
static void test_conv_transpose(void **state) {
    (void)state;
    check((gc_case){"ConvTranspose", "xp", {R(2, 2, 3, 3), R(2, 3, 3, 3)}, 1});
    check((gc_case){"ConvTranspose", "xpp", {R(1, 2, 3, 4), R(2, 3, 2, 3), R(3)}, 1, "strides=2,2"});
    check((gc_case){"ConvTranspose", "xpp", {R(1, 2, 4, 3), R(2, 2, 3, 3), R(2)}, 1,
                    "strides=2,2 pads=1,1,1,0 output_padding=1,1"});
    check((gc_case){"ConvTranspose", "xp", {R(2, 4, 3, 3), R(4, 1, 3, 3)}, 1,
                    "group=2 dilations=2,1"});
    check((gc_case){"ConvTranspose", "xpp", {R(1, 3, 4, 4), R(3, 1, 2, 2), R(3)}, 1,
                    "group=3 strides=2,2"}); /* depthwise */
    check((gc_case){"ConvTranspose", "xpp", {R(2, 2, 5), R(2, 3, 3), R(3)}, 1, "strides=l:2 pads=1,0"});
    check((gc_case){"ConvTranspose", "xp", {R(1, 1, 3, 3), R(1, 2, 3, 3)}, 1,
                    "strides=3,2 output_shape=10,8"});
    check((gc_case){"ConvTranspose", "xp", {R(1, 1, 3, 3), R(1, 2, 3, 3)}, 1,
                    "strides=2,2 auto_pad=s:SAME_UPPER"});
    check((gc_case){"ConvTranspose", "xpp", {R(1, 3, 4, 4), R(3, 2, 1, 1), R(2)}, 1}); /* 1x1 */
}

/* Resize / Upsample through pippin::ResizeGrad. */
static void test_resize(void **state) {
    (void)state;
    check((gc_case){"Resize", "x-c", {R(1, 2, 2, 3), NULL, F32V(1, 1, 2, 2)}, 1, "mode=s:nearest"});
    check((gc_case){"Resize", "x-c", {R(1, 2, 2, 3), NULL, F32V(1, 1, 2, 2)}, 1,
                    "mode=s:nearest coordinate_transformation_mode=s:asymmetric nearest_mode=s:floor"});
    check((gc_case){"Resize", "x-c", {R(1, 1, 3, 4), NULL, F32V(1, 1, 2, 2)}, 1,
                    "mode=s:linear coordinate_transformation_mode=s:pytorch_half_pixel"});
    check((gc_case){"Resize", "x-c", {R(2, 1, 3, 3), NULL, F32V(1, 1, 2, 1.5f)}, 1,
                    "mode=s:linear coordinate_transformation_mode=s:align_corners"});
    check((gc_case){"Resize", "x-c", {R(1, 2, 4, 6), NULL, F32V(1, 1, 0.5f, 0.5f)}, 1,
                    "mode=s:linear"});
    check((gc_case){"Resize", "x--c", {R(1, 1, 3, 2), NULL, NULL, I64V(1, 1, 5, 7)}, 1,
                    "mode=s:nearest coordinate_transformation_mode=s:half_pixel "
                    "nearest_mode=s:round_prefer_ceil"});
    check((gc_case){"Resize", "x-c", {R(1, 2, 3, 2, 2), NULL, F32V(1, 1, 2, 2, 2)}, 1,
                    "mode=s:linear"}); /* trilinear */
    check((gc_case){"Resize", "x--c", {R(2, 3, 5), NULL, NULL, I64V(8)}, 1, "mode=s:linear axes=l:2"});
    check((gc_case){"Upsample", "xc", {R(1, 1, 2, 3), F32V(1, 1, 2, 3)}, 1, "mode=s:nearest"});
    check((gc_case){"Upsample", "xc", {R(1, 1, 2, 3), F32V(1, 1, 2, 2)}, 1, "mode=s:linear"});
}

/* GroupNormalization (scale per group or per channel) and
 * InstanceNormalization through pippin::GroupNormGradInput / Weight. */
static void test_group_norm(void **state) {
    (void)state;
    check((gc_case){"GroupNormalization", "xpp", {R(2, 4, 3), R(2), R(2)}, 1, "num_groups=2"});
    check((gc_case){"GroupNormalization", "xpp", {R(2, 6, 2, 2), R(6), R(6)}, 1,
                    "num_groups=3 epsilon=f:0.01"});
    check((gc_case){"GroupNormalization", "xcp", {R(1, 4, 5), R(4), R(4)}, 1, "num_groups=1"});
    check((gc_case){"GroupNormalization", "xpp", {R(2, 3, 4), R(3), R(3)}, 1, "num_groups=3"});
    check((gc_case){"InstanceNormalization", "xpp", {R(2, 3, 2, 3), R(3), R(3)}, 1});
    check((gc_case){"InstanceNormalization", "xcc", {R(2, 2, 5), R(2), R(2)}, 1, "epsilon=f:0.001"});
}

/* Pad in every mode through pippin::PadGrad. */
static void test_pad(void **state) {
    (void)state;
    check((gc_case){"Pad", "xc", {R(2, 3), I64V(1, 2, 0, 1)}, 1});
    check((gc_case){"Pad", "xcc", {R(2, 3), I64V(1, 0, 2, -1), F32V(0.5f)}, 1});
    check((gc_case){"Pad", "xc", {R(2, 3, 3), I64V(0, 1, 2, 0, 2, 1)}, 1, "mode=s:edge"});
    check((gc_case){"Pad", "xc", {R(3, 4), I64V(2, 3, 1, 3)}, 1, "mode=s:reflect"});
    check((gc_case){"Pad", "xc", {R(2, 3), I64V(1, 4, 3, 2)}, 1, "mode=s:wrap"});
    check((gc_case){"Pad", "xc-c", {R(2, 3, 4), I64V(1, 2, 2, 1), NULL, I64V(0, -1)}, 1,
                    "mode=s:reflect"});
}

static void test_misc_ops(void **state) {
    check((gc_case){"Reciprocal", "x", {RGAP(2, 5)}, 1, .tol = 5e-3});
    check((gc_case){"Abs", "x", {RGAP(2, 5)}, 1});
    (void)state;
    check((gc_case){"Sin", "x", {R(2, 5)}, 1});
    check((gc_case){"Cos", "x", {R(2, 5)}, 1});
    check((gc_case){"Mish", "x", {R(2, 5)}, 1});
    check((gc_case){"Mish", "x", {tu_f32(1, (int64_t[]){4}, (float[]){-6, -2.5f, 3, 8})}, 1});
    check((gc_case){"Trilu", "x", {R(3, 4)}, 1});
    check((gc_case){"Trilu", "xc", {R(2, 3, 4), tu_i64(0, NULL, (int64_t[]){-1})}, 1, "upper=0"});
    check((gc_case){"CumSum", "xc", {R(3, 4), tu_i64(0, NULL, (int64_t[]){1})}, 1});
    check((gc_case){"CumSum", "xc", {R(3, 4), tu_i64(0, NULL, (int64_t[]){0})}, 1,
                    "exclusive=1 reverse=1"});
    check((gc_case){"CumSum", "pc", {R(5), tu_i64(0, NULL, (int64_t[]){-1})}, 1, "reverse=1"});
    check((gc_case){"Tile", "xc", {R(2, 3), I64V(2, 3)}, 1});
    check((gc_case){"Tile", "pc", {R(3, 1, 2), I64V(1, 4, 1)}, 1});
    check((gc_case){"GatherElements", "xc", {R(3, 4), tu_i64(2, (int64_t[]){3, 3},
                    (int64_t[]){0, 3, 0, 1, 1, -1, 2, 0, 2})}, 1, "axis=1"});
    check((gc_case){"GatherElements", "pc", {R(3, 2), tu_i64(2, (int64_t[]){4, 2},
                    (int64_t[]){0, 2, 1, 1, 2, 0, 2, 2})}, 1});
    check((gc_case){"ReduceMax", "x", {R(3, 4)}, 1, "axes=l:1"});
    check((gc_case){"ReduceMax", "x", {R(2, 3, 4)}, 1, "axes=0,2 keepdims=0"});
    check((gc_case){"ReduceMin", "x", {R(3, 4)}, 1, "axes=l:0 keepdims=0"});
    /* fixed, well-separated values: random ones can tie within the finite
     * difference's step, where min has no derivative */
    check((gc_case){"ReduceMin", "x", {F32(2, SHAPE(2, 3), 0.3f, -0.7f, 0.9f, -0.2f, 0.5f, 0.1f)}, 1});
    check((gc_case){"ReduceProd", "x", {RPOS(3, 4)}, 1, "axes=l:1"});
    check((gc_case){"ReduceProd", "x", {RGAP(2, 3)}, 1, "keepdims=0"});
    check((gc_case){"ReduceL2", "x", {RGAP(3, 4)}, 1, "axes=l:-1 keepdims=0"});
    check((gc_case){"ReduceL2", "x", {R(2, 3, 2)}, 1});
    check((gc_case){"ReduceLogSumExp", "x", {R(3, 4)}, 1, "axes=l:1"});
    check((gc_case){"ReduceLogSumExp", "x", {R(2, 3, 4)}, 1, "axes=0,1 keepdims=0"});
    check((gc_case){"TopK", "xc", {R(3, 5), I64V(2)}, 2});
    check((gc_case){"TopK", "xc", {R(4, 3), I64V(3)}, 2, "axis=0 largest=0"});
}

/* pippin::CausalAttention (the training fusion) through
 * pippin::CausalAttentionGrad: each layout of Q, K, V and Y, a scale that
 * multiplies or divides, masks of every broadcast (mask_ref is read for its
 * shape), and more keys than queries. */
static void test_causal_attention(void **state) {
    (void)state;
    check((gc_case){"CausalAttention", "xxx", {R(2, 2, 5, 3), R(2, 2, 3, 5), R(2, 2, 5, 4)}, 1, "scale=f:0.5",
                    "pippin"});
    check((gc_case){"CausalAttention", "xxx", {R(2, 5, 2, 3), R(2, 5, 2, 3), R(2, 5, 2, 4)}, 1,
                    "scale=f:2 scale_div=1 q_layout=s:bthd k_layout=s:bthd v_layout=s:bthd out_layout=s:bthd",
                    "pippin"});
    check((gc_case){"CausalAttention", "xxxc", {R(1, 2, 4, 3), R(1, 2, 4, 3), R(1, 2, 4, 2), R(1, 1, 4, 4)}, 1,
                    "k_layout=s:bhtd out_layout=s:bthd", "pippin"});
    check((gc_case){"CausalAttention", "xxxc", {R(2, 3, 2), R(2, 2, 3), R(2, 3, 2), R(1, 1, 3, 1)}, 1,
                    "scale=f:0.7", "pippin"});
    check((gc_case){"CausalAttention", "xxxc", {R(2, 3, 2), R(2, 2, 3), R(2, 3, 2), R(1, 1, 1, 3)}, 1, NULL,
                    "pippin"});
    check((gc_case){"CausalAttention", "xpx", {R(1, 1, 3, 2), R(1, 1, 2, 6), R(1, 1, 6, 3)}, 1, NULL, "pippin"});
}

/* CausalAttentionGrad over several row blocks (T 130 and D 70 make blocks
 * of 28 query rows, lib/ops/attention_internal.h) against a plain
 * reference in double: P = softmax(mask(Q K^T * c)), dV = P^T dY,
 * dS = P (dY V^T - rowsum), dQ = dS K c, dK = dS^T Q c. Q in bthd, K as
 * K^T (bhdt) or as rows (bhtd), V and dY in bhtd. */
static void attention_grad_blocks(int k_rows) {
    enum { B = 1, H = 2, T = 130, D = 70, DV = 5 };
    const float c = 0.125f;
    pp_tensor *q = R(B, T, H, D), *kt = k_rows ? R(B, H, T, D) : R(B, H, D, T), *v = R(B, H, T, DV),
              *dy = R(B, H, T, DV);
    pp_graph *g;
    TU_OK(pp_graph_new("attn_grad", &g));
    int in[4], node;
    pp_tensor *feed[4] = {dy, q, kt, v};
    const char *names[4] = {"dy", "q", "kt", "v"};
    for (int k = 0; k < 4; k++)
        TU_OK(pp_graph_add_input(g, names[k], PP_F32, feed[k]->ndim, feed[k]->shape, &in[k]));
    TU_OK(pp_graph_add_node(g, "CausalAttentionGrad", "pippin", "grad", 4, in, 3, NULL, &node));
    set_attrs(g, node, k_rows ? "scale=f:0.125 q_layout=s:bthd k_layout=s:bhtd" : "scale=f:0.125 q_layout=s:bthd");
    for (int k = 0; k < 3; k++) TU_OK(pp_graph_add_output(g, g->nodes[node].out[k]));
    pp_tensor *outs[3] = {0};
    TU_OK(pp_graph_run(g, feed, outs));
    const float *Q = q->data, *KT = kt->data, *V = v->data, *DY = dy->data;
    const float *dq = outs[0]->data, *dkt = outs[1]->data, *dv = outs[2]->data;
    double *p = malloc(sizeof(double) * T * T), *ds = malloc(sizeof(double) * T * T);
    double worst = 0;
    for (int h = 0; h < H; h++) {
#define QV(t, d) Q[((t) * H + h) * D + (d)]
#define KIX(t, d) (k_rows ? (h * T + (t)) * D + (d) : (h * D + (d)) * T + (t))
#define KV(t, d) KT[KIX(t, d)]
#define VV(t, e) V[(h * T + (t)) * DV + (e)]
#define DYV(t, e) DY[(h * T + (t)) * DV + (e)]
        for (int i = 0; i < T; i++) {
            double m = -INFINITY, sum = 0, dot = 0;
            for (int j = 0; j <= i; j++) {
                double x = 0;
                for (int d = 0; d < D; d++) x += (double)QV(i, d) * KV(j, d);
                p[i * T + j] = x * c;
                m = p[i * T + j] > m ? p[i * T + j] : m;
            }
            for (int j = 0; j <= i; j++) sum += (p[i * T + j] = exp(p[i * T + j] - m));
            for (int j = 0; j <= i; j++) {
                p[i * T + j] /= sum;
                double dp = 0;
                for (int e = 0; e < DV; e++) dp += (double)DYV(i, e) * VV(j, e);
                ds[i * T + j] = dp;
                dot += dp * p[i * T + j];
            }
            for (int j = 0; j <= i; j++) ds[i * T + j] = p[i * T + j] * (ds[i * T + j] - dot) * c;
        }
        for (int j = 0; j < T; j++) {
            for (int e = 0; e < DV; e++) { /* dV */
                double r = 0;
                for (int i = j; i < T; i++) r += p[i * T + j] * DYV(i, e);
                double got = dv[(h * T + j) * DV + e];
                worst = fmax(worst, fabs(got - r) / (1e-3 + fabs(r)));
            }
            for (int d = 0; d < D; d++) { /* dK in K's layout */
                double r = 0;
                for (int i = j; i < T; i++) r += ds[i * T + j] * QV(i, d);
                double got = dkt[KIX(j, d)];
                worst = fmax(worst, fabs(got - r) / (1e-3 + fabs(r)));
            }
        }
        for (int i = 0; i < T; i++)
            for (int d = 0; d < D; d++) { /* dQ, bthd */
                double r = 0;
                for (int j = 0; j <= i; j++) r += ds[i * T + j] * KV(j, d);
                double got = dq[(i * H + h) * D + d];
                worst = fmax(worst, fabs(got - r) / (1e-3 + fabs(r)));
            }
#undef QV
#undef KIX
#undef KV
#undef VV
#undef DYV
    }
    assert_true(worst < 1e-3);
    free(p);
    free(ds);
    for (int k = 0; k < 3; k++) pp_tensor_free(outs[k]);
    for (int k = 0; k < 4; k++) pp_tensor_free(feed[k]);
    pp_graph_free(g);
}

static void test_attention_grad_blocks(void **state) {
    (void)state;
    attention_grad_blocks(0); /* K given as K^T (bhdt) */
    attention_grad_blocks(1); /* K as rows (bhtd) */
}

/* Where the packed GEMM has no vector kernel (x86 without AVX2 and FMA:
 * simulated by limiting it to its plain C kernel), the attention takes
 * its scores and P V from the BLAS instead (the plain kernel calls a
 * software fmaf per product there): the gradients still check, and the
 * backward's recomputed P is the forward's (the same path for both). */
static void test_attention_without_vector_kernel(void **state) {
    int old = pp_gemm_packed_limit_isa(0);
    assert_false(pp_gemm_packed_fast());
    test_causal_attention(state);
    attention_grad_blocks(0);
    attention_grad_blocks(1);
    pp_gemm_packed_limit_isa(old);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_without_vector_kernel),
        cmocka_unit_test(test_arithmetic),     cmocka_unit_test(test_unary),
        cmocka_unit_test(test_matmul),         cmocka_unit_test(test_normalization),
        cmocka_unit_test(test_reductions),     cmocka_unit_test(test_shape_ops),
        cmocka_unit_test(test_where_mask),     cmocka_unit_test(test_gelu_patterns),
        cmocka_unit_test(test_pooling),        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_conv_transpose),
        cmocka_unit_test(test_resize),
        cmocka_unit_test(test_group_norm),
        cmocka_unit_test(test_pad),
        cmocka_unit_test(test_misc_ops),
        cmocka_unit_test(test_causal_attention),
        cmocka_unit_test(test_attention_grad_blocks),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
