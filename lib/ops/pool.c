/* Pooling: MaxPool (with its optional Indices output), AveragePool,
 * GlobalAveragePool, GlobalMaxPool, and the pippin-domain helpers autodiff
 * emits for their gradients (MaxPoolGrad scatters dy to the argmax
 * positions, AveragePoolGrad spreads dy / count over each window, the
 * global ones broadcast dy back). float32, NC + 1 to 3 spatial dims; 1-D and
 * 2-D are padded out to 3-D with unit dims so one loop nest serves all. */
#include <math.h>
#include <string.h>

#include "grad_kernels.h"
#include "op.h"
#include "vec.h"

#include "status_internal.h"

/* Window geometry of one pool node on one input shape, as 3 spatial dims. */
typedef struct pool_geo {
    int nsp;                       /* spatial dims of the real input: 1..3 */
    int64_t nc;                    /* N * C */
    int64_t in[3], out[3];         /* spatial extents, leading unit dims added */
    int64_t k[3], s[3], d[3], pb[3], pe[3];
} pool_geo;

static int attr_ints(const pp_node *n, const char *name, int want, int64_t *v, int64_t def) {
    const int64_t *a = NULL;
    int na = pp_node_attr_ints(n, name, &a);
    for (int i = 0; i < want; i++) v[i] = def;
    if (na < 0) return 0;
    if (na != want) return -1;
    for (int i = 0; i < want; i++) v[i] = a[i];
    return 1;
}

#define POOL_ATTR_MAX (1 << 20) /* kernel, stride, dilation, pad: far above any real model */

/* Attribute checks shared by the load-time check and the kernels. */
static pp_status pool_attrs_ok(const pp_node *n, int *nsp) {
    const int64_t *ks = NULL;
    int nk = pp_node_attr_ints(n, "kernel_shape", &ks);
    if (nk < 1) return pp_node_error(n, PP_ERR_INVALID, "kernel_shape is required");
    if (nk > 3)
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "%d-D pooling is not supported (1-D to 3-D)", nk);
    /* bounded so that every index product below stays far from overflow */
    for (int i = 0; i < nk; i++)
        if (ks[i] < 1 || ks[i] > POOL_ATTR_MAX)
            return pp_node_error(n, PP_ERR_INVALID, "kernel_shape %lld: expected 1 to %d", (long long)ks[i],
                                 POOL_ATTR_MAX);
    int64_t st[3], dl[3], pd[6];
    if (attr_ints(n, "strides", nk, st, 1) < 0 || attr_ints(n, "dilations", nk, dl, 1) < 0 ||
        attr_ints(n, "pads", 2 * nk, pd, 0) < 0)
        return pp_node_error(n, PP_ERR_INVALID, "strides, dilations or pads do not match kernel_shape");
    for (int i = 0; i < nk; i++)
        if (st[i] < 1 || st[i] > POOL_ATTR_MAX || dl[i] < 1 || dl[i] > POOL_ATTR_MAX)
            return pp_node_error(n, PP_ERR_INVALID, "strides and dilations must be 1 to %d", POOL_ATTR_MAX);
    for (int i = 0; i < 2 * nk; i++)
        if (pd[i] < 0 || pd[i] > POOL_ATTR_MAX)
            return pp_node_error(n, PP_ERR_INVALID, "pads must be 0 to %d, not %lld", POOL_ATTR_MAX,
                                 (long long)pd[i]);
    const char *ap = pp_node_attr_string(n, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID") && strcmp(ap, "SAME_UPPER") &&
        strcmp(ap, "SAME_LOWER"))
        return pp_node_error(n, PP_ERR_INVALID, "unknown auto_pad '%s'", ap);
    *nsp = nk;
    return PP_OK;
}

