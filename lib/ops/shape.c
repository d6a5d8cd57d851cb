/* Shape and data-movement kernels: reshape/transpose/concat/split/slice/
 * gather/cast and friends. Data is moved by element size, never by dtype, so
 * every kernel here works for every dtype unless it computes values (Cast,
 * Range). Pure reshapes return views that share their input's buffer. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "op.h"

#ifdef __SSE2__
#include <immintrin.h>
#include "status_internal.h"
#endif

/* ---------------------------------------------------------------- helpers */

static int want_out(const pp_kernel_ctx *ctx, int i) {
    return i < ctx->n_out && ctx->node->out[i] >= 0;
}

static pp_tensor *input(const pp_kernel_ctx *ctx, int i) {
    return i < ctx->n_in ? ctx->in[i] : NULL;
}

/* Normalises axis into [0, rank); -1 if out of range. */
static int norm_axis(int64_t axis, int rank) {
    if (axis < -rank || axis >= rank) return -1;
    return (int)(axis < 0 ? axis + rank : axis);
}

static const char *shape_s(const pp_tensor *t, char *buf, size_t cap) {
    return pp_shape_str(t->ndim, t->shape, buf, cap);
}

/* Reads a 0-d or 1-d int32/int64 tensor of at most max entries. */
static pp_status read_ints(const pp_kernel_ctx *ctx, const pp_tensor *t, const char *what,
                           int64_t *vals, int max, int *n) {
    if (t->dtype != PP_I64 && t->dtype != PP_I32)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be int64 or int32, got %s", what,
                               pp_dtype_name(t->dtype));
    if (t->ndim > 1)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be 1-D, got %d dims", what, t->ndim);
    int64_t cnt = pp_tensor_numel(t);
    if (cnt > max)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "%s has %" PRId64 " entries (at most %d)",
                               what, cnt, max);
    for (int64_t i = 0; i < cnt; i++) vals[i] = pp_tensor_get_i64(t, i);
    *n = (int)cnt;
    return PP_OK;
}

/* Reads a scalar (any numeric dtype, one element) as int64 / double. */
static pp_status read_scalar_i64(const pp_kernel_ctx *ctx, const pp_tensor *t, const char *what,
                                 int64_t *v) {
    if (pp_tensor_numel(t) != 1)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must hold one element, got %" PRId64, what,
                               pp_tensor_numel(t));
    *v = pp_tensor_get_i64(t, 0);
    return PP_OK;
}

/* 1 if every dim is >= 0 and the element count fits in int64 (shapes read
 * from tensors are untrusted; the products below must not overflow). */
static int shape_fits(int nd, const int64_t *shape) {
    int64_t n = 1;
    int zero = 0;
    for (int i = 0; i < nd; i++) {
        if (shape[i] < 0) return 0;
        if (shape[i] == 0) zero = 1;
    }
    if (zero) return 1;
    for (int i = 0; i < nd; i++) {
        if (n > INT64_MAX / shape[i]) return 0;
        n *= shape[i];
    }
    return 1;
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

/* A tensor that borrows src's buffer from byte offset off (zero-copy slices). */
static void release_parent(void *data, void *hint) {
    (void)data;
    pp_tensor_free(hint);
}

static pp_status subview(pp_tensor *src, size_t off, int ndim, const int64_t *shape,
                         pp_tensor **out) {
    char *base = src->data ? (char *)src->data + off : NULL;
    if (pp_shape_numel(ndim, shape) == 0) return pp_tensor_empty(src->dtype, ndim, shape, out);
    PP_TRY(pp_tensor_wrap(src->dtype, ndim, shape, base, release_parent, src, out));
    pp_tensor_retain(src);
    return PP_OK;
}

/* --------------------------------------------------------- strided copy */

/* dst[sum i_k*ds_k] = src[sum i_k*ss_k] over the index box n (strides in
 * elements, src strides may be 0 for broadcasting or negative for reversed
 * slices). Up to 2*PP_MAX_DIMS dims so Tile can split each dim in two. */
#define SC_MAXD (2 * PP_MAX_DIMS)

typedef struct {
    int nd;
    int64_t n[SC_MAXD];
    int64_t ss[SC_MAXD];
    int64_t ds[SC_MAXD];
} sc_layout;

static inline void copy_elem(char *d, const char *s, size_t es) {
    switch (es) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, es); break;
    }
}

/* Strided gather along one dim into contiguous dst. */
static void copy_run_strided(char *d, const char *s, int64_t n, int64_t sstride, size_t es) {
    ptrdiff_t sb = (ptrdiff_t)(sstride * (int64_t)es);
    switch (es) {
    case 4:
        for (int64_t j = 0; j < n; j++, s += sb) memcpy(d + j * 4, s, 4);
        break;
    case 8:
        for (int64_t j = 0; j < n; j++, s += sb) memcpy(d + j * 8, s, 8);
        break;
    case 2:
        for (int64_t j = 0; j < n; j++, s += sb) memcpy(d + j * 2, s, 2);
        break;
    default:
        for (int64_t j = 0; j < n; j++, s += sb) copy_elem(d + (size_t)j * es, s, es);
        break;
    }
}

/* Replicates one element n times (broadcast along the innermost dim). */
static void fill_elem(char *d, const char *s, int64_t n, size_t es) {
    if (n <= 0) return;
    memcpy(d, s, es);
    size_t done = es, total = (size_t)n * es;
    while (done < total) { /* doubling: few memcpy calls */
        size_t k = done < total - done ? done : total - done;
        memcpy(d + done, d, k);
        done += k;
    }
}

/* Cache-blocked 2-D transpose: d[i*drow + j] = s[i + j*scol]. */
static void transpose_block(char *d, int64_t drow, const char *s, int64_t scol, int64_t rows,
                            int64_t cols, size_t es) {
    enum { B = 32 };
    for (int64_t i0 = 0; i0 < rows; i0 += B) {
        int64_t i1 = i0 + B < rows ? i0 + B : rows;
        for (int64_t j0 = 0; j0 < cols; j0 += B) {
            int64_t j1 = j0 + B < cols ? j0 + B : cols;
            if (es == 4) {
                int64_t i = i0;
#ifdef __SSE2__
                /* 4x4 register transposes: 2-4x faster than scalar here */
                for (; i + 4 <= i1; i += 4) {
                    int64_t j = j0;
                    for (; j + 4 <= j1; j += 4) {
                        const float *sp = (const float *)s + i + j * scol;
                        __m128 r0 = _mm_loadu_ps(sp), r1 = _mm_loadu_ps(sp + scol);
                        __m128 r2 = _mm_loadu_ps(sp + 2 * scol), r3 = _mm_loadu_ps(sp + 3 * scol);
                        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
                        float *dp = (float *)d + i * drow + j;
                        _mm_storeu_ps(dp, r0);
                        _mm_storeu_ps(dp + drow, r1);
                        _mm_storeu_ps(dp + 2 * drow, r2);
                        _mm_storeu_ps(dp + 3 * drow, r3);
                    }
                    for (; j < j1; j++)
                        for (int64_t a = 0; a < 4; a++)
                            memcpy(d + (size_t)((i + a) * drow + j) * 4,
                                   s + (size_t)(i + a + j * scol) * 4, 4);
                }
#endif
                for (; i < i1; i++) {
                    char *dr = d + (size_t)(i * drow) * 4;
                    const char *sr = s + (size_t)i * 4;
                    for (int64_t j = j0; j < j1; j++)
                        memcpy(dr + (size_t)j * 4, sr + (size_t)(j * scol) * 4, 4);
                }
            } else {
                for (int64_t i = i0; i < i1; i++)
                    for (int64_t j = j0; j < j1; j++)
                        copy_elem(d + (size_t)(i * drow + j) * es, s + (size_t)(i + j * scol) * es,
                                  es);
            }
        }
    }
}

