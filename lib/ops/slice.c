/* Slice family: Concat, Split, Slice, Gather, GatherElements, GatherND.
 * Split and Slice share their input's buffer when the result is one
 * contiguous block. */
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shape_kernels.h"
#include "thread_pool.h"

#include "status_internal.h"

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
    int axis = pp_norm_axis(axis_attr, nd);
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
                                   "on axis %d", i, pp_dtype_name(t->dtype),
                                   pp_shape_s(t, a, sizeof a), pp_dtype_name(x0->dtype),
                                   pp_shape_s(x0, b, sizeof b), axis);
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

pp_status pp_split_sizes(const pp_kernel_ctx *ctx, const pp_tensor *x, int *axis_out, int64_t *sizes) {
    int nout = ctx->n_out;
    int64_t axis_attr = pp_node_attr_int(ctx->node, "axis", 0);
    int axis = pp_norm_axis(axis_attr, x->ndim);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, x->ndim);
    *axis_out = axis;
    int64_t dim = x->shape[axis];
    pp_status s = PP_OK;
    const pp_tensor *st = pp_kernel_input(ctx, 1);
    const int64_t *attr_split;
    int na = pp_node_attr_ints(ctx->node, "split", &attr_split);
    if (st || na >= 0) {
        int64_t cnt = st ? pp_tensor_numel(st) : na;
        if (cnt != nout)
            s = pp_kernel_error(ctx, PP_ERR_SHAPE, "split has %" PRId64 " entries for %d outputs",
                                cnt, nout);
        int got;
        if (s == PP_OK && st) s = pp_read_ints(ctx, st, "split", sizes, nout, &got);
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
    return s;
}

/* An output that is a copy: its buffer, the bytes it takes of each outer
 * row of the input, and where in the row they start. */
typedef struct {
    char *dst;
    size_t chunk, off;
} split_copy;

/* The copies' rows [lo, hi), every one of them. */
typedef struct {
    const char *src;
    size_t row; /* bytes of one outer row of the input */
    int n;
    const split_copy *c;
} split_job;

static void split_piece(void *arg, int64_t lo, int64_t hi) {
    const split_job *j = arg;
    for (int i = 0; i < j->n; i++) {
        const split_copy *c = &j->c[i];
        for (int64_t o = lo; o < hi; o++)
            memcpy(c->dst + (size_t)o * c->chunk, j->src + (size_t)o * j->row + c->off, c->chunk);
    }
}

