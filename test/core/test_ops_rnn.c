/* LSTM and GRU (lib/ops/rnn.c, rnn_core.c) and their backward helpers
 * pippin::LSTMGrad / GRUGrad (lib/ops/grad_rnn.c, rules in
 * lib/grad_rules_rnn.c): the forward against a reference written here in
 * double from the ONNX equations (directions, layouts, sequence_lens, clip,
 * peepholes, linear_before_reset, initial states, omitted outputs); the
 * gradients of every float input through pp_autodiff against central
 * differences; and the errors (bad attributes and shapes name the node). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"

typedef struct rcfg {
    int lstm;
    int64_t T, B, I, H;
    int dir;      /* 0 forward, 1 reverse, 2 bidirectional */
    int layout;
    int lbr;
    float clip;   /* 0: none */
    int has_b, has_seq, has_h0, has_c0, has_p;
    const int32_t *lens;
} rcfg;

static unsigned rng = 4242;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return -1.0f + 2.0f * (float)(rng >> 8) / 16777216.0f;
}

static pp_tensor *rnd(int nd, const int64_t *shape, float scale) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) ((float *)t->data)[i] = scale * frand();
    return t;
}

static const char *dir_name(int d) { return d == 0 ? "forward" : d == 1 ? "reverse" : "bidirectional"; }

/* Inputs in ONNX order (8 for LSTM, 6 for GRU); absent ones NULL. */
static int make_inputs(const rcfg *c, pp_tensor **in) {
    int64_t nd = c->dir == 2 ? 2 : 1, G = c->lstm ? 4 : 3;
    int n = c->lstm ? 8 : 6;
    memset(in, 0, sizeof(pp_tensor *) * 8);
    int64_t xs[3] = {c->T, c->B, c->I}, hs[3] = {nd, c->B, c->H};
    if (c->layout) xs[0] = c->B, xs[1] = c->T, hs[0] = c->B, hs[1] = nd;
    in[0] = rnd(3, xs, 1.0f);
    in[1] = rnd(3, (int64_t[]){nd, G * c->H, c->I}, 0.7f);
    in[2] = rnd(3, (int64_t[]){nd, G * c->H, c->H}, 0.7f);
    if (c->has_b) in[3] = rnd(2, (int64_t[]){nd, 2 * G * c->H}, 0.5f);
    if (c->has_seq) {
        TU_OK(pp_tensor_empty(PP_I32, 1, &c->B, &in[4]));
        for (int64_t b = 0; b < c->B; b++) ((int32_t *)in[4]->data)[b] = c->lens[b];
    }
    if (c->has_h0) in[5] = rnd(3, hs, 0.5f);
    if (c->lstm && c->has_c0) in[6] = rnd(3, hs, 0.5f);
    if (c->lstm && c->has_p) in[7] = rnd(2, (int64_t[]){nd, 3 * c->H}, 0.5f);
    return n;
}

static void set_attrs(pp_graph *g, int node, const rcfg *c) {
    TU_OK(pp_node_set_int(g, node, "hidden_size", c->H));
    if (c->dir) TU_OK(pp_node_set_string(g, node, "direction", dir_name(c->dir)));
    if (c->layout) TU_OK(pp_node_set_int(g, node, "layout", 1));
    if (c->lbr) TU_OK(pp_node_set_int(g, node, "linear_before_reset", 1));
    if (c->clip > 0) TU_OK(pp_node_set_float(g, node, "clip", c->clip));
}

static double sig(double x) { return 1 / (1 + exp(-x)); }
static double clipd(double x, float c) { return c > 0 ? (x > c ? c : x < -c ? -c : x) : x; }
static float at(const pp_tensor *t, int64_t i) { return t ? ((const float *)t->data)[i] : 0.0f; }

