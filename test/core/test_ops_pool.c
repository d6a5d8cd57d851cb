/* Pooling (lib/ops/pool.c) and the activation-derivative helpers
 * (lib/ops/grad_act.c): MaxPool/AveragePool on random shapes and attributes
 * against naive references written here, hand-computed cases, the gradient
 * helper kernels (MaxPoolGrad scatters to the reference argmax,
 * AveragePoolGrad is the adjoint of AveragePool), and errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "op.h"
#include "test_filter.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static pp_tensor *rand_f32(int nd, const int64_t *shape) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) ((float *)t->data)[i] = (float)tu_urand(&rng_state);
    return t;
}

static int irand(int lo, int hi) { /* [lo, hi] */
    return lo + (int)(tu_xorshift(&rng_state) % (uint64_t)(hi - lo + 1));
}

/* ------------------------------------------------------- naive reference */

typedef struct ref_pool {
    int nsp;
    int64_t n, c, in[2], k[2], s[2], d[2], pb[2], pe[2], out[2];
    int ceil_mode, cip;
} ref_pool;

static void ref_out(ref_pool *p) {
    for (int i = 0; i < p->nsp; i++) {
        int64_t ext = (p->k[i] - 1) * p->d[i] + 1, span = p->in[i] + p->pb[i] + p->pe[i] - ext;
        double q = (double)span / (double)p->s[i];
        int64_t o = (int64_t)(p->ceil_mode ? ceil(q) : floor(q)) + 1;
        if (p->ceil_mode && (o - 1) * p->s[i] >= p->in[i] + p->pb[i]) o--;
        p->out[i] = o;
    }
    if (p->nsp == 1) p->in[1] = p->out[1] = p->k[1] = p->s[1] = p->d[1] = 1;
}

/* Max and flat argmax (first maximum) or average of one window. */
static void ref_window(const ref_pool *p, const float *x, int64_t nc, int64_t oh, int64_t ow,
                       float *max, int64_t *arg, float *avg) {
    int64_t H = p->nsp == 2 ? p->in[0] : 1, W = p->nsp == 2 ? p->in[1] : p->in[0];
    int64_t kh = p->nsp == 2 ? p->k[0] : 1, kw = p->nsp == 2 ? p->k[1] : p->k[0];
    int64_t sh = p->nsp == 2 ? p->s[0] : 1, sw = p->nsp == 2 ? p->s[1] : p->s[0];
    int64_t dh = p->nsp == 2 ? p->d[0] : 1, dw = p->nsp == 2 ? p->d[1] : p->d[0];
    int64_t ph = p->nsp == 2 ? p->pb[0] : 0, pw = p->nsp == 2 ? p->pb[1] : p->pb[0];
    int64_t peh = p->nsp == 2 ? p->pe[0] : 0, pew = p->nsp == 2 ? p->pe[1] : p->pe[0];
    double sum = 0;
    int64_t cnt = 0, cnt_pad = 0;
    *max = -INFINITY;
    *arg = -1;
    for (int64_t i = 0; i < kh; i++)
        for (int64_t j = 0; j < kw; j++) {
            int64_t h = oh * sh - ph + i * dh, w = ow * sw - pw + j * dw;
            if (h >= -ph && h < H + peh && w >= -pw && w < W + pew) cnt_pad++;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            float v = x[(nc * H + h) * W + w];
            sum += v;
            cnt++;
            if (*arg < 0 || v > *max) {
                *max = v;
                *arg = (nc * H + h) * W + w;
            }
        }
    *avg = (float)(sum / (double)(p->cip ? cnt_pad : cnt));
}

static pp_tensor *run_pool(const char *op, const ref_pool *p, pp_tensor *x, pp_tensor **indices) {
    tu_node t;
    tu_node_init(&t, op, 1, (pp_tensor *[]){x}, indices ? 2 : 1, NULL);
    int64_t v[4];
    for (int i = 0; i < p->nsp; i++) v[i] = p->k[i];
    TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", p->nsp, v));
    for (int i = 0; i < p->nsp; i++) v[i] = p->s[i];
    TU_OK(pp_node_set_ints(t.g, t.node, "strides", p->nsp, v));
    for (int i = 0; i < p->nsp; i++) v[i] = p->d[i];
    TU_OK(pp_node_set_ints(t.g, t.node, "dilations", p->nsp, v));
    for (int i = 0; i < p->nsp; i++) {
        v[i] = p->pb[i];
        v[p->nsp + i] = p->pe[i];
    }
    TU_OK(pp_node_set_ints(t.g, t.node, "pads", 2 * p->nsp, v));
    TU_OK(pp_node_set_int(t.g, t.node, "ceil_mode", p->ceil_mode));
    if (strcmp(op, "AveragePool") == 0)
        TU_OK(pp_node_set_int(t.g, t.node, "count_include_pad", p->cip));
    pp_tensor *outs[2];
    TU_OK(tu_node_run(&t, outs));
    if (indices) *indices = outs[1];
    t.in[0] = NULL; /* the caller keeps x */
    tu_node_free(&t);
    return outs[0];
}

