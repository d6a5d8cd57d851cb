/* Pad family: Expand, Tile, Pad (and its gradient pippin::PadGrad), Trilu:
 * a new tensor of the input's elements laid out again, replicated or filled
 * around. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grad_kernels.h"
#include "shape_kernels.h"

#include "status_internal.h"

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
    pp_contiguous_strides(x->ndim, x->shape, istr);
    pp_sc_layout L = {.nd = nd};
    pp_contiguous_strides(nd, shape, L.ds);
    int lead = nd - x->ndim;
    for (int i = 0; i < nd; i++) {
        L.n[i] = shape[i];
        L.ss[i] = i < lead || x->shape[i - lead] == 1 ? 0 : istr[i - lead];
    }
    if (y->nbytes) pp_strided_copy(y->data, x->data, pp_dtype_size(x->dtype), &L);
    *out = y;
    return PP_OK;
}

static pp_status expand_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int64_t want[PP_MAX_DIMS], shape[PP_MAX_DIMS];
    int nw, nd;
    PP_TRY(pp_read_ints(ctx, ctx->in[1], "shape", want, PP_MAX_DIMS, &nw));
    char a[128], b[128];
    for (int i = 0; i < nw; i++)
        if (want[i] < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "negative dim in shape %s",
                                   pp_shape_str(nw, want, b, sizeof b));
    if (!broadcast_shapes(x->ndim, x->shape, nw, want, &nd, shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot expand %s to %s",
                               pp_shape_s(x, a, sizeof a), pp_shape_str(nw, want, b, sizeof b));
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
    PP_TRY(pp_read_ints(ctx, ctx->in[1], "repeats", rep, PP_MAX_DIMS, &nr));
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
    pp_contiguous_strides(nd, x->shape, istr);
    pp_contiguous_strides(nd, shape, ostr);
    /* Output index on dim i is r * in_i + k: one box dim for r (source stride
     * 0), one for k. */
    pp_sc_layout L = {.nd = 2 * nd};
    for (int i = 0; i < nd; i++) {
        L.n[2 * i] = rep[i];
        L.ss[2 * i] = 0;
        L.ds[2 * i] = x->shape[i] * ostr[i];
        L.n[2 * i + 1] = x->shape[i];
        L.ss[2 * i + 1] = istr[i];
        L.ds[2 * i + 1] = ostr[i];
    }
    if (y->nbytes) pp_strided_copy(y->data, x->data, pp_dtype_size(x->dtype), &L);
    ctx->out[0] = y;
    return PP_OK;
}

/* ------------------------------------------------------------------ Pad */

enum { PAD_CONSTANT, PAD_EDGE, PAD_REFLECT, PAD_WRAP };

static int pad_mode_of(const char *mode) {
    if (!strcmp(mode, "constant")) return PAD_CONSTANT;
    if (!strcmp(mode, "edge")) return PAD_EDGE;
    if (!strcmp(mode, "reflect")) return PAD_REFLECT;
    if (!strcmp(mode, "wrap")) return PAD_WRAP;
    return -1;
}

/* Source index along a dim of n entries for output index o (lo = head
 * pad), or -1 where the constant fills. */
static int64_t pad_source(int mode, int64_t o, int64_t lo, int64_t n) {
    int64_t i = o - lo;
    switch (mode) {
    case PAD_CONSTANT: return i < 0 || i >= n ? -1 : i;
    case PAD_EDGE: return i < 0 ? 0 : i >= n ? n - 1 : i;
    case PAD_REFLECT: { /* mirror without repeating the edge, as numpy */
        if (n == 1) return 0;
        int64_t period = 2 * (n - 1);
        i %= period;
        if (i < 0) i += period;
        return i >= n ? period - i : i;
    }
    default:
        i %= n;
        return i < 0 ? i + n : i;
    }
}

/* Per output dim, the source offset (index times x's stride, -1: fill) of
 * each output index, in one block (*mem, freed by the caller). */
