/* Misc family: CumSum, Mish (and pippin::MishGrad), ScatterElements,
 * ScatterND, InstanceNormalization, TopK, Einsum, and the pippin-domain
 * helpers the gradients of Tile (pippin::TileGrad: the sum over tiles) and
 * GatherElements and TopK (pippin::GatherElementsGrad: a scatter-add of dy
 * into zeros) emit. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shape_kernels.h"

#include "status_internal.h"

/* CumSum(x, axis) with attributes exclusive and reverse; float32, float64,
 * int32 and int64. */
#define CUMSUM_LOOP(T, A) /* A: the accumulator (unsigned for ints: wraps, no UB) */                                                                           \
    do {                                                                                         \
        const T *src = (const T *)x->data;                                                       \
        T *dst = (T *)y->data;                                                                   \
        for (int64_t o = 0; o < outer; o++)                                                      \
            for (int64_t i = 0; i < inner; i++) {                                                \
                A acc = 0;                                                                       \
                for (int64_t k = 0; k < len; k++) {                                              \
                    int64_t kk = reverse ? len - 1 - k : k;                                      \
                    int64_t at = (o * len + kk) * inner + i;                                     \
                    if (exclusive) {                                                             \
                        dst[at] = (T)acc;                                                           \
                        acc += (A)src[at];                                                          \
                    } else {                                                                     \
                        acc += (A)src[at];                                                          \
                        dst[at] = (T)acc;                                                           \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
    } while (0)

static pp_status cumsum_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    int64_t ax[1];
    int n_ax;
    PP_TRY(pp_read_ints(ctx, ctx->in[1], "axis", ax, 1, &n_ax));
    if (n_ax != 1) return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis must hold one value");
    int nd = x->ndim, axis = pp_norm_axis(ax[0], nd);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               ax[0], nd);
    int exclusive = pp_node_attr_int(ctx->node, "exclusive", 0) != 0;
    int reverse = pp_node_attr_int(ctx->node, "reverse", 0) != 0;
    int64_t outer = 1, inner = 1, len = x->shape[axis];
    for (int i = 0; i < axis; i++) outer *= x->shape[i];
    for (int i = axis + 1; i < nd; i++) inner *= x->shape[i];
    pp_tensor *y;
    switch (x->dtype) {
    case PP_F32:
    case PP_F64:
    case PP_I32:
    case PP_I64: break;
    default:
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "CumSum of %s",
                               pp_dtype_name(x->dtype));
    }
    PP_TRY(pp_tensor_empty(x->dtype, nd, x->shape, &y));
    switch (x->dtype) {
    case PP_F32: CUMSUM_LOOP(float, float); break;
    case PP_F64: CUMSUM_LOOP(double, double); break;
    case PP_I32: CUMSUM_LOOP(int32_t, uint32_t); break;
    default: CUMSUM_LOOP(int64_t, uint64_t); break;
    }
    ctx->out[0] = y;
    return PP_OK;
}

static pp_status cumsum_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    int64_t e = pp_node_attr_int(n, "exclusive", 0), r = pp_node_attr_int(n, "reverse", 0);
    if ((e != 0 && e != 1) || (r != 0 && r != 1))
        return pp_node_error(n, PP_ERR_INVALID, "exclusive and reverse must be 0 or 1");
    return PP_OK;
}

/* Reads a shape tensor (1-d int64) of rank nd into shape. */
static pp_status read_shape(pp_kernel_ctx *ctx, const pp_tensor *t, int64_t *shape, int *nd) {
    PP_TRY(pp_read_ints(ctx, t, "shape", shape, PP_MAX_DIMS, nd));
    for (int i = 0; i < *nd; i++)
        if (shape[i] < 0) return pp_kernel_error(ctx, PP_ERR_SHAPE, "negative dim in shape");
    return PP_OK;
}

/* pippin::TileGrad(dy, shape_x) -> dx: dx[i] = sum of dy[j] over j with
 * j mod shape_x == i in every dim (float32). */