static void test_pool_random(void **state) {
    (void)state;
    for (int iter = 0; iter < 300; iter++) {
        ref_pool p = {0};
        p.nsp = irand(1, 2);
        p.n = irand(1, 2);
        p.c = irand(1, 3);
        for (int i = 0; i < p.nsp; i++) {
            p.k[i] = irand(1, 3);
            p.s[i] = irand(1, 3);
            p.d[i] = irand(1, 2);
            p.pb[i] = irand(0, p.k[i] - 1);
            p.pe[i] = irand(0, p.k[i] - 1);
            p.in[i] = irand((int)((p.k[i] - 1) * p.d[i] + 1), 9);
        }
        p.ceil_mode = irand(0, 1);
        p.cip = irand(0, 1);
        int64_t xs[4] = {p.n, p.c, p.in[0], p.in[1]};
        pp_tensor *x = rand_f32(2 + p.nsp, xs);
        ref_out(&p);
        pp_tensor *idx;
        pp_tensor *ym = run_pool("MaxPool", &p, x, &idx);
        pp_tensor *ya = run_pool("AveragePool", &p, x, NULL);
        int64_t ys[4] = {p.n, p.c, p.out[0], p.out[1]};
        tu_assert_shape(ym, 2 + p.nsp, ys);
        tu_assert_shape(ya, 2 + p.nsp, ys);
        int64_t oh_n = p.nsp == 2 ? p.out[0] : 1, ow_n = p.nsp == 2 ? p.out[1] : p.out[0];
        for (int64_t nc = 0; nc < p.n * p.c; nc++)
            for (int64_t oh = 0; oh < oh_n; oh++)
                for (int64_t ow = 0; ow < ow_n; ow++) {
                    float mx, av;
                    int64_t arg, o = (nc * oh_n + oh) * ow_n + ow;
                    ref_window(&p, x->data, nc, oh, ow, &mx, &arg, &av);
                    if (((float *)ym->data)[o] != mx || ((int64_t *)idx->data)[o] != arg ||
                        fabsf(((float *)ya->data)[o] - av) > 1e-6f)
                        fail_msg("iter %d at %lld: max %g/%g arg %lld/%lld avg %g/%g", iter,
                                 (long long)o, ((float *)ym->data)[o], mx,
                                 (long long)((int64_t *)idx->data)[o], (long long)arg,
                                 ((float *)ya->data)[o], av);
                }
        /* MaxPoolGrad scatters dy to the argmax; AveragePoolGrad is the
         * adjoint: <avgpool(x), dy> == <x, avgpoolgrad(dy)>. */
        pp_tensor *dy = rand_f32(2 + p.nsp, ys);
        pp_tensor *shape = tu_i64_vec(2 + p.nsp, xs);
        tu_node t;
        pp_tensor *shape2;
        TU_OK(pp_tensor_clone(shape, &shape2));
        pp_tensor *dyc, *idxc;
        TU_OK(pp_tensor_clone(dy, &dyc));
        TU_OK(pp_tensor_clone(idx, &idxc));
        tu_node_init_dom(&t, "MaxPoolGrad", "pippin", 3, (pp_tensor *[]){dyc, idxc, shape}, 1, NULL);
        pp_tensor *dxm = tu_node_run_one(&t);
        tu_node_free(&t);
        double *want = calloc((size_t)pp_tensor_numel(x), sizeof *want);
        for (int64_t o = 0; o < pp_tensor_numel(dy); o++)
            if (((int64_t *)idx->data)[o] >= 0) want[((int64_t *)idx->data)[o]] += ((float *)dy->data)[o];
        for (int64_t i = 0; i < pp_tensor_numel(x); i++)
            assert_float_equal(((float *)dxm->data)[i], want[i], 1e-5);
        free(want);
        TU_OK(pp_tensor_clone(dy, &dyc));
        tu_node_init_dom(&t, "AveragePoolGrad", "pippin", 2, (pp_tensor *[]){dyc, shape2}, 1, NULL);
        int64_t v[4];
        for (int i = 0; i < p.nsp; i++) v[i] = p.k[i];
        TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", p.nsp, v));
        for (int i = 0; i < p.nsp; i++) v[i] = p.s[i];
        TU_OK(pp_node_set_ints(t.g, t.node, "strides", p.nsp, v));
        for (int i = 0; i < p.nsp; i++) v[i] = p.d[i];
        TU_OK(pp_node_set_ints(t.g, t.node, "dilations", p.nsp, v));
        for (int i = 0; i < p.nsp; i++) {
            v[i] = p.pb[i];
            v[p.nsp + i] = p.pe[i];
        }
        TU_OK(pp_node_set_ints(t.g, t.node, "pads", 2 * p.nsp, v));
        TU_OK(pp_node_set_int(t.g, t.node, "ceil_mode", p.ceil_mode));
        TU_OK(pp_node_set_int(t.g, t.node, "count_include_pad", p.cip));
        pp_tensor *dxa = tu_node_run_one(&t);
        tu_node_free(&t);
        double lhs = 0, rhs = 0;
        for (int64_t o = 0; o < pp_tensor_numel(dy); o++)
            lhs += (double)((float *)ya->data)[o] * ((float *)dy->data)[o];
        for (int64_t i = 0; i < pp_tensor_numel(x); i++)
            rhs += (double)((float *)x->data)[i] * ((float *)dxa->data)[i];
        assert_float_equal(lhs, rhs, 1e-4);
        pp_tensor_free(dxm);
        pp_tensor_free(dxa);
        pp_tensor_free(dy);
        pp_tensor_free(ym);
        pp_tensor_free(ya);
        pp_tensor_free(idx);
        pp_tensor_free(x);
    }
}

