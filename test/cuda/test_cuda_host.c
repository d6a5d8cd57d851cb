/* cuda-host: the CUDA kernels' arithmetic and indexing (lib/cuda/
 * kernel_math.h), run here on the CPU over the same index space as the
 * kernels launch (one call per thread index, in any order), against
 * pippin's CPU kernels. No GPU needed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_math.h"
#include "op_attrs.h"
#include "test_util.h"

#include "test_filter.h"

#define RTOL 1e-5
#define ATOL 1e-6

static pp_tensor *rand_f32(int nd, const int64_t *shape, uint64_t seed) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    float *d = t->data;
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) d[i] = (float)(2.0 * tu_urand(&seed));
    return t;
}

static pp_tensor *clone(const pp_tensor *t) {
    pp_tensor *c;
    TU_OK(pp_tensor_clone(t, &c));
    return c;
}

static pp_tensor *like(const pp_tensor *t) {
    pp_tensor *c;
    TU_OK(pp_tensor_new(t->dtype, t->ndim, t->shape, &c));
    return c;
}

/* The CPU kernel of op on clones of ins, with an attribute setter. */
typedef void (*set_attrs)(pp_graph *g, int node, const void *arg);

static pp_tensor **cpu_run(const char *op, const char *domain, int n_in, pp_tensor *const *ins, int n_out,
                           set_attrs attrs, const void *arg, pp_tensor **outs) {
    pp_tensor *c[TU_MAX_IN];
    for (int k = 0; k < n_in; k++) c[k] = ins[k] ? clone(ins[k]) : NULL;
    tu_node t;
    tu_node_init_dom(&t, op, domain, n_in, c, n_out, NULL);
    if (attrs) attrs(t.g, t.node, arg);
    TU_OK(tu_node_run(&t, outs));
    tu_node_free(&t);
    return outs;
}

static pp_tensor *cpu_one(const char *op, const char *domain, int n_in, pp_tensor *const *ins, set_attrs attrs,
                          const void *arg) {
    pp_tensor *out;
    cpu_run(op, domain, n_in, ins, 1, attrs, arg, &out);
    return out;
}

static void set_approx(pp_graph *g, int node, const void *arg) {
    if (arg) TU_OK(pp_node_set_string(g, node, "approximate", arg));
}

static void set_axis(pp_graph *g, int node, const void *arg) {
    TU_OK(pp_node_set_int(g, node, "axis", *(const int64_t *)arg));
}

/* ---------------------------------------------------------- elementwise */

static void test_binary_broadcast(void **state) {
    (void)state;
    static const char *const ops[] = {"Add", "Sub", "Mul", "Div"};
    pp_tensor *a = rand_f32(3, SHAPE(2, 3, 4), 1), *b = rand_f32(2, SHAPE(3, 1), 2);
    for (int op = 0; op < 4; op++) {
        for (int swap = 0; swap < 2; swap++) { /* the broadcast side first, then second */
            pp_tensor *x = swap ? b : a, *y = swap ? a : b;
            pp_tensor *want = cpu_one(ops[op], "", 2, (pp_tensor *[]){x, y}, NULL, NULL);
            pp_tensor *got = like(want);
            pp_km_strides sx, sy;
            assert_int_equal(pp_km_broadcast(want->ndim, want->shape, x->ndim, x->shape, &sx), 0);
            assert_int_equal(pp_km_broadcast(want->ndim, want->shape, y->ndim, y->shape, &sy), 0);
            const float *xd = x->data, *yd = y->data;
            float *o = got->data;
            for (int64_t i = 0; i < pp_tensor_numel(got); i++)
                o[i] = pp_km_binary((pp_km_binop)op, xd[pp_km_offset(&sx, i)], yd[pp_km_offset(&sy, i)]);
            tu_expect(got, want, RTOL, ATOL, ops[op]);
        }
    }
    pp_km_strides s;
    assert_int_equal(pp_km_broadcast(3, SHAPE(2, 3, 4), 1, SHAPE(3), &s), -1); /* 3 vs 4 */
    pp_tensor_free(a);
    pp_tensor_free(b);
}