/* Reference forward in double: y [T,nd,B,H] or [B,T,nd,H], yh, yc. */
static void reference(const rcfg *c, pp_tensor *const *in, double *y, double *yh, double *yc) {
    int64_t T = c->T, B = c->B, I = c->I, H = c->H, nd = c->dir == 2 ? 2 : 1, G = c->lstm ? 4 : 3;
    double h[64], cs[64], pre[4][16];
    for (int64_t d = 0; d < nd; d++)
        for (int64_t b = 0; b < B; b++) {
            int64_t len = c->has_seq ? c->lens[b] : T;
            int64_t hoff = c->layout ? (b * nd + d) * H : (d * B + b) * H;
            for (int64_t j = 0; j < H; j++) h[j] = at(in[5], hoff + j), cs[j] = c->lstm ? at(in[6], hoff + j) : 0;
            for (int64_t s = 0; s < T; s++) {
                int64_t t = (c->dir == 1 || d == 1) ? T - 1 - s : s;
                int64_t yoff = c->layout ? ((b * T + t) * nd + d) * H : ((t * nd + d) * B + b) * H;
                if (t >= len) {
                    for (int64_t j = 0; j < H; j++) y[yoff + j] = 0;
                    continue;
                }
                const float *x = (const float *)in[0]->data + (c->layout ? b * T + t : t * B + b) * I;
                const float *W = (const float *)in[1]->data + d * G * H * I;
                const float *R = (const float *)in[2]->data + d * G * H * H;
                int64_t bo = d * 2 * G * H;
                for (int64_t k = 0; k < G; k++)
                    for (int64_t j = 0; j < H; j++) {
                        double a = at(in[3], bo + k * H + j), r = at(in[3], bo + G * H + k * H + j);
                        for (int64_t i = 0; i < I; i++) a += (double)x[i] * W[(k * H + j) * I + i];
                        double hr = 0;
                        for (int64_t m = 0; m < H; m++) hr += h[m] * R[(k * H + j) * H + m];
                        pre[k][j] = c->lstm || k < 2 ? a + r + hr : a;
                        if (!c->lstm && k == 2) pre[3][j] = hr + r; /* h R_h^T + Rb_h */
                    }
                double hn[16];
                for (int64_t j = 0; j < H; j++) {
                    if (c->lstm) {
                        int64_t po = d * 3 * H;
                        double pi = pre[0][j] + at(in[7], po + j) * cs[j];
                        double pf = pre[2][j] + at(in[7], po + 2 * H + j) * cs[j];
                        double ig = sig(clipd(pi, c->clip)), fg = sig(clipd(pf, c->clip));
                        double cg = tanh(clipd(pre[3][j], c->clip));
                        double cn = fg * cs[j] + ig * cg;
                        double og = sig(clipd(pre[1][j] + at(in[7], po + H + j) * cn, c->clip));
                        cs[j] = cn;
                        hn[j] = og * tanh(cn);
                    } else {
                        double zg = sig(clipd(pre[0][j], c->clip)), rg = sig(clipd(pre[1][j], c->clip));
                        double ph;
                        if (c->lbr) {
                            ph = pre[2][j] + rg * pre[3][j];
                        } else {
                            const float *Rh = (const float *)in[2]->data + d * G * H * H + 2 * H * H;
                            double acc = pre[2][j] + at(in[3], bo + G * H + 2 * H + j);
                            for (int64_t m = 0; m < H; m++) {
                                double rm = sig(clipd(pre[1][m], c->clip));
                                acc += rm * h[m] * Rh[j * H + m];
                            }
                            ph = acc;
                        }
                        double hh = tanh(clipd(ph, c->clip));
                        hn[j] = (1 - zg) * hh + zg * h[j];
                    }
                }
                for (int64_t j = 0; j < H; j++) h[j] = hn[j], y[yoff + j] = hn[j];
            }
            for (int64_t j = 0; j < H; j++) {
                yh[hoff + j] = h[j];
                if (yc) yc[hoff + j] = cs[j];
            }
        }
}