static pp_status pool_check(const pp_graph *g, const pp_node *n) {
    int nsp;
    PP_TRY(pool_attrs_ok(n, &nsp));
    if (n->n_in > 0 && n->in[0] >= 0) {
        pp_dtype dt = g->values[n->in[0]].dtype;
        if (dt != PP_DTYPE_UNDEFINED && dt != PP_F32)
            return pp_node_error(n, PP_ERR_UNSUPPORTED, "pooling of %s is not supported (float32 only)",
                                 pp_dtype_name(dt));
    }
    return PP_OK;
}

static pp_status geo_init(const pp_kernel_ctx *ctx, int ndim, const int64_t *shape, pool_geo *g) {
    const pp_node *n = ctx->node;
    int nsp;
    PP_TRY(pool_attrs_ok(n, &nsp));
    if (ndim != nsp + 2)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "input has rank %d, kernel_shape wants %d", ndim,
                               nsp + 2);
    int64_t k[3], s[3], d[3], p[6];
    attr_ints(n, "kernel_shape", nsp, k, 1);
    attr_ints(n, "strides", nsp, s, 1);
    attr_ints(n, "dilations", nsp, d, 1);
    attr_ints(n, "pads", 2 * nsp, p, 0);
    int ceil_mode = pp_node_attr_int(n, "ceil_mode", 0) != 0;
    const char *ap = pp_node_attr_string(n, "auto_pad", "NOTSET");
    memset(g, 0, sizeof *g);
    g->nsp = nsp;
    g->nc = shape[0] * shape[1];
    int off = 3 - nsp;
    for (int i = 0; i < 3; i++) {
        g->in[i] = g->out[i] = g->k[i] = g->s[i] = g->d[i] = 1;
    }
    for (int i = 0; i < nsp; i++) {
        int j = off + i;
        int64_t in = shape[2 + i], ext = (k[i] - 1) * d[i] + 1, pb = p[i], pe = p[nsp + i], out;
        if (s[i] < 1 || d[i] < 1)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "strides and dilations must be positive");
        if (strcmp(ap, "VALID") == 0) {
            pb = pe = 0;
            out = in >= ext ? (in - ext) / s[i] + 1 : 0;
        } else if (strncmp(ap, "SAME", 4) == 0) {
            out = (in + s[i] - 1) / s[i];
            int64_t total = (out - 1) * s[i] + ext - in;
            if (total < 0) total = 0;
            pb = strcmp(ap, "SAME_UPPER") == 0 ? total / 2 : total - total / 2;
            pe = total - pb;
        } else {
            int64_t span = in + pb + pe - ext;
            if (span < 0) out = 0;
            else {
                out = (ceil_mode ? (span + s[i] - 1) / s[i] : span / s[i]) + 1;
                /* the last window must start inside the input or the left padding */
                if (ceil_mode && (out - 1) * s[i] >= in + pb) out--;
            }
        }
        g->in[j] = in;
        g->out[j] = out;
        g->k[j] = k[i];
        g->s[j] = s[i];
        g->d[j] = d[i];
        g->pb[j] = pb;
        g->pe[j] = pe;
    }
    return PP_OK;
}

static void out_shape(const pool_geo *g, const int64_t *xshape, int64_t *shape) {
    shape[0] = xshape[0];
    shape[1] = xshape[1];
    for (int i = 0; i < g->nsp; i++) shape[2 + i] = g->out[3 - g->nsp + i];
}

/* Window start and the first/last (exclusive) tap inside [0, in). */
static inline void taps(const pool_geo *g, int dim, int64_t o, int64_t *start, int64_t *k0,
                        int64_t *k1) {
    int64_t st = o * g->s[dim] - g->pb[dim], d = g->d[dim], k = g->k[dim], in = g->in[dim];
    int64_t a = 0, b = k;
    if (st < 0) a = (-st + d - 1) / d;
    if (st + (k - 1) * d >= in) b = in - st <= 0 ? 0 : (in - st + d - 1) / d;
    if (a > b) a = b;
    *start = st;
    *k0 = a;
    *k1 = b;
}