static void test_unary_and_grads(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(2, SHAPE(7, 33), 3), *dy = rand_f32(2, SHAPE(7, 33), 4);
    struct { const char *op; const char *approx; pp_km_unop k; } un[] = {
        {"Relu", NULL, PP_KM_RELU}, {"Tanh", NULL, PP_KM_TANH}, {"Gelu", "none", PP_KM_GELU},
        {"Gelu", "tanh", PP_KM_GELU_TANH}, {"Neg", NULL, PP_KM_NEG}, {"Exp", NULL, PP_KM_EXP},
        {"Sigmoid", NULL, PP_KM_SIGMOID}};
    int64_t n = pp_tensor_numel(x);
    for (size_t u = 0; u < sizeof un / sizeof *un; u++) {
        pp_tensor *want = cpu_one(un[u].op, "", 1, &x, set_approx, un[u].approx), *got = like(want);
        for (int64_t i = 0; i < n; i++) ((float *)got->data)[i] = pp_km_unary(un[u].k, ((float *)x->data)[i]);
        tu_expect(got, want, RTOL, ATOL, un[u].op);
    }
    pp_tensor *sq = cpu_one("Abs", "", 1, &x, NULL, NULL), *want = cpu_one("Sqrt", "", 1, &sq, NULL, NULL);
    pp_tensor *got = like(want);
    for (int64_t i = 0; i < n; i++) ((float *)got->data)[i] = pp_km_unary(PP_KM_SQRT, ((float *)sq->data)[i]);
    tu_expect(got, want, RTOL, ATOL, "Sqrt");
    pp_tensor_free(sq);
    /* gradients: Relu and Tanh from y, Gelu from x */
    pp_tensor *relu_y = cpu_one("Relu", "", 1, &x, NULL, NULL), *tanh_y = cpu_one("Tanh", "", 1, &x, NULL, NULL);
    struct { const char *op; const char *approx; pp_km_gradop k; pp_tensor *t; } gr[] = {
        {"ReluGrad", NULL, PP_KM_RELU_GRAD, relu_y}, {"TanhGrad", NULL, PP_KM_TANH_GRAD, tanh_y},
        {"GeluGrad", "none", PP_KM_GELU_GRAD, x}, {"GeluGrad", "tanh", PP_KM_GELU_TANH_GRAD, x}};
    for (size_t k = 0; k < sizeof gr / sizeof *gr; k++) {
        want = cpu_one(gr[k].op, "pippin", 2, (pp_tensor *[]){dy, gr[k].t}, set_approx, gr[k].approx);
        got = like(want);
        for (int64_t i = 0; i < n; i++)
            ((float *)got->data)[i] = pp_km_unary_grad(gr[k].k, ((float *)dy->data)[i], ((float *)gr[k].t->data)[i]);
        tu_expect(got, want, RTOL, ATOL, gr[k].op);
    }
    pp_tensor_free(relu_y);
    pp_tensor_free(tanh_y);
    pp_tensor_free(x);
    pp_tensor_free(dy);
}

/* ------------------------------------------------------------------ rows */

static void test_softmax_and_grad(void **state) {
    (void)state;
    int64_t rows = 6, n = 37;
    pp_tensor *x = rand_f32(3, SHAPE(2, 3, n), 5), *dy = rand_f32(3, SHAPE(2, 3, n), 6);
    int64_t axis = -1;
    pp_tensor *want = cpu_one("Softmax", "", 1, &x, set_axis, &axis), *got = like(want);
    for (int64_t r = 0; r < rows; r++) /* one thread per row */
        pp_km_softmax_row((float *)x->data + r * n, (float *)got->data + r * n, n);
    tu_assert_close(got, want, RTOL, ATOL, "Softmax");
    pp_tensor *y = want, *gwant = cpu_one("SoftmaxGrad", "pippin", 2, (pp_tensor *[]){dy, y}, set_axis, &axis);
    pp_tensor *ggot = like(gwant);
    for (int64_t r = 0; r < rows; r++)
        pp_km_softmax_grad_row((float *)dy->data + r * n, (float *)y->data + r * n, (float *)ggot->data + r * n, n);
    tu_expect(ggot, gwant, RTOL, ATOL, "SoftmaxGrad");
    pp_tensor_free(got);
    pp_tensor_free(y);
    pp_tensor_free(x);
    pp_tensor_free(dy);
}

static void test_layernorm_and_grads(void **state) {
    (void)state;
    int64_t rows = 10, n = 48;
    pp_tensor *x = rand_f32(3, SHAPE(2, 5, n), 7), *w = rand_f32(1, SHAPE(n), 8), *b = rand_f32(1, SHAPE(n), 9);
    pp_tensor *dy = rand_f32(3, SHAPE(2, 5, n), 10);
    int64_t axis = -1;
    pp_tensor *outs[3];
    cpu_run("LayerNormalization", "", 3, (pp_tensor *[]){x, w, b}, 3, set_axis, &axis, outs);
    pp_tensor *y = like(outs[0]), *mean = like(outs[1]), *rstd = like(outs[2]);
    for (int64_t r = 0; r < rows; r++)
        pp_km_layernorm_row((float *)x->data + r * n, w->data, b->data, 1e-5f, (float *)y->data + r * n, n,
                            (float *)mean->data + r, (float *)rstd->data + r);
    tu_expect(y, outs[0], RTOL, ATOL, "LayerNormalization Y");
    tu_expect(mean, outs[1], RTOL, ATOL, "LayerNormalization Mean");
    tu_expect(rstd, outs[2], RTOL, ATOL, "LayerNormalization InvStdDev");
    /* the input half: one thread per row */
    pp_tensor *want = cpu_one("LayerNormGradInput", "pippin", 3, (pp_tensor *[]){dy, x, w}, set_axis, &axis);
    pp_tensor *got = like(want);
    for (int64_t r = 0; r < rows; r++)
        pp_km_ln_grad_input_row((float *)dy->data + r * n, (float *)x->data + r * n, w->data, 1e-5f,
                                (float *)got->data + r * n, n);
    tu_expect(got, want, RTOL, ATOL, "LayerNormGradInput");
    /* the weight half: row stats, then one thread per column */
    cpu_run("LayerNormGradWeight", "pippin", 2, (pp_tensor *[]){dy, x}, 2, set_axis, &axis, outs);
    float *stats = malloc(sizeof(float) * 2 * (size_t)rows);
    for (int64_t r = 0; r < rows; r++)
        pp_km_ln_stats((float *)x->data + r * n, n, 1e-5f, &stats[2 * r], &stats[2 * r + 1]);
    pp_tensor *ds = like(outs[0]), *db = like(outs[1]);
    for (int64_t c = 0; c < n; c++)
        pp_km_ln_grad_weight_col(dy->data, x->data, stats, rows, n, c, (float *)ds->data + c, (float *)db->data + c);
    free(stats);
    tu_expect(ds, outs[0], RTOL, ATOL, "LayerNormGradWeight dscale");
    tu_expect(db, outs[1], RTOL, ATOL, "LayerNormGradWeight dbias");
    pp_tensor_free(x);
    pp_tensor_free(w);
    pp_tensor_free(b);
    pp_tensor_free(dy);
}

