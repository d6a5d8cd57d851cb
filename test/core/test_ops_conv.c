/* Conv and its gradient helpers (lib/ops/conv.c): forward, pippin::
 * ConvGradInput and pippin::ConvGradWeight against a naive reference computed
 * here from the definition (strides, pads, dilations, groups/depthwise, bias,
 * 1-D, auto_pad), ONNX's own Conv test data (its models are opset 11, which
 * the loader refuses, so the node is built here with the cases' attributes),
 * errors (3-D refused, shapes that do not agree), and the direct depthwise
 * cores (conv_depthwise.c) against the im2col + GEMM path on random shapes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pippin/onnx.h"
#include "test_util.h"

#include "conv_internal.h"

#include "test_filter.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static pp_tensor *rand_f32(int nd, const int64_t *shape) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    int64_t n = pp_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = (float)tu_urand(&rng_state);
    return t;
}

typedef struct cc {
    int nsp;                  /* 1 or 2 */
    int64_t N, C, M, G;
    int64_t in[2], k[2];
    int64_t s[2], d[2];       /* 0: attribute omitted (1) */
    int64_t pads[4];          /* head..., tail... */
    int has_pads;
    const char *auto_pad;     /* NULL: omitted */
    int bias;
    int kernel_shape;         /* set the kernel_shape attribute */
} cc;

/* Head pads and output size of dim i, from the ONNX definition. */
static void geometry(const cc *c, int i, int64_t *head, int64_t *out) {
    int64_t s = c->s[i] ? c->s[i] : 1, d = c->d[i] ? c->d[i] : 1;
    int64_t ek = (c->k[i] - 1) * d + 1, h = 0, t = 0;
    if (c->auto_pad && strncmp(c->auto_pad, "SAME", 4) == 0) {
        int64_t o = (c->in[i] + s - 1) / s, tot = (o - 1) * s + ek - c->in[i];
        if (tot < 0) tot = 0;
        h = strcmp(c->auto_pad, "SAME_UPPER") == 0 ? tot / 2 : tot - tot / 2;
        t = tot - h;
    } else if (c->has_pads && !(c->auto_pad && strcmp(c->auto_pad, "VALID") == 0)) {
        h = c->pads[i];
        t = c->pads[i + c->nsp];
    }
    *head = h;
    *out = (c->in[i] + h + t - ek) / s + 1;
}

/* Naive conv in double, and (dy given) its gradients. */
typedef struct naive {
    pp_tensor *y, *dx, *dw, *db;
} naive;

static naive run_naive(const cc *c, const pp_tensor *x, const pp_tensor *w, const pp_tensor *b,
                       const pp_tensor *dy) {
    int64_t ph[2] = {0, 0}, o[2] = {1, 1}, in[2] = {1, 1}, k[2] = {1, 1}, s[2] = {1, 1},
            d[2] = {1, 1};
    int off = c->nsp == 1 ? 1 : 0; /* 1-D: height 1 */
    for (int i = 0; i < c->nsp; i++) {
        geometry(c, i, &ph[i + off], &o[i + off]);
        in[i + off] = c->in[i];
        k[i + off] = c->k[i];
        s[i + off] = c->s[i] ? c->s[i] : 1;
        d[i + off] = c->d[i] ? c->d[i] : 1;
    }
    int64_t Cg = c->C / c->G, Mg = c->M / c->G;
    int64_t ys[4] = {c->N, c->M, o[off], o[1]};
    naive r = {0};
    TU_OK(pp_tensor_new(PP_F32, 2 + c->nsp, ys, &r.y));
    if (dy) {
        TU_OK(pp_tensor_new(PP_F32, x->ndim, x->shape, &r.dx));
        TU_OK(pp_tensor_new(PP_F32, w->ndim, w->shape, &r.dw));
        TU_OK(pp_tensor_new(PP_F32, 1, &c->M, &r.db));
    }
    const float *xd = x->data, *wd = w->data;
    float *yd = r.y->data;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t m = 0; m < c->M; m++) {
            int64_t g = m / Mg;
            for (int64_t oy = 0; oy < o[0]; oy++)
                for (int64_t ox = 0; ox < o[1]; ox++) {
                    int64_t yi = ((n * c->M + m) * o[0] + oy) * o[1] + ox;
                    double acc = b ? ((const float *)b->data)[m] : 0;
                    double gy = dy ? ((const float *)dy->data)[yi] : 0;
                    if (dy) ((float *)r.db->data)[m] += (float)gy;
                    for (int64_t cg = 0; cg < Cg; cg++)
                        for (int64_t i = 0; i < k[0]; i++)
                            for (int64_t j = 0; j < k[1]; j++) {
                                int64_t iy = oy * s[0] - ph[0] + i * d[0];
                                int64_t ix = ox * s[1] - ph[1] + j * d[1];
                                if (iy < 0 || iy >= in[0] || ix < 0 || ix >= in[1]) continue;
                                int64_t xi = ((n * c->C + g * Cg + cg) * in[0] + iy) * in[1] + ix;
                                int64_t wi = ((m * Cg + cg) * k[0] + i) * k[1] + j;
                                acc += (double)xd[xi] * wd[wi];
                                if (dy) {
                                    ((float *)r.dx->data)[xi] += (float)(gy * wd[wi]);
                                    ((float *)r.dw->data)[wi] += (float)(gy * xd[xi]);
                                }
                            }
                    yd[yi] = (float)acc;
                }
        }
    return r;
}