static void strided_copy(void *dstv, const void *srcv, size_t es, const sc_layout *in) {
    char *dst = dstv;
    const char *src = srcv;
    int64_t n[SC_MAXD], ss[SC_MAXD], ds[SC_MAXD];
    int nd = 0;
    /* Coalesce: drop unit dims, merge a dim into its outer neighbour when
     * both strides line up. */
    for (int i = 0; i < in->nd; i++) {
        if (in->n[i] == 0) return;
        if (in->n[i] == 1) continue;
        if (nd > 0 && ss[nd - 1] == in->ss[i] * in->n[i] && ds[nd - 1] == in->ds[i] * in->n[i]) {
            n[nd - 1] *= in->n[i];
            ss[nd - 1] = in->ss[i];
            ds[nd - 1] = in->ds[i];
        } else {
            n[nd] = in->n[i];
            ss[nd] = in->ss[i];
            ds[nd] = in->ds[i];
            nd++;
        }
    }
    if (nd == 0) {
        memcpy(dst, src, es);
        return;
    }
    int last = nd - 1;
    /* Transpose pattern: dst contiguous in the last dim, src contiguous in an
     * outer one -> blocked tiles instead of a strided gather. */
    int tp = -1;
    if (ds[last] == 1 && ss[last] != 1 && ss[last] != 0 && n[last] >= 4)
        for (int i = last - 1; i >= 0; i--)
            if (ss[i] == 1 && n[i] >= 4) {
                tp = i;
                break;
            }
    int outer[SC_MAXD], no = 0;
    for (int i = 0; i < last; i++)
        if (i != tp) outer[no++] = i;
    int64_t idx[SC_MAXD] = {0};
    int64_t soff = 0, doff = 0; /* in elements */
    for (;;) {
        char *d = dst + doff * (int64_t)es;
        const char *s = src + soff * (int64_t)es;
        if (tp >= 0) {
            transpose_block(d, ds[tp], s, ss[last], n[tp], n[last], es);
        } else if (ss[last] == 1 && ds[last] == 1) {
            memcpy(d, s, (size_t)n[last] * es);
        } else if (ds[last] == 1 && ss[last] == 0) {
            fill_elem(d, s, n[last], es);
        } else if (ds[last] == 1) {
            copy_run_strided(d, s, n[last], ss[last], es);
        } else {
            for (int64_t j = 0; j < n[last]; j++)
                copy_elem(d + j * ds[last] * (int64_t)es, s + j * ss[last] * (int64_t)es, es);
        }
        /* odometer over the outer dims */
        int k = no - 1;
        for (; k >= 0; k--) {
            int a = outer[k];
            idx[a]++;
            soff += ss[a];
            doff += ds[a];
            if (idx[a] < n[a]) break;
            soff -= ss[a] * n[a];
            doff -= ds[a] * n[a];
            idx[a] = 0;
        }
        if (k < 0) break;
    }
}

/* 1 if a view with these sizes and strides is contiguous row-major. */
static int is_contiguous(int nd, const int64_t *n, const int64_t *ss) {
    int64_t expect = 1;
    for (int i = nd - 1; i >= 0; i--) {
        if (n[i] == 1) continue;
        if (ss[i] != expect) return 0;
        expect *= n[i];
    }
    return 1;
}

/* ------------------------------------------------------------ Identity */

static pp_status identity_run(pp_kernel_ctx *ctx) {
    if (!ctx->in[0]) return pp_kernel_error(ctx, PP_ERR_INVALID, "missing input");
    ctx->out[0] = pp_tensor_retain(ctx->in[0]);
    return PP_OK;
}

/* ------------------------------------------------------------- Reshape */

static pp_status reshape_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    const pp_tensor *st = input(ctx, 1);
    int64_t shape[PP_MAX_DIMS];
    int nd = 0;
    char a[128], b[128];
    if (st) {
        PP_TRY(read_ints(ctx, st, "shape", shape, PP_MAX_DIMS, &nd));
    } else {
        const int64_t *v;
        int cnt = pp_node_attr_ints(ctx->node, "shape", &v);
        if (cnt < 0) return pp_kernel_error(ctx, PP_ERR_INVALID, "no shape given");
        if (cnt > PP_MAX_DIMS)
            return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "shape has %d dims (at most %d)", cnt,
                                   PP_MAX_DIMS);
        memcpy(shape, v, sizeof(int64_t) * (size_t)cnt);
        nd = cnt;
    }
    int allowzero = pp_node_attr_int(ctx->node, "allowzero", 0) != 0;
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < nd; i++) {
        if (shape[i] == -1) {
            if (infer >= 0) return pp_kernel_error(ctx, PP_ERR_SHAPE, "shape has more than one -1");
            infer = i;
            continue;
        }
        if (shape[i] == 0 && !allowzero) {
            if (i >= x->ndim)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "shape[%d] = 0 copies a dim that %s lacks",
                                       i, shape_s(x, a, sizeof a));
            shape[i] = x->shape[i];
        }
        if (shape[i] < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "invalid dim %" PRId64 " in shape", shape[i]);
        if (shape[i] > 0 && known > INT64_MAX / shape[i])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "shape %s overflows",
                                   pp_shape_str(nd, shape, b, sizeof b));
        known *= shape[i];
    }
    int64_t numel = pp_tensor_numel(x);
    if (infer >= 0) {
        if (known == 0) {
            if (allowzero)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "shape has both 0 and -1 with allowzero");
            if (numel != 0)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot infer -1 for %s into a 0-sized shape",
                                       shape_s(x, a, sizeof a));
            shape[infer] = 0;
        } else {
            if (numel % known != 0)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot reshape %s (%" PRId64
                                       " elements) with -1 and %" PRId64 " known",
                                       shape_s(x, a, sizeof a), numel, known);
            shape[infer] = numel / known;
        }
    }
    if (pp_shape_numel(nd, shape) != numel)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot reshape %s into %s",
                               shape_s(x, a, sizeof a), pp_shape_str(nd, shape, b, sizeof b));
    return pp_tensor_view(x, nd, shape, &ctx->out[0]);
}

/* ------------------------------------------------------------- Flatten */

static pp_status flatten_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int64_t axis = pp_node_attr_int(ctx->node, "axis", 1);
    if (axis < 0) axis += x->ndim;
    if (axis < 0 || axis > x->ndim)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               pp_node_attr_int(ctx->node, "axis", 1), x->ndim);
    int64_t shape[2] = {pp_shape_numel((int)axis, x->shape),
                        pp_shape_numel(x->ndim - (int)axis, x->shape + axis)};
    return pp_tensor_view(x, 2, shape, &ctx->out[0]);
}

/* ---------------------------------------------------- Squeeze/Unsqueeze */

/* Axes from input 1 (opset >= 13) or the attribute (older opsets). *n = -1
 * when neither is given. */
static pp_status get_axes(const pp_kernel_ctx *ctx, int64_t *axes, int max, int *n) {
    const pp_tensor *t = input(ctx, 1);
    if (t) return read_ints(ctx, t, "axes", axes, max, n);
    const int64_t *v;
    int cnt = pp_node_attr_ints(ctx->node, "axes", &v);
    if (cnt > max)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%d axes (at most %d)", cnt, max);
    for (int i = 0; i < cnt; i++) axes[i] = v[i];
    *n = cnt;
    return PP_OK;
}

static pp_status squeeze_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int64_t axes[PP_MAX_DIMS];
    int na = -1;
    PP_TRY(get_axes(ctx, axes, PP_MAX_DIMS, &na));
    uint8_t drop[PP_MAX_DIMS] = {0};
    if (na < 0) {
        for (int i = 0; i < x->ndim; i++) drop[i] = x->shape[i] == 1;
    } else {
        for (int i = 0; i < na; i++) {
            int a = norm_axis(axes[i], x->ndim);
            if (a < 0)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                                       axes[i], x->ndim);
            if (x->shape[a] != 1)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot squeeze axis %d of size %" PRId64,
                                       a, x->shape[a]);
            drop[a] = 1;
        }
    }
    int64_t shape[PP_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < x->ndim; i++)
        if (!drop[i]) shape[nd++] = x->shape[i];
    return pp_tensor_view(x, nd, shape, &ctx->out[0]);
}

static pp_status unsqueeze_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int64_t axes[PP_MAX_DIMS];
    int na = -1;
    PP_TRY(get_axes(ctx, axes, PP_MAX_DIMS, &na));
    if (na < 0) return pp_kernel_error(ctx, PP_ERR_INVALID, "axes are required");
    int nd = x->ndim + na;
    if (nd > PP_MAX_DIMS)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "result would have %d dims (at most %d)", nd,
                               PP_MAX_DIMS);
    uint8_t ins[PP_MAX_DIMS] = {0};
    for (int i = 0; i < na; i++) {
        int a = norm_axis(axes[i], nd);
        if (a < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                                   axes[i], nd);
        if (ins[a]) return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %d given twice", a);
        ins[a] = 1;
    }
    int64_t shape[PP_MAX_DIMS];
    for (int i = 0, k = 0; i < nd; i++) shape[i] = ins[i] ? 1 : x->shape[k++];
    return pp_tensor_view(x, nd, shape, &ctx->out[0]);
}

/* ----------------------------------------------------------- Transpose */

static pp_status transpose_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const int64_t *p;
    int np = pp_node_attr_ints(n, "perm", &p);
    if (np < 0) return PP_OK;
    if (np > PP_MAX_DIMS) return pp_node_error(n, PP_ERR_UNSUPPORTED, "perm has %d entries", np);
    uint8_t seen[PP_MAX_DIMS] = {0};
    for (int i = 0; i < np; i++) {
        if (p[i] < 0 || p[i] >= np || seen[p[i]])
            return pp_node_error(n, PP_ERR_INVALID, "perm is not a permutation of 0..%d", np - 1);
        seen[p[i]] = 1;
    }
    return PP_OK;
}