static void set_keepdims0(pp_graph *g, int node, const void *arg) {
    (void)arg;
    TU_OK(pp_node_set_int(g, node, "keepdims", 0));
}

static void test_reduce_sum(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(3, SHAPE(4, 9, 5), 11), *axes = I64(1, SHAPE(1), 1);
    pp_tensor *want = cpu_one("ReduceSum", "", 2, (pp_tensor *[]){x, axes}, set_keepdims0, NULL), *got = like(want);
    for (int64_t i = 0; i < 4 * 5; i++) ((float *)got->data)[i] = pp_km_reduce_sum(x->data, 9, 5, i / 5, i % 5);
    tu_expect(got, want, RTOL, ATOL, "ReduceSum");
    pp_tensor_free(x);
    pp_tensor_free(axes);
}

/* ------------------------------------------------- gather, cross-entropy */

static void test_gather_and_grad(void **state) {
    (void)state;
    pp_tensor *table = rand_f32(2, SHAPE(11, 6), 12);
    pp_tensor *idx = I64(2, SHAPE(2, 4), 3, -1, 0, 3, 5, 3, 2, -6); /* repeats, negatives */
    for (int64_t axis = 0; axis < 2; axis++) {
        pp_tensor *want = cpu_one("Gather", "", 2, (pp_tensor *[]){table, idx}, set_axis, &axis), *got = like(want);
        int64_t axis_len = table->shape[axis], inner = axis ? 1 : 6;
        for (int64_t i = 0; i < pp_tensor_numel(got); i++)
            ((float *)got->data)[i] = ((float *)table->data)[pp_km_gather_src(i, idx->data, 8, axis_len, inner)];
        pp_tensor *dy = rand_f32(want->ndim, want->shape, 13 + (uint64_t)axis), *shape = I64(1, SHAPE(2), 11, 6);
        tu_expect(got, want, RTOL, ATOL, axis ? "Gather axis 1" : "Gather axis 0");
        /* the scatter-add gradient (GatherGrad(dy, indices, data shape)) */
        pp_tensor *gwant = cpu_one("GatherGrad", "pippin", 3, (pp_tensor *[]){dy, idx, shape}, set_axis, &axis);
        pp_tensor *ggot = like(gwant);
        for (int64_t i = 0; i < pp_tensor_numel(dy); i++)
            ((float *)ggot->data)[pp_km_gather_grad_dst(i, idx->data, 8, axis_len, inner)] += ((float *)dy->data)[i];
        tu_expect(ggot, gwant, RTOL, ATOL, "GatherGrad");
        pp_tensor_free(dy);
        pp_tensor_free(shape);
    }
    pp_tensor_free(table);
    pp_tensor_free(idx);
}

static void set_ignore(pp_graph *g, int node, const void *arg) {
    TU_OK(pp_node_set_int(g, node, "ignore_index", *(const int64_t *)arg));
}

static void test_cross_entropy_and_grad(void **state) {
    (void)state;
    int64_t N = 9, C = 13, ignore = 4;
    pp_tensor *s = rand_f32(2, SHAPE(N, C), 14);
    pp_tensor *labels = I64(1, SHAPE(N), 0, 12, 4, 7, 4, 1, 3, 3, 11);
    pp_tensor *want = cpu_one("SoftmaxCrossEntropyLoss", "", 2, (pp_tensor *[]){s, labels}, set_ignore, &ignore);
    const int64_t *lb = labels->data;
    double sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < N; r++) { /* one thread per row; the mean after */
        sum += pp_km_sce_row_loss((float *)s->data + r * C, C, lb[r], ignore);
        count += lb[r] != ignore;
    }
    pp_tensor *got;
    TU_OK(pp_tensor_scalar_f32((float)(sum / (double)count), &got));
    tu_expect(got, want, RTOL, ATOL, "SoftmaxCrossEntropyLoss");
    pp_tensor *dloss;
    TU_OK(pp_tensor_scalar_f32(0.75f, &dloss));
    pp_tensor *gwant = cpu_one("SoftmaxCrossEntropyLossGrad", "pippin", 3, (pp_tensor *[]){dloss, s, labels},
                               set_ignore, &ignore);
    pp_tensor *ggot = like(gwant);
    for (int64_t r = 0; r < N; r++)
        pp_km_sce_row_grad((float *)s->data + r * C, C, lb[r], ignore, (float)(0.75 / (double)count),
                           (float *)ggot->data + r * C);
    tu_expect(ggot, gwant, RTOL, ATOL, "SoftmaxCrossEntropyLossGrad");
    pp_tensor_free(dloss);
    pp_tensor_free(s);
    pp_tensor_free(labels);
}

