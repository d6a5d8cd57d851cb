/* The upsampling side of a UNet: ConvTranspose (lib/ops/conv_transpose.c)
 * against a naive scatter reference, Resize/Upsample (lib/ops/resize.c)
 * against values PyTorch 1.13 gives, GroupNormalization
 * (lib/ops/group_norm.c) against a naive reference, Pad's wrap mode, the
 * gradient helpers (ResizeGrad and PadGrad as exact adjoints: <A x, r> =
 * <x, A^T r>), PyTorch 1.13's GroupNorm export (InstanceNormalization +
 * Reshape + Mul + Add) training like GroupNormalization, and the errors
 * (cubic, antialias, attributes out of bounds) naming the node. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static pp_tensor *rand_f32(int nd, const int64_t *shape) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) ((float *)t->data)[i] = (float)tu_urand(&rng_state);
    return t;
}
#define RND(...) rand_f32(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})
#define I64V(...) tu_i64_vec(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})
#define F32V(...) tu_f32(1, (int64_t[]){sizeof((float[]){__VA_ARGS__}) / sizeof(float)}, (float[]){__VA_ARGS__})

/* Gives contiguous t another shape of the same element count. */
static void reshape(pp_tensor *t, int nd, const int64_t *shape) {
    assert_int_equal(pp_shape_numel(nd, shape), pp_tensor_numel(t));
    t->ndim = nd;
    for (int i = 0; i < nd; i++) t->shape[i] = shape[i];
}

static double dot(const pp_tensor *a, const pp_tensor *b) {
    assert_int_equal(pp_tensor_numel(a), pp_tensor_numel(b));
    double s = 0;
    for (int64_t i = 0; i < pp_tensor_numel(a); i++)
        s += (double)((const float *)a->data)[i] * ((const float *)b->data)[i];
    return s;
}

/* ------------------------------------------------------- ConvTranspose */

typedef struct ctc {
    int nsp;
    int64_t N, C, M, G, in[2], k[2], s[2], d[2], head[2], out[2];
    const char *attrs; /* extra attributes, set by the caller */
} ctc;

/* Naive transposed conv: y[n, m, o] += x[n, c, i] * w[c, m', k] at
 * o = i*s - head + k*d. */
static pp_tensor *naive_ct(const ctc *c, const pp_tensor *x, const pp_tensor *w, const pp_tensor *b) {
    int64_t in[2] = {1, 1}, k[2] = {1, 1}, s[2] = {1, 1}, d[2] = {1, 1}, h[2] = {0, 0}, o[2] = {1, 1};
    int off = c->nsp == 1;
    for (int i = 0; i < c->nsp; i++) {
        in[i + off] = c->in[i], k[i + off] = c->k[i], s[i + off] = c->s[i] ? c->s[i] : 1;
        d[i + off] = c->d[i] ? c->d[i] : 1, h[i + off] = c->head[i], o[i + off] = c->out[i];
    }
    int64_t ys[4] = {c->N, c->M, o[off], o[1]};
    pp_tensor *y;
    TU_OK(pp_tensor_new(PP_F32, 2 + c->nsp, ys, &y));
    int64_t Cg = c->C / c->G, Mg = c->M / c->G;
    const float *xd = x->data, *wd = w->data;
    float *yd = y->data;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t ci = 0; ci < c->C; ci++)
            for (int64_t mg = 0; mg < Mg; mg++) {
                int64_t g = ci / Cg, m = g * Mg + mg;
                for (int64_t iy = 0; iy < in[0]; iy++)
                    for (int64_t ix = 0; ix < in[1]; ix++)
                        for (int64_t ky = 0; ky < k[0]; ky++)
                            for (int64_t kx = 0; kx < k[1]; kx++) {
                                int64_t oy = iy * s[0] - h[0] + ky * d[0];
                                int64_t ox = ix * s[1] - h[1] + kx * d[1];
                                if (oy < 0 || oy >= o[0] || ox < 0 || ox >= o[1]) continue;
                                yd[((n * c->M + m) * o[0] + oy) * o[1] + ox] +=
                                    xd[((n * c->C + ci) * in[0] + iy) * in[1] + ix] *
                                    wd[((ci * Mg + mg) * k[0] + ky) * k[1] + kx];
                            }
            }
    if (b)
        for (int64_t i = 0; i < pp_tensor_numel(y); i++)
            yd[i] += ((const float *)b->data)[(i / (o[0] * o[1])) % c->M];
    return y;
}