static pp_status transpose_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int nd = x->ndim;
    int64_t perm[PP_MAX_DIMS];
    const int64_t *p;
    int np = pp_node_attr_ints(ctx->node, "perm", &p);
    if (np < 0) {
        for (int i = 0; i < nd; i++) perm[i] = nd - 1 - i;
    } else {
        if (np != nd)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "perm has %d entries for rank %d", np, nd);
        uint8_t seen[PP_MAX_DIMS] = {0};
        for (int i = 0; i < nd; i++) {
            if (p[i] < 0 || p[i] >= nd || seen[p[i]])
                return pp_kernel_error(ctx, PP_ERR_INVALID, "perm is not a permutation");
            seen[p[i]] = 1;
            perm[i] = p[i];
        }
    }
    int64_t shape[PP_MAX_DIMS], istr[PP_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = x->shape[perm[i]];
    /* Only unit dims move: same memory order, so a view will do. */
    int order_kept = 1;
    for (int i = 0, last = -1; i < nd; i++) {
        if (x->shape[perm[i]] == 1) continue;
        if (perm[i] < last) order_kept = 0;
        last = (int)perm[i];
    }
    if (order_kept) return pp_tensor_view(x, nd, shape, &ctx->out[0]);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, shape, &y));
    contiguous_strides(nd, x->shape, istr);
    sc_layout L = {.nd = nd};
    contiguous_strides(nd, shape, L.ds);
    for (int i = 0; i < nd; i++) {
        L.n[i] = shape[i];
        L.ss[i] = istr[perm[i]];
    }
    strided_copy(y->data, x->data, pp_dtype_size(x->dtype), &L);
    ctx->out[0] = y;
    return PP_OK;
}

/* -------------------------------------------------------------- Concat */

static pp_status concat_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const pp_attr *a = pp_node_attr(n, "axis");
    if (!a || a->type != PP_ATTR_INT)
        return pp_node_error(n, PP_ERR_INVALID, "needs an int attribute 'axis'");
    return PP_OK;
}

static pp_status concat_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x0 = NULL;
    for (int i = 0; i < ctx->n_in && !x0; i++) x0 = ctx->in[i];
    if (!x0) return pp_kernel_error(ctx, PP_ERR_INVALID, "no inputs");
    int nd = x0->ndim;
    int64_t axis_attr = pp_node_attr_int(ctx->node, "axis", 0);
    int axis = norm_axis(axis_attr, nd);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, nd);
    int64_t shape[PP_MAX_DIMS];
    memcpy(shape, x0->shape, sizeof(int64_t) * (size_t)nd);
    shape[axis] = 0;
    char a[128], b[128];
    for (int i = 0; i < ctx->n_in; i++) {
        const pp_tensor *t = ctx->in[i];
        if (!t) continue;
        int ok = t->dtype == x0->dtype && t->ndim == nd;
        for (int d = 0; ok && d < nd; d++)
            if (d != axis && t->shape[d] != x0->shape[d]) ok = 0;
        if (!ok)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "input %d (%s%s) does not fit input 0 (%s%s) "
                                   "on axis %d", i, pp_dtype_name(t->dtype), shape_s(t, a, sizeof a),
                                   pp_dtype_name(x0->dtype), shape_s(x0, b, sizeof b), axis);
        shape[axis] += t->shape[axis];
    }
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x0->dtype, nd, shape, &y));
    size_t es = pp_dtype_size(x0->dtype);
    int64_t outer = pp_shape_numel(axis, shape);
    int64_t inner = pp_shape_numel(nd - axis - 1, shape + axis + 1);
    size_t row = (size_t)(shape[axis] * inner) * es; /* bytes per outer index in y */
    size_t off = 0;
    for (int i = 0; i < ctx->n_in && y->nbytes; i++) {
        const pp_tensor *t = ctx->in[i];
        if (!t || !t->nbytes) continue;
        size_t chunk = (size_t)(t->shape[axis] * inner) * es;
        const char *s = t->data;
        char *d = (char *)y->data + off;
        for (int64_t o = 0; o < outer; o++, s += chunk, d += row) memcpy(d, s, chunk);
        off += chunk;
    }
    ctx->out[0] = y;
    return PP_OK;
}

/* --------------------------------------------------------------- Split */

static pp_status split_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int nout = ctx->n_out;
    int64_t axis_attr = pp_node_attr_int(ctx->node, "axis", 0);
    int axis = norm_axis(axis_attr, x->ndim);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, x->ndim);
    int64_t dim = x->shape[axis];
    int64_t *sizes = calloc((size_t)(nout ? nout : 1), sizeof *sizes);
    if (!sizes) return pp_error(PP_ERR_NOMEM, "out of memory");
    pp_status s = PP_OK;
    const pp_tensor *st = input(ctx, 1);
    const int64_t *attr_split;
    int na = pp_node_attr_ints(ctx->node, "split", &attr_split);
    if (st || na >= 0) {
        int64_t cnt = st ? pp_tensor_numel(st) : na;
        if (cnt != nout)
            s = pp_kernel_error(ctx, PP_ERR_SHAPE, "split has %" PRId64 " entries for %d outputs",
                                cnt, nout);
        int got;
        if (s == PP_OK && st) s = read_ints(ctx, st, "split", sizes, nout, &got);
        if (s == PP_OK && !st)
            for (int i = 0; i < na; i++) sizes[i] = attr_split[i];
        int64_t sum = 0;
        for (int i = 0; s == PP_OK && i < nout; i++) {
            if (sizes[i] < 0 || sizes[i] > dim - sum) { /* also keeps sum from overflowing */
                sum = -1;
                break;
            }
            sum += sizes[i];
        }
        if (s == PP_OK && sum != dim)
            s = pp_kernel_error(ctx, PP_ERR_SHAPE, "split sizes do not sum to %" PRId64
                                " (the size of axis %d)", dim, axis);
    } else if (nout > 0) {
        /* num_outputs (opset 18) allows a smaller last chunk; older opsets
         * need equal parts. */
        int64_t num = pp_node_attr_int(ctx->node, "num_outputs", 0);
        if (num == 0 && dim % nout != 0)
            s = pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %d of size %" PRId64
                                " does not split into %d equal parts", axis, dim, nout);
        else if (num != 0 && num != nout)
            s = pp_kernel_error(ctx, PP_ERR_SHAPE, "num_outputs %" PRId64 " but %d outputs", num,
                                nout);
        int64_t chunk = (dim + nout - 1) / nout, left = dim;
        for (int i = 0; i < nout; i++) {
            sizes[i] = left < chunk ? left : chunk;
            left -= sizes[i];
        }
    }
    size_t es = pp_dtype_size(x->dtype);
    int64_t outer = pp_shape_numel(axis, x->shape);
    int64_t inner = pp_shape_numel(x->ndim - axis - 1, x->shape + axis + 1);
    size_t row = (size_t)(dim * inner) * es;
    int64_t start = 0;
    for (int i = 0; i < nout && s == PP_OK; i++) {
        int64_t shape[PP_MAX_DIMS];
        memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        shape[axis] = sizes[i];
        size_t chunk = (size_t)(sizes[i] * inner) * es, off = (size_t)(start * inner) * es;
        start += sizes[i];
        if (!want_out(ctx, i)) continue;
        if (outer == 1) { /* one contiguous block: share the buffer */
            s = subview(x, off, x->ndim, shape, &ctx->out[i]);
            continue;
        }
        s = pp_tensor_empty(x->dtype, x->ndim, shape, &ctx->out[i]);
        if (s != PP_OK || !chunk) continue;
        const char *src = (const char *)x->data + off;
        char *d = ctx->out[i]->data;
        for (int64_t o = 0; o < outer; o++, src += row, d += chunk) memcpy(d, src, chunk);
    }
    free(sizes);
    if (s != PP_OK)
        for (int i = 0; i < nout; i++) {
            pp_tensor_free(ctx->out[i]);
            ctx->out[i] = NULL;
        }
    return s;
}

/* --------------------------------------------------------------- Slice */