static pp_status tile_grad_run(pp_kernel_ctx *ctx) {
    const pp_tensor *dy = ctx->in[0];
    int64_t shape[PP_MAX_DIMS];
    int nd;
    PP_TRY(read_shape(ctx, ctx->in[1], shape, &nd));
    if (dy->dtype != PP_F32) return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "dy must be float32");
    if (nd != dy->ndim) return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and shape differ in rank");
    for (int i = 0; i < nd; i++)
        if (shape[i] == 0 ? dy->shape[i] != 0 : dy->shape[i] % shape[i] != 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy dim %d (%" PRId64 ") is not a multiple"
                                   " of %" PRId64, i, dy->shape[i], shape[i]);
    pp_tensor *dx;
    PP_TRY(pp_tensor_new(PP_F32, nd, shape, &dx));
    int64_t n = pp_tensor_numel(dy), xs[PP_MAX_DIMS], pos[PP_MAX_DIMS] = {0};
    pp_contiguous_strides(nd, shape, xs);
    const float *g = dy->data;
    float *out = dx->data;
    for (int64_t j = 0; j < n; j++) {
        int64_t at = 0;
        for (int d = 0; d < nd; d++) at += (pos[d] % shape[d]) * xs[d];
        out[at] += g[j];
        for (int d = nd - 1; d >= 0; d--) {
            if (++pos[d] < dy->shape[d]) break;
            pos[d] = 0;
        }
    }
    ctx->out[0] = dx;
    return PP_OK;
}

/* pippin::GatherElementsGrad(dy, indices, shape_x), attribute axis -> dx:
 * zeros of shape_x with dx[.., indices[j], ..] += dy[j] (float32). */
static pp_status gather_elements_grad_run(pp_kernel_ctx *ctx) {
    const pp_tensor *dy = ctx->in[0], *idx = ctx->in[1];
    int64_t shape[PP_MAX_DIMS];
    int nd;
    PP_TRY(read_shape(ctx, ctx->in[2], shape, &nd));
    int64_t axis_attr = pp_node_attr_int(ctx->node, "axis", 0);
    int axis = pp_norm_axis(axis_attr, nd);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, nd);
    if (dy->dtype != PP_F32) return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "dy must be float32");
    if (idx->dtype != PP_I64 && idx->dtype != PP_I32)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices must be int64 or int32");
    if (dy->ndim != nd || idx->ndim != nd)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy, indices and shape differ in rank");
    for (int i = 0; i < nd; i++)
        if (dy->shape[i] != idx->shape[i] || (i != axis && idx->shape[i] > shape[i]))
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy, indices and shape do not fit");
    pp_tensor *dx;
    PP_TRY(pp_tensor_new(PP_F32, nd, shape, &dx));
    int64_t n = pp_tensor_numel(idx), xs[PP_MAX_DIMS], pos[PP_MAX_DIMS] = {0}, dim = shape[axis];
    pp_contiguous_strides(nd, shape, xs);
    const float *g = dy->data;
    float *out = dx->data;
    for (int64_t j = 0; j < n; j++) {
        int64_t v = pp_tensor_get_i64(idx, j);
        if (v < -dim || v >= dim) {
            pp_tensor_free(dx);
            return pp_kernel_error(ctx, PP_ERR_INVALID, "index %" PRId64 " out of range for axis"
                                   " %d of size %" PRId64, v, axis, dim);
        }
        if (v < 0) v += dim;
        int64_t at = 0;
        for (int d = 0; d < nd; d++) at += (d == axis ? v : pos[d]) * xs[d];
        out[at] += g[j];
        for (int d = nd - 1; d >= 0; d--) {
            if (++pos[d] < idx->shape[d]) break;
            pos[d] = 0;
        }
    }
    ctx->out[0] = dx;
    return PP_OK;
}

/* Mish(x) = x * tanh(softplus(x)); pippin::MishGrad(dy, x) = dy * d/dx
 * (float32). */