static void set_attrs(pp_graph *g, int node, const char *spec) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        assert_non_null(eq);
        *eq = 0;
        const char *v = eq + 1;
        if (strncmp(v, "s:", 2) == 0) {
            TU_OK(pp_node_set_string(g, node, tok, v + 2));
            continue;
        }
        int64_t ints[8];
        int n = 0;
        for (const char *p = v; *p && n < 8;) {
            char *e;
            ints[n++] = strtoll(p, &e, 10);
            p = *e == ',' ? e + 1 : e;
        }
        if (!strcmp(tok, "group") || !strcmp(tok, "num_groups") || !strcmp(tok, "antialias"))
            TU_OK(pp_node_set_int(g, node, tok, ints[0]));
        else TU_OK(pp_node_set_ints(g, node, tok, n, ints));
    }
}

static void check_ct(const ctc *c, int bias) {
    int64_t xs[4] = {c->N, c->C, c->in[0], c->in[1]}, ws[4] = {c->C, c->M / c->G, c->k[0], c->k[1]};
    pp_tensor *x = rand_f32(2 + c->nsp, xs), *w = rand_f32(2 + c->nsp, ws);
    pp_tensor *b = bias ? rand_f32(1, &c->M) : NULL;
    pp_tensor *want = naive_ct(c, x, w, b);
    tu_node t;
    tu_node_init(&t, "ConvTranspose", bias ? 3 : 2, (pp_tensor *[]){x, w, b}, 1, NULL);
    set_attrs(t.g, t.node, c->attrs);
    tu_expect(tu_node_run_one(&t), want, 1e-5, 1e-5, c->attrs);
    tu_node_free(&t);
}

static void test_conv_transpose(void **state) {
    (void)state;
    /* N C M G in k s d head out attrs */
    check_ct(&(ctc){2, 2, 3, 3, 1, {3, 3}, {3, 3}, {0}, {0}, {0}, {5, 5}, NULL}, 1);
    check_ct(&(ctc){2, 1, 2, 3, 1, {3, 4}, {3, 3}, {2, 2}, {0}, {1, 1}, {7, 9},
                    "strides=2,2 pads=1,1,0,0 output_padding=1,1"}, 1);
    check_ct(&(ctc){2, 1, 4, 2, 2, {3, 3}, {3, 2}, {1, 1}, {2, 1}, {0}, {7, 4}, "group=2 dilations=2,1"}, 0);
    check_ct(&(ctc){2, 2, 3, 3, 3, {4, 4}, {2, 2}, {2, 2}, {0}, {0}, {8, 8}, "group=3 strides=2,2"}, 1);
    check_ct(&(ctc){1, 2, 2, 3, 1, {5}, {3}, {2}, {0}, {1}, {9}, "strides=2 pads=1,1"}, 1);
    /* output_shape bigger than the kernel covers: head 0, zeros at the end */
    check_ct(&(ctc){2, 1, 1, 2, 1, {3, 3}, {3, 3}, {3, 2}, {0}, {0, 0}, {10, 8},
                    "strides=3,2 output_shape=10,8"}, 0);
    /* SAME_UPPER: out = in * stride, the odd pad at the end */
    check_ct(&(ctc){2, 1, 1, 2, 1, {3, 3}, {3, 3}, {2, 2}, {0}, {0, 0}, {6, 6},
                    "strides=2,2 auto_pad=s:SAME_UPPER"}, 0);
    check_ct(&(ctc){2, 1, 1, 2, 1, {3, 3}, {3, 3}, {2, 2}, {0}, {1, 1}, {6, 6},
                    "strides=2,2 auto_pad=s:SAME_LOWER"}, 0);
}