static void check_forward(const rcfg *c) {
    pp_tensor *in[8];
    int n = make_inputs(c, in);
    tu_node t;
    int n_out = c->lstm ? 3 : 2;
    tu_node_init(&t, c->lstm ? "LSTM" : "GRU", n, in, n_out, NULL);
    set_attrs(t.g, t.node, c);
    pp_tensor *outs[3] = {0};
    TU_OK(tu_node_run(&t, outs));
    int64_t nd = c->dir == 2 ? 2 : 1;
    int64_t ny = c->T * nd * c->B * c->H, nh = nd * c->B * c->H;
    double *y = calloc((size_t)ny + 1, sizeof *y), *yh = calloc((size_t)nh + 1, sizeof *yh),
           *yc = calloc((size_t)nh + 1, sizeof *yc);
    reference(c, in, y, yh, c->lstm ? yc : NULL);
    const double *want[3] = {y, yh, yc};
    for (int k = 0; k < n_out; k++) {
        assert_int_equal(pp_tensor_numel(outs[k]), k ? nh : ny);
        for (int64_t i = 0; i < pp_tensor_numel(outs[k]); i++) {
            double g = ((float *)outs[k]->data)[i];
            if (fabs(g - want[k][i]) > 2e-5)
                fail_msg("%s dir %d layout %d lbr %d clip %g: output %d [%lld] = %.7f, want %.7f",
                         c->lstm ? "LSTM" : "GRU", c->dir, c->layout, c->lbr, c->clip, k,
                         (long long)i, g, want[k][i]);
        }
        pp_tensor_free(outs[k]);
    }
    free(y);
    free(yh);
    free(yc);
    tu_node_free(&t);
}

static const int32_t lens3[3] = {4, 2, 3};

static void test_forward_lstm(void **state) {
    (void)state;
    for (int dir = 0; dir < 3; dir++)
        for (int layout = 0; layout < 2; layout++) {
            check_forward(&(rcfg){1, 4, 3, 5, 3, dir, layout, 0, 0, 1, 0, 1, 1, 0, NULL});
            check_forward(&(rcfg){1, 4, 3, 2, 4, dir, layout, 0, 0, 1, 1, 1, 1, 1, lens3});
            check_forward(&(rcfg){1, 3, 3, 3, 2, dir, layout, 0, 0.3f, 0, 0, 0, 0, 1, NULL});
        }
}

static void test_forward_gru(void **state) {
    (void)state;
    for (int dir = 0; dir < 3; dir++)
        for (int layout = 0; layout < 2; layout++)
            for (int lbr = 0; lbr < 2; lbr++) {
                check_forward(&(rcfg){0, 4, 3, 5, 3, dir, layout, lbr, 0, 1, 0, 1, 0, 0, NULL});
                check_forward(&(rcfg){0, 4, 3, 2, 4, dir, layout, lbr, 0, 1, 1, 1, 0, 0, lens3});
                check_forward(&(rcfg){0, 3, 3, 3, 2, dir, layout, lbr, 0.4f, 0, 0, 0, 0, 0, NULL});
            }
}

/* Y omitted, only Y_h (as ONNX's own cases do), and an empty batch. */
static void test_omitted_outputs(void **state) {
    (void)state;
    rcfg c = {1, 3, 2, 3, 2, 2, 0, 0, 0, 1, 0, 0, 0, 0, NULL};
    pp_tensor *in[8];
    int n = make_inputs(&c, in);
    tu_node t;
    tu_node_init(&t, "LSTM", n, in, 2, (const char *const[]){"", "yh"});
    set_attrs(t.g, t.node, &c);
    pp_tensor *yh = tu_node_run_one(&t);
    tu_assert_shape(yh, 3, (int64_t[]){2, 2, 2});
    double y[64], want[8];
    reference(&c, in, y, want, NULL);
    for (int i = 0; i < 8; i++) assert_true(fabs(((float *)yh->data)[i] - want[i]) < 2e-5);
    pp_tensor_free(yh);
    tu_node_free(&t);
    /* T = 0: Y empty, Y_h the initial state */
    rcfg e = {0, 0, 2, 3, 2, 0, 0, 0, 0, 0, 0, 1, 0, 0, NULL};
    n = make_inputs(&e, in);
    float h0[4];
    memcpy(h0, in[5]->data, sizeof h0);
    tu_node_init(&t, "GRU", n, in, 2, NULL);
    set_attrs(t.g, t.node, &e);
    pp_tensor *outs[2];
    TU_OK(tu_node_run(&t, outs));
    assert_int_equal(pp_tensor_numel(outs[0]), 0);
    assert_memory_equal(outs[1]->data, h0, sizeof h0);
    pp_tensor_free(outs[0]);
    pp_tensor_free(outs[1]);
    tu_node_free(&t);
}

/* ---------------------------------------------------------------- grads */

/* L = sum_k <y_k, S_k> over the float outputs; autodiff's gradient of every
 * float input (graph inputs) against central differences. */