static float softplus1(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static pp_status mish_like(pp_kernel_ctx *ctx, int grad) {
    const pp_tensor *x = ctx->in[grad], *dy = grad ? ctx->in[0] : NULL;
    if (x->dtype != PP_F32 || (dy && dy->dtype != PP_F32))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "float32 only, got %s",
                               pp_dtype_name(dy && dy->dtype != PP_F32 ? dy->dtype : x->dtype));
    if (dy && (dy->ndim != x->ndim ||
               memcmp(dy->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim)))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and x differ in shape");
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, x->shape, &y));
    int64_t n = pp_tensor_numel(x);
    const float *xv = x->data, *g = dy ? dy->data : NULL;
    float *out = y->data;
    for (int64_t i = 0; i < n; i++) {
        float v = xv[i], t = tanhf(softplus1(v));
        if (!grad) {
            out[i] = v * t;
        } else {
            float sig = 1.0f / (1.0f + expf(-v));
            out[i] = g[i] * (t + v * (1.0f - t * t) * sig);
        }
    }
    ctx->out[0] = y;
    return PP_OK;
}
static pp_status mish_run(pp_kernel_ctx *ctx) { return mish_like(ctx, 0); }
static pp_status mish_grad_run(pp_kernel_ctx *ctx) { return mish_like(ctx, 1); }

/* ------------------------------------------- ScatterElements, ScatterND */

enum { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN };

static pp_status scatter_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const char *r = pp_node_attr_string(n, "reduction", "none");
    if (strcmp(r, "none") && strcmp(r, "add") && strcmp(r, "mul") && strcmp(r, "max") &&
        strcmp(r, "min"))
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "reduction '%s'", r);
    return PP_OK;
}

/* The reduction and whether the data type supports it. */
static pp_status scatter_reduction(pp_kernel_ctx *ctx, pp_dtype dt, int *red) {
    const char *r = pp_node_attr_string(ctx->node, "reduction", "none");
    *red = !strcmp(r, "add") ? RED_ADD : !strcmp(r, "mul") ? RED_MUL : !strcmp(r, "max") ? RED_MAX
         : !strcmp(r, "min") ? RED_MIN : RED_NONE;
    if (*red != RED_NONE && dt != PP_F32 && dt != PP_F64 && dt != PP_I32 && dt != PP_I64)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "reduction '%s' on %s", r,
                               pp_dtype_name(dt));
    return PP_OK;
}

#define RED_APPLY(T, d, s)                                                                       \
    do {                                                                                         \
        T *dp_ = (T *)(d);                                                                       \
        T sv_ = *(const T *)(s);                                                                 \
        switch (red) {                                                                           \
        case RED_ADD: *dp_ += sv_; break;                                                        \
        case RED_MUL: *dp_ *= sv_; break;                                                        \
        case RED_MAX: if (sv_ > *dp_) *dp_ = sv_; break;                                         \
        default: if (sv_ < *dp_) *dp_ = sv_; break;                                              \
        }                                                                                        \
    } while (0)

/* dst (op)= src for one element of dt. */
static void scatter_one(char *dst, const char *src, pp_dtype dt, size_t es, int red) {
    if (red == RED_NONE) {
        pp_copy_elem(dst, src, es);
        return;
    }
    switch (dt) {
    case PP_F32: RED_APPLY(float, dst, src); break;
    case PP_F64: RED_APPLY(double, dst, src); break;
    case PP_I32: RED_APPLY(int32_t, dst, src); break;
    default: RED_APPLY(int64_t, dst, src); break;
    }
}

static pp_status copy_of(const pp_tensor *x, pp_tensor **out) {
    PP_TRY(pp_tensor_empty(x->dtype, x->ndim, x->shape, out));
    if (x->nbytes) memcpy((*out)->data, x->data, x->nbytes);
    return PP_OK;
}