static void test_conv_transpose_errors(void **state) {
    (void)state;
    tu_node t;
    /* W's first dim must be X's channels */
    tu_node_init(&t, "ConvTranspose", 2, (pp_tensor *[]){RND(1, 2, 3, 3), RND(3, 1, 2, 2)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "do not agree");
    tu_node_free(&t);
    tu_node_init(&t, "ConvTranspose", 2, (pp_tensor *[]){RND(1, 1, 2, 2, 2), RND(1, 1, 2, 2, 2)}, 1,
                 NULL);
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "3-D");
    tu_node_free(&t);
    /* attributes from a file are bounded before any allocation */
    tu_node_init(&t, "ConvTranspose", 2, (pp_tensor *[]){RND(1, 1, 2, 2), RND(1, 1, 2, 2)}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "strides", 2, (int64_t[]){INT64_C(1) << 40, 1}));
    tu_node_expect_error(&t, PP_ERR_INVALID, "strides");
    tu_node_free(&t);
    tu_node_init(&t, "ConvTranspose", 2, (pp_tensor *[]){RND(1, 1, 2, 2), RND(1, 1, 2, 2)}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "output_shape", 2, (int64_t[]){2000000000, 2000000000}));
    tu_node_expect_error(&t, PP_ERR_NOMEM, "too large");
    tu_node_free(&t);
    tu_node_init(&t, "ConvTranspose", 2, (pp_tensor *[]){RND(1, 1, 2, 2), RND(1, 1, 2, 2)}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "pads", 4, (int64_t[]){3, 3, 3, 3}));
    tu_node_expect_error(&t, PP_ERR_SHAPE, "pads exceed");
    tu_node_free(&t);
}

/* --------------------------------------------------------------- Resize */

static pp_tensor *resize(pp_tensor *x, pp_tensor *scales, pp_tensor *sizes, const char *attrs) {
    tu_node t;
    tu_node_init(&t, "Resize", sizes ? 4 : 3, (pp_tensor *[]){x, NULL, scales, sizes}, 1, NULL);
    set_attrs(t.g, t.node, attrs);
    pp_tensor *y = tu_node_run_one(&t);
    tu_node_free(&t);
    return y;
}

static void test_resize_values(void **state) {
    (void)state;
    /* F.interpolate(x, scale_factor=2, mode='nearest') */
    tu_expect(resize(F32(4, SHAPE(1, 1, 2, 2), 1, 2, 3, 4), F32V(1, 1, 2, 2), NULL,
                     "mode=s:nearest coordinate_transformation_mode=s:asymmetric nearest_mode=s:floor"),
              F32(4, SHAPE(1, 1, 4, 4), 1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4), 0, 0, "nearest");
    /* F.interpolate(x, scale_factor=2, mode='bilinear', align_corners=False) */
    tu_expect(resize(F32(4, SHAPE(1, 1, 2, 2), 1, 2, 3, 4), F32V(1, 1, 2, 2), NULL,
                     "mode=s:linear coordinate_transformation_mode=s:pytorch_half_pixel"),
              F32(4, SHAPE(1, 1, 4, 4), 1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f,
                  3.25f, 3.5f, 3, 3.25f, 3.75f, 4),
              1e-6, 1e-6, "bilinear");
    /* align_corners=True, sizes (3, 3) */
    tu_expect(resize(F32(4, SHAPE(1, 1, 2, 2), 1, 2, 3, 4), NULL, I64V(1, 1, 3, 3),
                     "mode=s:linear coordinate_transformation_mode=s:align_corners"),
              F32(4, SHAPE(1, 1, 3, 3), 1, 1.5f, 2, 2, 2.5f, 3, 3, 3.5f, 4), 1e-6, 1e-6, "align");
    /* 1-D linear over the last axis only (opset 18 axes) */
    tu_expect(resize(F32(3, SHAPE(1, 2, 2), 0, 4, 8, 0), NULL, I64V(4),
                     "mode=s:linear axes=-1 coordinate_transformation_mode=s:asymmetric"),
              F32(3, SHAPE(1, 2, 4), 0, 2, 4, 4, 8, 4, 0, 0), 1e-6, 1e-6, "axes");
    /* round_prefer_ceil and ceil pick the upper neighbour at .5 */
    tu_expect(resize(F32(1, SHAPE(3), 1, 2, 3), NULL, I64V(6),
                     "mode=s:nearest coordinate_transformation_mode=s:asymmetric "
                     "nearest_mode=s:round_prefer_ceil"),
              F32(1, SHAPE(6), 1, 2, 2, 3, 3, 3), 0, 0, "prefer ceil");
    /* Upsample 7: scales attribute */
    tu_node t;
    tu_node_init(&t, "Upsample", 1, (pp_tensor *[]){F32(2, SHAPE(1, 2), 5, 6)}, 1, NULL);
    TU_OK(pp_node_set_floats(t.g, t.node, "scales", 2, (float[]){2, 2}));
    tu_expect(tu_node_run_one(&t), F32(2, SHAPE(2, 4), 5, 5, 6, 6, 5, 5, 6, 6), 0, 0, "upsample");
    tu_node_free(&t);
}