static pp_status slice_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int nd = x->ndim;
    int64_t starts[PP_MAX_DIMS], ends[PP_MAX_DIMS], axes[PP_MAX_DIMS], steps[PP_MAX_DIMS];
    int ns, ne, na = -1, nst = -1;
    if (ctx->n_in >= 3 && ctx->in[1] && ctx->in[2]) {
        PP_TRY(read_ints(ctx, ctx->in[1], "starts", starts, PP_MAX_DIMS, &ns));
        PP_TRY(read_ints(ctx, ctx->in[2], "ends", ends, PP_MAX_DIMS, &ne));
        if (input(ctx, 3)) PP_TRY(read_ints(ctx, ctx->in[3], "axes", axes, PP_MAX_DIMS, &na));
        if (input(ctx, 4)) PP_TRY(read_ints(ctx, ctx->in[4], "steps", steps, PP_MAX_DIMS, &nst));
    } else { /* opset < 10: attributes */
        const int64_t *v;
        ns = pp_node_attr_ints(ctx->node, "starts", &v);
        if (ns < 0 || ns > PP_MAX_DIMS) return pp_kernel_error(ctx, PP_ERR_INVALID, "bad starts");
        memcpy(starts, v, sizeof(int64_t) * (size_t)ns);
        ne = pp_node_attr_ints(ctx->node, "ends", &v);
        if (ne < 0 || ne > PP_MAX_DIMS) return pp_kernel_error(ctx, PP_ERR_INVALID, "bad ends");
        memcpy(ends, v, sizeof(int64_t) * (size_t)ne);
        na = pp_node_attr_ints(ctx->node, "axes", &v);
        if (na > PP_MAX_DIMS) return pp_kernel_error(ctx, PP_ERR_INVALID, "bad axes");
        if (na > 0) memcpy(axes, v, sizeof(int64_t) * (size_t)na);
    }
    if (ne != ns) return pp_kernel_error(ctx, PP_ERR_SHAPE, "%d starts but %d ends", ns, ne);
    if (na >= 0 && na != ns)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%d starts but %d axes", ns, na);
    if (nst >= 0 && nst != ns)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%d starts but %d steps", ns, nst);
    if (na < 0) {
        if (ns > nd) return pp_kernel_error(ctx, PP_ERR_SHAPE, "%d starts for rank %d", ns, nd);
        for (int i = 0; i < ns; i++) axes[i] = i;
    }
    if (nst < 0)
        for (int i = 0; i < ns; i++) steps[i] = 1;
    int64_t beg[PP_MAX_DIMS], step[PP_MAX_DIMS], shape[PP_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        beg[i] = 0;
        step[i] = 1;
        shape[i] = x->shape[i];
    }
    uint8_t seen[PP_MAX_DIMS] = {0};
    for (int i = 0; i < ns; i++) {
        int a = norm_axis(axes[i], nd);
        if (a < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                                   axes[i], nd);
        if (seen[a]) return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %d sliced twice", a);
        seen[a] = 1;
        int64_t dim = x->shape[a], st = steps[i], b = starts[i], e = ends[i];
        if (st == 0) return pp_kernel_error(ctx, PP_ERR_INVALID, "step 0 on axis %d", a);
        if (b < 0) b += dim;
        if (e < 0) e += dim;
        int64_t cnt;
        if (st > 0) {
            b = b < 0 ? 0 : b > dim ? dim : b;
            e = e < 0 ? 0 : e > dim ? dim : e;
            /* (e - b + st - 1) could overflow for huge steps: divide first */
            cnt = e > b ? (e - b - 1) / st + 1 : 0;
        } else {
            b = b < 0 ? 0 : b > dim - 1 ? dim - 1 : b;
            e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
            cnt = b > e ? (b - e - 1) / (st == INT64_MIN ? INT64_MAX : -st) + 1 : 0;
        }
        beg[a] = cnt ? b : 0;
        step[a] = st;
        shape[a] = cnt;
    }
    int64_t istr[PP_MAX_DIMS];
    contiguous_strides(nd, x->shape, istr);
    sc_layout L = {.nd = nd};
    int64_t off = 0;
    for (int i = 0; i < nd; i++) {
        L.n[i] = shape[i];
        L.ss[i] = shape[i] > 1 ? istr[i] * step[i] : istr[i];
        off += beg[i] * istr[i];
    }
    size_t es = pp_dtype_size(x->dtype);
    if (pp_shape_numel(nd, shape) > 0 && is_contiguous(nd, L.n, L.ss))
        return subview(x, (size_t)off * es, nd, shape, &ctx->out[0]);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, shape, &y));
    contiguous_strides(nd, shape, L.ds);
    if (y->nbytes) strided_copy(y->data, (const char *)x->data + off * (int64_t)es, es, &L);
    ctx->out[0] = y;
    return PP_OK;
}

/* -------------------------------------------------------------- Gather */

static pp_status check_indices(const pp_kernel_ctx *ctx, const pp_tensor *idx, int64_t dim,
                               int axis) {
    if (idx->dtype != PP_I64 && idx->dtype != PP_I32)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices must be int64 or int32, got %s",
                               pp_dtype_name(idx->dtype));
    int64_t n = pp_tensor_numel(idx);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = pp_tensor_get_i64(idx, i);
        if (v < -dim || v >= dim)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "index %" PRId64 " (at %" PRId64
                                   ") out of range for axis %d of size %" PRId64, v, i, axis, dim);
    }
    return PP_OK;
}

static inline int64_t index_at(const pp_tensor *idx, int64_t i, int64_t dim) {
    int64_t v = idx->dtype == PP_I64 ? ((const int64_t *)idx->data)[i]
                                      : ((const int32_t *)idx->data)[i];
    return v < 0 ? v + dim : v;
}

static pp_status gather_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    const pp_tensor *idx = ctx->in[1];
    int64_t axis_attr = pp_node_attr_int(ctx->node, "axis", 0);
    int axis = norm_axis(axis_attr, x->ndim);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, x->ndim);
    int nd = x->ndim - 1 + idx->ndim;
    if (nd > PP_MAX_DIMS)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "result would have %d dims", nd);
    int64_t dim = x->shape[axis];
    PP_TRY(check_indices(ctx, idx, dim, axis));
    int64_t shape[PP_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < axis; i++) shape[k++] = x->shape[i];
    for (int i = 0; i < idx->ndim; i++) shape[k++] = idx->shape[i];
    for (int i = axis + 1; i < x->ndim; i++) shape[k++] = x->shape[i];
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, shape, &y));
    size_t es = pp_dtype_size(x->dtype);
    int64_t outer = pp_shape_numel(axis, x->shape);
    int64_t inner = pp_shape_numel(x->ndim - axis - 1, x->shape + axis + 1);
    int64_t ni = pp_tensor_numel(idx);
    size_t chunk = (size_t)inner * es;
    char *d = y->data;
    for (int64_t o = 0; o < outer && y->nbytes; o++) {
        const char *base = (const char *)x->data + (size_t)(o * dim) * chunk;
        for (int64_t i = 0; i < ni; i++, d += chunk)
            memcpy(d, base + (size_t)index_at(idx, i, dim) * chunk, chunk);
    }
    ctx->out[0] = y;
    return PP_OK;
}

static pp_status gather_elements_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *idx = ctx->in[1];
    int64_t axis_attr = pp_node_attr_int(ctx->node, "axis", 0);
    int nd = x->ndim, axis = norm_axis(axis_attr, nd);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, nd);
    char a[128], b[128];
    if (idx->ndim != nd)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices %s and data %s differ in rank",
                               shape_s(idx, a, sizeof a), shape_s(x, b, sizeof b));
    for (int i = 0; i < nd; i++)
        if (i != axis && idx->shape[i] > x->shape[i])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices %s exceed data %s on axis %d",
                                   shape_s(idx, a, sizeof a), shape_s(x, b, sizeof b), i);
    int64_t dim = x->shape[axis];
    PP_TRY(check_indices(ctx, idx, dim, axis));
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, idx->shape, &y));
    size_t es = pp_dtype_size(x->dtype);
    int64_t n = pp_tensor_numel(idx), xs[PP_MAX_DIMS], pos[PP_MAX_DIMS] = {0};
    contiguous_strides(nd, x->shape, xs);
    int64_t base = 0; /* offset in x of pos with pos[axis] = 0 */
    for (int64_t i = 0; i < n; i++) {
        int64_t src = base + index_at(idx, i, dim) * xs[axis];
        copy_elem((char *)y->data + (size_t)i * es, (const char *)x->data + (size_t)src * es, es);
        for (int d = nd - 1; d >= 0; d--) {
            if (++pos[d] < idx->shape[d]) {
                if (d != axis) base += xs[d];
                break;
            }
            if (d != axis) base -= xs[d] * (pos[d] - 1);
            pos[d] = 0;
        }
    }
    ctx->out[0] = y;
    return PP_OK;
}