static void set_attrs(pp_graph *g, int node, const cc *c) {
    if (c->s[0]) TU_OK(pp_node_set_ints(g, node, "strides", c->nsp, c->s));
    if (c->d[0]) TU_OK(pp_node_set_ints(g, node, "dilations", c->nsp, c->d));
    if (c->has_pads) TU_OK(pp_node_set_ints(g, node, "pads", 2 * c->nsp, c->pads));
    if (c->auto_pad) TU_OK(pp_node_set_string(g, node, "auto_pad", c->auto_pad));
    if (c->G != 1) TU_OK(pp_node_set_int(g, node, "group", c->G));
    if (c->kernel_shape) TU_OK(pp_node_set_ints(g, node, "kernel_shape", c->nsp, c->k));
}

/* Forward and both helpers against the naive reference. */
static void check_case(cc c) {
    int nd = 2 + c.nsp;
    int64_t xs[4] = {c.N, c.C, c.in[0], c.in[1]}, ws[4] = {c.M, c.C / c.G, c.k[0], c.k[1]};
    pp_tensor *x = rand_f32(nd, xs), *w = rand_f32(nd, ws), *b = c.bias ? rand_f32(1, &c.M) : NULL;
    naive ref = run_naive(&c, x, w, b, NULL);
    pp_tensor *dy = rand_f32(ref.y->ndim, ref.y->shape);
    naive gr = run_naive(&c, x, w, b, dy);
    char what[64];
    snprintf(what, sizeof what, "Conv %dD G=%lld", c.nsp, (long long)c.G);

    /* forward */
    tu_node t;
    pp_tensor *ins[3] = {pp_tensor_retain(x), pp_tensor_retain(w), b ? pp_tensor_retain(b) : NULL};
    tu_node_init(&t, "Conv", b ? 3 : 2, ins, 1, NULL);
    set_attrs(t.g, t.node, &c);
    pp_tensor *y = tu_node_run_one(&t);
    tu_assert_close(y, ref.y, 1e-4, 1e-4, what);
    pp_tensor_free(y);
    tu_node_free(&t);

    /* ConvGradInput(dy, W, shape_x) */
    pp_tensor *gi[3] = {pp_tensor_retain(dy), pp_tensor_retain(w), tu_i64_vec(nd, xs)};
    tu_node_init_dom(&t, "ConvGradInput", "pippin", 3, gi, 1, NULL);
    set_attrs(t.g, t.node, &c);
    pp_tensor *dx = tu_node_run_one(&t);
    tu_assert_close(dx, gr.dx, 1e-4, 1e-4, "ConvGradInput");
    pp_tensor_free(dx);
    tu_node_free(&t);

    /* ConvGradWeight(dy, X, shape_w) -> dW, dB */
    pp_tensor *gw[3] = {pp_tensor_retain(dy), pp_tensor_retain(x), tu_i64_vec(nd, ws)};
    tu_node_init_dom(&t, "ConvGradWeight", "pippin", 3, gw, 2, NULL);
    set_attrs(t.g, t.node, &c);
    pp_tensor *outs[2];
    TU_OK(tu_node_run(&t, outs));
    tu_assert_close(outs[0], gr.dw, 1e-4, 1e-4, "ConvGradWeight dW");
    tu_assert_close(outs[1], gr.db, 1e-4, 1e-4, "ConvGradWeight dB");
    pp_tensor_free(outs[0]);
    pp_tensor_free(outs[1]);
    tu_node_free(&t);

    pp_tensor_free(ref.y);
    pp_tensor_free(gr.y);
    pp_tensor_free(gr.dx);
    pp_tensor_free(gr.dw);
    pp_tensor_free(gr.db);
    pp_tensor_free(x);
    pp_tensor_free(w);
    pp_tensor_free(b);
    pp_tensor_free(dy);
}

