/* Conv (ONNX, 1-D and 2-D, float32) and its gradient helpers
 * pippin::ConvGradInput (dx = col2im(W^T dy)) and pippin::ConvGradWeight
 * (dW = sum over the batch of dy col^T, and dB = sum of dy over batch and
 * space), kept apart so the input gradient holds no weight-gradient work.
 *
 * Every kernel goes through im2col per batch item and group, then one sgemm;
 * the three GEMM cores are shared with ConvTranspose (conv_internal.h).
 * A 1-D conv is a 2-D conv of height 1. A 1x1 kernel with unit strides and no
 * padding skips im2col (the input is its own column matrix). Depthwise
 * convolutions (one input channel per group) take the direct cores of
 * conv_depthwise.c instead: C tiny GEMMs cost far more than their work. */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "conv_internal.h"
#include "grad_kernels.h"

#include "status_internal.h"

#define CONV_ATTR_MAX PP_CONV_ATTR_MAX /* kernel, stride, dilation, pad, group: far above any real model */

typedef pp_conv_plan conv_plan;

/* ---------------------------------------------------------- attributes */

static int auto_pad_mode(const char *s) {
    if (!s || !strcmp(s, "NOTSET") || !s[0]) return 0;
    if (!strcmp(s, "VALID")) return 1;
    if (!strcmp(s, "SAME_UPPER")) return 2;
    if (!strcmp(s, "SAME_LOWER")) return 3;
    return -1;
}

/* Attribute checks shared by Conv and its helpers; nsp_known = spatial rank
 * when known (else -1). */
static pp_status conv_check_attrs(const pp_node *n, int nsp_known) {
    const pp_attr *ap = pp_node_attr(n, "auto_pad");
    if (ap && (ap->type != PP_ATTR_STRING || auto_pad_mode(ap->s) < 0))
        return pp_node_error(n, PP_ERR_INVALID,
                             "auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER");
    static const char *const lists[] = {"kernel_shape", "strides", "dilations", "pads"};
    int nsp = nsp_known;
    for (int i = 0; i < 4; i++) {
        const pp_attr *a = pp_node_attr(n, lists[i]);
        if (!a) continue;
        if (a->type != PP_ATTR_INTS)
            return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' must be a list of ints",
                                 lists[i]);
        int r = i == 3 ? a->n / 2 : a->n;
        if (i == 3 && a->n % 2)
            return pp_node_error(n, PP_ERR_INVALID, "pads must have 2 entries per spatial dim");
        if (r >= 3)
            return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                 "%d-D convolution is not supported (1-D and 2-D only)", r);
        if (r < 1)
            return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' is empty", lists[i]);
        if (nsp >= 0 && r != nsp)
            return pp_node_error(n, PP_ERR_INVALID,
                                 "attribute '%s' has %d spatial dims, expected %d", lists[i], r, nsp);
        nsp = r;
        for (int k = 0; k < a->n; k++) /* bounded: every index product stays far from overflow */
            if ((i == 3 ? a->ints[k] < 0 : a->ints[k] < 1) || a->ints[k] > CONV_ATTR_MAX)
                return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' has a bad entry %" PRId64 " (expected %s to %d)",
                                     lists[i], a->ints[k], i == 3 ? "0" : "1", CONV_ATTR_MAX);
    }
    const pp_attr *g = pp_node_attr(n, "group");
    if (g && (g->type != PP_ATTR_INT || g->i < 1 || g->i > CONV_ATTR_MAX))
        return pp_node_error(n, PP_ERR_INVALID, "group must be an int from 1 to %d", CONV_ATTR_MAX);
    return PP_OK;
}

static pp_status conv_check(const pp_graph *gr, const pp_node *n) {
    int nsp = -1;
    if (n->n_in > 0 && n->in[0] >= 0) {
        const pp_value *x = &gr->values[n->in[0]];
        int r = x->data ? x->data->ndim : x->ndim;
        if (r >= 5)
            return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                 "%d-D convolution is not supported (1-D and 2-D only)", r - 2);
        if (r == 3 || r == 4) nsp = r - 2;
        if (x->dtype != PP_DTYPE_UNDEFINED && x->dtype != PP_F32)
            return pp_node_error(n, PP_ERR_UNSUPPORTED, "Conv supports float32 only, not %s",
                                 pp_dtype_name(x->dtype));
    }
    return conv_check_attrs(n, nsp);
}

static pp_status grad_check(const pp_graph *gr, const pp_node *n) {
    (void)gr;
    return conv_check_attrs(n, -1);
}

