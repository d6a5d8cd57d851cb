/* ConvTranspose (ONNX, 1-D and 2-D, float32) and its gradient helpers
 * pippin::ConvTransposeGradInput and pippin::ConvTransposeGradWeight.
 *
 * A transposed convolution X [N, C, in] * W [C, M/G, k] -> Y [N, M, out] is
 * the input gradient of the convolution Y -> X with the same weight,
 * strides, dilations, pads and groups. So the forward is conv.c's
 * col2im(W^T X) core, the input gradient is a Conv forward of dY, and the
 * weight gradient is Conv's weight gradient with X in the role of dy and dY
 * in the role of the conv's input. No loop here touches the data. */
#include <inttypes.h>
#include <limits.h>
#include <string.h>

#include "conv_internal.h"
#include "grad_kernels.h"

#include "status_internal.h"

#define CT_OUT_MAX INT64_C(2147483647) /* bound on one output spatial dim */
#define CT_NUMEL_MAX (INT64_C(1) << 40) /* bound on the output's element count */

static int auto_pad_mode(const char *s) {
    if (!s || !s[0] || !strcmp(s, "NOTSET")) return 0;
    if (!strcmp(s, "VALID")) return 1;
    if (!strcmp(s, "SAME_UPPER")) return 2;
    if (!strcmp(s, "SAME_LOWER")) return 3;
    return -1;
}

static int64_t floor_div2(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

/* Attribute checks (load time); nsp_known = spatial rank if known, else -1. */
static pp_status ct_check_attrs(const pp_node *n, int nsp_known) {
    const pp_attr *ap = pp_node_attr(n, "auto_pad");
    if (ap && (ap->type != PP_ATTR_STRING || auto_pad_mode(ap->s) < 0))
        return pp_node_error(n, PP_ERR_INVALID,
                             "auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER");
    static const char *const lists[] = {"kernel_shape", "strides", "dilations", "pads",
                                        "output_padding", "output_shape"};
    int nsp = nsp_known;
    for (int i = 0; i < 6; i++) {
        const pp_attr *a = pp_node_attr(n, lists[i]);
        if (!a) continue;
        if (a->type != PP_ATTR_INTS)
            return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' must be a list of ints",
                                 lists[i]);
        if (i == 3 && a->n % 2)
            return pp_node_error(n, PP_ERR_INVALID, "pads must have 2 entries per spatial dim");
        int r = i == 3 ? a->n / 2 : a->n;
        if (r < 1 || (i == 5 && r > 4)) /* output_shape may name N and C too */
            return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' has %d entries", lists[i],
                                 a->n);
        if (i != 5 && r >= 3)
            return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                 "%d-D transposed convolution is not supported (1-D and 2-D only)",
                                 r);
        if (i != 5) {
            if (nsp >= 0 && r != nsp)
                return pp_node_error(n, PP_ERR_INVALID,
                                     "attribute '%s' has %d spatial dims, expected %d", lists[i],
                                     r, nsp);
            nsp = r;
        }
        int64_t lo = i == 3 || i == 4 ? 0 : 1;
        int64_t hi = i == 5 ? CT_OUT_MAX : PP_CONV_ATTR_MAX;
        for (int k = 0; k < a->n; k++)
            if (a->ints[k] < lo || a->ints[k] > hi)
                return pp_node_error(n, PP_ERR_INVALID,
                                     "attribute '%s' has a bad entry %" PRId64
                                     " (expected %" PRId64 " to %" PRId64 ")",
                                     lists[i], a->ints[k], lo, hi);
    }
    const pp_attr *g = pp_node_attr(n, "group");
    if (g && (g->type != PP_ATTR_INT || g->i < 1 || g->i > PP_CONV_ATTR_MAX))
        return pp_node_error(n, PP_ERR_INVALID, "group must be an int from 1 to %d",
                             PP_CONV_ATTR_MAX);
    return PP_OK;
}