/* ONNX's documented examples, by hand. */
static void test_pool_hand(void **state) {
    (void)state;
    const int64_t s44[] = {1, 1, 4, 4};
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = (float)(i + 1);
    /* 4x4, kernel 3, stride 2, ceil_mode: 2x2 windows clipped at the edge */
    tu_node t;
    tu_node_init(&t, "MaxPool", 1, (pp_tensor *[]){tu_f32(4, s44, v)}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 2, (int64_t[]){3, 3}));
    TU_OK(pp_node_set_ints(t.g, t.node, "strides", 2, (int64_t[]){2, 2}));
    TU_OK(pp_node_set_int(t.g, t.node, "ceil_mode", 1));
    tu_expect(tu_node_run_one(&t), F32(4, SHAPE(1, 1, 2, 2), 11, 12, 15, 16), 0, 0, "maxpool ceil");
    tu_node_free(&t);
    tu_node_init(&t, "AveragePool", 1, (pp_tensor *[]){tu_f32(4, s44, v)}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 2, (int64_t[]){3, 3}));
    TU_OK(pp_node_set_ints(t.g, t.node, "strides", 2, (int64_t[]){2, 2}));
    TU_OK(pp_node_set_int(t.g, t.node, "ceil_mode", 1));
    tu_expect(tu_node_run_one(&t), F32(4, SHAPE(1, 1, 2, 2), 6, 7.5f, 12, 13.5f), 1e-6, 0,
              "avgpool ceil");
    tu_node_free(&t);
    /* SAME_UPPER 2x2 on 4x4: pads 0 before, 1 after */
    tu_node_init(&t, "AveragePool", 1, (pp_tensor *[]){tu_f32(4, s44, v)}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 2, (int64_t[]){2, 2}));
    TU_OK(pp_node_set_string(t.g, t.node, "auto_pad", "SAME_UPPER"));
    pp_tensor *y = tu_node_run_one(&t);
    tu_assert_shape(y, 4, s44);
    assert_float_equal(((float *)y->data)[0], (1 + 2 + 5 + 6) / 4.0, 1e-6);
    assert_float_equal(((float *)y->data)[15], 16, 1e-6);
    pp_tensor_free(y);
    tu_node_free(&t);
    /* global pools over 3 spatial dims */
    const int64_t s3[] = {1, 2, 2, 1, 2};
    float w[8] = {1, -2, 3, 4, -5, -6, -7, -8};
    tu_node_init(&t, "GlobalAveragePool", 1, (pp_tensor *[]){tu_f32(5, s3, w)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(5, SHAPE(1, 2, 1, 1, 1), 1.5f, -6.5f), 1e-6, 0, "gavg");
    tu_node_free(&t);
    tu_node_init(&t, "GlobalMaxPool", 1, (pp_tensor *[]){tu_f32(5, s3, w)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(5, SHAPE(1, 2, 1, 1, 1), 4, -5), 0, 0, "gmax");
    tu_node_free(&t);
    tu_node_init_dom(&t, "GlobalMaxPoolGrad", "pippin", 2,
                     (pp_tensor *[]){F32(5, SHAPE(1, 2, 1, 1, 1), 10, 20), tu_f32(5, s3, w)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(5, s3, 0, 0, 0, 10, 20, 0, 0, 0), 0, 0, "gmax grad");
    tu_node_free(&t);
    tu_node_init_dom(&t, "GlobalAveragePoolGrad", "pippin", 2,
                     (pp_tensor *[]){F32(5, SHAPE(1, 2, 1, 1, 1), 4, 8), tu_i64_vec(5, s3)}, 1, NULL);
    tu_expect(tu_node_run_one(&t), F32(5, s3, 1, 1, 1, 1, 2, 2, 2, 2), 0, 0, "gavg grad");
    tu_node_free(&t);
}

static void test_pool_errors(void **state) {
    (void)state;
    tu_node t;
    tu_node_init(&t, "MaxPool", 1, (pp_tensor *[]){rand_f32(4, SHAPE(1, 1, 4, 4))}, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "kernel_shape");
    tu_node_free(&t);
    tu_node_init(&t, "AveragePool", 1, (pp_tensor *[]){rand_f32(3, SHAPE(1, 1, 4))}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 2, (int64_t[]){2, 2}));
    tu_node_expect_error(&t, PP_ERR_SHAPE, "rank");
    tu_node_free(&t);
    tu_node_init(&t, "MaxPool", 1, (pp_tensor *[]){rand_f32(6, SHAPE(1, 1, 2, 2, 2, 2))}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 4, (int64_t[]){1, 1, 1, 1}));
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "4-D");
    tu_node_free(&t);
    tu_node_init(&t, "MaxPool", 1, (pp_tensor *[]){T(PP_U8, 3, SHAPE(1, 1, 2), 1, 2)}, 1, NULL);
    TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 1, (int64_t[]){2}));
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "float32 only");
    tu_node_free(&t);
    /* regressions (review): a dilation that overflowed the window's extent
     * read and wrote past the buffers; negative pads were taken */
    const char *pool_ops[2] = {"MaxPool", "AveragePool"};
    for (int o = 0; o < 2; o++) {
        tu_node_init(&t, pool_ops[o], 1, (pp_tensor *[]){rand_f32(3, SHAPE(1, 1, 4))}, 1, NULL);
        TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 1, (int64_t[]){3}));
        TU_OK(pp_node_set_ints(t.g, t.node, "dilations", 1, (int64_t[]){INT64_MAX}));
        tu_node_expect_error(&t, PP_ERR_INVALID, "dilations");
        tu_node_free(&t);
        tu_node_init(&t, pool_ops[o], 1, (pp_tensor *[]){rand_f32(3, SHAPE(1, 1, 4))}, 1, NULL);
        TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 1, (int64_t[]){2}));
        TU_OK(pp_node_set_ints(t.g, t.node, "pads", 2, (int64_t[]){-3, 5}));
        tu_node_expect_error(&t, PP_ERR_INVALID, "pads");
        tu_node_free(&t);
        tu_node_init(&t, pool_ops[o], 1, (pp_tensor *[]){rand_f32(3, SHAPE(1, 1, 4))}, 1, NULL);
        TU_OK(pp_node_set_ints(t.g, t.node, "kernel_shape", 1, (int64_t[]){(int64_t)1 << 40}));
        tu_node_expect_error(&t, PP_ERR_INVALID, "kernel_shape");
        tu_node_free(&t);
    }
}