static double loss_of(pp_graph *g, pp_tensor **feed, int n_out, pp_tensor *const *seed) {
    pp_tensor *outs[3] = {0};
    TU_OK(pp_graph_run(g, feed, outs));
    double l = 0;
    for (int k = 0; k < n_out; k++) {
        for (int64_t i = 0; i < pp_tensor_numel(seed[k]); i++)
            l += (double)((float *)outs[k]->data)[i] * ((float *)seed[k]->data)[i];
        pp_tensor_free(outs[k]);
    }
    return l;
}

static pp_graph *build(const rcfg *c, pp_tensor *const *in, int n, int *ids, int *node) {
    pp_graph *g;
    TU_OK(pp_graph_new("rnn", &g));
    for (int k = 0; k < n; k++) {
        ids[k] = -1;
        if (!in[k]) continue;
        char name[16];
        snprintf(name, sizeof name, "in%d", k);
        TU_OK(pp_graph_add_input(g, name, in[k]->dtype, in[k]->ndim, in[k]->shape, &ids[k]));
    }
    int n_out = c->lstm ? 3 : 2;
    TU_OK(pp_graph_add_node(g, c->lstm ? "LSTM" : "GRU", "", "rnn", n, ids, n_out, NULL, node));
    set_attrs(g, *node, c);
    for (int k = 0; k < n_out; k++) TU_OK(pp_graph_add_output(g, g->nodes[*node].out[k]));
    TU_OK(pp_graph_resolve(g));
    return g;
}

static void check_grads(const rcfg *c) {
    pp_tensor *in[8];
    int n = make_inputs(c, in), ids[8], node, n_out = c->lstm ? 3 : 2;
    pp_tensor *feed[16];
    int nf = 0;
    for (int k = 0; k < n; k++)
        if (in[k]) feed[nf++] = in[k];
    pp_graph *fg = build(c, in, n, ids, &node);
    pp_tensor *outs[3] = {0}, *seed[3] = {0};
    TU_OK(pp_graph_run(fg, feed, outs));
    for (int k = 0; k < n_out; k++) {
        seed[k] = rnd(outs[k]->ndim, outs[k]->shape, 1.0f);
        pp_tensor_free(outs[k]);
    }
    pp_graph *bg = build(c, in, n, ids, &node);
    int seeds[3], wrt[8], n_wrt = 0;
    for (int k = 0; k < n_out; k++) seeds[k] = bg->nodes[node].out[k];
    for (int k = 0; k < n; k++)
        if (in[k] && in[k]->dtype == PP_F32) wrt[n_wrt++] = ids[k];
    pp_backward_spec spec = {-1, n_out, seeds, n_wrt, wrt};
    pp_backward *b;
    TU_OK(pp_autodiff(bg, &spec, &b));
    int nb = nf;
    for (int k = 0; k < n_out; k++) feed[nb++] = seed[k];
    pp_tensor **all = calloc((size_t)bg->n_outputs, sizeof *all);
    TU_OK(pp_graph_run(bg, feed, all));
    int checked = 0;
    for (int w = 0; w < b->n_wrt; w++) {
        int k = 0;
        while (ids[k] != b->wrt_values[w]) k++;
        const pp_tensor *ga = NULL;
        for (int i = 0; i < bg->n_outputs; i++)
            if (bg->outputs[i] == b->wrt_grads[w]) ga = all[i];
        assert_non_null(ga);
        assert_int_equal(pp_tensor_numel(ga), pp_tensor_numel(in[k]));
        float *d = in[k]->data;
        for (int64_t e = 0; e < pp_tensor_numel(in[k]); e++) {
            float keep = d[e], eps = 1e-3f;
            d[e] = keep + eps;
            double lp = loss_of(fg, feed, n_out, seed);
            d[e] = keep - eps;
            double lm = loss_of(fg, feed, n_out, seed);
            d[e] = keep;
            double num = (lp - lm) / (2.0 * eps), an = ((const float *)ga->data)[e];
            if (fabs(an - num) > 3e-3 * (1 + fabs(num)))
                fail_msg("%s dir %d layout %d lbr %d clip %g seq %d: d/d input %d [%lld]: autodiff "
                         "%.6f, finite difference %.6f",
                         c->lstm ? "LSTM" : "GRU", c->dir, c->layout, c->lbr, c->clip, c->has_seq, k,
                         (long long)e, an, num);
            checked++;
        }
    }
    assert_true(checked > 0);
    for (int i = 0; i < bg->n_outputs; i++) pp_tensor_free(all[i]);
    free(all);
    pp_backward_free(b);
    pp_graph_free(bg);
    pp_graph_free(fg);
    for (int k = 0; k < n_out; k++) pp_tensor_free(seed[k]);
    for (int k = 0; k < 8; k++) pp_tensor_free(in[k]);
}