/* ------------------------------------------------------------------ MaxPool */

/* y (may be NULL) and idx (may be NULL) for every output position; idx is
 * the flat index into x (NCHW, storage order 0), -1 for an empty window. */
static void maxpool_f32(const pool_geo *g, int colmajor, const float *restrict x,
                        float *restrict y, int64_t *restrict idx) {
    int64_t plane = g->in[0] * g->in[1] * g->in[2], oplane = g->out[0] * g->out[1] * g->out[2];
    for (int64_t c = 0; c < g->nc; c++) {
        const float *xc = x + c * plane;
        int64_t o = c * oplane;
        for (int64_t od = 0; od < g->out[0]; od++) {
            int64_t sd, ad, bd;
            taps(g, 0, od, &sd, &ad, &bd);
            for (int64_t oh = 0; oh < g->out[1]; oh++) {
                int64_t sh, ah, bh;
                taps(g, 1, oh, &sh, &ah, &bh);
                for (int64_t ow = 0; ow < g->out[2]; ow++, o++) {
                    int64_t sw, aw, bw;
                    taps(g, 2, ow, &sw, &aw, &bw);
                    float m = -INFINITY;
                    int64_t mi = -1;
                    for (int64_t kd = ad; kd < bd; kd++) {
                        int64_t id = sd + kd * g->d[0];
                        for (int64_t kh = ah; kh < bh; kh++) {
                            int64_t row = (id * g->in[1] + sh + kh * g->d[1]) * g->in[2];
                            if (g->d[2] == 1) {
                                const float *xr = xc + row + sw;
                                for (int64_t kw = aw; kw < bw; kw++)
                                    if (xr[kw] > m || mi < 0) {
                                        m = xr[kw];
                                        mi = row + sw + kw;
                                    }
                            } else {
                                for (int64_t kw = aw; kw < bw; kw++) {
                                    int64_t p = row + sw + kw * g->d[2];
                                    if (xc[p] > m || mi < 0) {
                                        m = xc[p];
                                        mi = p;
                                    }
                                }
                            }
                        }
                    }
                    if (y) y[o] = m;
                    if (idx && mi >= 0 && colmajor) { /* storage_order 1: (w * H + h) * D + d */
                        int64_t iw = mi % g->in[2], ih = mi / g->in[2] % g->in[1],
                                id = mi / (g->in[2] * g->in[1]);
                        mi = (iw * g->in[1] + ih) * g->in[0] + id;
                    }
                    if (idx) idx[o] = mi < 0 ? -1 : c * plane + mi;
                }
            }
        }
    }
}

static pp_status f32_input(const pp_kernel_ctx *ctx, const pp_tensor **x) {
    if (ctx->n_in < 1 || !ctx->in[0]) return pp_kernel_error(ctx, PP_ERR_INVALID, "missing input X");
    if (ctx->in[0]->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "pooling of %s is not supported (float32 only)",
                               pp_dtype_name(ctx->in[0]->dtype));
    *x = ctx->in[0];
    return PP_OK;
}

static pp_status maxpool_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x;
    PP_TRY(f32_input(ctx, &x));
    pool_geo g;
    PP_TRY(geo_init(ctx, x->ndim, x->shape, &g));
    int64_t shape[PP_MAX_DIMS];
    out_shape(&g, x->shape, shape);
    pp_tensor *y = NULL, *idx = NULL;
    int want_y = ctx->node->out[0] >= 0, want_i = ctx->n_out > 1 && ctx->node->out[1] >= 0;
    if (want_y) PP_TRY(pp_tensor_empty(PP_F32, x->ndim, shape, &y));
    if (want_i) {
        pp_status s = pp_tensor_empty(PP_I64, x->ndim, shape, &idx);
        if (s != PP_OK) {
            pp_tensor_free(y);
            return s;
        }
    }
    int colmajor = pp_node_attr_int(ctx->node, "storage_order", 0) != 0;
    maxpool_f32(&g, colmajor, x->data, y ? y->data : NULL, idx ? idx->data : NULL);
    ctx->out[0] = y;
    if (want_i) ctx->out[1] = idx;
    return PP_OK;
}