static void test_conv_basic(void **state) {
    (void)state;
    /* hand-computed: 1x1x3x3 ones-ramp, 2x2 kernel of ones */
    tu_node t;
    pp_tensor *ins[2] = {tu_f32(4, (int64_t[]){1, 1, 3, 3}, (float[]){0, 1, 2, 3, 4, 5, 6, 7, 8}),
                         tu_f32(4, (int64_t[]){1, 1, 2, 2}, (float[]){1, 1, 1, 1})};
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    tu_expect(tu_node_run_one(&t), tu_f32(4, (int64_t[]){1, 1, 2, 2}, (float[]){8, 12, 20, 24}),
              0, 0, "2x2 sums");
    tu_node_free(&t);
    check_case((cc){2, 2, 3, 4, 1, {6, 5}, {3, 3}});
    check_case((cc){2, 1, 3, 4, 1, {6, 5}, {3, 3}, .bias = 1, .kernel_shape = 1});
    check_case((cc){2, 2, 3, 5, 1, {5, 7}, {1, 1}, .bias = 1}); /* 1x1: no im2col */
}

static void test_conv_strides_pads(void **state) {
    (void)state;
    check_case((cc){2, 2, 3, 4, 1, {7, 8}, {3, 3}, {2, 2}, .pads = {1, 1, 1, 1}, .has_pads = 1});
    check_case((cc){2, 1, 2, 3, 1, {7, 6}, {3, 2}, {2, 3}, .pads = {1, 0, 2, 1}, .has_pads = 1,
                    .bias = 1});
    check_case((cc){2, 2, 3, 2, 1, {5, 5}, {1, 1}, {2, 2}, .bias = 1}); /* 1x1 strided */
    check_case((cc){2, 1, 2, 2, 1, {4, 4}, {3, 3}, .pads = {2, 2, 2, 2}, .has_pads = 1});
}

static void test_conv_dilations(void **state) {
    (void)state;
    check_case((cc){2, 2, 3, 4, 1, {8, 9}, {3, 3}, .d = {2, 2}});
    check_case((cc){2, 1, 2, 3, 1, {9, 7}, {2, 3}, {2, 1}, {3, 2}, {1, 2, 0, 1}, 1, .bias = 1});
}

static void test_conv_groups(void **state) {
    (void)state;
    check_case((cc){2, 2, 4, 6, 2, {6, 5}, {3, 3}, .pads = {1, 1, 1, 1}, .has_pads = 1, .bias = 1});
    check_case((cc){2, 2, 4, 4, 4, {6, 6}, {3, 3}, {2, 2}, .pads = {1, 1, 1, 1}, .has_pads = 1});
    /* depthwise with a channel multiplier */
    check_case((cc){2, 1, 3, 6, 3, {5, 6}, {3, 3}, .pads = {1, 1, 1, 1}, .has_pads = 1, .bias = 1});
}

static void test_conv_1d(void **state) {
    (void)state;
    check_case((cc){1, 2, 3, 4, 1, {10}, {3}, .bias = 1});
    check_case((cc){1, 2, 4, 4, 2, {11}, {3}, {2}, {2}, {1, 2}, 1, .kernel_shape = 1});
    check_case((cc){1, 1, 3, 3, 3, {8}, {5}, .auto_pad = "SAME_UPPER"});
}

static void test_conv_auto_pad(void **state) {
    (void)state;
    const char *modes[] = {"SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"};
    for (int i = 0; i < 4; i++) {
        check_case((cc){2, 2, 2, 3, 1, {5, 6}, {2, 3}, .auto_pad = modes[i]});
        check_case((cc){2, 1, 2, 3, 1, {7, 6}, {3, 2}, {2, 2}, .auto_pad = modes[i], .bias = 1});
        check_case((cc){2, 1, 2, 2, 1, {7, 6}, {3, 2}, {2, 3}, {2, 1}, .auto_pad = modes[i]});
    }
    /* hand-checked: SAME_UPPER pads the tail, SAME_LOWER the head */
    tu_node t;
    pp_tensor *ins[2] = {tu_f32(3, (int64_t[]){1, 1, 4}, (float[]){1, 2, 3, 4}),
                         tu_f32(3, (int64_t[]){1, 1, 2}, (float[]){1, 10})};
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "auto_pad", "SAME_UPPER"));
    tu_expect(tu_node_run_one(&t), tu_f32(3, (int64_t[]){1, 1, 4}, (float[]){21, 32, 43, 4}), 0, 0,
              "SAME_UPPER");
    tu_node_free(&t);
    ins[0] = tu_f32(3, (int64_t[]){1, 1, 4}, (float[]){1, 2, 3, 4});
    ins[1] = tu_f32(3, (int64_t[]){1, 1, 2}, (float[]){1, 10});
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "auto_pad", "SAME_LOWER"));
    tu_expect(tu_node_run_one(&t), tu_f32(3, (int64_t[]){1, 1, 4}, (float[]){10, 21, 32, 43}), 0, 0,
              "SAME_LOWER");
    tu_node_free(&t);
}