static void test_grad_lstm(void **state) {
    (void)state;
    for (int dir = 0; dir < 3; dir++)
        for (int layout = 0; layout < 2; layout++) {
            check_grads(&(rcfg){1, 3, 2, 3, 2, dir, layout, 0, 0, 1, 0, 1, 1, 0, NULL});
            check_grads(&(rcfg){1, 4, 3, 2, 3, dir, layout, 0, 0, 1, 1, 1, 1, 1, lens3});
        }
    /* clip well inside the range the gates reach */
    check_grads(&(rcfg){1, 3, 2, 3, 2, 2, 0, 0, 0.5f, 1, 0, 0, 0, 1, NULL});
    check_grads(&(rcfg){1, 3, 2, 3, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL}); /* W R only */
}

static void test_grad_gru(void **state) {
    (void)state;
    for (int dir = 0; dir < 3; dir++)
        for (int layout = 0; layout < 2; layout++)
            for (int lbr = 0; lbr < 2; lbr++) {
                check_grads(&(rcfg){0, 3, 2, 3, 2, dir, layout, lbr, 0, 1, 0, 1, 0, 0, NULL});
                check_grads(&(rcfg){0, 4, 3, 2, 3, dir, layout, lbr, 0, 1, 1, 1, 0, 0, lens3});
            }
    check_grads(&(rcfg){0, 3, 2, 3, 2, 2, 0, 1, 0.5f, 1, 0, 1, 0, 0, NULL});
    check_grads(&(rcfg){0, 3, 2, 3, 2, 0, 0, 0, 0.5f, 0, 0, 0, 0, 0, NULL});
}

/* The rule makes the forward pippin::LSTMTrain / GRUTrain, whose stash the
 * sweep (region I, with d/dX asked) reads and whose dG the weight helper
 * (region W) takes. Checks that layout; that I then W gives the whole
 * backward's bits; and that the sweep rerunning the forward (no stash
 * input) gives the same bits. */
static pp_tensor **run_regions(pp_graph *g, const pp_backward *b, pp_tensor *const *feed) {
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    pp_tensor **env = calloc((size_t)g->n_values, sizeof *env);
    for (int i = 0; i < g->n_inputs; i++) env[g->inputs[i]] = pp_tensor_retain(feed[i]);
    uint8_t *kf, *ki;
    TU_OK(pp_backward_keep_masks(g, b, &kf, &ki));
    TU_OK(pp_exec_run_nodes(ex, b->forward_nodes, b->n_forward, env, kf));
    TU_OK(pp_exec_run_nodes(ex, b->i_nodes, b->n_i, env, ki));
    TU_OK(pp_exec_run_nodes(ex, b->w_nodes, b->n_w, env, kf));
    pp_tensor **outs = calloc((size_t)g->n_outputs, sizeof *outs);
    for (int i = 0; i < g->n_outputs; i++) {
        assert_non_null(env[g->outputs[i]]);
        outs[i] = pp_tensor_retain(env[g->outputs[i]]);
    }
    for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]);
    free(env);
    free(kf);
    free(ki);
    pp_exec_free(ex);
    return outs;
}

static void free_all(pp_tensor **t, int n) {
    for (int i = 0; i < n; i++) pp_tensor_free(t[i]);
    free(t);
}

static void assert_same_bits(pp_tensor *const *a, pp_tensor *const *b, int n) {
    for (int i = 0; i < n; i++) {
        assert_int_equal(a[i]->nbytes, b[i]->nbytes);
        assert_memory_equal(a[i]->data, b[i]->data, a[i]->nbytes);
    }
}