/* Plan from the node's attributes, the shape of x ([N,C,spatial]) and of W
 * ([M,C/group,kernel]). */
static pp_status conv_plan_make(const pp_kernel_ctx *ctx, int xnd, const int64_t *xs, int wnd,
                                const int64_t *ws, conv_plan *p) {
    char a[128], b[128];
    const pp_node *n = ctx->node;
    if (xnd >= 5)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED,
                               "%d-D convolution is not supported (1-D and 2-D only)", xnd - 2);
    if ((xnd != 3 && xnd != 4) || wnd != xnd)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "X %s and W %s must both be 3-D or 4-D",
                               pp_shape_str(xnd, xs, a, sizeof a), pp_shape_str(wnd, ws, b, sizeof b));
    memset(p, 0, sizeof *p);
    int nsp = xnd - 2;
    p->nsp = nsp;
    p->N = xs[0];
    p->C = xs[1];
    p->M = ws[0];
    p->G = pp_node_attr_int(n, "group", 1);
    if (p->G < 1 || p->C % p->G || p->M % p->G || ws[1] * p->G != p->C)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "X %s, W %s and group %" PRId64 " do not agree",
                               pp_shape_str(xnd, xs, a, sizeof a), pp_shape_str(wnd, ws, b, sizeof b),
                               p->G);
    p->Cg = p->C / p->G;
    p->Mg = p->M / p->G;
    const int64_t *ks, *st, *dl, *pd;
    int nk = pp_node_attr_ints(n, "kernel_shape", &ks), ns = pp_node_attr_ints(n, "strides", &st);
    int nd = pp_node_attr_ints(n, "dilations", &dl), np = pp_node_attr_ints(n, "pads", &pd);
    if ((nk >= 0 && nk != nsp) || (ns >= 0 && ns != nsp) || (nd >= 0 && nd != nsp) ||
        (np >= 0 && np != 2 * nsp))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "attributes do not match %d spatial dims", nsp);
    int mode = auto_pad_mode(pp_node_attr_string(n, "auto_pad", "NOTSET"));
    if (mode < 0) return pp_kernel_error(ctx, PP_ERR_INVALID, "bad auto_pad");
    int64_t in[2], k[2], s[2], d[2], ph[2], out[2];
    for (int i = 0; i < nsp; i++) {
        in[i] = xs[2 + i];
        k[i] = ws[2 + i];
        if (nk >= 0 && ks[i] != k[i])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "kernel_shape does not match W %s",
                                   pp_shape_str(wnd, ws, b, sizeof b));
        s[i] = ns >= 0 ? st[i] : 1;
        d[i] = nd >= 0 ? dl[i] : 1;
        if (s[i] < 1 || d[i] < 1 || k[i] < 1)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "strides, dilations and kernel must be >= 1");
        /* shapes may come from a shape input (the helpers): bound them before
         * any sum or product below */
        if (k[i] > CONV_ATTR_MAX || s[i] > CONV_ATTR_MAX || d[i] > CONV_ATTR_MAX ||
            in[i] > INT_MAX)
            return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED,
                                   "X %s or W %s too large for a convolution",
                                   pp_shape_str(xnd, xs, a, sizeof a),
                                   pp_shape_str(wnd, ws, b, sizeof b));
        int64_t ek = (k[i] - 1) * d[i] + 1;
        int64_t head = 0, tail = 0;
        if (mode == 0) {
            head = np >= 0 ? pd[i] : 0;
            tail = np >= 0 ? pd[i + nsp] : 0;
        } else if (mode >= 2) {
            int64_t o = (in[i] + s[i] - 1) / s[i];
            int64_t tot = (o - 1) * s[i] + ek - in[i];
            if (tot < 0) tot = 0;
            head = mode == 2 ? tot / 2 : tot - tot / 2;
            tail = tot - head;
        }
        if (head < 0 || tail < 0) return pp_kernel_error(ctx, PP_ERR_INVALID, "negative pads");
        int64_t span = in[i] + head + tail - ek;
        if (span < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "kernel %s is larger than padded input %s",
                                   pp_shape_str(wnd, ws, b, sizeof b), pp_shape_str(xnd, xs, a, sizeof a));
        out[i] = span / s[i] + 1;
        ph[i] = head;
    }
    if (nsp == 1) {
        p->ih = p->kh = p->oh = p->sh = p->dh = 1;
        p->ph = 0;
        p->iw = in[0], p->kw = k[0], p->ow = out[0], p->sw = s[0], p->dw = d[0], p->pw = ph[0];
    } else {
        p->ih = in[0], p->kh = k[0], p->oh = out[0], p->sh = s[0], p->dh = d[0], p->ph = ph[0];
        p->iw = in[1], p->kw = k[1], p->ow = out[1], p->sw = s[1], p->dw = d[1], p->pw = ph[1];
    }
    return pp_conv_plan_finish(ctx, p);
}