static pp_status pad_tables(const pp_kernel_ctx *ctx, int mode, int nd, const int64_t *xshape,
                            const int64_t *shape, const int64_t *lo, int64_t **t, int64_t **mem) {
    static const char *const names[] = {"constant", "edge", "reflect", "wrap"};
    for (int i = 0; i < nd; i++) {
        if (mode != PAD_CONSTANT && xshape[i] == 0 && shape[i] > 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot %s-pad empty axis %d", names[mode], i);
        /* wrap over a crop: runtimes disagree (crop first, or wrap over the
         * whole axis); refuse rather than pick one silently */
        int64_t hi = shape[i] - xshape[i] - lo[i];
        if (mode == PAD_WRAP && ((lo[i] < 0 && hi > 0) || (lo[i] > 0 && hi < 0)))
            return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "wrap padding that crops one end of axis %d and "
                                   "pads the other is not supported", i);
    }
    int64_t total = 0;
    for (int i = 0; i < nd; i++) total += shape[i];
    int64_t *tab = malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
    if (!tab) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory");
    int64_t istr[PP_MAX_DIMS];
    pp_contiguous_strides(nd, xshape, istr);
    int64_t *p = tab;
    for (int d = 0; d < nd; p += shape[d], d++) {
        t[d] = p;
        for (int64_t o = 0; o < shape[d]; o++) {
            int64_t i = pad_source(mode, o, lo[d], xshape[d]);
            p[o] = i < 0 ? -1 : i * istr[d];
        }
    }
    *mem = tab;
    return PP_OK;
}

/* Edge / reflect / wrap padding through the tables; the innermost dim is
 * copied element by element. */
static pp_status pad_index_mode(pp_kernel_ctx *ctx, const pp_tensor *x, const int64_t *shape,
                                const int64_t *lo, int mode) {
    int nd = x->ndim;
    int64_t *t[PP_MAX_DIMS], *tab;
    PP_TRY(pad_tables(ctx, mode, nd, x->shape, shape, lo, t, &tab));
    pp_tensor *y;
    pp_status st = pp_tensor_empty(x->dtype, nd, shape, &y);
    if (st != PP_OK) {
        free(tab);
        return st;
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
            for (int64_t j = 0; j < inner; j++, d += es)
                pp_copy_elem(d, src + (size_t)tl[j] * es, es);
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

/* Head pads (lo) and the padded shape of x from the pads (the tensor pads_t,
 * or the 'pads' attribute before opset 11) and the optional axes. */
static pp_status pad_geometry(pp_kernel_ctx *ctx, int nd, const int64_t *xshape,
                              const pp_tensor *pads_t, const pp_tensor *axes_t, int64_t *lo,
                              int64_t *shape) {
    int64_t pads[2 * PP_MAX_DIMS], axes[PP_MAX_DIMS];
    int np, na = -1;
    if (pads_t) {
        PP_TRY(pp_read_ints(ctx, pads_t, "pads", pads, 2 * PP_MAX_DIMS, &np));
    } else {
        const int64_t *v;
        np = pp_node_attr_ints(ctx->node, "pads", &v);
        if (np < 0 || np > 2 * PP_MAX_DIMS) return pp_kernel_error(ctx, PP_ERR_INVALID, "bad pads");
        memcpy(pads, v, sizeof(int64_t) * (size_t)np);
    }
    if (axes_t) PP_TRY(pp_read_ints(ctx, axes_t, "axes", axes, PP_MAX_DIMS, &na));
    if (na < 0) {
        na = nd;
        for (int i = 0; i < nd; i++) axes[i] = i;
    }
    if (np != 2 * na)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%d pads for %d axes", np, na);
    int64_t hi[PP_MAX_DIMS] = {0};
    for (int i = 0; i < nd; i++) lo[i] = 0;
    for (int i = 0; i < na; i++) {
        int a = pp_norm_axis(axes[i], nd);
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
        shape[i] = xshape[i] + lo[i] + hi[i];
        if (shape[i] < 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "pads make axis %d negative", i);
    }
    if (!shape_fits(nd, shape)) return pp_kernel_error(ctx, PP_ERR_SHAPE, "padded shape overflows");
    return PP_OK;
}

static pp_status pad_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const char *mode = pp_node_attr_string(n, "mode", "constant");
    if (pad_mode_of(mode) < 0)
        return pp_node_error(n, PP_ERR_UNSUPPORTED,
                             "mode '%s' (supported: constant, edge, reflect, wrap)", mode);
    return PP_OK;
}

static pp_status pad_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int nd = x->ndim;
    const char *mode = pp_node_attr_string(ctx->node, "mode", "constant");
    int m = pad_mode_of(mode);
    if (m < 0)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED,
                               "mode '%s' (supported: constant, edge, reflect, wrap)", mode);
    int64_t lo[PP_MAX_DIMS], shape[PP_MAX_DIMS];
    PP_TRY(pad_geometry(ctx, nd, x->shape, pp_kernel_input(ctx, 1), pp_kernel_input(ctx, 3), lo,
                        shape));
    if (m != PAD_CONSTANT) return pad_index_mode(ctx, x, shape, lo, m);
    int64_t hi[PP_MAX_DIMS];
    for (int i = 0; i < nd; i++) hi[i] = shape[i] - x->shape[i] - lo[i];
    size_t es = pp_dtype_size(x->dtype);
    /* The fill value in x's dtype. */
    unsigned char val[8] = {0};
    const pp_tensor *cv = pp_kernel_input(ctx, 2);
    pp_tensor *tmp = NULL, *fv = NULL;
    if (cv && pp_tensor_numel(cv) > 0) {
        PP_TRY(pp_cast_tensor(cv, x->dtype, &tmp));
    } else if (!cv && pp_node_attr(ctx->node, "value")) { /* opset < 11 */
        PP_TRY(pp_tensor_empty(PP_F64, 0, NULL, &fv));
        *(double *)fv->data = pp_node_attr_float(ctx->node, "value", 0);
        pp_status s = pp_cast_tensor(fv, x->dtype, &tmp);
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
    pp_fill_elem(y->data, (const char *)val, pp_tensor_numel(y), es);
    int64_t istr[PP_MAX_DIMS], ostr[PP_MAX_DIMS];
    pp_contiguous_strides(nd, x->shape, istr);
    pp_contiguous_strides(nd, shape, ostr);
    pp_sc_layout L = {.nd = nd};
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
        pp_strided_copy((char *)y->data + doff * (int64_t)es,
                        (const char *)x->data + soff * (int64_t)es, es, &L);
    ctx->out[0] = y;
    return PP_OK;
}