static void check_stash_split(const rcfg *c) {
    pp_tensor *in[8];
    int n = make_inputs(c, in), ids[8], node, n_out = c->lstm ? 3 : 2;
    pp_graph *g;
    TU_OK(pp_graph_new("rnn", &g));
    int wrt[8], n_wrt = 0;
    for (int k = 0; k < n; k++) {
        ids[k] = -1;
        if (!in[k]) continue;
        char name[16];
        snprintf(name, sizeof name, "in%d", k);
        if (k == 1 || k == 2 || k == 3 || k == 7) { /* W R B P: parameters */
            TU_OK(pp_graph_add_initializer(g, name, PP_VALUE_PARAM, pp_tensor_retain(in[k]), &ids[k]));
            continue;
        }
        TU_OK(pp_graph_add_input(g, name, in[k]->dtype, in[k]->ndim, in[k]->shape, &ids[k]));
        if (in[k]->dtype == PP_F32) wrt[n_wrt++] = ids[k];
    }
    TU_OK(pp_graph_add_node(g, c->lstm ? "LSTM" : "GRU", "", "rnn", n, ids, n_out, NULL, &node));
    set_attrs(g, node, c);
    for (int k = 0; k < n_out; k++) TU_OK(pp_graph_add_output(g, g->nodes[node].out[k]));
    TU_OK(pp_graph_resolve(g));
    int seeds[3];
    for (int k = 0; k < n_out; k++) seeds[k] = g->nodes[node].out[k];
    pp_backward_spec spec = {-1, n_out, seeds, n_wrt, wrt};
    pp_backward *b;
    TU_OK(pp_autodiff(g, &spec, &b));
    const char *train = c->lstm ? "LSTMTrain" : "GRUTrain", *gi = c->lstm ? "LSTMGrad" : "GRUGrad",
               *gw = c->lstm ? "LSTMGradWeight" : "GRUGradWeight";
    assert_string_equal(g->nodes[node].op_type, train);
    assert_string_equal(g->nodes[node].domain, "pippin");
    int stash = g->nodes[node].out[n_out], sweep = -1, weight = -1;
    for (int i = 0; i < b->n_i; i++)
        if (!strcmp(g->nodes[b->i_nodes[i]].op_type, gi)) sweep = b->i_nodes[i];
    for (int i = 0; i < b->n_w; i++)
        if (!strcmp(g->nodes[b->w_nodes[i]].op_type, gw)) weight = b->w_nodes[i];
    assert_true(sweep >= 0 && weight >= 0);
    pp_node *sn = &g->nodes[sweep];
    assert_int_equal(sn->in[sn->n_in - 1], stash);
    assert_int_equal(b->n_params, c->lstm ? 2 + c->has_b + c->has_p : 2 + c->has_b);
    pp_tensor *feed[16];
    int nf = 0;
    for (int k = 0; k < n; k++)
        if (in[k] && g->values[ids[k]].kind == PP_VALUE_INPUT) feed[nf++] = in[k];
    int64_t nd = c->dir == 2 ? 2 : 1, ys[4] = {c->T, nd, c->B, c->H}, hs[3] = {nd, c->B, c->H};
    if (c->layout) ys[0] = c->B, ys[1] = c->T, ys[2] = nd, hs[0] = c->B, hs[1] = nd;
    for (int k = 0; k < n_out; k++) feed[nf++] = k ? rnd(3, hs, 1.0f) : rnd(4, ys, 1.0f);
    assert_int_equal(nf, g->n_inputs);
    pp_tensor **whole = calloc((size_t)g->n_outputs, sizeof *whole);
    TU_OK(pp_graph_run(g, feed, whole));
    pp_tensor **split = run_regions(g, b, feed);
    assert_same_bits(whole, split, g->n_outputs);
    sn->in[sn->n_in - 1] = -1; /* the sweep reruns the forward */
    pp_tensor **rerun = calloc((size_t)g->n_outputs, sizeof *rerun);
    TU_OK(pp_graph_run(g, feed, rerun));
    assert_same_bits(whole, rerun, g->n_outputs);
    free_all(whole, g->n_outputs);
    free_all(split, g->n_outputs);
    free_all(rerun, g->n_outputs);
    for (int k = nf - n_out; k < nf; k++) pp_tensor_free(feed[k]);
    pp_backward_free(b);
    pp_graph_free(g);
    for (int k = 0; k < 8; k++) pp_tensor_free(in[k]);
}