/* --------------------------------------------------------- data movement */

static void set_perm(pp_graph *g, int node, const void *arg) {
    TU_OK(pp_node_set_ints(g, node, "perm", 4, arg));
}

static void test_transpose_slice_concat(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(4, SHAPE(2, 3, 4, 5), 15);
    int64_t perm[4] = {0, 2, 3, 1};
    pp_tensor *want = cpu_one("Transpose", "", 1, &x, set_perm, perm), *got = like(want);
    pp_km_strides st;
    pp_km_transpose(4, x->shape, perm, &st);
    for (int64_t i = 0; i < pp_tensor_numel(got); i++) ((float *)got->data)[i] = ((float *)x->data)[pp_km_offset(&st, i)];
    tu_expect(got, want, RTOL, ATOL, "Transpose");
    /* Slice x[:, 1:3, ::-2 (from 3), 0:5:2] */
    pp_tensor *starts = I64(1, SHAPE(3), 1, 3, 0), *ends = I64(1, SHAPE(3), 3, -100, 5);
    pp_tensor *axes = I64(1, SHAPE(3), 1, 2, 3), *steps = I64(1, SHAPE(3), 1, -2, 2);
    want = cpu_one("Slice", "", 5, (pp_tensor *[]){x, starts, ends, axes, steps}, NULL, NULL);
    got = like(want);
    int64_t base;
    pp_km_slice(4, x->shape, want->shape, (int64_t[]){0, 1, 3, 0}, (int64_t[]){1, 1, -2, 2}, &st, &base);
    for (int64_t i = 0; i < pp_tensor_numel(got); i++)
        ((float *)got->data)[i] = ((float *)x->data)[base + pp_km_offset(&st, i)];
    tu_expect(got, want, RTOL, ATOL, "Slice");
    pp_tensor_free(starts);
    pp_tensor_free(ends);
    pp_tensor_free(axes);
    pp_tensor_free(steps);
    /* Concat along axis 2 of x and a part of another length */
    pp_tensor *y = rand_f32(4, SHAPE(2, 3, 2, 5), 16);
    int64_t axis = 2;
    want = cpu_one("Concat", "", 2, (pp_tensor *[]){x, y}, set_axis, &axis);
    got = like(want);
    const pp_tensor *parts[2] = {x, y};
    int64_t off = 0;
    for (int k = 0; k < 2; k++) { /* one launch per part */
        int64_t len = parts[k]->shape[2];
        for (int64_t i = 0; i < pp_tensor_numel(parts[k]); i++)
            ((float *)got->data)[pp_km_concat_dst(i, len, 5, 6, off)] = ((float *)parts[k]->data)[i];
        off += len;
    }
    tu_expect(got, want, RTOL, ATOL, "Concat");
    pp_tensor_free(x);
    pp_tensor_free(y);
}

/* ---------------------------------------------------------------- Split */

typedef struct split_case {
    int64_t axis;
    const int64_t *split_attr; /* n_out entries, or NULL */
    int split_input;           /* the sizes as input 1 instead */
    int64_t num_outputs;       /* 0: not set */
    int n_out;
} split_case;

static void set_split(pp_graph *g, int node, const void *arg) {
    const split_case *c = arg;
    TU_OK(pp_node_set_int(g, node, "axis", c->axis));
    if (c->split_attr) TU_OK(pp_node_set_ints(g, node, "split", c->n_out, c->split_attr));
    if (c->num_outputs) TU_OK(pp_node_set_int(g, node, "num_outputs", c->num_outputs));
}

/* Each part by pp_km_split_src over its index space (one launch per part),
 * against the CPU's Split: equal parts, the split attribute, the split
 * input, num_outputs with a shorter last part; first, middle and last axis. */