/* ScatterElements(data, indices, updates), attributes axis, reduction. */
static pp_status scatter_elements_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *idx = ctx->in[1], *upd = ctx->in[2];
    int64_t axis_attr = pp_node_attr_int(ctx->node, "axis", 0);
    int nd = x->ndim, axis = pp_norm_axis(axis_attr, nd), red;
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, nd);
    PP_TRY(scatter_reduction(ctx, x->dtype, &red));
    char a[128], b[128];
    if (idx->dtype != PP_I64 && idx->dtype != PP_I32)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices must be int64 or int32");
    if (upd->dtype != x->dtype)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "updates are %s, data %s",
                               pp_dtype_name(upd->dtype), pp_dtype_name(x->dtype));
    if (idx->ndim != nd || upd->ndim != nd)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices %s, updates and data %s differ in rank",
                               pp_shape_s(idx, a, sizeof a), pp_shape_s(x, b, sizeof b));
    for (int i = 0; i < nd; i++)
        if (idx->shape[i] != upd->shape[i] || (i != axis && idx->shape[i] > x->shape[i]))
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices %s do not fit data %s",
                                   pp_shape_s(idx, a, sizeof a), pp_shape_s(x, b, sizeof b));
    int64_t n = pp_tensor_numel(idx), dim = x->shape[axis];
    for (int64_t j = 0; j < n; j++) {
        int64_t v = pp_tensor_get_i64(idx, j);
        if (v < -dim || v >= dim)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "index %" PRId64 " (at %" PRId64
                                   ") out of range for axis %d of size %" PRId64, v, j, axis, dim);
    }
    pp_tensor *y;
    PP_TRY(copy_of(x, &y));
    size_t es = pp_dtype_size(x->dtype);
    int64_t xs[PP_MAX_DIMS], pos[PP_MAX_DIMS] = {0};
    pp_contiguous_strides(nd, x->shape, xs);
    for (int64_t j = 0; j < n; j++) {
        int64_t v = pp_tensor_get_i64(idx, j), at = 0;
        if (v < 0) v += dim;
        for (int d = 0; d < nd; d++) at += (d == axis ? v : pos[d]) * xs[d];
        scatter_one((char *)y->data + (size_t)at * es, (const char *)upd->data + (size_t)j * es,
                    x->dtype, es, red);
        for (int d = nd - 1; d >= 0; d--) {
            if (++pos[d] < idx->shape[d]) break;
            pos[d] = 0;
        }
    }
    ctx->out[0] = y;
    return PP_OK;
}

/* ScatterND(data, indices, updates), attribute reduction. */
static pp_status scatter_nd_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *idx = ctx->in[1], *upd = ctx->in[2];
    int r = x->ndim, q = idx->ndim, red;
    PP_TRY(scatter_reduction(ctx, x->dtype, &red));
    char a[128], b[128], c[128];
    if (idx->dtype != PP_I64 && idx->dtype != PP_I32)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices must be int64 or int32");
    if (upd->dtype != x->dtype)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "updates are %s, data %s",
                               pp_dtype_name(upd->dtype), pp_dtype_name(x->dtype));
    int64_t k = q >= 1 ? idx->shape[q - 1] : -1;
    int ok = q >= 1 && r >= 1 && k >= 1 && k <= r && upd->ndim == q - 1 + r - (int)k;
    for (int i = 0; ok && i < q - 1; i++) ok = upd->shape[i] == idx->shape[i];
    for (int i = 0; ok && i < r - k; i++) ok = upd->shape[q - 1 + i] == x->shape[k + i];
    if (!ok)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "data %s, indices %s and updates %s do not fit",
                               pp_shape_s(x, a, sizeof a), pp_shape_s(idx, b, sizeof b),
                               pp_shape_s(upd, c, sizeof c));
    int64_t xs[PP_MAX_DIMS], n_tuples = 1, slice = 1;
    pp_contiguous_strides(r, x->shape, xs);
    for (int i = 0; i < q - 1; i++) n_tuples *= idx->shape[i];
    for (int i = (int)k; i < r; i++) slice *= x->shape[i];
    for (int64_t t = 0; t < n_tuples; t++)
        for (int64_t m = 0; m < k; m++) {
            int64_t v = pp_tensor_get_i64(idx, t * k + m), dim = x->shape[m];
            if (v < -dim || v >= dim)
                return pp_kernel_error(ctx, PP_ERR_INVALID, "index %" PRId64 " out of range for"
                                       " dim %d of size %" PRId64, v, (int)m, dim);
        }
    pp_tensor *y;
    PP_TRY(copy_of(x, &y));
    size_t es = pp_dtype_size(x->dtype);
    for (int64_t t = 0; t < n_tuples; t++) {
        int64_t off = 0;
        for (int64_t m = 0; m < k; m++) {
            int64_t v = pp_tensor_get_i64(idx, t * k + m);
            off += (v < 0 ? v + x->shape[m] : v) * xs[m];
        }
        for (int64_t s = 0; s < slice; s++)
            scatter_one((char *)y->data + (size_t)(off + s) * es,
                        (const char *)upd->data + (size_t)(t * slice + s) * es, x->dtype, es, red);
    }
    ctx->out[0] = y;
    return PP_OK;
}