static pp_status split_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int nout = ctx->n_out, axis = 0;
    size_t n1 = (size_t)(nout ? nout : 1);
    int64_t *sizes = calloc(n1, sizeof *sizes);
    split_copy *copies = calloc(n1, sizeof *copies);
    pp_status s = sizes && copies ? pp_split_sizes(ctx, x, &axis, sizes) : pp_error(PP_ERR_NOMEM, "out of memory");
    if (s != PP_OK) {
        free(sizes), free(copies);
        return s;
    }
    split_job job = {x->data, 0, 0, copies};
    int64_t dim = x->shape[axis];
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
        if (!pp_kernel_want_out(ctx, i)) continue;
        if (outer == 1) { /* one contiguous block: share the buffer */
            s = subview(x, off, x->ndim, shape, &ctx->out[i]);
            continue;
        }
        s = pp_tensor_empty(x->dtype, x->ndim, shape, &ctx->out[i]);
        if (s != PP_OK || !chunk) continue;
        copies[job.n++] = (split_copy){ctx->out[i]->data, chunk, off};
    }
    job.row = row;
    if (s == PP_OK && job.n) /* one pass of row copies, split between threads */
        pp_parallel_for(outer, pp_grain_rows((int64_t)(es ? row / es : row), PP_GRAIN_ELEMS), split_piece, &job);
    free(sizes), free(copies);
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
        PP_TRY(pp_read_ints(ctx, ctx->in[1], "starts", starts, PP_MAX_DIMS, &ns));
        PP_TRY(pp_read_ints(ctx, ctx->in[2], "ends", ends, PP_MAX_DIMS, &ne));
        if (pp_kernel_input(ctx, 3))
            PP_TRY(pp_read_ints(ctx, ctx->in[3], "axes", axes, PP_MAX_DIMS, &na));
        if (pp_kernel_input(ctx, 4))
            PP_TRY(pp_read_ints(ctx, ctx->in[4], "steps", steps, PP_MAX_DIMS, &nst));
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
        int a = pp_norm_axis(axes[i], nd);
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
    pp_contiguous_strides(nd, x->shape, istr);
    pp_sc_layout L = {.nd = nd};
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
    pp_contiguous_strides(nd, shape, L.ds);
    if (y->nbytes) pp_strided_copy(y->data, (const char *)x->data + off * (int64_t)es, es, &L);
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
    int axis = pp_norm_axis(axis_attr, x->ndim);
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
    int nd = x->ndim, axis = pp_norm_axis(axis_attr, nd);
    if (axis < 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range for rank %d",
                               axis_attr, nd);
    char a[128], b[128];
    if (idx->ndim != nd)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices %s and data %s differ in rank",
                               pp_shape_s(idx, a, sizeof a), pp_shape_s(x, b, sizeof b));
    for (int i = 0; i < nd; i++)
        if (i != axis && idx->shape[i] > x->shape[i])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "indices %s exceed data %s on axis %d",
                                   pp_shape_s(idx, a, sizeof a), pp_shape_s(x, b, sizeof b), i);
    int64_t dim = x->shape[axis];
    PP_TRY(check_indices(ctx, idx, dim, axis));
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, nd, idx->shape, &y));
    size_t es = pp_dtype_size(x->dtype);
    int64_t n = pp_tensor_numel(idx), xs[PP_MAX_DIMS], pos[PP_MAX_DIMS] = {0};
    pp_contiguous_strides(nd, x->shape, xs);
    int64_t base = 0; /* offset in x of pos with pos[axis] = 0 */
    for (int64_t i = 0; i < n; i++) {
        int64_t src = base + index_at(idx, i, dim) * xs[axis];
        pp_copy_elem((char *)y->data + (size_t)i * es, (const char *)x->data + (size_t)src * es,
                     es);
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
                               "indices %s", bd, pp_shape_s(x, a, sizeof a),
                               pp_shape_s(idx, b, sizeof b));
    int nb = (int)bd;
    int64_t m = idx->shape[q - 1];
    for (int i = 0; i < nb; i++)
        if (x->shape[i] != idx->shape[i])
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "batch dims of data %s and indices %s differ",
                                   pp_shape_s(x, a, sizeof a), pp_shape_s(idx, b, sizeof b));
    if (m < 1 || m > r - nb)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "index tuples of length %" PRId64
                               " for data %s with %d batch dims", m, pp_shape_s(x, a, sizeof a),
                               nb);
    int nd = q - 1 + r - nb - (int)m;
    if (nd > PP_MAX_DIMS)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "result would have %d dims", nd);
    int64_t shape[PP_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < q - 1; i++) shape[k++] = idx->shape[i];
    for (int i = nb + (int)m; i < r; i++) shape[k++] = x->shape[i];
    int64_t xs[PP_MAX_DIMS];
    pp_contiguous_strides(r, x->shape, xs);
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

/* ---------------------------------------------------------------- table */

const pp_op pp_ops_slice[] = {
    {"Concat", "", 1, 1024, 1, 1, concat_check, concat_run},
    {"Split", "", 1, 2, 1, 1024, NULL, split_run},
    {"Slice", "", 1, 5, 1, 1, NULL, slice_run},
    {"Gather", "", 2, 2, 1, 1, NULL, gather_run},
    {"GatherElements", "", 2, 2, 1, 1, NULL, gather_elements_run},
    {"GatherND", "", 2, 2, 1, 1, NULL, gather_nd_run},
    {NULL},
};