/* <Resize(x), r> = <x, ResizeGrad(r)> for several modes (an exact adjoint). */
static void adjoint_resize(const char *attrs, int64_t n, const int64_t *xs, pp_tensor *scales,
                           pp_tensor *sizes) {
    pp_tensor *x = rand_f32((int)n, xs), *sc2 = NULL, *sz2 = NULL;
    if (scales) TU_OK(pp_tensor_clone(scales, &sc2));
    if (sizes) TU_OK(pp_tensor_clone(sizes, &sz2));
    pp_tensor *xc;
    TU_OK(pp_tensor_clone(x, &xc));
    pp_tensor *y = resize(xc, scales, sizes, attrs);
    pp_tensor *r = rand_f32(y->ndim, y->shape), *rc;
    TU_OK(pp_tensor_clone(r, &rc));
    tu_node t;
    tu_node_init_dom(&t, "ResizeGrad", "pippin", 5,
                     (pp_tensor *[]){rc, tu_i64_vec((int)n, xs), NULL, sc2, sz2}, 1, NULL);
    set_attrs(t.g, t.node, attrs);
    TU_OK(pp_node_set_int(t.g, t.node, "form", 0));
    pp_tensor *dx = tu_node_run_one(&t);
    tu_assert_shape(dx, (int)n, xs);
    double a = dot(y, r), b = dot(x, dx);
    if (fabs(a - b) > 1e-4 * (1 + fabs(a))) fail_msg("%s: <Ax,r> %.7f, <x,A^T r> %.7f", attrs, a, b);
    tu_node_free(&t);
    pp_tensor_free(dx);
    pp_tensor_free(x);
    pp_tensor_free(y);
    pp_tensor_free(r);
}

static void test_resize_grad(void **state) {
    (void)state;
    int64_t s4[4] = {2, 2, 3, 5}, s3[3] = {2, 3, 4};
    adjoint_resize("mode=s:nearest", 4, s4, F32V(1, 1, 2.5f, 1.5f), NULL);
    adjoint_resize("mode=s:nearest nearest_mode=s:ceil", 4, s4, F32V(1, 1, 0.6f, 0.5f), NULL);
    adjoint_resize("mode=s:linear", 4, s4, F32V(1, 1, 2, 2), NULL);
    adjoint_resize("mode=s:linear coordinate_transformation_mode=s:align_corners", 4, s4, NULL,
                   I64V(2, 2, 7, 3));
    adjoint_resize("mode=s:linear coordinate_transformation_mode=s:pytorch_half_pixel", 3, s3,
                   F32V(1, 2, 3), NULL);
    adjoint_resize("mode=s:nearest coordinate_transformation_mode=s:tf_half_pixel_for_nn", 3, s3,
                   NULL, I64V(3, 5, 2));
}