static void test_split(void **state) {
    (void)state;
    pp_tensor *x = rand_f32(3, SHAPE(4, 6, 7), 41);
    static const int64_t s0[] = {1, 3}, s1[] = {1, 3, 2}, s2[] = {2, 0, 5};
    split_case cases[] = {
        {1, NULL, 0, 0, 3},  /* equal parts of 6 */
        {0, s0, 0, 0, 2},    /* attribute, axis 0: nothing before it */
        {-2, s1, 1, 0, 3},   /* input, negative axis */
        {2, s2, 0, 0, 3},    /* last axis, an empty part */
        {-1, NULL, 0, 3, 3}, /* num_outputs: 3, 3, 1 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const split_case *c = &cases[k];
        pp_tensor *ins[2] = {x, NULL};
        int n_in = 1;
        if (c->split_input) {
            TU_OK(pp_tensor_new(PP_I64, 1, (int64_t[]){c->n_out}, &ins[1]));
            memcpy(ins[1]->data, c->split_attr, sizeof(int64_t) * (size_t)c->n_out);
            n_in = 2;
        }
        split_case attrs = *c;
        if (c->split_input) attrs.split_attr = NULL;
        pp_tensor *want[8] = {0};
        cpu_run("Split", "", n_in, ins, c->n_out, set_split, &attrs, want);
        int axis = (int)(c->axis < 0 ? c->axis + x->ndim : c->axis);
        int64_t inner = pp_shape_numel(x->ndim - axis - 1, x->shape + axis + 1), off = 0;
        for (int o = 0; o < c->n_out; o++) {
            pp_tensor *got = like(want[o]);
            int64_t len = want[o]->shape[axis];
            for (int64_t i = 0; i < pp_tensor_numel(got); i++)
                ((float *)got->data)[i] = ((float *)x->data)[pp_km_split_src(i, len, inner, x->shape[axis], off)];
            char what[64];
            snprintf(what, sizeof what, "Split case %zu part %d", k, o);
            tu_expect(got, want[o], RTOL, ATOL, what);
            off += len;
        }
        assert_int_equal(off, x->shape[axis]);
        pp_tensor_free(ins[1]);
    }
    pp_tensor_free(x);
}

/* ----------------------------------------------------- causal attention */

enum { A_BHTD, A_BTHD, A_BHDT };
static const char *const layout_names[] = {"bhtd", "bthd", "bhdt"};

typedef struct attn_case {
    int ql, kl, vl, ol;
    int64_t B, H, tq, tk, d, dv; /* B = 0: 3-D operands (no batch dim) */
    int mask_nd;                 /* 0: no mask_ref */
    int64_t mask_a, mask_b;
    float scale;
    int scale_div;
} attn_case;

static void set_attn(pp_graph *g, int node, const void *arg) {
    const attn_case *c = arg;
    TU_OK(pp_node_set_float(g, node, "scale", c->scale));
    if (c->scale_div) TU_OK(pp_node_set_int(g, node, "scale_div", 1));
    TU_OK(pp_node_set_string(g, node, "q_layout", layout_names[c->ql]));
    TU_OK(pp_node_set_string(g, node, "k_layout", layout_names[c->kl]));
    TU_OK(pp_node_set_string(g, node, "v_layout", layout_names[c->vl]));
    TU_OK(pp_node_set_string(g, node, "out_layout", layout_names[c->ol]));
}

/* An operand of t rows (time) by w features in layout l, and its view as
 * the kernels index it (written out here, not taken from the CPU's). */
static pp_tensor *attn_operand(const attn_case *c, int l, int64_t t, int64_t w, uint64_t seed, pp_km_attn_view *v) {
    int64_t B = c->B ? c->B : 1, H = c->H;
    if (l == A_BTHD) {
        *v = (pp_km_attn_view){t * H * w, w, H * w, 1};
        return rand_f32(4, SHAPE(B, t, H, w), seed);
    }
    if (l == A_BHDT) *v = (pp_km_attn_view){H * w * t, w * t, 1, t};
    else *v = (pp_km_attn_view){H * t * w, t * w, w, 1};
    int64_t r = l == A_BHDT ? w : t, cl = l == A_BHDT ? t : w;
    return c->B ? rand_f32(4, SHAPE(c->B, H, r, cl), seed) : rand_f32(3, SHAPE(H, r, cl), seed);
}

static pp_km_attn_view attn_out_view(const attn_case *c) {
    if (c->ol == A_BTHD) return (pp_km_attn_view){c->tq * c->H * c->dv, c->dv, c->H * c->dv, 1};
    return (pp_km_attn_view){c->H * c->tq * c->dv, c->tq * c->dv, c->dv, 1};
}

static const attn_case attn_cases[] = {
    /* the optimizer's usual form: K^T, odd T, D != Dv */
    {A_BHTD, A_BHDT, A_BHTD, A_BHTD, 2, 3, 7, 7, 5, 4, 0, 0, 0, 0.37f, 0},
    /* everything [B, T, H, D], the graph's sliced mask, a divided scale */
    {A_BTHD, A_BTHD, A_BTHD, A_BTHD, 1, 2, 9, 9, 3, 3, 4, 9, 9, 2.0f, 1},
    /* a mask of one row (every query sees key 0 alone), Y as [B, T, H, D] */
    {A_BHTD, A_BHTD, A_BHTD, A_BTHD, 2, 2, 5, 5, 4, 6, 4, 1, 5, 0.5f, 0},
    /* a mask of one column (every key seen), a 5-D mask widening Y */
    {A_BHTD, A_BHDT, A_BTHD, A_BHTD, 1, 3, 7, 7, 2, 5, 5, 7, 1, 1.5f, 0},
    /* 3-D operands, more keys than queries (no mask: keys j <= i) */
    {A_BHTD, A_BHDT, A_BHTD, A_BHTD, 0, 2, 5, 8, 3, 3, 0, 0, 0, 0.8f, 1},
    /* one query, one head */
    {A_BHTD, A_BHTD, A_BHTD, A_BHTD, 1, 1, 1, 1, 6, 2, 0, 0, 0, 0.3f, 0},
};

typedef struct attn_data {
    pp_tensor *q, *k, *v, *m;
    pp_km_attn a;
    int n_in;
} attn_data;

static void attn_setup(const attn_case *c, uint64_t seed, attn_data *o) {
    memset(o, 0, sizeof *o);
    pp_km_attn *a = &o->a;
    o->q = attn_operand(c, c->ql, c->tq, c->d, seed, &a->q);
    o->k = attn_operand(c, c->kl, c->tk, c->d, seed + 1, &a->k);
    o->v = attn_operand(c, c->vl, c->tk, c->dv, seed + 2, &a->v);
    o->n_in = 3;
    if (c->mask_nd) {
        int64_t ms[8];
        for (int d = 0; d < c->mask_nd; d++) ms[d] = 1;
        ms[c->mask_nd - 2] = c->mask_a, ms[c->mask_nd - 1] = c->mask_b;
        TU_OK(pp_tensor_new(PP_F32, c->mask_nd, ms, &o->m)); /* read for its shape alone */
        o->n_in = 4;
    }
    a->heads = c->H, a->tq = c->tq, a->tk = c->tk, a->d = c->d, a->dv = c->dv;
    a->mask_a = c->mask_nd ? c->mask_a : c->tq, a->mask_b = c->mask_nd ? c->mask_b : c->tk;
    a->scale = c->scale, a->scale_div = c->scale_div;
    a->y = attn_out_view(c);
}

static void attn_free(attn_data *o) {
    pp_tensor_free(o->q);
    pp_tensor_free(o->k);
    pp_tensor_free(o->v);
    pp_tensor_free(o->m);
}

/* pippin::CausalAttention: one call of pp_km_attn_fwd_row per (batch-head,
 * query row), in reverse order, against the CPU kernel. */
static void test_attention(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof attn_cases / sizeof *attn_cases; k++) {
        const attn_case *c = &attn_cases[k];
        attn_data d;
        attn_setup(c, 60 + 10 * k, &d);
        pp_tensor *want = cpu_one("CausalAttention", "pippin", d.n_in, (pp_tensor *[]){d.q, d.k, d.v, d.m}, set_attn, c);
        pp_tensor *got = like(want);
        float *y = got->data;
        for (int64_t i = 0; i < pp_tensor_numel(got); i++) y[i] = NAN; /* every element written */
        int64_t nbh = (c->B ? c->B : 1) * c->H;
        for (int64_t t = nbh * c->tq - 1; t >= 0; t--)
            pp_km_attn_fwd_row(&d.a, d.q->data, d.k->data, d.v->data, y, t / c->tq, t % c->tq);
        char what[64];
        snprintf(what, sizeof what, "CausalAttention case %zu", k);
        tu_expect(got, want, 1e-5, 1e-5, what);
        attn_free(&d);
    }
}

/* pippin::CausalAttentionGrad: the query-row pass (stats, dQ) then the
 * key-row pass (dK, dV), as the two kernels launch, against the CPU
 * kernel; also with dQ alone and with dK, dV alone wanted. */
static void test_attention_grad(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof attn_cases / sizeof *attn_cases; k++) {
        const attn_case *c = &attn_cases[k];
        attn_data d;
        attn_setup(c, 160 + 10 * k, &d);
        pp_tensor *y = cpu_one("CausalAttention", "pippin", d.n_in, (pp_tensor *[]){d.q, d.k, d.v, d.m}, set_attn, c);
        pp_tensor *dy = rand_f32(y->ndim, y->shape, 260 + k);
        pp_tensor_free(y);
        pp_tensor *want[3] = {0};
        cpu_run("CausalAttentionGrad", "pippin", d.n_in + 1, (pp_tensor *[]){dy, d.q, d.k, d.v, d.m}, 3, set_attn, c,
                want);
        int64_t nbh = (c->B ? c->B : 1) * c->H;
        float cf = c->scale_div ? 1.0f / c->scale : c->scale;
        for (int only = 0; only < 3; only++) { /* 0: all; 1: dQ alone; 2: dK, dV alone */
            pp_tensor *got[3] = {like(want[0]), like(want[1]), like(want[2])};
            for (int g = 0; g < 3; g++)
                for (int64_t i = 0; i < pp_tensor_numel(got[g]); i++) ((float *)got[g]->data)[i] = NAN;
            float *stats = malloc(sizeof(float) * (size_t)(3 * nbh * c->tq + 1));
            float *dq = only != 2 ? got[0]->data : NULL, *dk = only != 1 ? got[1]->data : NULL;
            float *dv = only != 1 ? got[2]->data : NULL;
            for (int64_t t = nbh * c->tq - 1; t >= 0; t--)
                pp_km_attn_grad_row(&d.a, d.q->data, d.k->data, d.v->data, dy->data, t / c->tq, t % c->tq, cf,
                                    stats + 3 * t, dq);
            for (int64_t t = 0; (dk || dv) && t < nbh * c->tk; t++)
                pp_km_attn_grad_key(&d.a, d.q->data, d.k->data, d.v->data, dy->data, stats, t / c->tk, t % c->tk, cf,
                                    dk, dv);
            static const char *const names[] = {"dQ", "dK", "dV"};
            for (int g = 0; g < 3; g++) {
                if ((g == 0 && !dq) || (g == 1 && !dk) || (g == 2 && !dv)) continue;
                char what[80];
                snprintf(what, sizeof what, "CausalAttentionGrad case %zu %s (pass %d)", k, names[g], only);
                tu_assert_close(got[g], want[g], 1e-4, 1e-5, what);
            }
            for (int g = 0; g < 3; g++) pp_tensor_free(got[g]);
            free(stats);
        }
        for (int g = 0; g < 3; g++) pp_tensor_free(want[g]);
        pp_tensor_free(dy);
        attn_free(&d);
    }
}