/* ---------------------------------------------------- InstanceNormalization */

/* InstanceNormalization(x [N,C,...], scale [C], B [C]), attribute epsilon:
 * each (n, c) plane normalized by its own mean and variance (float32). */
static pp_status instance_norm_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *sc = ctx->in[1], *bias = ctx->in[2];
    float eps = pp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    if (x->dtype != PP_F32 || sc->dtype != PP_F32 || bias->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "float32 only");
    char a[128], b[128];
    if (x->ndim < 2)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "input %s has rank below 2",
                               pp_shape_s(x, a, sizeof a));
    int64_t nb = x->shape[0], ch = x->shape[1], plane = 1;
    for (int i = 2; i < x->ndim; i++) plane *= x->shape[i];
    if (pp_tensor_numel(sc) != ch || pp_tensor_numel(bias) != ch || sc->ndim != 1 ||
        bias->ndim != 1)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "scale %s and B must be [%" PRId64 "]",
                               pp_shape_s(sc, b, sizeof b), ch);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, x->shape, &y));
    const float *xv = x->data, *sv = sc->data, *bv = bias->data;
    float *out = y->data;
    for (int64_t i = 0; i < nb * ch; i++) {
        const float *p = xv + i * plane;
        float *o = out + i * plane;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < plane; j++) mean += p[j];
        mean = plane ? mean / (double)plane : 0;
        for (int64_t j = 0; j < plane; j++) var += (p[j] - mean) * (p[j] - mean);
        var = plane ? var / (double)plane : 0;
        double inv = 1.0 / sqrt(var + eps), g = sv[i % ch] * inv;
        for (int64_t j = 0; j < plane; j++) o[j] = (float)((p[j] - mean) * g + bv[i % ch]);
    }
    ctx->out[0] = y;
    return PP_OK;
}

/* ------------------------------------------------------------------ TopK */

typedef struct {
    double v;
    int64_t i;
} topk_item;

/* Larger first (NaN above everything), ties by lower index. */
static int topk_desc(const void *pa, const void *pb) {
    const topk_item *a = pa, *b = pb;
    int na = a->v != a->v, nb = b->v != b->v;
    if (na != nb) return na ? -1 : 1;
    if (!na && a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}
/* Smaller first (NaN below everything), ties by lower index. */
static int topk_asc(const void *pa, const void *pb) {
    const topk_item *a = pa, *b = pb;
    int na = a->v != a->v, nb = b->v != b->v;
    if (na != nb) return na ? 1 : -1;
    if (!na && a->v != b->v) return a->v < b->v ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static pp_status topk_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    if (pp_node_attr_int(n, "sorted", 1) != 1)
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "sorted=0 (pippin always sorts)");
    return PP_OK;
}

/* TopK(X, K) -> Values, Indices; attributes axis, largest; sorted output
 * (ties: the lower index first). float32, float64, int32, int64 (compared as
 * doubles, so int64 beyond 2^53 may tie). */