static void test_resize_errors(void **state) {
    (void)state;
    const char *bad[][2] = {
        {"mode=s:cubic", "cubic"},
        {"mode=s:linear antialias=1", "antialias"},
        {"mode=s:linear coordinate_transformation_mode=s:tf_crop_and_resize", "tf_crop_and_resize"},
    };
    for (int i = 0; i < 3; i++) {
        tu_node t;
        tu_node_init(&t, "Resize", 3, (pp_tensor *[]){RND(1, 1, 2, 2), NULL, F32V(1, 1, 2, 2)}, 1,
                     NULL);
        set_attrs(t.g, t.node, bad[i][0]);
        tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, bad[i][1]);
        tu_node_free(&t);
    }
    tu_node t;
    tu_node_init(&t, "Resize", 3, (pp_tensor *[]){RND(1, 1, 2, 2), NULL, F32V(1, 1, 1e9f, 1e9f)}, 1,
                 NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "scale");
    tu_node_free(&t);
    tu_node_init(&t, "Resize", 4,
                 (pp_tensor *[]){RND(1, 1, 2, 2), NULL, NULL, I64V(1, 1, 2000000000, 2000000000)}, 1,
                 NULL);
    tu_node_expect_error(&t, PP_ERR_NOMEM, "too large");
    tu_node_free(&t);
    tu_node_init(&t, "Resize", 4, (pp_tensor *[]){RND(1, 1, 2, 2), NULL, F32V(1, 1, 2, 2),
                                                 I64V(1, 1, 4, 4)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "exactly one");
    tu_node_free(&t);
}

/* --------------------------------------------------- GroupNormalization */

static pp_tensor *naive_gn(const pp_tensor *x, const pp_tensor *sc, const pp_tensor *b, int64_t G,
                           float eps) {
    pp_tensor *y;
    TU_OK(pp_tensor_new(PP_F32, x->ndim, x->shape, &y));
    int64_t N = x->shape[0], C = x->shape[1], S = pp_tensor_numel(x) / (N * C), cg = C / G;
    int per_c = sc->shape[0] == C;
    const float *xv = x->data, *sv = sc->data, *bv = b->data;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            const float *p = xv + (n * C + g * cg) * S;
            double m = 0, v = 0;
            for (int64_t i = 0; i < cg * S; i++) m += p[i];
            m /= (double)(cg * S);
            for (int64_t i = 0; i < cg * S; i++) v += (p[i] - m) * (p[i] - m);
            v /= (double)(cg * S);
            for (int64_t i = 0; i < cg * S; i++) {
                int64_t k = per_c ? g * cg + i / S : g;
                ((float *)y->data)[(n * C + g * cg) * S + i] =
                    (float)((p[i] - m) / sqrt(v + eps) * sv[k] + bv[k]);
            }
        }
    return y;
}

static void test_group_norm(void **state) {
    (void)state;
    for (int per_c = 0; per_c < 2; per_c++) {
        pp_tensor *x = RND(2, 6, 3, 2), *sc = per_c ? RND(6) : RND(3), *b = per_c ? RND(6) : RND(3);
        pp_tensor *want = naive_gn(x, sc, b, 3, 1e-5f);
        tu_node t;
        tu_node_init(&t, "GroupNormalization", 3, (pp_tensor *[]){x, sc, b}, 1, NULL);
        TU_OK(pp_node_set_int(t.g, t.node, "num_groups", 3));
        tu_expect(tu_node_run_one(&t), want, 1e-5, 1e-5, per_c ? "per channel" : "per group");
        tu_node_free(&t);
    }
    tu_node t;
    tu_node_init(&t, "GroupNormalization", 3, (pp_tensor *[]){RND(2, 6, 3), RND(3), RND(3)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "num_groups", 4));
    tu_node_expect_error(&t, PP_ERR_SHAPE, "does not divide");
    tu_node_free(&t);
    tu_node_init(&t, "GroupNormalization", 3, (pp_tensor *[]){RND(2, 6, 3), RND(4), RND(4)}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "num_groups", 3));
    tu_node_expect_error(&t, PP_ERR_SHAPE, "entries");
    tu_node_free(&t);
    tu_node_init(&t, "GroupNormalization", 3, (pp_tensor *[]){RND(2, 6, 3), RND(3), RND(3)}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "num_groups");
    tu_node_free(&t);
}