pp_status pp_conv_plan_finish(const pp_kernel_ctx *ctx, conv_plan *p) {
    int64_t K, L, IL;
    if (__builtin_mul_overflow(p->Cg, p->kh, &K) || __builtin_mul_overflow(K, p->kw, &K) ||
        __builtin_mul_overflow(p->oh, p->ow, &L) || __builtin_mul_overflow(p->ih, p->iw, &IL) ||
        K > INT_MAX || L > INT_MAX || p->Mg > INT_MAX || K * L > INT64_MAX / 8)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "convolution too large for BLAS");
    p->K = K;
    p->L = L;
    p->IL = IL;
    p->direct = p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 && p->ph == 0 && p->pw == 0 &&
                p->oh == p->ih && p->ow == p->iw;
    return PP_OK;
}

static void out_shape(const conv_plan *p, int64_t *ys) {
    ys[0] = p->N;
    ys[1] = p->M;
    if (p->nsp == 1) ys[2] = p->ow;
    else ys[2] = p->oh, ys[3] = p->ow;
}

/* ------------------------------------------------------ im2col / col2im */

/* col[(c*kh+i)*kw+j][oy*ow+ox] = x[c][oy*sh-ph+i*dh][ox*sw-pw+j*dw] (0 outside). */
static void im2col(const conv_plan *p, const float *restrict x, float *restrict col) {
    for (int64_t c = 0; c < p->Cg; c++) {
        const float *xc = x + c * p->IL;
        for (int64_t i = 0; i < p->kh; i++)
            for (int64_t j = 0; j < p->kw; j++) {
                float *row = col + ((c * p->kh + i) * p->kw + j) * p->L;
                /* ox range with ix in [0, iw) */
                int64_t off = j * p->dw - p->pw;
                int64_t lo = off >= 0 ? 0 : (-off + p->sw - 1) / p->sw;
                int64_t hi = p->iw - off <= 0 ? 0 : (p->iw - off + p->sw - 1) / p->sw;
                if (hi > p->ow) hi = p->ow;
                if (lo > hi) lo = hi;
                for (int64_t oy = 0; oy < p->oh; oy++) {
                    float *r = row + oy * p->ow;
                    int64_t iy = oy * p->sh - p->ph + i * p->dh;
                    if (iy < 0 || iy >= p->ih) {
                        memset(r, 0, (size_t)p->ow * sizeof(float));
                        continue;
                    }
                    const float *xr = xc + iy * p->iw + off;
                    for (int64_t ox = 0; ox < lo; ox++) r[ox] = 0;
                    if (p->sw == 1) memcpy(r + lo, xr + lo, (size_t)(hi - lo) * sizeof(float));
                    else
                        for (int64_t ox = lo; ox < hi; ox++) r[ox] = xr[ox * p->sw];
                    for (int64_t ox = hi; ox < p->ow; ox++) r[ox] = 0;
                }
            }
    }
}

/* x[c][..] += col entries (the adjoint of im2col); x zeroed by the caller. */
static void col2im(const conv_plan *p, const float *restrict col, float *restrict x) {
    for (int64_t c = 0; c < p->Cg; c++) {
        float *xc = x + c * p->IL;
        for (int64_t i = 0; i < p->kh; i++)
            for (int64_t j = 0; j < p->kw; j++) {
                const float *row = col + ((c * p->kh + i) * p->kw + j) * p->L;
                int64_t off = j * p->dw - p->pw;
                int64_t lo = off >= 0 ? 0 : (-off + p->sw - 1) / p->sw;
                int64_t hi = p->iw - off <= 0 ? 0 : (p->iw - off + p->sw - 1) / p->sw;
                if (hi > p->ow) hi = p->ow;
                if (lo > hi) lo = hi;
                for (int64_t oy = 0; oy < p->oh; oy++) {
                    int64_t iy = oy * p->sh - p->ph + i * p->dh;
                    if (iy < 0 || iy >= p->ih) continue;
                    const float *r = row + oy * p->ow;
                    float *xr = xc + iy * p->iw + off;
                    for (int64_t ox = lo; ox < hi; ox++) xr[ox * p->sw] += r[ox];
                }
            }
    }
}