static pp_status ct_check(const pp_graph *gr, const pp_node *n) {
    int nsp = -1;
    if (n->n_in > 0 && n->in[0] >= 0) {
        const pp_value *x = &gr->values[n->in[0]];
        int r = x->data ? x->data->ndim : x->ndim;
        if (r >= 5)
            return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                 "%d-D transposed convolution is not supported (1-D and 2-D only)",
                                 r - 2);
        if (r == 3 || r == 4) nsp = r - 2;
        if (x->dtype != PP_DTYPE_UNDEFINED && x->dtype != PP_F32)
            return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                 "ConvTranspose supports float32 only, not %s",
                                 pp_dtype_name(x->dtype));
    }
    return ct_check_attrs(n, nsp);
}

static pp_status ct_grad_check(const pp_graph *gr, const pp_node *n) {
    (void)gr;
    return ct_check_attrs(n, -1);
}

/* The plan of the convolution Y -> X that this node transposes, from the
 * shapes of X ([N, C, spatial]) and W ([C, M/G, kernel]); ys gets Y's shape. */
static pp_status ct_plan_make(const pp_kernel_ctx *ctx, int xnd, const int64_t *xs, int wnd,
                              const int64_t *ws, pp_conv_plan *p, int64_t *ys) {
    char a[128], b[128];
    const pp_node *n = ctx->node;
    if (xnd >= 5)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED,
                               "%d-D transposed convolution is not supported (1-D and 2-D only)",
                               xnd - 2);
    if ((xnd != 3 && xnd != 4) || wnd != xnd)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "X %s and W %s must both be 3-D or 4-D",
                               pp_shape_str(xnd, xs, a, sizeof a), pp_shape_str(wnd, ws, b, sizeof b));
    memset(p, 0, sizeof *p);
    int nsp = xnd - 2;
    int64_t G = pp_node_attr_int(n, "group", 1);
    if (G < 1 || G > PP_CONV_ATTR_MAX || xs[1] % G || ws[0] != xs[1] || ws[1] > INT64_MAX / G)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "X %s, W %s and group %" PRId64 " do not agree "
                               "(W must be [C, M/group, kernel...])",
                               pp_shape_str(xnd, xs, a, sizeof a), pp_shape_str(wnd, ws, b, sizeof b),
                               G);
    p->nsp = nsp;
    p->N = xs[0];
    p->G = G;
    p->M = xs[1];       /* the conv's output channels: X's */
    p->Mg = xs[1] / G;
    p->Cg = ws[1];
    p->C = ws[1] * G;   /* the conv's input channels: Y's */
    const int64_t *ks, *st, *dl, *pd, *op, *os;
    int nk = pp_node_attr_ints(n, "kernel_shape", &ks), ns = pp_node_attr_ints(n, "strides", &st);
    int nd = pp_node_attr_ints(n, "dilations", &dl), np = pp_node_attr_ints(n, "pads", &pd);
    int nop = pp_node_attr_ints(n, "output_padding", &op);
    int nos = pp_node_attr_ints(n, "output_shape", &os);
    if (nos == nsp + 2) {
        os += 2;
        nos = nsp;
    }
    if ((nk >= 0 && nk != nsp) || (ns >= 0 && ns != nsp) || (nd >= 0 && nd != nsp) ||
        (np >= 0 && np != 2 * nsp) || (nop >= 0 && nop != nsp) || (nos >= 0 && nos != nsp))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "attributes do not match %d spatial dims", nsp);
    int mode = auto_pad_mode(pp_node_attr_string(n, "auto_pad", "NOTSET"));
    if (mode < 0) return pp_kernel_error(ctx, PP_ERR_INVALID, "bad auto_pad");
    int64_t in[2], k[2], s[2], d[2], head[2], out[2];
    for (int i = 0; i < nsp; i++) {
        in[i] = xs[2 + i];
        k[i] = ws[2 + i];
        if (nk >= 0 && ks[i] != k[i])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "kernel_shape does not match W %s",
                                   pp_shape_str(wnd, ws, b, sizeof b));
        s[i] = ns >= 0 ? st[i] : 1;
        d[i] = nd >= 0 ? dl[i] : 1;
        int64_t opad = nop >= 0 ? op[i] : 0;
        if (s[i] < 1 || d[i] < 1 || k[i] < 1 || s[i] > PP_CONV_ATTR_MAX ||
            d[i] > PP_CONV_ATTR_MAX || k[i] > PP_CONV_ATTR_MAX || opad < 0 ||
            opad > PP_CONV_ATTR_MAX)
            return pp_kernel_error(ctx, PP_ERR_INVALID,
                                   "strides, dilations and kernel must be 1 to %d, output_padding "
                                   "0 to %d", PP_CONV_ATTR_MAX, PP_CONV_ATTR_MAX);
        if (in[i] > CT_OUT_MAX)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "input too large");
        /* each term below 2^41, so no overflow */
        int64_t ek = (k[i] - 1) * d[i] + 1;
        int64_t natural = s[i] * (in[i] > 0 ? in[i] - 1 : 0) + opad + ek;
        if (nos >= 0 || mode >= 2) {
            int64_t want = nos >= 0 ? os[i] : in[i] * s[i];
            if (want < 0 || want > CT_OUT_MAX)
                return pp_kernel_error(ctx, PP_ERR_INVALID, "output_shape entry %" PRId64
                                       " out of range", want);
            int64_t total = natural - want;
            head[i] = mode == 2 ? floor_div2(total) : total - floor_div2(total);
            out[i] = want;
        } else {
            int64_t h = 0, t = 0;
            if (mode == 0 && np >= 0) {
                h = pd[i];
                t = pd[i + nsp];
            }
            if (h < 0 || t < 0 || h > PP_CONV_ATTR_MAX || t > PP_CONV_ATTR_MAX)
                return pp_kernel_error(ctx, PP_ERR_INVALID, "pads must be 0 to %d",
                                       PP_CONV_ATTR_MAX);
            head[i] = h;
            out[i] = natural - h - t;
            if (out[i] < 0)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "pads exceed the output of X %s and W %s",
                                       pp_shape_str(xnd, xs, a, sizeof a),
                                       pp_shape_str(wnd, ws, b, sizeof b));
            if (out[i] > CT_OUT_MAX) return pp_kernel_error(ctx, PP_ERR_SHAPE, "output too large");
        }
    }
    if (nsp == 1) {
        p->ih = p->kh = p->oh = p->sh = p->dh = 1;
        p->ph = 0;
        p->iw = out[0], p->kw = k[0], p->ow = in[0], p->sw = s[0], p->dw = d[0], p->pw = head[0];
    } else {
        p->ih = out[0], p->kh = k[0], p->oh = in[0], p->sh = s[0], p->dh = d[0], p->ph = head[0];
        p->iw = out[1], p->kw = k[1], p->ow = in[1], p->sw = s[1], p->dw = d[1], p->pw = head[1];
    }
    ys[0] = p->N;
    ys[1] = p->C;
    for (int i = 0; i < nsp; i++) ys[2 + i] = out[i];
    /* Y's size is bounded before its plan's products are formed and before
     * any allocation (output_shape and strides come from the file). */
    size_t bytes;
    if (pp_shape_bytes(PP_F32, xnd, ys, &bytes) != PP_OK || bytes / sizeof(float) > CT_NUMEL_MAX)
        return pp_kernel_error(ctx, PP_ERR_NOMEM, "output %s too large (at most 2^40 elements)",
                               pp_shape_str(xnd, ys, a, sizeof a));
    return pp_conv_plan_finish(ctx, p);
}