/* PyTorch 1.13 exports nn.GroupNorm(G, C) as Reshape(x, [N, G, -1]) ->
 * InstanceNormalization(ones(G), zeros(G)) -> Reshape(shape(x)) ->
 * Mul(weight [C, 1, 1]) -> Add(bias [C, 1, 1]). Its backward must equal
 * GroupNormalization's (opset 21 form, per-channel scale) for x, weight and
 * bias. */
static int add1(pp_graph *g, const char *op, int a, int b) {
    int id, in[2] = {a, b};
    TU_OK(pp_graph_add_node(g, op, "", NULL, b < 0 ? 1 : 2, in, 1, NULL, &id));
    return g->nodes[id].out[0];
}

static void grads_of(int torch_form, pp_tensor *x, pp_tensor *w, pp_tensor *b, pp_tensor *r,
                     pp_tensor **out) {
    const int64_t N = x->shape[0], C = x->shape[1], G = 2;
    pp_graph *g;
    TU_OK(pp_graph_new("gn", &g));
    int xi, wi, bi, y;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, x->ndim, x->shape, &xi));
    pp_tensor *wc, *bc;
    TU_OK(pp_tensor_clone(w, &wc));
    TU_OK(pp_tensor_clone(b, &bc));
    if (torch_form) {
        reshape(wc, 3, SHAPE(C, 1, 1));
        reshape(bc, 3, SHAPE(C, 1, 1));
    }
    TU_OK(pp_graph_add_initializer(g, "w", PP_VALUE_PARAM, wc, &wi));
    TU_OK(pp_graph_add_initializer(g, "b", PP_VALUE_PARAM, bc, &bi));
    if (torch_form) {
        int shp, ones, zeros, sx, id;
        TU_OK(pp_graph_add_initializer(g, "shp", PP_VALUE_CONST, I64V(N, G, -1), &shp));
        TU_OK(pp_graph_add_initializer(g, "ones", PP_VALUE_CONST, F32V(1, 1), &ones));
        TU_OK(pp_graph_add_initializer(g, "zeros", PP_VALUE_CONST, F32V(0, 0), &zeros));
        int r1 = add1(g, "Reshape", xi, shp);
        TU_OK(pp_graph_add_node(g, "InstanceNormalization", "", "in", 3, (int[]){r1, ones, zeros}, 1,
                                NULL, &id));
        int inorm = g->nodes[id].out[0];
        sx = add1(g, "Shape", xi, -1);
        y = add1(g, "Add", add1(g, "Mul", add1(g, "Reshape", inorm, sx), wi), bi);
    } else {
        int id;
        TU_OK(pp_graph_add_node(g, "GroupNormalization", "", "gn", 3, (int[]){xi, wi, bi}, 1, NULL,
                                &id));
        TU_OK(pp_node_set_int(g, id, "num_groups", G));
        y = g->nodes[id].out[0];
    }
    TU_OK(pp_graph_add_output(g, y));
    pp_backward_spec spec = {-1, 1, &y, 1, &xi};
    pp_backward *bw;
    TU_OK(pp_autodiff(g, &spec, &bw));
    pp_tensor **all = calloc((size_t)g->n_outputs, sizeof *all);
    TU_OK(pp_graph_run(g, (pp_tensor *[]){x, r}, all));
    int want[3] = {bw->wrt_grads[0], -1, -1};
    for (int i = 0; i < bw->n_params; i++) want[bw->params[i] == wi ? 1 : 2] = bw->param_grads[i];
    for (int k = 0; k < 3; k++) {
        out[k] = NULL;
        for (int i = 0; i < g->n_outputs; i++)
            if (g->outputs[i] == want[k] && !out[k]) TU_OK(pp_tensor_clone(all[i], &out[k]));
        assert_non_null(out[k]);
    }
    for (int i = 0; i < g->n_outputs; i++) pp_tensor_free(all[i]);
    free(all);
    pp_backward_free(bw);
    pp_graph_free(g);
}