/* Activation derivatives against their formulas. */
static void test_activation_grads(void **state) {
    (void)state;
    const float xs[] = {-4, -3.5f, -2, -0.7f, -0.1f, 0.3f, 1, 2.2f, 3.2f, 5};
    const int n = 10;
    const char *ops[] = {"HardSigmoidGrad", "HardSwishGrad", "EluGrad", "SeluGrad",
                         "SoftplusGrad", "SoftsignGrad", "ClipGrad"};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        float dyv[10], want[10];
        for (int i = 0; i < n; i++) {
            double x = xs[i], g = 0.5 + 0.1 * i, d;
            dyv[i] = (float)g;
            switch (o) {
            case 0: d = (0.2 * x + 0.5 > 0 && 0.2 * x + 0.5 < 1) ? 0.2 : 0; break;
            case 1: d = x < -3 ? 0 : x > 3 ? 1 : x / 3 + 0.5; break;
            case 2: d = x < 0 ? 1.0 * exp(x) : 1; break;
            case 3: d = x <= 0 ? 1.0507009873554805 * 1.6732632423543772 * exp(x) : 1.0507009873554805; break;
            case 4: d = 1 / (1 + exp(-x)); break;
            case 5: d = 1 / ((1 + fabs(x)) * (1 + fabs(x))); break;
            default: d = x > -1 && x < 2 ? 1 : 0; break;
            }
            want[i] = (float)(g * d);
        }
        int64_t sh[1] = {n};
        tu_node t;
        if (o == 6)
            tu_node_init_dom(&t, ops[o], "pippin", 4,
                             (pp_tensor *[]){tu_f32(1, sh, dyv), tu_f32(1, sh, xs),
                                             F32(0, NULL, -1), F32(0, NULL, 2)},
                             1, NULL);
        else
            tu_node_init_dom(&t, ops[o], "pippin", 2,
                             (pp_tensor *[]){tu_f32(1, sh, dyv), tu_f32(1, sh, xs)}, 1, NULL);
        tu_expect(tu_node_run_one(&t), tu_f32(1, sh, want), 2e-6, 1e-7, ops[o]);
        tu_node_free(&t);
    }
}