/* ------------------------------------------------------- ConvTranspose */

static pp_status ct_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *w = ctx->in[1];
    const pp_tensor *bias = ctx->n_in > 2 ? ctx->in[2] : NULL;
    if (x->dtype != PP_F32 || w->dtype != PP_F32 || (bias && bias->dtype != PP_F32))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "ConvTranspose supports float32 only");
    pp_conv_plan p;
    int64_t ys[4];
    PP_TRY(ct_plan_make(ctx, x->ndim, x->shape, w->ndim, w->shape, &p, ys));
    if (bias && (bias->ndim != 1 || bias->shape[0] != p.C))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "B must be 1-D of %" PRId64 " entries", p.C);
    pp_tensor *y;
    PP_TRY(pp_tensor_new(PP_F32, x->ndim, ys, &y));
    if (!y->nbytes) {
        ctx->out[0] = y;
        return PP_OK;
    }
    float *yd = y->data;
    if (pp_tensor_numel(x) > 0) {
        pp_status s = pp_conv_backward_data(ctx, &p, x->data, w->data, yd);
        if (s != PP_OK) {
            pp_tensor_free(y);
            return s;
        }
    }
    if (bias) pp_conv_add_bias(yd, bias->data, p.N, p.C, p.IL);
    ctx->out[0] = y;
    return PP_OK;
}