static pp_status scratch(const pp_kernel_ctx *ctx, const conv_plan *p, float **col) {
    *col = NULL;
    if (p->direct) return PP_OK;
    *col = malloc((size_t)(p->K * p->L) * sizeof(float) + 1);
    if (!*col) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory for the column buffer");
    return PP_OK;
}

/* ---------------------------------------------------------- GEMM cores */

pp_status pp_conv_forward(const pp_kernel_ctx *ctx, const conv_plan *p, const float *xd,
                          const float *wd, float *yd) {
    if (p->K == 0) {
        memset(yd, 0, (size_t)(p->N * p->M * p->L) * sizeof(float));
        return PP_OK;
    }
    if (!p->im2col && pp_conv_dw_usable(p)) return pp_conv_dw_forward(ctx, p, xd, wd, yd);
    float *col;
    PP_TRY(scratch(ctx, p, &col));
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t g = 0; g < p->G; g++) {
            const float *xg = xd + (n * p->C + g * p->Cg) * p->IL;
            float *yg = yd + (n * p->M + g * p->Mg) * p->L;
            const float *cm = xg;
            if (!p->direct) {
                im2col(p, xg, col);
                cm = col;
            }
            pp_gemm_f32(0, 0, (int)p->Mg, (int)p->L,
                        (int)p->K, 1.0f, wd + g * p->Mg * p->K, (int)p->K, cm, (int)p->L, 0.0f,
                        yg, (int)p->L);
        }
    free(col);
    return PP_OK;
}

pp_status pp_conv_backward_data(const pp_kernel_ctx *ctx, const conv_plan *p, const float *dyd,
                                const float *wd, float *dxd) {
    memset(dxd, 0, (size_t)(p->N * p->C * p->IL) * sizeof(float));
    if (p->K == 0 || p->L == 0 || p->Mg == 0) return PP_OK;
    if (!p->im2col && pp_conv_dw_usable(p)) return pp_conv_dw_backward_data(ctx, p, dyd, wd, dxd);
    float *col;
    PP_TRY(scratch(ctx, p, &col));
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t g = 0; g < p->G; g++) {
            float *dxg = dxd + (n * p->C + g * p->Cg) * p->IL;
            float *cm = p->direct ? dxg : col;
            /* col[K x L] = W_g^T [K x Mg] dy_g [Mg x L] */
            pp_gemm_f32(1, 0, (int)p->K, (int)p->L, (int)p->Mg,
                        1.0f, wd + g * p->Mg * p->K, (int)p->K,
                        dyd + (n * p->M + g * p->Mg) * p->L, (int)p->L, 0.0f, cm, (int)p->L);
            if (!p->direct) col2im(p, col, dxg);
        }
    free(col);
    return PP_OK;
}

pp_status pp_conv_backward_filter(const pp_kernel_ctx *ctx, const conv_plan *p, const float *dyd,
                                  const float *xd, float *dwd) {
    memset(dwd, 0, (size_t)(p->M * p->K) * sizeof(float));
    if (p->K == 0 || p->L == 0 || p->Mg == 0) return PP_OK;
    if (!p->im2col && pp_conv_dw_usable(p)) return pp_conv_dw_backward_filter(ctx, p, dyd, xd, dwd);
    float *col;
    PP_TRY(scratch(ctx, p, &col));
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t g = 0; g < p->G; g++) {
            const float *xg = xd + (n * p->C + g * p->Cg) * p->IL;
            const float *cm = xg;
            if (!p->direct) {
                im2col(p, xg, col);
                cm = col;
            }
            /* dW_g[Mg x K] += dy_g [Mg x L] col^T [L x K] */
            pp_gemm_f32(0, 1, (int)p->Mg, (int)p->K, (int)p->L,
                        1.0f, dyd + (n * p->M + g * p->Mg) * p->L, (int)p->L, cm, (int)p->L,
                        n ? 1.0f : 0.0f, dwd + g * p->Mg * p->K, (int)p->K);
        }
    free(col);
    return PP_OK;
}

/* ---------------------------------------------------------------- Conv */