/* -------------------------------------------------------------- AveragePool */

/* The divisor of one window: taps inside the input (count_include_pad 0) or
 * inside the padded input (1). */
static inline int64_t avg_count(const pool_geo *g, int include_pad, const int64_t *st,
                                const int64_t *a, const int64_t *b) {
    int64_t cnt = 1;
    for (int i = 0; i < 3; i++) {
        if (!include_pad) {
            cnt *= b[i] - a[i];
            continue;
        }
        int64_t n = 0, d = g->d[i];
        for (int64_t k = 0; k < g->k[i]; k++) {
            int64_t p = st[i] + k * d;
            if (p >= -g->pb[i] && p < g->in[i] + g->pe[i]) n++;
        }
        cnt *= n;
    }
    return cnt;
}

/* grad 0: y = avg(x) over windows; grad 1: dx += dy / count (x zeroed). */
static void avgpool_f32(const pool_geo *g, int include_pad, int grad, float *restrict x,
                        float *restrict y) {
    int64_t plane = g->in[0] * g->in[1] * g->in[2], oplane = g->out[0] * g->out[1] * g->out[2];
    for (int64_t c = 0; c < g->nc; c++) {
        float *xc = x + c * plane;
        int64_t o = c * oplane;
        for (int64_t od = 0; od < g->out[0]; od++) {
            int64_t st[3], a[3], b[3];
            taps(g, 0, od, &st[0], &a[0], &b[0]);
            for (int64_t oh = 0; oh < g->out[1]; oh++) {
                taps(g, 1, oh, &st[1], &a[1], &b[1]);
                for (int64_t ow = 0; ow < g->out[2]; ow++, o++) {
                    taps(g, 2, ow, &st[2], &a[2], &b[2]);
                    int64_t cnt = avg_count(g, include_pad, st, a, b);
                    float acc = 0, share = grad && cnt ? y[o] / (float)cnt : 0;
                    for (int64_t kd = a[0]; kd < b[0]; kd++) {
                        int64_t id = st[0] + kd * g->d[0];
                        for (int64_t kh = a[1]; kh < b[1]; kh++) {
                            float *xr = xc + (id * g->in[1] + st[1] + kh * g->d[1]) * g->in[2] + st[2];
                            if (grad)
                                for (int64_t kw = a[2]; kw < b[2]; kw++) xr[kw * g->d[2]] += share;
                            else
                                for (int64_t kw = a[2]; kw < b[2]; kw++) acc += xr[kw * g->d[2]];
                        }
                    }
                    if (!grad) y[o] = cnt ? acc / (float)cnt : 0.0f;
                }
            }
        }
    }
}

static pp_status avgpool_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x;
    PP_TRY(f32_input(ctx, &x));
    pool_geo g;
    PP_TRY(geo_init(ctx, x->ndim, x->shape, &g));
    int64_t shape[PP_MAX_DIMS];
    out_shape(&g, x->shape, shape);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, shape, &y));
    avgpool_f32(&g, pp_node_attr_int(ctx->node, "count_include_pad", 0) != 0, 0, x->data, y->data);
    ctx->out[0] = y;
    return PP_OK;
}

/* -------------------------------------------------------------- Global pools */

static pp_status global_geo(const pp_kernel_ctx *ctx, const pp_tensor *x, int64_t *nc,
                            int64_t *plane, int64_t *shape) {
    if (x->ndim < 2)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "input must have rank >= 2 (N, C, ...)");
    *nc = x->shape[0] * x->shape[1];
    *plane = 1;
    for (int i = 0; i < x->ndim; i++) {
        shape[i] = i < 2 ? x->shape[i] : 1;
        if (i >= 2) *plane *= x->shape[i];
    }
    return PP_OK;
}