static pp_status topk_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    int64_t kv[1];
    int nk;
    PP_TRY(pp_read_ints(ctx, ctx->in[1], "K", kv, 1, &nk));
    int64_t axis_attr = pp_node_attr_int(ctx->node, "axis", -1);
    int nd = x->ndim, axis = pp_norm_axis(axis_attr, nd);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, nd);
    if (x->dtype != PP_F32 && x->dtype != PP_F64 && x->dtype != PP_I32 && x->dtype != PP_I64)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "TopK of %s", pp_dtype_name(x->dtype));
    int64_t len = x->shape[axis], k = nk == 1 ? kv[0] : -1;
    if (k < 0 || k > len)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "K %" PRId64 " out of range for axis of size %"
                               PRId64, k, len);
    int largest = pp_node_attr_int(ctx->node, "largest", 1) != 0;
    int64_t outer = 1, inner = 1, shape[PP_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = i == axis ? k : x->shape[i];
    for (int i = 0; i < axis; i++) outer *= x->shape[i];
    for (int i = axis + 1; i < nd; i++) inner *= x->shape[i];
    topk_item *items = malloc(sizeof *items * (size_t)(len ? len : 1));
    if (!items) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory");
    pp_tensor *vals = NULL, *idx = NULL;
    pp_status st = pp_tensor_empty(x->dtype, nd, shape, &vals);
    if (st == PP_OK) st = pp_tensor_empty(PP_I64, nd, shape, &idx);
    if (st != PP_OK) {
        free(items);
        pp_tensor_free(vals);
        return st;
    }
    size_t es = pp_dtype_size(x->dtype);
    int64_t *iv = idx->data;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t in = 0; in < inner; in++) {
            for (int64_t j = 0; j < len; j++) {
                items[j].v = pp_tensor_get_f64(x, (o * len + j) * inner + in);
                items[j].i = j;
            }
            qsort(items, (size_t)len, sizeof *items, largest ? topk_desc : topk_asc);
            for (int64_t j = 0; j < k; j++) {
                int64_t at = (o * k + j) * inner + in;
                int64_t src = (o * len + items[j].i) * inner + in;
                pp_copy_elem((char *)vals->data + (size_t)at * es,
                             (const char *)x->data + (size_t)src * es, es);
                iv[at] = items[j].i;
            }
        }
    free(items);
    if (pp_kernel_want_out(ctx, 0)) ctx->out[0] = vals;
    else pp_tensor_free(vals);
    if (pp_kernel_want_out(ctx, 1)) ctx->out[1] = idx;
    else pp_tensor_free(idx);
    return PP_OK;
}

/* ---------------------------------------------------------------- Einsum */

/* Labels: 'a'..'z', 'A'..'Z' as their char codes; ellipsis dims as
 * EIN_ELL + j (j counted from the widest ellipsis' left end). */
#define EIN_ELL 256
#define EIN_MAXL 64
#define EIN_MAXIN 8

typedef struct {
    int n;               /* axes of the term */
    int label[PP_MAX_DIMS];
} ein_term;

/* Parses one term (letters and at most one "...") of an input of rank
 * (or, for the output, rank < 0) into t; ell_rank is the ellipsis rank of
 * the term, ell_max the widest. */
static int ein_parse(const char *s, size_t len, int rank, int ell_max, ein_term *t, int *ell_rank) {
    int letters = 0, has_ell = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            if (has_ell || i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.') return -1;
            has_ell = 1;
            i += 2;
        } else if ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')) {
            letters++;
        } else {
            return -1;
        }
    }
    int e = rank >= 0 ? rank - letters : ell_max;
    if (e < 0 || (!has_ell && e != 0 && rank >= 0)) return -1;
    if (!has_ell) e = 0;
    if (letters + e > PP_MAX_DIMS) return -1;
    *ell_rank = e;
    t->n = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            for (int j = 0; j < e; j++) t->label[t->n++] = EIN_ELL + (ell_max - e) + j;
            i += 2;
        } else {
            t->label[t->n++] = (unsigned char)s[i];
        }
    }
    return 0;
}