/* -------------------------------------------------------------- PadGrad */

/* PadGrad(dy, shape_x, pads, axes) -> dx, with the forward's mode (and its
 * 'pads' attribute before opset 11): dy summed back into the x position
 * each padded element was read from (fill positions pass nothing). */
static pp_status pad_grad_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    int nd;
    int64_t xs[PP_MAX_DIMS], lo[PP_MAX_DIMS], shape[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 1, &nd, xs));
    const pp_tensor *dy = ctx->in[0];
    int m = pad_mode_of(pp_node_attr_string(ctx->node, "mode", "constant"));
    if (m < 0) return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "unknown mode");
    PP_TRY(pad_geometry(ctx, nd, xs, pp_kernel_input(ctx, 2), pp_kernel_input(ctx, 3), lo, shape));
    char a[128], b[128];
    if (!pp_shape_equal(dy->ndim, dy->shape, nd, shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy is %s, the padded shape %s",
                               pp_shape_s(dy, a, sizeof a), pp_shape_str(nd, shape, b, sizeof b));
    pp_tensor *dx;
    PP_TRY(pp_tensor_new(PP_F32, nd, xs, &dx));
    int64_t n = pp_tensor_numel(dy);
    if (!dx->nbytes || !n) {
        ctx->out[0] = dx;
        return PP_OK;
    }
    int64_t *t[PP_MAX_DIMS], *tab;
    pp_status st = pad_tables(ctx, m, nd, xs, shape, lo, t, &tab);
    if (st != PP_OK) {
        pp_tensor_free(dx);
        return st;
    }
    const float *g = dy->data;
    float *d = dx->data;
    int64_t idx[PP_MAX_DIMS] = {0}, inner = nd ? shape[nd - 1] : 1;
    for (int64_t o = 0; o < n; o += inner, g += inner) {
        int64_t base = 0;
        int fill = 0;
        for (int k = 0; k + 1 < nd; k++) {
            int64_t v = t[k][idx[k]];
            if (v < 0) fill = 1;
            base += v;
        }
        if (nd == 0) d[0] += g[0];
        else if (!fill) {
            const int64_t *tl = t[nd - 1];
            for (int64_t j = 0; j < inner; j++)
                if (tl[j] >= 0) d[base + tl[j]] += g[j];
        }
        for (int k = nd - 2; k >= 0; k--) {
            if (++idx[k] < shape[k]) break;
            idx[k] = 0;
        }
    }
    free(tab);
    ctx->out[0] = dx;
    return PP_OK;
}

/* --------------------------------------------------------------- Trilu */

static pp_status trilu_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    if (x->ndim < 2) return pp_kernel_error(ctx, PP_ERR_SHAPE, "input needs at least 2 dims");
    int64_t k = 0;
    if (pp_kernel_input(ctx, 1)) PP_TRY(read_scalar_i64(ctx, ctx->in[1], "k", &k));
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

const pp_op pp_ops_pad[] = {
    {"Expand", "", 2, 2, 1, 1, NULL, expand_run},
    {"Tile", "", 2, 2, 1, 1, NULL, tile_run},
    {"Pad", "", 1, 4, 1, 1, pad_check, pad_run},
    /* dy, shape_x, pads, axes -> dx */
    {"PadGrad", "pippin", 2, 4, 1, 1, pad_check, pad_grad_run},
    {"Trilu", "", 1, 2, 1, 1, NULL, trilu_run},
    {NULL},
};