static pp_status global_run(pp_kernel_ctx *ctx, int is_max) {
    const pp_tensor *x;
    PP_TRY(f32_input(ctx, &x));
    int64_t nc, plane, shape[PP_MAX_DIMS];
    PP_TRY(global_geo(ctx, x, &nc, &plane, shape));
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, shape, &y));
    const float *xd = x->data;
    float *yd = y->data;
    for (int64_t c = 0; c < nc; c++) {
        const float *restrict xc = xd + c * plane;
        if (is_max) {
            float m = plane ? xc[0] : -INFINITY;
            for (int64_t i = 1; i < plane; i++) m = xc[i] > m ? xc[i] : m;
            yd[c] = m;
        } else {
            double acc = 0;
            for (int64_t i = 0; i < plane; i++) acc += xc[i];
            yd[c] = plane ? (float)(acc / (double)plane) : 0.0f;
        }
    }
    ctx->out[0] = y;
    return PP_OK;
}

static pp_status gavg_run(pp_kernel_ctx *ctx) { return global_run(ctx, 0); }
static pp_status gmax_run(pp_kernel_ctx *ctx) { return global_run(ctx, 1); }

static pp_status global_check(const pp_graph *g, const pp_node *n) {
    if (n->n_in > 0 && n->in[0] >= 0) {
        pp_dtype dt = g->values[n->in[0]].dtype;
        if (dt != PP_DTYPE_UNDEFINED && dt != PP_F32)
            return pp_node_error(n, PP_ERR_UNSUPPORTED, "pooling of %s is not supported (float32 only)",
                                 pp_dtype_name(dt));
    }
    return PP_OK;
}

/* ------------------------------------------------------------ Gradient helpers */

/* dx of shape shape_x (input k), zeroed. */
static pp_status zero_dx(pp_kernel_ctx *ctx, int k, int *ndim, int64_t *shape, pp_tensor **dx) {
    PP_TRY(pp_grad_k_shape(ctx, k, ndim, shape));
    PP_TRY(pp_tensor_empty(PP_F32, *ndim, shape, dx));
    memset((*dx)->data, 0, sizeof(float) * (size_t)pp_tensor_numel(*dx));
    return PP_OK;
}

/* pippin::MaxPoolGrad(dy, indices, shape_x): dx[indices[i]] += dy[i]. */
static pp_status maxpool_grad_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    const pp_tensor *dy = ctx->in[0], *ix = ctx->n_in > 1 ? ctx->in[1] : NULL;
    if (!ix || ix->dtype != PP_I64 || pp_tensor_numel(ix) != pp_tensor_numel(dy))
        return pp_kernel_error(ctx, PP_ERR_INVALID, "indices must be int64 with dy's element count");
    int nd;
    int64_t shape[PP_MAX_DIMS];
    pp_tensor *dx;
    PP_TRY(zero_dx(ctx, 2, &nd, shape, &dx));
    const float *g = dy->data;
    const int64_t *id = ix->data;
    float *o = dx->data;
    int64_t n = pp_tensor_numel(dy), nx = pp_tensor_numel(dx);
    for (int64_t i = 0; i < n; i++) {
        if (id[i] < 0) continue;
        if (id[i] >= nx) {
            pp_tensor_free(dx);
            return pp_kernel_error(ctx, PP_ERR_INVALID, "index %lld out of range", (long long)id[i]);
        }
        o[id[i]] += g[i];
    }
    ctx->out[0] = dx;
    return PP_OK;
}