/* ONNX's backend cases for Conv (onnx/backend/test/case/node/conv.py). */
static void test_conv_onnx_data(void **state) {
    (void)state;
    static const struct {
        const char *name;
        int64_t k[2], s[2], pads[4];
        const char *auto_pad;
    } cases[] = {
        {"test_basic_conv_with_padding", {3, 3}, {1, 1}, {1, 1, 1, 1}, NULL},
        {"test_basic_conv_without_padding", {3, 3}, {1, 1}, {0, 0, 0, 0}, NULL},
        {"test_conv_with_strides_padding", {3, 3}, {2, 2}, {1, 1, 1, 1}, NULL},
        {"test_conv_with_strides_no_padding", {3, 3}, {2, 2}, {0, 0, 0, 0}, NULL},
        {"test_conv_with_strides_and_asymmetric_padding", {3, 3}, {2, 2}, {1, 0, 1, 0}, NULL},
        {"test_conv_with_autopad_same", {3, 3}, {2, 2}, {0}, "SAME_LOWER"},
    };
    const char *root = "/usr/share/libonnx-testdata/data/node";
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[512], path[600];
        snprintf(dir, sizeof dir, "%s/%s/test_data_set_0", root, cases[i].name);
        if (access(dir, R_OK) != 0) continue;
        pp_tensor *ins[2], *want;
        snprintf(path, sizeof path, "%s/input_0.pb", dir);
        TU_OK(pp_onnx_tensor_load(path, &ins[0], NULL));
        snprintf(path, sizeof path, "%s/input_1.pb", dir);
        TU_OK(pp_onnx_tensor_load(path, &ins[1], NULL));
        snprintf(path, sizeof path, "%s/output_0.pb", dir);
        TU_OK(pp_onnx_tensor_load(path, &want, NULL));
        tu_node t;
        tu_node_init(&t, "Conv", 2, ins, 1, NULL);
        TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 2, cases[i].k));
        TU_OK(pp_node_set_ints(t.g, t.node, "strides", 2, cases[i].s));
        if (cases[i].auto_pad) TU_OK(pp_node_set_string(t.g, t.node, "auto_pad", cases[i].auto_pad));
        else TU_OK(pp_node_set_ints(t.g, t.node, "pads", 4, cases[i].pads));
        tu_expect(tu_node_run_one(&t), want, 1e-5, 1e-5, cases[i].name);
        tu_node_free(&t);
        ran++;
    }
    if (!ran) printf("# ONNX test data not found under %s; cases not run\n", root);
}