/* ------------------------------------------------------------ optimizers */

static void check_optimizer(pp_optim_kind kind, double momentum, int nesterov) {
    int64_t n = 300;
    pp_optim_config c;
    pp_optim_config_init(&c, kind);
    c.lr = 0.05;
    c.weight_decay = 0.01;
    c.momentum = momentum;
    c.nesterov = nesterov;
    pp_optim *o;
    TU_OK(pp_optim_new(&c, n, &o));
    pp_tensor *p_cpu = rand_f32(1, &n, 17), *p_km = clone(p_cpu);
    float *s0 = calloc((size_t)n, sizeof(float)), *s1 = calloc((size_t)n, sizeof(float));
    for (int step = 0; step < 3; step++) {
        pp_tensor *g = rand_f32(1, &n, 18 + (uint64_t)step);
        TU_OK(pp_optim_step(o, p_cpu->data, g->data, n));
        if (kind == PP_OPTIM_SGD) {
            pp_km_sgd k = {(float)c.lr, (float)c.weight_decay, (float)c.momentum, (float)c.dampening, 1.0f,
                           c.nesterov, step == 0};
            for (int64_t i = 0; i < n; i++) pp_km_sgd_step(&k, p_km->data, g->data, s0, i);
        } else {
            pp_km_adamw k = pp_km_adamw_for_step(c.lr, c.weight_decay, c.beta1, c.beta2, c.eps, 0, step + 1);
            for (int64_t i = 0; i < n; i++) pp_km_adamw_step(&k, p_km->data, g->data, s0, s1, i);
        }
        pp_tensor_free(g);
    }
    tu_assert_close(p_km, p_cpu, RTOL, ATOL, pp_optim_kind_name(kind));
    free(s0);
    free(s1);
    pp_tensor_free(p_cpu);
    pp_tensor_free(p_km);
    pp_optim_free(o);
}