static pp_status conv_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *w = ctx->in[1];
    const pp_tensor *bias = ctx->n_in > 2 ? ctx->in[2] : NULL;
    if (x->dtype != PP_F32 || w->dtype != PP_F32 || (bias && bias->dtype != PP_F32))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "Conv supports float32 only");
    conv_plan p;
    PP_TRY(conv_plan_make(ctx, x->ndim, x->shape, w->ndim, w->shape, &p));
    if (bias && (bias->ndim != 1 || bias->shape[0] != p.M))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "B must be 1-D of %" PRId64 " entries", p.M);
    int64_t ys[4];
    out_shape(&p, ys);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, ys, &y));
    if (!y->nbytes) {
        ctx->out[0] = y;
        return PP_OK;
    }
    float *yd = y->data;
    pp_status s = pp_conv_forward(ctx, &p, x->data, w->data, yd);
    if (s != PP_OK) {
        pp_tensor_free(y);
        return s;
    }
    if (bias) pp_conv_add_bias(yd, bias->data, p.N, p.M, p.L);
    ctx->out[0] = y;
    return PP_OK;
}

/* ------------------------------------------------------- ConvGradInput */

/* ConvGradInput(dy, W, shape_x) -> dx, with the forward Conv's attributes. */
static pp_status conv_grad_input_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "W"));
    int xnd;
    int64_t xs[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 2, &xnd, xs));
    const pp_tensor *dy = ctx->in[0], *w = ctx->in[1];
    conv_plan p;
    PP_TRY(conv_plan_make(ctx, xnd, xs, w->ndim, w->shape, &p));
    int64_t ys[4];
    out_shape(&p, ys);
    char a[128], b[128];
    if (!pp_shape_equal(dy->ndim, dy->shape, xnd, ys))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy is %s, the conv's output is %s",
                               pp_shape_str(dy->ndim, dy->shape, a, sizeof a),
                               pp_shape_str(xnd, ys, b, sizeof b));
    pp_tensor *dx;
    PP_TRY(pp_tensor_new(PP_F32, xnd, xs, &dx));
    if (!dx->nbytes || !pp_tensor_numel(dy)) {
        ctx->out[0] = dx;
        return PP_OK;
    }
    pp_status s = pp_conv_backward_data(ctx, &p, dy->data, w->data, dx->data);
    if (s != PP_OK) {
        pp_tensor_free(dx);
        return s;
    }
    ctx->out[0] = dx;
    return PP_OK;
}

/* ------------------------------------------------------ ConvGradWeight */

/* ConvGradWeight(dy, X, shape_w) -> dW[, dB], with the forward's attributes. */
static pp_status conv_grad_weight_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "X"));
    int wnd;
    int64_t wsh[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 2, &wnd, wsh));
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1];
    conv_plan p;
    PP_TRY(conv_plan_make(ctx, x->ndim, x->shape, wnd, wsh, &p));
    int64_t ys[4];
    out_shape(&p, ys);
    char a[128], b[128];
    if (!pp_shape_equal(dy->ndim, dy->shape, x->ndim, ys))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy is %s, the conv's output is %s",
                               pp_shape_str(dy->ndim, dy->shape, a, sizeof a),
                               pp_shape_str(x->ndim, ys, b, sizeof b));
    const float *dyd = dy->data;
    if (ctx->node->out[0] >= 0) {
        pp_tensor *dw;
        PP_TRY(pp_tensor_new(PP_F32, wnd, wsh, &dw));
        pp_status s = dw->nbytes ? pp_conv_backward_filter(ctx, &p, dyd, x->data, dw->data) : PP_OK;
        if (s != PP_OK) {
            pp_tensor_free(dw);
            return s;
        }
        ctx->out[0] = dw;
    }
    if (ctx->n_out > 1 && ctx->node->out[1] >= 0) {
        pp_tensor *db;
        PP_TRY(pp_tensor_new(PP_F32, 1, &p.M, &db));
        float *dbd = db->data;
        for (int64_t n = 0; n < p.N; n++)
            for (int64_t m = 0; m < p.M; m++) dbd[m] += pp_grad_vsum(dyd + (n * p.M + m) * p.L, p.L);
        ctx->out[1] = db;
    }
    return PP_OK;
}

const pp_op pp_ops_conv[] = {
    {"Conv", "", 2, 3, 1, 1, conv_check, conv_run},
    /* dy, W, shape_x -> dx */
    {"ConvGradInput", "pippin", 3, 3, 1, 1, grad_check, conv_grad_input_run},
    /* dy, X, shape_w -> dW[, dB] */
    {"ConvGradWeight", "pippin", 3, 3, 1, 2, grad_check, conv_grad_weight_run},
    {NULL},
};