static void test_conv_errors(void **state) {
    (void)state;
    tu_node t;
    /* 3-D is refused */
    pp_tensor *ins[2] = {rand_f32(5, (int64_t[]){1, 1, 3, 3, 3}),
                         rand_f32(5, (int64_t[]){1, 1, 2, 2, 2})};
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "3-D");
    tu_node_free(&t);
    ins[0] = rand_f32(4, (int64_t[]){1, 2, 3, 3});
    ins[1] = rand_f32(4, (int64_t[]){1, 1, 2, 2});
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 3, (int64_t[]){2, 2, 2}));
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "3-D");
    tu_node_free(&t);
    /* channels do not match W */
    ins[0] = rand_f32(4, (int64_t[]){1, 3, 3, 3});
    ins[1] = rand_f32(4, (int64_t[]){2, 2, 2, 2});
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "group");
    tu_node_free(&t);
    /* kernel larger than the input */
    ins[0] = rand_f32(4, (int64_t[]){1, 1, 2, 2});
    ins[1] = rand_f32(4, (int64_t[]){1, 1, 3, 3});
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "larger");
    tu_node_free(&t);
    /* bad auto_pad */
    ins[0] = rand_f32(4, (int64_t[]){1, 1, 3, 3});
    ins[1] = rand_f32(4, (int64_t[]){1, 1, 2, 2});
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "auto_pad", "SAME"));
    tu_node_expect_error(&t, PP_ERR_INVALID, "auto_pad");
    tu_node_free(&t);
    /* regressions (review): attributes whose products overflowed */
    const char *attrs[3] = {"dilations", "strides", "pads"};
    for (int a = 0; a < 3; a++) {
        ins[0] = rand_f32(3, (int64_t[]){1, 1, 4});
        ins[1] = rand_f32(3, (int64_t[]){1, 1, 3});
        tu_node_init(&t, "Conv", 2, ins, 1, NULL);
        int64_t huge[2] = {INT64_MAX / 2, 0};
        TU_OK(pp_node_set_ints(t.g, t.node, attrs[a], a == 2 ? 2 : 1, huge));
        tu_node_expect_error(&t, PP_ERR_INVALID, attrs[a]);
        tu_node_free(&t);
    }
    ins[0] = rand_f32(3, (int64_t[]){1, 1, 4});
    ins[1] = rand_f32(3, (int64_t[]){1, 1, 3});
    tu_node_init(&t, "Conv", 2, ins, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "group", (int64_t)1 << 62));
    tu_node_expect_error(&t, PP_ERR_INVALID, "group");
    tu_node_free(&t);
}

/* ------------------------------------------- depthwise: direct vs im2col */

typedef struct dwc {
    int nsp;
    int64_t N, C, Mg, in[2], k[2], s[2], d[2], head[2], tail[2]; /* pads may be < 0 */
} dwc;

static float *rand_buf(int64_t n) {
    float *b = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    assert_non_null(b);
    for (int64_t i = 0; i < n; i++) b[i] = (float)tu_urand(&rng_state);
    return b;
}

static void close_bufs(const float *got, const float *want, int64_t n, const char *what,
                       const dwc *c) {
    for (int64_t i = 0; i < n; i++) {
        double tol = 1e-5 + 1e-5 * fabs((double)want[i]);
        if (!(fabs((double)got[i] - want[i]) <= tol)) {
            fail_msg("%s: %dD N=%lld C=%lld Mg=%lld in=%lldx%lld k=%lldx%lld s=%lldx%lld "
                     "d=%lldx%lld pads=%lld,%lld,%lld,%lld: element %lld %.8g vs %.8g",
                     what, c->nsp, (long long)c->N, (long long)c->C, (long long)c->Mg,
                     (long long)c->in[0], (long long)c->in[1], (long long)c->k[0],
                     (long long)c->k[1], (long long)c->s[0], (long long)c->s[1],
                     (long long)c->d[0], (long long)c->d[1], (long long)c->head[0],
                     (long long)c->head[1], (long long)c->tail[0], (long long)c->tail[1],
                     (long long)i, (double)got[i], (double)want[i]);
        }
    }
}

/* Runs the three cores on both paths; returns 0 when the geometry has no
 * output (nothing checked). */
static int dw_check(dwc c) {
    pp_node node = {0};
    node.name = "dw";
    node.op_type = "Conv";
    node.domain = "";
    pp_kernel_ctx ctx = {0};
    ctx.node = &node;
    pp_conv_plan p = {0};
    p.nsp = c.nsp;
    p.N = c.N, p.C = c.C, p.G = c.C, p.Cg = 1, p.Mg = c.Mg, p.M = c.C * c.Mg;
    int64_t o[2];
    for (int i = 0; i < 2; i++) {
        int64_t ek = (c.k[i] - 1) * c.d[i] + 1, span = c.in[i] + c.head[i] + c.tail[i] - ek;
        if (span < 0) return 0;
        o[i] = span / c.s[i] + 1;
    }
    p.ih = c.in[0], p.kh = c.k[0], p.oh = o[0], p.sh = c.s[0], p.dh = c.d[0], p.ph = c.head[0];
    p.iw = c.in[1], p.kw = c.k[1], p.ow = o[1], p.sw = c.s[1], p.dw = c.d[1], p.pw = c.head[1];
    TU_OK(pp_conv_plan_finish(&ctx, &p));
    assert_true(pp_conv_dw_usable(&p));
    int64_t nx = p.N * p.C * p.IL, nw = p.M * p.K, ny = p.N * p.M * p.L;
    float *x = rand_buf(nx), *w = rand_buf(nw), *dy = rand_buf(ny);
    float *a = rand_buf(nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw));
    float *b = rand_buf(nx > ny ? (nx > nw ? nx : nw) : (ny > nw ? ny : nw));
    pp_conv_plan q = p;
    q.im2col = 1;
    TU_OK(pp_conv_forward(&ctx, &p, x, w, a));
    TU_OK(pp_conv_forward(&ctx, &q, x, w, b));
    close_bufs(a, b, ny, "depthwise forward", &c);
    TU_OK(pp_conv_backward_data(&ctx, &p, dy, w, a));
    TU_OK(pp_conv_backward_data(&ctx, &q, dy, w, b));
    close_bufs(a, b, nx, "depthwise backward data", &c);
    TU_OK(pp_conv_backward_filter(&ctx, &p, dy, x, a));
    TU_OK(pp_conv_backward_filter(&ctx, &q, dy, x, b));
    close_bufs(a, b, nw, "depthwise backward filter", &c);
    free(x), free(w), free(dy), free(a), free(b);
    return 1;
}