static void test_optimizers(void **state) {
    (void)state;
    check_optimizer(PP_OPTIM_SGD, 0.0, 0);
    check_optimizer(PP_OPTIM_SGD, 0.9, 0);
    check_optimizer(PP_OPTIM_SGD, 0.9, 1);
    check_optimizer(PP_OPTIM_ADAMW, 0.0, 0);
}

/* ------------------------------------------------------------- GEMMs */

/* cuBLAS's column-major strided batched SGEMM (alpha 1, beta 0), as the
 * backend calls it through pp_km_gemm_blas. */
static void blas_ref(const pp_km_blas *b, const float *first, const float *second, float *c) {
    for (int64_t q = 0; q < b->batch; q++) {
        const float *f = first + q * b->stride_first, *s = second + q * b->stride_second;
        float *cq = c + q * b->stride_c;
        for (int64_t j = 0; j < b->n; j++)
            for (int64_t i = 0; i < b->m; i++) {
                double acc = 0;
                for (int64_t l = 0; l < b->k; l++) {
                    float x = b->op_first ? f[l + i * b->ld_first] : f[i + l * b->ld_first];
                    float y = b->op_second ? s[j + l * b->ld_second] : s[l + j * b->ld_second];
                    acc += (double)x * y;
                }
                cq[i + j * b->ld_c] = (float)acc;
            }
    }
}

static void set_weight_t(pp_graph *g, int node, const void *arg) {
    if (*(const int *)arg) TU_OK(pp_node_set_int(g, node, "weight_t", 1));
}

/* MatMulGradA/B on the CPU against the plan the backend launches: the
 * batches match, b is 2-D, and weight_t (b = W^T: the node reads or
 * writes W itself), square and not, as the GPT's linear layers and tied
 * head have them. */