static pp_status check_dy(const pp_kernel_ctx *ctx, const pp_tensor *dy, int nd, const int64_t *ys) {
    char a[128], b[128];
    if (!pp_shape_equal(dy->ndim, dy->shape, nd, ys))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy is %s, the transposed conv's output is %s",
                               pp_shape_str(dy->ndim, dy->shape, a, sizeof a),
                               pp_shape_str(nd, ys, b, sizeof b));
    return PP_OK;
}

/* ConvTransposeGradInput(dY, W, shape_x) -> dX = Conv(dY, W), with the
 * forward's attributes. */
static pp_status ct_grad_input_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "W"));
    int xnd;
    int64_t xs[PP_MAX_DIMS], ys[4];
    PP_TRY(pp_grad_k_shape(ctx, 2, &xnd, xs));
    const pp_tensor *dy = ctx->in[0], *w = ctx->in[1];
    pp_conv_plan p;
    PP_TRY(ct_plan_make(ctx, xnd, xs, w->ndim, w->shape, &p, ys));
    PP_TRY(check_dy(ctx, dy, xnd, ys));
    pp_tensor *dx;
    PP_TRY(pp_tensor_new(PP_F32, xnd, xs, &dx));
    if (dx->nbytes) {
        pp_status s = pp_conv_forward(ctx, &p, dy->data, w->data, dx->data);
        if (s != PP_OK) {
            pp_tensor_free(dx);
            return s;
        }
    }
    ctx->out[0] = dx;
    return PP_OK;
}

/* ConvTransposeGradWeight(dY, X, shape_w) -> dW[, dB]: Conv's weight
 * gradient with X as the conv's output gradient and dY as its input. */
static pp_status ct_grad_weight_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "X"));
    int wnd;
    int64_t wsh[PP_MAX_DIMS], ys[4];
    PP_TRY(pp_grad_k_shape(ctx, 2, &wnd, wsh));
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1];
    pp_conv_plan p;
    PP_TRY(ct_plan_make(ctx, x->ndim, x->shape, wnd, wsh, &p, ys));
    PP_TRY(check_dy(ctx, dy, x->ndim, ys));
    const float *dyd = dy->data;
    if (ctx->node->out[0] >= 0) {
        pp_tensor *dw;
        PP_TRY(pp_tensor_new(PP_F32, wnd, wsh, &dw));
        pp_status s = dw->nbytes && pp_tensor_numel(dy)
                          ? pp_conv_backward_filter(ctx, &p, x->data, dyd, dw->data)
                          : PP_OK;
        if (s != PP_OK) {
            pp_tensor_free(dw);
            return s;
        }
        ctx->out[0] = dw;
    }
    if (ctx->n_out > 1 && ctx->node->out[1] >= 0) {
        pp_tensor *db;
        PP_TRY(pp_tensor_new(PP_F32, 1, &p.C, &db));
        float *dbd = db->data;
        for (int64_t n = 0; n < p.N; n++)
            for (int64_t m = 0; m < p.C; m++)
                dbd[m] += pp_grad_vsum(dyd + (n * p.C + m) * p.IL, p.IL);
        ctx->out[1] = db;
    }
    return PP_OK;
}

const pp_op pp_ops_conv_transpose[] = {
    {"ConvTranspose", "", 2, 3, 1, 1, ct_check, ct_run},
    /* dY, W, shape_x -> dX */
    {"ConvTransposeGradInput", "pippin", 3, 3, 1, 1, ct_grad_check, ct_grad_input_run},
    /* dY, X, shape_w -> dW[, dB] */
    {"ConvTransposeGradWeight", "pippin", 3, 3, 1, 2, ct_grad_check, ct_grad_weight_run},
    {NULL},
};