static void test_torch_group_norm_export(void **state) {
    (void)state;
    pp_tensor *x = RND(2, 4, 3, 3), *w = RND(4), *b = RND(4), *r = RND(2, 4, 3, 3);
    pp_tensor *ga[3], *gb[3];
    grads_of(1, x, w, b, r, ga);
    grads_of(0, x, w, b, r, gb);
    const char *what[3] = {"dx", "dweight", "dbias"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(pp_tensor_numel(ga[k]), pp_tensor_numel(gb[k]));
        reshape(ga[k], gb[k]->ndim, gb[k]->shape);
        tu_expect(ga[k], gb[k], 1e-4, 1e-5, what[k]);
    }
    pp_tensor_free(x);
    pp_tensor_free(w);
    pp_tensor_free(b);
    pp_tensor_free(r);
}

/* ------------------------------------------------------------------ Pad */

static void test_pad_wrap(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "Pad", 2, (pp_tensor *[]){F32(2, SHAPE(2, 3), 1, 2, 3, 4, 5, 6), I64V(1, 2, 0, 2)},
                 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "mode", "wrap"));
    tu_expect(tu_node_run_one(&t),
              F32(2, SHAPE(3, 7), 5, 6, 4, 5, 6, 4, 5, 2, 3, 1, 2, 3, 1, 2, 5, 6, 4, 5, 6, 4, 5),
              0, 0, "wrap");
    tu_node_free(&t);
    /* PadGrad is Pad's adjoint in every mode, negative pads included */
    const char *modes[4] = {"constant", "edge", "reflect", "wrap"};
    for (int m = 0; m < 4; m++) {
        /* wrap: no axis both cropped and padded (refused, below) */
        pp_tensor *x = RND(3, 4), *xc, *pads = m == 3 ? I64V(2, 1, 1, 3) : I64V(2, -1, 1, 3), *pc;
        TU_OK(pp_tensor_clone(x, &xc));
        TU_OK(pp_tensor_clone(pads, &pc));
        tu_node_init(&t, "Pad", 2, (pp_tensor *[]){xc, pads}, 1, NULL);
        TU_OK(pp_node_set_string(t.g, t.node, "mode", modes[m]));
        pp_tensor *y = tu_node_run_one(&t);
        tu_node_free(&t);
        pp_tensor *r = rand_f32(y->ndim, y->shape), *rc;
        TU_OK(pp_tensor_clone(r, &rc));
        tu_node_init_dom(&t, "PadGrad", "pippin", 3, (pp_tensor *[]){rc, I64V(3, 4), pc}, 1, NULL);
        TU_OK(pp_node_set_string(t.g, t.node, "mode", modes[m]));
        pp_tensor *dx = tu_node_run_one(&t);
        tu_node_free(&t);
        double a = dot(y, r), c = dot(x, dx);
        if (fabs(a - c) > 1e-4 * (1 + fabs(a))) fail_msg("%s: %.7f vs %.7f", modes[m], a, c);
        pp_tensor_free(x);
        pp_tensor_free(y);
        pp_tensor_free(r);
        pp_tensor_free(dx);
    }
    /* wrap that crops one end of an axis and pads the other: runtimes
     * disagree on it, so it is refused */
    tu_node_init(&t, "Pad", 2, (pp_tensor *[]){F32(1, SHAPE(4), 1, 2, 3, 4), I64V(-1, 2)}, 1, NULL);
    TU_OK(pp_node_set_string(t.g, t.node, "mode", "wrap"));
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "crops one end");
    tu_node_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_transpose),  cmocka_unit_test(test_conv_transpose_errors),
        cmocka_unit_test(test_resize_values),   cmocka_unit_test(test_resize_grad),
        cmocka_unit_test(test_resize_errors),   cmocka_unit_test(test_group_norm),
        cmocka_unit_test(test_torch_group_norm_export), cmocka_unit_test(test_pad_wrap),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