/* Autodiff of a MaxPool without its Indices output takes the argmax with
 * the forward (a region-F MaxPool giving only Indices): the backward keeps
 * the int64 indices, not the activation x. */
static void test_maxpool_backward_regions(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("mp", &g));
    int x, node, y;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 4, SHAPE(2, 3, 6, 6), &x));
    TU_OK(pp_graph_add_node(g, "MaxPool", "", "mp", 1, &x, 1, NULL, &node));
    TU_OK(pp_node_set_ints(g, node, "kernel_shape", 2, (int64_t[]){3, 3}));
    TU_OK(pp_node_set_ints(g, node, "strides", 2, (int64_t[]){2, 2}));
    y = g->nodes[node].out[0];
    TU_OK(pp_graph_add_output(g, y));
    pp_backward_spec spec = {-1, 1, &y, 1, &x};
    pp_backward *b;
    TU_OK(pp_autodiff(g, &spec, &b));
    int side = -1;
    for (int i = 0; i < b->n_forward; i++) {
        const pp_node *n = &g->nodes[b->forward_nodes[i]];
        if (b->forward_nodes[i] != node && strcmp(n->op_type, "MaxPool") == 0) side = b->forward_nodes[i];
    }
    assert_true(side >= 0);
    /* Y is a value of its own (ONNX requires it) that nothing reads or keeps */
    int side_y = g->nodes[side].out[0];
    assert_true(side_y >= 0 && side_y != y && g->nodes[side].out[1] >= 0);
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_in; k++) assert_int_not_equal(g->nodes[j].in[k], side_y);
    for (int i = 0; i < b->n_stash; i++) assert_int_not_equal(b->stash[i], side_y);
    for (int i = 0; i < b->n_stash; i++) assert_int_not_equal(b->stash[i], x);
    int grads = 0;
    for (int i = 0; i < b->n_i; i++) grads += strcmp(g->nodes[b->i_nodes[i]].op_type, "MaxPoolGrad") == 0;
    assert_int_equal(grads, 1);
    pp_backward_free(b);
    pp_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_random),
        cmocka_unit_test(test_pool_hand),
        cmocka_unit_test(test_pool_errors),
        cmocka_unit_test(test_activation_grads),
        cmocka_unit_test(test_maxpool_backward_regions),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