static void test_stash_and_split(void **state) {
    (void)state;
    check_stash_split(&(rcfg){1, 4, 3, 2, 3, 2, 0, 0, 0, 1, 1, 1, 1, 1, lens3});
    check_stash_split(&(rcfg){1, 4, 3, 2, 3, 1, 1, 0, 0.5f, 1, 0, 1, 1, 1, NULL});
    for (int lbr = 0; lbr < 2; lbr++) {
        check_stash_split(&(rcfg){0, 4, 3, 2, 3, 2, 1, lbr, 0, 1, 1, 1, 0, 0, lens3});
        check_stash_split(&(rcfg){0, 4, 3, 2, 3, 0, 0, lbr, 0.5f, 1, 0, 0, 0, 0, NULL});
    }
}

/* ----------------------------------------------------------------- errors */

static void expect_attr_error(int lstm, const char *attr, const char *sval, int64_t ival,
                              pp_status code, const char *part) {
    rcfg c = {lstm, 2, 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL};
    pp_tensor *in[8];
    int n = make_inputs(&c, in);
    tu_node t;
    tu_node_init(&t, lstm ? "LSTM" : "GRU", n, in, 2, NULL);
    if (sval) TU_OK(pp_node_set_string(t.g, t.node, attr, sval));
    else TU_OK(pp_node_set_int(t.g, t.node, attr, ival));
    tu_node_expect_error(&t, code, part);
    tu_node_free(&t);
}

static void test_errors(void **state) {
    (void)state;
    expect_attr_error(1, "input_forget", NULL, 1, PP_ERR_UNSUPPORTED, "input_forget");
    expect_attr_error(1, "direction", "sideways", 0, PP_ERR_INVALID, "direction");
    expect_attr_error(0, "layout", NULL, 2, PP_ERR_INVALID, "layout");
    expect_attr_error(0, "linear_before_reset", NULL, 5, PP_ERR_INVALID, "linear_before_reset");
    /* hidden_size from an untrusted file: bounded, and must match R */
    expect_attr_error(1, "hidden_size", NULL, (int64_t)1 << 40, PP_ERR_INVALID, "hidden_size");
    expect_attr_error(1, "hidden_size", NULL, 3, PP_ERR_SHAPE, "hidden_size 3");
    /* activations other than the defaults, named */
    rcfg c = {1, 2, 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL};
    pp_tensor *in[8];
    int n = make_inputs(&c, in);
    tu_node t;
    tu_node_init(&t, "LSTM", n, in, 1, NULL);
    pp_attr a = {0};
    a.name = strdup("activations");
    a.type = PP_ATTR_STRINGS;
    a.n = 3;
    a.strings = calloc(3, sizeof(char *));
    a.strings[0] = strdup("Sigmoid");
    a.strings[1] = strdup("Relu");
    a.strings[2] = strdup("Tanh");
    TU_OK(pp_node_add_attr(t.g, t.node, &a));
    tu_node_expect_error(&t, PP_ERR_UNSUPPORTED, "activation 'Relu'");
    tu_node_free(&t);
    /* shapes: W with the wrong gate count, a sequence length past T */
    n = make_inputs(&c, in);
    pp_tensor_free(in[1]);
    in[1] = rnd(3, (int64_t[]){1, 6, 2}, 1);
    tu_node_init(&t, "LSTM", n, in, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "W is");
    tu_node_free(&t);
    c.has_seq = 1;
    static const int32_t bad[1] = {3};
    c.lens = bad;
    n = make_inputs(&c, in);
    tu_node_init(&t, "LSTM", n, in, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_INVALID, "sequence_lens");
    tu_node_free(&t);
    /* X not 3-D */
    n = make_inputs(&c, in);
    pp_tensor_free(in[0]);
    in[0] = rnd(2, (int64_t[]){2, 2}, 1);
    pp_tensor_free(in[4]);
    in[4] = NULL;
    tu_node_init(&t, "GRU", 6, in, 1, NULL);
    tu_node_expect_error(&t, PP_ERR_SHAPE, "X must be 3-D");
    tu_node_free(&t);
    for (int k = 6; k < 8; k++) pp_tensor_free(in[k]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_lstm),
        cmocka_unit_test(test_forward_gru),
        cmocka_unit_test(test_omitted_outputs),
        cmocka_unit_test(test_grad_lstm),
        cmocka_unit_test(test_grad_gru),
        cmocka_unit_test(test_stash_and_split),
        cmocka_unit_test(test_errors),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