static pp_status gather_nd_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *idx = ctx->in[1];
    int r = x->ndim, q = idx->ndim;
    int64_t bd = pp_node_attr_int(ctx->node, "batch_dims", 0);
    char a[128], b[128];
    if (idx->dtype != PP_I64 && idx->dtype != PP_I32)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices must be int64 or int32, got %s",
                               pp_dtype_name(idx->dtype));
    if (r < 1 || q < 1 || bd < 0 || bd >= (r < q ? r : q))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "batch_dims %" PRId64 " invalid for data %s and "
                               "indices %s", bd, shape_s(x, a, sizeof a), shape_s(idx, b, sizeof b));
    int nb = (int)bd;
    int64_t m = idx->shape[q - 1];
    for (int i = 0; i < nb; i++)
        if (x->shape[i] != idx->shape[i])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "batch dims of data %s and indices %s differ",
                                   shape_s(x, a, sizeof a), shape_s(idx, b, sizeof b));
    if (m < 1 || m > r - nb)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "index tuples of length %" PRId64
                               " for data %s with %d batch dims", m, shape_s(x, a, sizeof a), nb);
    int nd = q - 1 + r - nb - (int)m;
    if (nd > PP_MAX_DIMS)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "result would have %d dims", nd);
    int64_t shape[PP_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < q - 1; i++) shape[k++] = idx->shape[i];
    for (int i = nb + (int)m; i < r; i++) shape[k++] = x->shape[i];
    int64_t xs[PP_MAX_DIMS];
    contiguous_strides(r, x->shape, xs);
    int64_t nbatch = pp_shape_numel(nb, x->shape);
    int64_t tuples = pp_shape_numel(q - 1 - nb, idx->shape + nb);
    int64_t inner = pp_shape_numel(r - nb - (int)m, x->shape + nb + m);
    int64_t bstride = nb > 0 ? xs[nb - 1] : 0;
    /* validate every index before allocating */
    for (int64_t t = 0; t < nbatch * tuples; t++)
        for (int64_t j = 0; j < m; j++) {
            int64_t v = pp_tensor_get_i64(idx, t * m + j), dim = x->shape[nb + j];
            if (v < -dim || v >= dim)
                return pp_kernel_error(ctx, PP_ERR_INVALID, "index %" PRId64 " out of range for "
                                       "axis %d of size %" PRId64, v, nb + (int)j, dim);
        }
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, shape, &y));
    size_t es = pp_dtype_size(x->dtype), chunk = (size_t)inner * es;
    char *d = y->data;
    for (int64_t bi = 0; bi < nbatch && chunk; bi++)
        for (int64_t t = 0; t < tuples; t++, d += chunk) {
            int64_t off = bi * bstride;
            for (int64_t j = 0; j < m; j++)
                off += index_at(idx, (bi * tuples + t) * m + j, x->shape[nb + j]) * xs[nb + j];
            memcpy(d, (const char *)x->data + (size_t)off * es, chunk);
        }
    ctx->out[0] = y;
    return PP_OK;
}

/* -------------------------------------------------------------- Expand */

/* Numpy broadcast of two shapes into out (rank max of both). */
static int broadcast_shapes(int na, const int64_t *a, int nb, const int64_t *b, int *nout,
                            int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int64_t da = i < n - na ? 1 : a[i - (n - na)];
        int64_t db = i < n - nb ? 1 : b[i - (n - nb)];
        if (da != db && da != 1 && db != 1) return 0;
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return 1;
}

/* Copies x broadcast to shape (rank nd >= x->ndim) into a new tensor. */
static pp_status broadcast_to(const pp_tensor *x, int nd, const int64_t *shape, pp_tensor **out) {
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, shape, &y));
    int64_t istr[PP_MAX_DIMS];
    contiguous_strides(x->ndim, x->shape, istr);
    sc_layout L = {.nd = nd};
    contiguous_strides(nd, shape, L.ds);
    int lead = nd - x->ndim;
    for (int i = 0; i < nd; i++) {
        L.n[i] = shape[i];
        L.ss[i] = i < lead || x->shape[i - lead] == 1 ? 0 : istr[i - lead];
    }
    if (y->nbytes) strided_copy(y->data, x->data, pp_dtype_size(x->dtype), &L);
    *out = y;
    return PP_OK;
}

static pp_status expand_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int64_t want[PP_MAX_DIMS], shape[PP_MAX_DIMS];
    int nw, nd;
    PP_TRY(read_ints(ctx, ctx->in[1], "shape", want, PP_MAX_DIMS, &nw));
    char a[128], b[128];
    for (int i = 0; i < nw; i++)
        if (want[i] < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "negative dim in shape %s",
                                   pp_shape_str(nw, want, b, sizeof b));
    if (!broadcast_shapes(x->ndim, x->shape, nw, want, &nd, shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot expand %s to %s", shape_s(x, a, sizeof a),
                               pp_shape_str(nw, want, b, sizeof b));
    if (!shape_fits(nd, shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "shape %s overflows",
                               pp_shape_str(nd, shape, b, sizeof b));
    if (pp_shape_equal(nd, shape, x->ndim, x->shape)) {
        ctx->out[0] = pp_tensor_retain(x);
        return PP_OK;
    }
    if (pp_shape_numel(nd, shape) == pp_tensor_numel(x)) /* only unit dims added */
        return pp_tensor_view(x, nd, shape, &ctx->out[0]);
    return broadcast_to(x, nd, shape, &ctx->out[0]);
}

/* ---------------------------------------------------------------- Tile */

static pp_status tile_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int64_t rep[PP_MAX_DIMS];
    int nr;
    PP_TRY(read_ints(ctx, ctx->in[1], "repeats", rep, PP_MAX_DIMS, &nr));
    int nd = x->ndim;
    if (nr != nd)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "repeats has %d entries for rank %d", nr, nd);
    int64_t shape[PP_MAX_DIMS], istr[PP_MAX_DIMS], ostr[PP_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        if (rep[i] < 0) return pp_kernel_error(ctx, PP_ERR_SHAPE, "negative repeat %" PRId64, rep[i]);
        if (rep[i] > 0 && x->shape[i] > INT64_MAX / rep[i])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "repeat %" PRId64 " overflows", rep[i]);
        shape[i] = x->shape[i] * rep[i];
    }
    if (!shape_fits(nd, shape)) return pp_kernel_error(ctx, PP_ERR_SHAPE, "repeats overflow");
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, shape, &y));
    contiguous_strides(nd, x->shape, istr);
    contiguous_strides(nd, shape, ostr);
    /* Output index on dim i is r * in_i + k: one box dim for r (source stride
     * 0), one for k. */
    sc_layout L = {.nd = 2 * nd};
    for (int i = 0; i < nd; i++) {
        L.n[2 * i] = rep[i];
        L.ss[2 * i] = 0;
        L.ds[2 * i] = x->shape[i] * ostr[i];
        L.n[2 * i + 1] = x->shape[i];
        L.ss[2 * i + 1] = istr[i];
        L.ds[2 * i + 1] = ostr[i];
    }
    if (y->nbytes) strided_copy(y->data, x->data, pp_dtype_size(x->dtype), &L);
    ctx->out[0] = y;
    return PP_OK;
}

/* ------------------------------------------------------------------ Pad */

static pp_status cast_tensor(const pp_tensor *src, pp_dtype dt, pp_tensor **out);

/* Edge / reflect padding: each output index along a dim maps to a source
 * index (tables per dim); the innermost dim is copied element by element. */
static pp_status pad_index_mode(pp_kernel_ctx *ctx, const pp_tensor *x, const int64_t *shape,
                                const int64_t *lo, int reflect) {
    int nd = x->ndim;
    for (int i = 0; i < nd; i++)
        if (x->shape[i] == 0 && shape[i] > 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot %s-pad empty axis %d",
                                   reflect ? "reflect" : "edge", i);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, shape, &y));
    int64_t total = 0;
    for (int i = 0; i < nd; i++) total += shape[i];
    int64_t *tab = malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
    if (!tab) {
        pp_tensor_free(y);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    int64_t *t[PP_MAX_DIMS], istr[PP_MAX_DIMS];
    contiguous_strides(nd, x->shape, istr);
    int64_t *p = tab;
    for (int d = 0; d < nd; p += shape[d], d++) {
        t[d] = p;
        int64_t n = x->shape[d], period = 2 * (n - 1);
        for (int64_t o = 0; o < shape[d]; o++) {
            int64_t i = o - lo[d];
            if (!reflect || n == 1) {
                i = i < 0 ? 0 : i >= n ? n - 1 : i;
            } else { /* mirror without repeating the edge, as numpy */
                i %= period;
                if (i < 0) i += period;
                if (i >= n) i = period - i;
            }
            p[o] = i * istr[d];
        }
    }
    size_t es = pp_dtype_size(x->dtype);
    int64_t n = pp_tensor_numel(y), idx[PP_MAX_DIMS] = {0};
    int64_t inner = nd ? shape[nd - 1] : 1;
    char *d = y->data;
    for (int64_t o = 0; o < n; o += inner) {
        int64_t base = 0;
        for (int k = 0; k + 1 < nd; k++) base += t[k][idx[k]];
        const char *src = (const char *)x->data + (size_t)base * es;
        if (nd == 0) {
            memcpy(d, src, es);
        } else {
            const int64_t *tl = t[nd - 1];
            for (int64_t j = 0; j < inner; j++, d += es) copy_elem(d, src + (size_t)tl[j] * es, es);
        }
        for (int k = nd - 2; k >= 0; k--) {
            if (++idx[k] < shape[k]) break;
            idx[k] = 0;
        }
    }
    free(tab);
    ctx->out[0] = y;
    return PP_OK;
}