/* pippin::AveragePoolGrad(dy, shape_x), the forward's attributes copied. */
static pp_status avgpool_grad_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    int nd;
    int64_t shape[PP_MAX_DIMS], ys[PP_MAX_DIMS];
    pp_tensor *dx;
    PP_TRY(zero_dx(ctx, 1, &nd, shape, &dx));
    pool_geo g;
    pp_status s = geo_init(ctx, nd, shape, &g);
    if (s == PP_OK) {
        out_shape(&g, shape, ys);
        if (!pp_shape_equal(nd, ys, ctx->in[0]->ndim, ctx->in[0]->shape))
            s = pp_kernel_error(ctx, PP_ERR_SHAPE, "dy does not have the pooled shape");
    }
    if (s != PP_OK) {
        pp_tensor_free(dx);
        return s;
    }
    avgpool_f32(&g, pp_node_attr_int(ctx->node, "count_include_pad", 0) != 0, 1, dx->data,
                ctx->in[0]->data);
    ctx->out[0] = dx;
    return PP_OK;
}

/* pippin::GlobalAveragePoolGrad(dy, shape_x): dx = dy / plane, broadcast. */
static pp_status gavg_grad_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    int nd;
    int64_t shape[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 1, &nd, shape));
    if (nd < 2) return pp_kernel_error(ctx, PP_ERR_SHAPE, "shape_x must have rank >= 2");
    int64_t nc = shape[0] * shape[1], plane = 1;
    for (int i = 2; i < nd; i++) plane *= shape[i];
    if (pp_tensor_numel(ctx->in[0]) != nc)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy must have N*C elements");
    pp_tensor *dx;
    PP_TRY(pp_tensor_empty(PP_F32, nd, shape, &dx));
    const float *g = ctx->in[0]->data;
    float *o = dx->data;
    for (int64_t c = 0; c < nc; c++) {
        const float v = g[c] / (float)plane;
        float *restrict oc = o + c * plane;
        PP_VFOR(i, plane, oc[i] = v;);
    }
    ctx->out[0] = dx;
    return PP_OK;
}

/* pippin::GlobalMaxPoolGrad(dy, x): dy to the first maximum of each plane. */
static pp_status gmax_grad_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "x"));
    const pp_tensor *x = ctx->in[1];
    int64_t nc, plane, shape[PP_MAX_DIMS];
    PP_TRY(global_geo(ctx, x, &nc, &plane, shape));
    if (pp_tensor_numel(ctx->in[0]) != nc)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy must have N*C elements");
    pp_tensor *dx;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, x->shape, &dx));
    memset(dx->data, 0, sizeof(float) * (size_t)pp_tensor_numel(dx));
    const float *xd = x->data, *g = ctx->in[0]->data;
    float *o = dx->data;
    for (int64_t c = 0; c < nc; c++) {
        const float *xc = xd + c * plane;
        int64_t mi = 0;
        for (int64_t i = 1; i < plane; i++)
            if (xc[i] > xc[mi]) mi = i;
        if (plane) o[c * plane + mi] = g[c];
    }
    ctx->out[0] = dx;
    return PP_OK;
}

const pp_op pp_ops_pool[] = {
    {"MaxPool", "", 1, 1, 1, 2, pool_check, maxpool_run},
    {"AveragePool", "", 1, 1, 1, 1, pool_check, avgpool_run},
    {"GlobalAveragePool", "", 1, 1, 1, 1, global_check, gavg_run},
    {"GlobalMaxPool", "", 1, 1, 1, 1, global_check, gmax_run},
    /* dy, indices, shape_x -> dx */
    {"MaxPoolGrad", "pippin", 3, 3, 1, 1, NULL, maxpool_grad_run},
    /* dy, shape_x -> dx (AveragePool's attributes) */
    {"AveragePoolGrad", "pippin", 2, 2, 1, 1, NULL, avgpool_grad_run},
    /* dy, shape_x -> dx */
    {"GlobalAveragePoolGrad", "pippin", 2, 2, 1, 1, NULL, gavg_grad_run},
    /* dy, x -> dx */
    {"GlobalMaxPoolGrad", "pippin", 2, 2, 1, 1, NULL, gmax_grad_run},
    {NULL},
};