static int64_t rnd(int64_t lo, int64_t hi) {
    return lo + (int64_t)(tu_urand(&rng_state) * 0.5 * (double)(hi - lo + 1) + 0.5 * (hi - lo + 1)) %
                    (hi - lo + 1);
}

static void test_conv_depthwise_direct(void **state) {
    (void)state;
    /* named cases: MobileNet's 3x3 (stride 1 and 2, pad 1) down to 1x1 and
     * 2x2 images, dilation 2, channel multiplier 2, 1-D, 5x5, 1x1 */
    const dwc fixed[] = {
        {2, 2, 3, 1, {8, 8}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}},
        {2, 2, 3, 1, {8, 8}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}},
        {2, 2, 3, 1, {7, 9}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}},
        {2, 2, 4, 1, {2, 2}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}},
        {2, 2, 4, 1, {2, 2}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}},
        {2, 2, 4, 1, {1, 1}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {1, 1}},
        {2, 1, 3, 1, {9, 9}, {3, 3}, {1, 1}, {2, 2}, {2, 2}, {2, 2}},
        {2, 2, 3, 2, {6, 7}, {3, 3}, {2, 2}, {2, 2}, {1, 1}, {1, 1}},
        {2, 2, 5, 2, {9, 8}, {5, 5}, {2, 1}, {1, 2}, {2, 2}, {1, 0}},
        {2, 3, 2, 1, {5, 5}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, {0, 0}},
        {2, 1, 2, 3, {6, 6}, {1, 1}, {2, 2}, {1, 1}, {0, 0}, {0, 0}},
        {1, 2, 3, 2, {1, 17}, {1, 3}, {1, 2}, {1, 2}, {0, 1}, {0, 1}},
        {2, 1, 2, 1, {12, 13}, {3, 3}, {3, 3}, {1, 1}, {1, 1}, {1, 1}},
        {2, 1, 2, 1, {9, 9}, {3, 3}, {1, 2}, {1, 1}, {-1, -2}, {-1, 1}}, /* ConvTranspose's */
        {2, 2, 2, 2, {8, 6}, {2, 3}, {2, 1}, {1, 1}, {-1, 0}, {2, 3}},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) assert_true(dw_check(fixed[i]));
    /* random shapes */
    int ran = 0;
    for (int it = 0; it < 400; it++) {
        dwc c = {0};
        c.nsp = rnd(1, 4) == 1 ? 1 : 2;
        c.N = rnd(1, 2), c.C = rnd(1, 4), c.Mg = rnd(1, 3);
        for (int i = 0; i < 2; i++) {
            int one = c.nsp == 1 && i == 0;
            c.in[i] = one ? 1 : rnd(1, 11);
            c.k[i] = one ? 1 : rnd(1, 5);
            c.s[i] = one ? 1 : rnd(1, 3);
            c.d[i] = one ? 1 : rnd(1, 3);
            c.head[i] = one ? 0 : rnd(-1, 3);
            c.tail[i] = one ? 0 : rnd(-1, 3);
        }
        ran += dw_check(c);
    }
    assert_true(ran > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_basic),
        cmocka_unit_test(test_conv_strides_pads),
        cmocka_unit_test(test_conv_dilations),
        cmocka_unit_test(test_conv_groups),
        cmocka_unit_test(test_conv_1d),
        cmocka_unit_test(test_conv_auto_pad),
        cmocka_unit_test(test_conv_onnx_data),
        cmocka_unit_test(test_conv_errors),
        cmocka_unit_test(test_conv_depthwise_direct),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