static pp_status pad_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int nd = x->ndim;
    const char *mode = pp_node_attr_string(ctx->node, "mode", "constant");
    int edge = strcmp(mode, "edge") == 0, reflect = strcmp(mode, "reflect") == 0;
    if (strcmp(mode, "constant") != 0 && !edge && !reflect)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED,
                               "mode '%s' (supported: constant, edge, reflect)", mode);
    int64_t pads[2 * PP_MAX_DIMS], axes[PP_MAX_DIMS];
    int np, na = -1;
    if (input(ctx, 1)) {
        PP_TRY(read_ints(ctx, ctx->in[1], "pads", pads, 2 * PP_MAX_DIMS, &np));
    } else {
        const int64_t *v;
        np = pp_node_attr_ints(ctx->node, "pads", &v);
        if (np < 0 || np > 2 * PP_MAX_DIMS) return pp_kernel_error(ctx, PP_ERR_INVALID, "bad pads");
        memcpy(pads, v, sizeof(int64_t) * (size_t)np);
    }
    if (input(ctx, 3)) PP_TRY(read_ints(ctx, ctx->in[3], "axes", axes, PP_MAX_DIMS, &na));
    if (na < 0) {
        na = nd;
        for (int i = 0; i < nd; i++) axes[i] = i;
    }
    if (np != 2 * na)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%d pads for %d axes", np, na);
    int64_t lo[PP_MAX_DIMS] = {0}, hi[PP_MAX_DIMS] = {0}, shape[PP_MAX_DIMS];
    for (int i = 0; i < na; i++) {
        int a = norm_axis(axes[i], nd);
        if (a < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range", axes[i]);
        lo[a] = pads[i];
        hi[a] = pads[na + i];
        /* keeps in + lo + hi from overflowing */
        const int64_t lim = INT64_C(1) << 61;
        if (lo[a] < -lim || lo[a] > lim || hi[a] < -lim || hi[a] > lim)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "pad on axis %d out of range", a);
    }
    for (int i = 0; i < nd; i++) {
        shape[i] = x->shape[i] + lo[i] + hi[i];
        if (shape[i] < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "pads make axis %d negative", i);
    }
    if (!shape_fits(nd, shape)) return pp_kernel_error(ctx, PP_ERR_SHAPE, "padded shape overflows");
    if (edge || reflect) return pad_index_mode(ctx, x, shape, lo, reflect);
    size_t es = pp_dtype_size(x->dtype);
    /* The fill value in x's dtype. */
    unsigned char val[8] = {0};
    const pp_tensor *cv = input(ctx, 2);
    pp_tensor *tmp = NULL, *fv = NULL;
    if (cv && pp_tensor_numel(cv) > 0) {
        PP_TRY(cast_tensor(cv, x->dtype, &tmp));
    } else if (!cv && pp_node_attr(ctx->node, "value")) { /* opset < 11 */
        PP_TRY(pp_tensor_empty(PP_F64, 0, NULL, &fv));
        *(double *)fv->data = pp_node_attr_float(ctx->node, "value", 0);
        pp_status s = cast_tensor(fv, x->dtype, &tmp);
        pp_tensor_free(fv);
        PP_TRY(s);
    }
    if (tmp) {
        memcpy(val, tmp->data, es);
        pp_tensor_free(tmp);
    }
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, shape, &y));
    if (!y->nbytes) {
        ctx->out[0] = y;
        return PP_OK;
    }
    fill_elem(y->data, (const char *)val, pp_tensor_numel(y), es);
    int64_t istr[PP_MAX_DIMS], ostr[PP_MAX_DIMS];
    contiguous_strides(nd, x->shape, istr);
    contiguous_strides(nd, shape, ostr);
    sc_layout L = {.nd = nd};
    int64_t soff = 0, doff = 0;
    for (int i = 0; i < nd; i++) {
        int64_t s0 = lo[i] < 0 ? -lo[i] : 0, d0 = lo[i] > 0 ? lo[i] : 0;
        int64_t cnt = x->shape[i] - s0 - (hi[i] < 0 ? -hi[i] : 0);
        L.n[i] = cnt > 0 ? cnt : 0;
        L.ss[i] = istr[i];
        L.ds[i] = ostr[i];
        soff += s0 * istr[i];
        doff += d0 * ostr[i];
    }
    if (pp_shape_numel(nd, L.n) > 0)
        strided_copy((char *)y->data + doff * (int64_t)es, (const char *)x->data + soff * (int64_t)es,
                     es, &L);
    ctx->out[0] = y;
    return PP_OK;
}

/* ---------------------------------------------------------------- Cast */

/* Rounds |d| to a binary float with mbits mantissa and ebits exponent bits
 * (f16: 10/5, bf16: 7/8), nearest even, straight from double so there is no
 * double rounding through float. */
static uint16_t f64_to_small(double d, int mbits, int ebits) {
    uint16_t sign = signbit(d) ? (uint16_t)(1u << (mbits + ebits)) : 0;
    uint32_t emask = (1u << ebits) - 1;
    if (isnan(d)) return (uint16_t)(sign | (emask << mbits) | (1u << (mbits - 1)));
    double ad = fabs(d);
    if (ad == 0) return sign;
    if (isinf(ad)) return (uint16_t)(sign | (emask << mbits));
    int bias = (int)(emask >> 1), e;
    frexp(ad, &e);
    int ue = e - 1; /* ad in [2^ue, 2^(ue+1)) */
    if (ue < 1 - bias) ue = 1 - bias; /* subnormal: fixed quantum */
    if (ue + bias >= (int)emask) return (uint16_t)(sign | (emask << mbits));
    double q = rint(ldexp(ad, mbits - ue)); /* exact scaling, then round-half-even */
    uint64_t enc = ((uint64_t)(ue + bias - 1) << mbits) + (uint64_t)q;
    if (enc >= ((uint64_t)emask << mbits)) return (uint16_t)(sign | (emask << mbits));
    return (uint16_t)(sign | enc);
}

/* Float -> int64 truncating toward zero; NaN -> 0 and saturation outside the
 * range (ONNX leaves both undefined; this avoids C undefined behaviour). */
static inline int64_t f64_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

enum { CAST_CHUNK = 256 };

static void load_f64(const pp_tensor *t, int64_t i0, int n, double *buf) {
    const void *p = t->data;
    switch (t->dtype) {
    case PP_F32: for (int i = 0; i < n; i++) buf[i] = ((const float *)p)[i0 + i]; break;
    case PP_F64: memcpy(buf, (const double *)p + i0, sizeof(double) * (size_t)n); break;
    case PP_F16: for (int i = 0; i < n; i++) buf[i] = pp_f16_to_f32(((const uint16_t *)p)[i0 + i]); break;
    case PP_BF16: for (int i = 0; i < n; i++) buf[i] = pp_bf16_to_f32(((const uint16_t *)p)[i0 + i]); break;
    default: break;
    }
}

static void load_i64(const pp_tensor *t, int64_t i0, int n, int64_t *buf) {
    const void *p = t->data;
    switch (t->dtype) {
    case PP_I64: memcpy(buf, (const int64_t *)p + i0, sizeof(int64_t) * (size_t)n); break;
    case PP_I32: for (int i = 0; i < n; i++) buf[i] = ((const int32_t *)p)[i0 + i]; break;
    case PP_I8: for (int i = 0; i < n; i++) buf[i] = ((const int8_t *)p)[i0 + i]; break;
    case PP_U8: for (int i = 0; i < n; i++) buf[i] = ((const uint8_t *)p)[i0 + i]; break;
    case PP_BOOL: for (int i = 0; i < n; i++) buf[i] = ((const uint8_t *)p)[i0 + i] != 0; break;
    default: break;
    }
}

static void store_f64(pp_tensor *t, int64_t i0, int n, const double *buf) {
    void *p = t->data;
    switch (t->dtype) {
    case PP_F32: for (int i = 0; i < n; i++) ((float *)p)[i0 + i] = (float)buf[i]; break;
    case PP_F64: memcpy((double *)p + i0, buf, sizeof(double) * (size_t)n); break;
    case PP_F16: for (int i = 0; i < n; i++) ((uint16_t *)p)[i0 + i] = f64_to_small(buf[i], 10, 5); break;
    case PP_BF16: for (int i = 0; i < n; i++) ((uint16_t *)p)[i0 + i] = f64_to_small(buf[i], 7, 8); break;
    case PP_BOOL: for (int i = 0; i < n; i++) ((uint8_t *)p)[i0 + i] = buf[i] != 0; break;
    default: /* integers: truncate to int64, then wrap like numpy's astype */
        for (int i = 0; i < n; i++) {
            int64_t v = f64_to_i64(buf[i]);
            switch (t->dtype) {
            case PP_I64: ((int64_t *)p)[i0 + i] = v; break;
            case PP_I32: ((int32_t *)p)[i0 + i] = (int32_t)(uint32_t)(uint64_t)v; break;
            case PP_I8: ((int8_t *)p)[i0 + i] = (int8_t)(uint8_t)(uint64_t)v; break;
            case PP_U8: ((uint8_t *)p)[i0 + i] = (uint8_t)(uint64_t)v; break;
            default: break;
            }
        }
        break;
    }
}