/* Einsum(inputs...), attribute equation: explicit ("ij,jk->ik") or implicit
 * output, repeated labels (diagonals), "..." broadcast. A naive loop over
 * every label's range, accumulated in double; float32, float64, int32,
 * int64. */
static pp_status einsum_run(pp_kernel_ctx *ctx) {
    const char *eq = pp_node_attr_string(ctx->node, "equation", NULL);
    if (!eq) return pp_kernel_error(ctx, PP_ERR_INVALID, "no equation");
    char buf[256];
    size_t m = 0;
    for (const char *p = eq; *p; p++)
        if (*p != ' ') {
            if (m + 1 >= sizeof buf)
                return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "equation too long");
            buf[m++] = *p;
        }
    buf[m] = 0;
    int n = ctx->n_in;
    pp_dtype dt = ctx->in[0]->dtype;
    if (dt != PP_F32 && dt != PP_F64 && dt != PP_I32 && dt != PP_I64)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "Einsum of %s", pp_dtype_name(dt));
    for (int i = 1; i < n; i++)
        if (ctx->in[i]->dtype != dt)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "inputs of different types");
    char *arrow = strstr(buf, "->");
    size_t lhs_len = arrow ? (size_t)(arrow - buf) : m;
    /* Split the left side into terms. */
    size_t start[EIN_MAXIN], len[EIN_MAXIN];
    int nt = 0;
    size_t b = 0;
    for (size_t i = 0; i <= lhs_len; i++)
        if (i == lhs_len || buf[i] == ',') {
            if (nt >= EIN_MAXIN) return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "too many terms");
            start[nt] = b;
            len[nt++] = i - b;
            b = i + 1;
        }
    if (nt != n)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "equation '%s' has %d terms for %d inputs", eq,
                               nt, n);
    int ell_max = 0;
    for (int i = 0; i < n; i++) {
        int letters = 0;
        for (size_t j = 0; j < len[i]; j++) letters += buf[start[i] + j] != '.';
        if (memchr(buf + start[i], '.', len[i]) && ctx->in[i]->ndim - letters > ell_max)
            ell_max = ctx->in[i]->ndim - letters;
    }
    ein_term terms[EIN_MAXIN], out;
    int e;
    for (int i = 0; i < n; i++)
        if (ein_parse(buf + start[i], len[i], ctx->in[i]->ndim, ell_max, &terms[i], &e) != 0)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "equation '%s' does not fit input %d (rank "
                                   "%d)", eq, i, ctx->in[i]->ndim);
    /* Every label's size (an ellipsis dim of size 1 broadcasts). */
    int labels[EIN_MAXL], nl = 0;
    int64_t size[EIN_MAXL];
    int count[EIN_MAXL];
    for (int i = 0; i < n; i++)
        for (int a = 0; a < terms[i].n; a++) {
            int l = terms[i].label[a], k = 0;
            int64_t d = ctx->in[i]->shape[a];
            while (k < nl && labels[k] != l) k++;
            if (k == nl) {
                if (nl == EIN_MAXL)
                    return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "too many labels");
                labels[nl] = l;
                size[nl] = d;
                count[nl++] = 0;
            } else if (size[k] != d) {
                if (l >= EIN_ELL && (size[k] == 1 || d == 1)) {
                    if (size[k] == 1) size[k] = d;
                } else {
                    return pp_kernel_error(ctx, PP_ERR_SHAPE, "label '%c' has sizes %" PRId64
                                           " and %" PRId64, l < EIN_ELL ? l : '.', size[k], d);
                }
            }
            count[k]++;
        }
    if (arrow) {
        if (ein_parse(arrow + 2, strlen(arrow + 2), -1, ell_max, &out, &e) != 0)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "bad output in '%s'", eq);
    } else { /* ellipsis dims, then the labels seen once, sorted */
        out.n = 0;
        for (int j = 0; j < ell_max; j++) out.label[out.n++] = EIN_ELL + j;
        for (int c = 'A'; c <= 'z'; c++)
            for (int k = 0; k < nl; k++)
                if (labels[k] == c && count[k] == 1) {
                    if (out.n == PP_MAX_DIMS)
                        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "output rank too large");
                    out.label[out.n++] = c;
                }
    }
    /* Order: output labels, then the summed ones. */
    int order[EIN_MAXL], no = 0, used[EIN_MAXL] = {0};
    int64_t oshape[PP_MAX_DIMS];
    for (int a = 0; a < out.n; a++) {
        int k = 0;
        while (k < nl && labels[k] != out.label[a]) k++;
        if (k == nl || used[k])
            return pp_kernel_error(ctx, PP_ERR_INVALID, "output label %d of '%s' unknown or "
                                   "repeated", a, eq);
        used[k] = 1;
        order[no++] = k;
        oshape[a] = size[k];
    }
    for (int k = 0; k < nl; k++)
        if (!used[k]) order[no++] = k;
    /* Per input: its stride along each label (summed over repeats). */
    int64_t stride[EIN_MAXIN][EIN_MAXL];
    memset(stride, 0, sizeof stride);
    for (int i = 0; i < n; i++) {
        int64_t st[PP_MAX_DIMS];
        pp_contiguous_strides(ctx->in[i]->ndim, ctx->in[i]->shape, st);
        for (int a = 0; a < terms[i].n; a++) {
            int k = 0;
            while (labels[k] != terms[i].label[a]) k++;
            if (ctx->in[i]->shape[a] != 1 || size[k] == 1) stride[i][k] += st[a];
        }
    }
    pp_tensor *y;
    PP_TRY(pp_tensor_new(dt, out.n, oshape, &y));
    int64_t total = 1, inner = 1;
    for (int k = 0; k < nl; k++) total *= size[k];
    for (int j = out.n; j < no; j++) inner *= size[order[j]];
    if (total > 0) {
        int64_t pos[EIN_MAXL] = {0}, off[EIN_MAXIN] = {0};
        double acc = 0;
        for (int64_t t = 0; t < total; t++) {
            double p = 1;
            for (int i = 0; i < n; i++) p *= pp_tensor_get_f64(ctx->in[i], off[i]);
            acc += p;
            if ((t + 1) % inner == 0) {
                pp_tensor_set_f64(y, t / inner, acc);
                acc = 0;
            }
            for (int j = no - 1; j >= 0; j--) {
                int k = order[j];
                for (int i = 0; i < n; i++) off[i] += stride[i][k];
                if (++pos[k] < size[k]) break;
                for (int i = 0; i < n; i++) off[i] -= stride[i][k] * size[k];
                pos[k] = 0;
            }
        }
    }
    ctx->out[0] = y;
    return PP_OK;
}

const pp_op pp_ops_misc[] = {
    {"Einsum", "", 1, EIN_MAXIN, 1, 1, NULL, einsum_run},
    {"TopK", "", 2, 2, 1, 2, topk_check, topk_run},
    {"ScatterElements", "", 3, 3, 1, 1, scatter_check, scatter_elements_run},
    {"ScatterND", "", 3, 3, 1, 1, scatter_check, scatter_nd_run},
    {"InstanceNormalization", "", 3, 3, 1, 1, NULL, instance_norm_run},
    {"Mish", "", 1, 1, 1, 1, NULL, mish_run},
    {"MishGrad", "pippin", 2, 2, 1, 1, NULL, mish_grad_run},
    {"CumSum", "", 2, 2, 1, 1, cumsum_check, cumsum_run},
    {"TileGrad", "pippin", 2, 2, 1, 1, NULL, tile_grad_run},
    {"GatherElementsGrad", "pippin", 3, 3, 1, 1, NULL, gather_elements_grad_run},
    {NULL},
};