static void test_matmul_grad_plans(void **state) {
    (void)state;
    static const struct {
        int want_a, weight_t, nd_dy, nd_o, nd_t;
        int64_t dy[4], o[4], t[4];
    } cases[] = {
        {1, 0, 3, 2, 3, {4, 16, 96}, {32, 96}, {4, 16, 32}},
        {1, 1, 3, 2, 3, {2, 16, 32}, {32, 32}, {2, 16, 32}}, /* attn.c_proj: square, W itself */
        {1, 1, 3, 2, 3, {2, 16, 96}, {96, 32}, {2, 16, 32}},
        {1, 1, 3, 2, 3, {1, 16, 64}, {64, 32}, {1, 16, 32}}, /* the tied head */
        {1, 0, 4, 4, 4, {2, 4, 16, 16}, {2, 4, 8, 16}, {2, 4, 16, 8}},
        {0, 0, 3, 3, 2, {4, 16, 96}, {4, 16, 32}, {32, 96}},
        {0, 1, 3, 3, 2, {2, 16, 32}, {2, 16, 32}, {32, 32}},
        {0, 1, 3, 3, 2, {2, 16, 96}, {2, 16, 32}, {96, 32}},
        {0, 0, 4, 4, 4, {2, 4, 16, 16}, {2, 4, 16, 8}, {2, 4, 8, 16}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        pp_tensor *dy = rand_f32(cases[k].nd_dy, cases[k].dy, 100 + k), *o = rand_f32(cases[k].nd_o, cases[k].o, 200 + k);
        pp_tensor *sh;
        TU_OK(pp_tensor_empty(PP_I64, 1, SHAPE(cases[k].nd_t), &sh));
        for (int d = 0; d < cases[k].nd_t; d++) ((int64_t *)sh->data)[d] = cases[k].t[d];
        char what[64];
        snprintf(what, sizeof what, "MatMulGrad%c case %zu (weight_t %d)", cases[k].want_a ? 'A' : 'B', k,
                 cases[k].weight_t);
        pp_tensor *want = cpu_one(cases[k].want_a ? "MatMulGradA" : "MatMulGradB", "pippin", 3,
                                  (pp_tensor *[]){dy, o, sh}, set_weight_t, &cases[k].weight_t);
        pp_km_gemm g = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        if (pp_km_matmul_grad_plan(cases[k].want_a, cases[k].weight_t, dy->ndim, dy->shape, o->ndim, o->shape,
                                   cases[k].nd_t, cases[k].t, &g))
            fail_msg("%s: no plan", what);
        pp_tensor *got = like(want);
        pp_km_blas b = pp_km_gemm_blas(&g);
        const float *A = g.a_is_dy ? dy->data : o->data, *B = g.a_is_dy ? o->data : dy->data;
        blas_ref(&b, B, A, got->data);
        double scale = 0; /* sums that cancel: within RTOL of the tensor's largest element */
        for (int64_t i = 0; i < pp_tensor_numel(want); i++)
            if (fabs(((float *)want->data)[i]) > scale) scale = fabs(((float *)want->data)[i]);
        tu_expect(got, want, RTOL, RTOL * scale + ATOL, what);
        pp_tensor_free(dy);
        pp_tensor_free(o);
        pp_tensor_free(sh);
    }
    /* broadcast batches, weight_t with a batched weight: the CPU's */
    pp_km_gemm g = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    assert_int_equal(pp_km_matmul_grad_plan(1, 0, 4, SHAPE(2, 4, 16, 16), 4, SHAPE(1, 4, 8, 16), 4,
                                            SHAPE(2, 4, 16, 8), &g), -1);
    assert_int_equal(pp_km_matmul_grad_plan(1, 1, 3, SHAPE(2, 16, 16), 3, SHAPE(2, 16, 8), 3, SHAPE(2, 16, 8), &g),
                     -1);
    assert_int_equal(pp_km_matmul_grad_plan(0, 1, 3, SHAPE(2, 16, 32), 3, SHAPE(2, 16, 32), 3, SHAPE(1, 32, 32), &g),
                     -1);
}

/* Every node of the example GPT's training stages whose op the CUDA
 * backend claims carries only attributes the backend reads (op_attrs.h):
 * one it ignored would be computed wrong on the device (MatMulGradA/B's
 * weight_t was), one it does not know keeps the node on the CPU. */
static void test_gpt_attributes_known(void **state) {
    (void)state;
    static const char *const claimed[] = {
        "Add", "Sub", "Mul", "Div", "Relu", "Tanh", "Gelu", "Neg", "Exp", "Sqrt", "Sigmoid", "ReluGrad", "TanhGrad",
        "GeluGrad", "Softmax", "SoftmaxGrad", "LayerNormalization", "LayerNormGradInput", "LayerNormGradWeight",
        "MatMul", "Gemm", "MatMulAdd", "MatMulGradA", "MatMulGradB", "SumToShape", "Gather", "GatherGrad",
        "SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad", "Transpose", "Reshape", "Flatten", "Squeeze",
        "Unsqueeze", "Identity", "Concat", "Split", "CausalAttention", "CausalAttentionGrad"};
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    pp_runner *r;
    TU_OK(pp_runner_new(p, 1, &r));
    int weight_t = 0, unknown = 0;
    for (int s = 0; s < pp_runner_n_stages(r); s++) {
        const pp_graph *sg = pp_stage_graph(pp_runner_stage(r, s));
        for (int i = 0; i < sg->n_nodes; i++) {
            const pp_node *n = &sg->nodes[i];
            int is_claimed = 0;
            for (size_t c = 0; c < sizeof claimed / sizeof *claimed; c++) is_claimed |= !strcmp(claimed[c], n->op_type);
            for (int a = 0; is_claimed && a < n->n_attr; a++) {
                weight_t += !strcmp(n->attrs[a].name, "weight_t");
                if (!pp_cuda_attr_known(n->op_type, n->attrs[a].name)) {
                    printf("stage %d node %s (%s): attribute %s unknown to the CUDA backend\n", s, n->name,
                           n->op_type, n->attrs[a].name);
                    unknown++;
                }
            }
        }
    }
    assert_int_equal(unknown, 0);
    assert_true(weight_t > 0); /* the linear layers' and the tied head's gradients read W itself */
    assert_true(pp_cuda_attr_known("MatMulGradA", "weight_t"));
    assert_false(pp_cuda_attr_known("MatMulAdd", "packed_n"));
    assert_false(pp_cuda_attr_known("Add", "axis"));
    pp_runner_free(r);
    pp_pipe_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binary_broadcast),
        cmocka_unit_test(test_unary_and_grads),
        cmocka_unit_test(test_softmax_and_grad),
        cmocka_unit_test(test_layernorm_and_grads),
        cmocka_unit_test(test_reduce_sum),
        cmocka_unit_test(test_gather_and_grad),
        cmocka_unit_test(test_cross_entropy_and_grad),
        cmocka_unit_test(test_transpose_slice_concat),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_grad),
        cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_matmul_grad_plans),
        cmocka_unit_test(test_gpt_attributes_known),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