static void store_i64(pp_tensor *t, int64_t i0, int n, const int64_t *buf) {
    void *p = t->data;
    switch (t->dtype) {
    case PP_I64: memcpy((int64_t *)p + i0, buf, sizeof(int64_t) * (size_t)n); break;
    case PP_I32: for (int i = 0; i < n; i++) ((int32_t *)p)[i0 + i] = (int32_t)(uint32_t)(uint64_t)buf[i]; break;
    case PP_I8: for (int i = 0; i < n; i++) ((int8_t *)p)[i0 + i] = (int8_t)(uint8_t)(uint64_t)buf[i]; break;
    case PP_U8: for (int i = 0; i < n; i++) ((uint8_t *)p)[i0 + i] = (uint8_t)(uint64_t)buf[i]; break;
    case PP_BOOL: for (int i = 0; i < n; i++) ((uint8_t *)p)[i0 + i] = buf[i] != 0; break;
    case PP_F32: for (int i = 0; i < n; i++) ((float *)p)[i0 + i] = (float)buf[i]; break;
    case PP_F64: for (int i = 0; i < n; i++) ((double *)p)[i0 + i] = (double)buf[i]; break;
    case PP_F16: for (int i = 0; i < n; i++) ((uint16_t *)p)[i0 + i] = f64_to_small((double)buf[i], 10, 5); break;
    case PP_BF16: for (int i = 0; i < n; i++) ((uint16_t *)p)[i0 + i] = f64_to_small((double)buf[i], 7, 8); break;
    default: break;
    }
}

/* Casts src to dt into a new tensor: via double for float sources, via int64
 * for integer/bool ones, in chunks so each inner loop is typed. */
static pp_status cast_tensor(const pp_tensor *src, pp_dtype dt, pp_tensor **out) {
    PP_TRY(pp_tensor_empty(dt, src->ndim, src->shape, out));
    pp_tensor *y = *out;
    int64_t n = pp_tensor_numel(src);
    int from_float = pp_dtype_is_float(src->dtype);
    if (src->dtype == PP_F32 && dt == PP_F16) { /* hot pair: skip the double step */
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)y->data)[i] = pp_f32_to_f16(((const float *)src->data)[i]);
        return PP_OK;
    }
    if (src->dtype == PP_F32 && dt == PP_BF16) {
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)y->data)[i] = pp_f32_to_bf16(((const float *)src->data)[i]);
        return PP_OK;
    }
    double fb[CAST_CHUNK];
    int64_t ib[CAST_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += CAST_CHUNK) {
        int m = (int)(n - i0 < CAST_CHUNK ? n - i0 : CAST_CHUNK);
        if (from_float) {
            load_f64(src, i0, m, fb);
            store_f64(y, i0, m, fb);
        } else {
            load_i64(src, i0, m, ib);
            store_i64(y, i0, m, ib);
        }
    }
    return PP_OK;
}

static pp_status cast_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const pp_attr *a = pp_node_attr(n, "to");
    if (!a || a->type != PP_ATTR_INT)
        return pp_node_error(n, PP_ERR_INVALID, "needs an int attribute 'to'");
    if (!pp_dtype_is_valid((pp_dtype)a->i))
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "cast to ONNX type %" PRId64 " is not supported",
                             a->i);
    return PP_OK;
}

static pp_status cast_to(pp_kernel_ctx *ctx, pp_dtype dt) {
    pp_tensor *x = ctx->in[0];
    if (!pp_dtype_is_valid(dt))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "cast to ONNX type %d is not supported",
                               (int)dt);
    if (!pp_dtype_is_valid(x->dtype))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "cast from ONNX type %d", (int)x->dtype);
    if (x->dtype == dt) { /* tensors are immutable: share */
        ctx->out[0] = pp_tensor_retain(x);
        return PP_OK;
    }
    return cast_tensor(x, dt, &ctx->out[0]);
}

static pp_status cast_run(pp_kernel_ctx *ctx) {
    return cast_to(ctx, (pp_dtype)pp_node_attr_int(ctx->node, "to", 0));
}

static pp_status castlike_run(pp_kernel_ctx *ctx) { return cast_to(ctx, ctx->in[1]->dtype); }

/* --------------------------------------------------------- Shape, Size */

static pp_status shape_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    int r = x->ndim;
    int64_t start = pp_node_attr_int(ctx->node, "start", 0);
    int64_t end = pp_node_attr_int(ctx->node, "end", r);
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = start < 0 ? 0 : start > r ? r : start;
    end = end < 0 ? 0 : end > r ? r : end;
    int64_t n = end > start ? end - start : 0;
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_I64, 1, &n, &y));
    for (int64_t i = 0; i < n; i++) ((int64_t *)y->data)[i] = x->shape[start + i];
    ctx->out[0] = y;
    return PP_OK;
}

static pp_status size_run(pp_kernel_ctx *ctx) {
    return pp_tensor_scalar_i64(pp_tensor_numel(ctx->in[0]), &ctx->out[0]);
}

/* --------------------------------------------------------------- Range */

static pp_status range_run(pp_kernel_ctx *ctx) {
    const pp_tensor *ts = ctx->in[0], *tl = ctx->in[1], *td = ctx->in[2];
    pp_dtype dt = ts->dtype;
    if (tl->dtype != dt || td->dtype != dt)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "start, limit and delta differ in dtype");
    if (pp_tensor_numel(ts) != 1 || pp_tensor_numel(tl) != 1 || pp_tensor_numel(td) != 1)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "start, limit and delta must be scalars");
    int64_t n;
    pp_tensor *y;
    if (dt == PP_F32 || dt == PP_F64) {
        double s = pp_tensor_get_f64(ts, 0), l = pp_tensor_get_f64(tl, 0), d = pp_tensor_get_f64(td, 0);
        if (d == 0 || !isfinite(s) || !isfinite(l) || !isfinite(d))
            return pp_kernel_error(ctx, PP_ERR_INVALID, "bad range %g..%g step %g", s, l, d);
        double c = ceil((l - s) / d);
        if (c > 1e12) return pp_kernel_error(ctx, PP_ERR_NOMEM, "range of %g elements", c);
        n = c > 0 ? (int64_t)c : 0;
        PP_TRY(pp_tensor_empty(dt, 1, &n, &y));
        /* start + i*delta as numpy and PyTorch do (no accumulated drift) */
        for (int64_t i = 0; i < n; i++) {
            double v = s + (double)i * d;
            if (dt == PP_F32) ((float *)y->data)[i] = (float)v;
            else ((double *)y->data)[i] = v;
        }
    } else if (dt == PP_I64 || dt == PP_I32) {
        int64_t s = pp_tensor_get_i64(ts, 0), l = pp_tensor_get_i64(tl, 0), d = pp_tensor_get_i64(td, 0);
        if (d == 0) return pp_kernel_error(ctx, PP_ERR_INVALID, "delta is 0");
        /* exact ceil((l - s) / d) without overflow, in 128-bit-free form */
        if ((d > 0 && l <= s) || (d < 0 && l >= s)) {
            n = 0;
        } else {
            uint64_t span = d > 0 ? (uint64_t)l - (uint64_t)s : (uint64_t)s - (uint64_t)l;
            uint64_t step = d > 0 ? (uint64_t)d : (uint64_t)0 - (uint64_t)d;
            uint64_t c = (span - 1) / step + 1;
            if (c > ((uint64_t)1 << 40)) return pp_kernel_error(ctx, PP_ERR_NOMEM, "range too long");
            n = (int64_t)c;
        }
        PP_TRY(pp_tensor_empty(dt, 1, &n, &y));
        for (int64_t i = 0; i < n; i++) {
            int64_t v = (int64_t)((uint64_t)s + (uint64_t)i * (uint64_t)d);
            if (dt == PP_I64) ((int64_t *)y->data)[i] = v;
            else ((int32_t *)y->data)[i] = (int32_t)v;
        }
    } else {
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "dtype %s", pp_dtype_name(dt));
    }
    ctx->out[0] = y;
    return PP_OK;
}

/* ------------------------------------------------------ ConstantOfShape */

static pp_status constant_of_shape_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const pp_attr *a = pp_node_attr(n, "value");
    if (a && (a->type != PP_ATTR_TENSOR || !a->t || pp_tensor_numel(a->t) != 1))
        return pp_node_error(n, PP_ERR_INVALID, "'value' must be a one-element tensor");
    return PP_OK;
}

static pp_status constant_of_shape_run(pp_kernel_ctx *ctx) {
    int64_t shape[PP_MAX_DIMS];
    int nd;
    PP_TRY(read_ints(ctx, ctx->in[0], "shape", shape, PP_MAX_DIMS, &nd));
    for (int i = 0; i < nd; i++)
        if (shape[i] < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "negative dim %" PRId64, shape[i]);
    const pp_attr *a = pp_node_attr(ctx->node, "value");
    const pp_tensor *v = a && a->type == PP_ATTR_TENSOR ? a->t : NULL;
    if (v && pp_tensor_numel(v) != 1)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "'value' must hold one element");
    pp_dtype dt = v ? v->dtype : PP_F32;
    if (!v) return pp_tensor_new(PP_F32, nd, shape, &ctx->out[0]);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(dt, nd, shape, &y));
    fill_elem(y->data, v->data, pp_tensor_numel(y), pp_dtype_size(dt));
    ctx->out[0] = y;
    return PP_OK;
}

/* ------------------------------------------------------------ Constant */

static pp_status constant_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    static const char *const ok[] = {"value", "value_float", "value_floats", "value_int",
                                     "value_ints"};
    int found = 0;
    for (int i = 0; i < n->n_attr; i++) {
        const char *name = n->attrs[i].name;
        int known = 0;
        for (size_t k = 0; k < sizeof ok / sizeof ok[0]; k++)
            if (strcmp(name, ok[k]) == 0) known = 1;
        if (!known)
            return pp_node_error(n, PP_ERR_UNSUPPORTED, "attribute '%s' is not supported", name);
        found++;
    }
    if (found != 1)
        return pp_node_error(n, PP_ERR_INVALID, "needs exactly one value attribute, has %d", found);
    const pp_attr *a = &n->attrs[0];
    pp_attr_type want = strcmp(a->name, "value") == 0          ? PP_ATTR_TENSOR
                        : strcmp(a->name, "value_float") == 0  ? PP_ATTR_FLOAT
                        : strcmp(a->name, "value_floats") == 0 ? PP_ATTR_FLOATS
                        : strcmp(a->name, "value_int") == 0    ? PP_ATTR_INT
                                                               : PP_ATTR_INTS;
    if (a->type != want || (want == PP_ATTR_TENSOR && !a->t))
        return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' has the wrong type", a->name);
    return PP_OK;
}

static pp_status constant_run(pp_kernel_ctx *ctx) {
    const pp_node *n = ctx->node;
    const pp_attr *a;
    if ((a = pp_node_attr(n, "value")) && a->type == PP_ATTR_TENSOR && a->t) {
        ctx->out[0] = pp_tensor_retain(a->t);
        return PP_OK;
    }
    if ((a = pp_node_attr(n, "value_float")) && a->type == PP_ATTR_FLOAT)
        return pp_tensor_scalar_f32(a->f, &ctx->out[0]);
    if ((a = pp_node_attr(n, "value_int")) && a->type == PP_ATTR_INT)
        return pp_tensor_scalar_i64(a->i, &ctx->out[0]);
    int64_t len;
    if ((a = pp_node_attr(n, "value_floats")) && a->type == PP_ATTR_FLOATS) {
        len = a->n;
        PP_TRY(pp_tensor_empty(PP_F32, 1, &len, &ctx->out[0]));
        if (len) memcpy(ctx->out[0]->data, a->floats, sizeof(float) * (size_t)len);
        return PP_OK;
    }
    if ((a = pp_node_attr(n, "value_ints")) && a->type == PP_ATTR_INTS) {
        len = a->n;
        PP_TRY(pp_tensor_empty(PP_I64, 1, &len, &ctx->out[0]));
        if (len) memcpy(ctx->out[0]->data, a->ints, sizeof(int64_t) * (size_t)len);
        return PP_OK;
    }
    return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "no supported value attribute");
}

/* ------------------------------------------------------------- Dropout */

static pp_status dropout_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    const pp_tensor *tr = input(ctx, 1), *tm = input(ctx, 2);
    int training = 0;
    if (tm) {
        if (pp_tensor_numel(tm) != 1)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "training_mode must be a scalar");
        training = pp_tensor_get_f64(tm, 0) != 0;
    }
    if (training) {
        double ratio = tr ? (pp_tensor_numel(tr) == 1 ? pp_tensor_get_f64(tr, 0) : -1)
                          : pp_node_attr_float(ctx->node, "ratio", 0.5f);
        if (ratio != 0)
            return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED,
                                   "training-mode dropout with ratio %g is not supported "
                                   "(export with dropout disabled or p=0)", ratio);
    }
    pp_tensor *mask = NULL;
    if (want_out(ctx, 1)) {
        PP_TRY(pp_tensor_empty(PP_BOOL, x->ndim, x->shape, &mask));
        if (mask->nbytes) memset(mask->data, 1, mask->nbytes);
        ctx->out[1] = mask;
    }
    ctx->out[0] = pp_tensor_retain(x);
    return PP_OK;
}

/* --------------------------------------------------------------- Trilu */

static pp_status trilu_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    if (x->ndim < 2) return pp_kernel_error(ctx, PP_ERR_SHAPE, "input needs at least 2 dims");
    int64_t k = 0;
    if (input(ctx, 1)) PP_TRY(read_scalar_i64(ctx, ctx->in[1], "k", &k));
    int upper = pp_node_attr_int(ctx->node, "upper", 1) != 0;
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, x->ndim, x->shape, &y));
    size_t es = pp_dtype_size(x->dtype);
    int64_t rows = x->shape[x->ndim - 2], cols = x->shape[x->ndim - 1];
    int64_t mats = pp_shape_numel(x->ndim - 2, x->shape);
    /* clamp k so i + k never overflows */
    if (k > cols) k = cols + 1;
    if (k < -rows) k = -rows - 1;
    for (int64_t m = 0; m < mats && y->nbytes; m++)
        for (int64_t i = 0; i < rows; i++) {
            size_t roff = (size_t)((m * rows + i) * cols) * es;
            const char *s = (const char *)x->data + roff;
            char *d = (char *)y->data + roff;
            /* keep columns [j0, j1) of this row */
            int64_t j0 = upper ? i + k : 0, j1 = upper ? cols : i + k + 1;
            j0 = j0 < 0 ? 0 : j0 > cols ? cols : j0;
            j1 = j1 < 0 ? 0 : j1 > cols ? cols : j1;
            if (j1 < j0) j1 = j0;
            memset(d, 0, (size_t)j0 * es);
            memcpy(d + (size_t)j0 * es, s + (size_t)j0 * es, (size_t)(j1 - j0) * es);
            memset(d + (size_t)j1 * es, 0, (size_t)(cols - j1) * es);
        }
    ctx->out[0] = y;
    return PP_OK;
}

/* ---------------------------------------------------------------- table */

const pp_op pp_ops_shape[] = {
    {"Identity", "", 1, 1, 1, 1, NULL, identity_run},
    {"Reshape", "", 1, 2, 1, 1, NULL, reshape_run},
    {"Flatten", "", 1, 1, 1, 1, NULL, flatten_run},
    {"Squeeze", "", 1, 2, 1, 1, NULL, squeeze_run},
    {"Unsqueeze", "", 1, 2, 1, 1, NULL, unsqueeze_run},
    {"Transpose", "", 1, 1, 1, 1, transpose_check, transpose_run},
    {"Concat", "", 1, 1024, 1, 1, concat_check, concat_run},
    {"Split", "", 1, 2, 1, 1024, NULL, split_run},
    {"Slice", "", 1, 5, 1, 1, NULL, slice_run},
    {"Gather", "", 2, 2, 1, 1, NULL, gather_run},
    {"GatherElements", "", 2, 2, 1, 1, NULL, gather_elements_run},
    {"GatherND", "", 2, 2, 1, 1, NULL, gather_nd_run},
    {"Expand", "", 2, 2, 1, 1, NULL, expand_run},
    {"Tile", "", 2, 2, 1, 1, NULL, tile_run},
    {"Pad", "", 1, 4, 1, 1, NULL, pad_run},
    {"Cast", "", 1, 1, 1, 1, cast_check, cast_run},
    {"CastLike", "", 2, 2, 1, 1, NULL, castlike_run},
    {"Shape", "", 1, 1, 1, 1, NULL, shape_run},
    {"Size", "", 1, 1, 1, 1, NULL, size_run},
    {"Range", "", 3, 3, 1, 1, NULL, range_run},
    {"ConstantOfShape", "", 1, 1, 1, 1, constant_of_shape_check, constant_of_shape_run},
    {"Constant", "", 0, 0, 1, 1, constant_check, constant_run},
    {"Dropout", "", 1, 3, 1, 2, NULL, dropout_run},
    {"Trilu", "", 1, 2, 1, 1, NULL, trilu_run},
    {NULL},
};
