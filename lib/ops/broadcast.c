/* numpy-style broadcasting plans and their row iterator. */
#include "broadcast.h"

#include <stdio.h>
#include <string.h>

#include "status_internal.h"
#include "thread_pool.h"
/* "shapes [2,3] and [4]" / "shapes [2], [3] and [4]" into buf. */
static const char *shapes_str(int n, const int *ndims, const int64_t *const *shapes, char *buf,
                              size_t cap) {
    size_t len = (size_t)snprintf(buf, cap, "shapes ");
    for (int k = 0; k < n && len < cap; k++) {
        char s[160];
        const char *sep = k == 0 ? "" : (k == n - 1 ? " and " : ", ");
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", sep,
                                pp_shape_str(ndims[k], shapes[k], s, sizeof s));
    }
    return buf;
}

static pp_status shape_error(int n, const int *ndims, const int64_t *const *shapes) {
    char buf[800];
    return pp_error(PP_ERR_SHAPE, "%s do not broadcast", shapes_str(n, ndims, shapes, buf, sizeof buf));
}

pp_status pp_broadcast_shape(int na, const int64_t *a, int nb, const int64_t *b, int *nout,
                             int64_t *out) {
    const int ndims[2] = {na, nb};
    const int64_t *const shapes[2] = {a, b};
    pp_bcast plan;
    PP_TRY(pp_bcast_init_shapes(&plan, 2, ndims, shapes));
    *nout = plan.ndim;
    for (int d = 0; d < plan.ndim; d++) out[d] = plan.shape[d];
    return PP_OK;
}

pp_status pp_bcast_init_shapes(pp_bcast *b, int n, const int *ndims,
                               const int64_t *const *shapes) {
    if (n < 1 || n > PP_BCAST_MAX)
        return pp_error(PP_ERR_INTERNAL, "broadcast of %d operands (1 to %d supported)", n,
                        PP_BCAST_MAX);
    memset(b, 0, sizeof *b);
    b->n = n;
    int nd = 0;
    for (int k = 0; k < n; k++) {
        if (ndims[k] < 0 || ndims[k] > PP_MAX_DIMS)
            return pp_error(PP_ERR_INVALID, "operand %d has rank %d", k, ndims[k]);
        if (ndims[k] > nd) nd = ndims[k];
    }
    b->ndim = nd;
    /* Output shape: right-aligned; each dim is 1 or the one size > 1. A 0
     * broadcasts like any size against 1 only. */
    for (int d = 0; d < nd; d++) {
        int64_t size = 1;
        for (int k = 0; k < n; k++) {
            int j = d - (nd - ndims[k]);
            if (j < 0) continue;
            int64_t s = shapes[k][j];
            if (s < 0) return pp_error(PP_ERR_SHAPE, "operand %d has a negative dimension", k);
            if (s == 1) continue;
            if (size != 1 && size != s) return shape_error(n, ndims, shapes);
            size = s;
        }
        b->shape[d] = size;
    }
    b->numel = pp_shape_numel(nd, b->shape);

    /* Per-operand element strides on the output dims, then size-1 dims
     * dropped and mergeable neighbours merged. */
    int64_t stride[PP_BCAST_MAX][PP_MAX_DIMS];
    for (int k = 0; k < n; k++) {
        int64_t st = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int j = d - (nd - ndims[k]);
            if (j < 0 || shapes[k][j] == 1) {
                stride[k][d] = 0;
            } else {
                stride[k][d] = st;
                st *= shapes[k][j];
            }
        }
    }
    int c = 0;
    for (int d = 0; d < nd; d++) {
        if (b->shape[d] == 1) continue;
        int merge = c > 0;
        for (int k = 0; k < n && merge; k++)
            if (b->cstride[k][c - 1] != stride[k][d] * b->shape[d]) merge = 0;
        if (merge) {
            b->cshape[c - 1] *= b->shape[d];
            for (int k = 0; k < n; k++) b->cstride[k][c - 1] = stride[k][d];
        } else {
            b->cshape[c] = b->shape[d];
            for (int k = 0; k < n; k++) b->cstride[k][c] = stride[k][d];
            c++;
        }
    }
    b->cdim = c;
    b->inner = c ? b->cshape[c - 1] : 1;
    for (int k = 0; k < n; k++) b->inner_stride[k] = c ? b->cstride[k][c - 1] : 0;
    b->rows = b->numel == 0 ? 0 : b->numel / b->inner;
    return PP_OK;
}

pp_status pp_bcast_init(pp_bcast *b, int n, const pp_tensor *const *ts) {
    int ndims[PP_BCAST_MAX];
    const int64_t *shapes[PP_BCAST_MAX];
    if (n < 1 || n > PP_BCAST_MAX)
        return pp_error(PP_ERR_INTERNAL, "broadcast of %d operands (1 to %d supported)", n,
                        PP_BCAST_MAX);
    for (int k = 0; k < n; k++) {
        ndims[k] = ts[k]->ndim;
        shapes[k] = ts[k]->shape;
    }
    return pp_bcast_init_shapes(b, n, ndims, shapes);
}

void pp_bcast_iter_init(pp_bcast_iter *it, const pp_bcast *b) {
    memset(it, 0, sizeof *it);
    it->b = b;
}

void pp_bcast_iter_seek(pp_bcast_iter *it, const pp_bcast *b, int64_t row) {
    pp_bcast_iter_init(it, b);
    it->row = row;
    /* The outer merged dims' coordinates of row, innermost outer dim first. */
    int64_t rem = row;
    for (int d = b->cdim - 2; d >= 0 && rem > 0; d--) {
        it->idx[d] = rem % b->cshape[d];
        rem /= b->cshape[d];
        for (int k = 0; k < b->n; k++) it->off[k] += it->idx[d] * b->cstride[k][d];
    }
}

int pp_bcast_iter_next(pp_bcast_iter *it) {
    const pp_bcast *b = it->b;
    if (++it->row >= b->rows) return 0;
    /* Odometer over the outer merged dims, innermost first. */
    for (int d = b->cdim - 2; d >= 0; d--) {
        for (int k = 0; k < b->n; k++) it->off[k] += b->cstride[k][d];
        if (++it->idx[d] < b->cshape[d]) break;
        for (int k = 0; k < b->n; k++) it->off[k] -= b->cstride[k][d] * b->cshape[d];
        it->idx[d] = 0;
    }
    return 1;
}

typedef struct seg_job {
    const pp_bcast *b;
    pp_bcast_seg_fn seg;
    void *user;
} seg_job;

/* Elements [lo, hi) * PP_BCAST_ALIGN of the output, row by row. */
static void seg_piece(void *arg, int64_t lo, int64_t hi) {
    const seg_job *j = arg;
    const pp_bcast *b = j->b;
    lo *= PP_BCAST_ALIGN;
    hi *= PP_BCAST_ALIGN;
    if (hi > b->numel) hi = b->numel;
    int64_t inner = b->inner, col = lo % inner, off[PP_BCAST_MAX];
    pp_bcast_iter it;
    pp_bcast_iter_seek(&it, b, lo / inner);
    while (lo < hi) {
        int64_t len = inner - col < hi - lo ? inner - col : hi - lo;
        for (int k = 0; k < b->n; k++) off[k] = it.off[k] + col * b->inner_stride[k];
        j->seg(j->user, len, off, lo);
        lo += len;
        col = 0;
        if (lo < hi) pp_bcast_iter_next(&it);
    }
}

void pp_bcast_run(const pp_bcast *b, int64_t grain_elems, pp_bcast_seg_fn seg, void *user) {
    if (b->rows <= 0) return;
    seg_job j = {b, seg, user};
    int64_t blocks = (b->numel + PP_BCAST_ALIGN - 1) / PP_BCAST_ALIGN;
    pp_parallel_for(blocks, grain_elems / PP_BCAST_ALIGN, seg_piece, &j);
}

typedef struct bto_job {
    const char *s;
    char *o;
    size_t es;
    int64_t stride;
} bto_job;

static void bto_seg(void *user, int64_t len, const int64_t *off, int64_t out) {
    const bto_job *j = user;
    char *dst = j->o + (size_t)out * j->es;
    const char *from = j->s + (size_t)off[0] * j->es;
    if (j->stride) {
        memcpy(dst, from, (size_t)len * j->es);
    } else {
        for (int64_t i = 0; i < len; i++) memcpy(dst + (size_t)i * j->es, from, j->es);
    }
}

pp_status pp_broadcast_to(const pp_tensor *src, int ndim, const int64_t *shape,
                          pp_tensor **out) {
    const int ndims[2] = {src->ndim, ndim};
    const int64_t *const shapes[2] = {src->shape, shape};
    pp_bcast b;
    PP_TRY(pp_bcast_init_shapes(&b, 2, ndims, shapes));
    if (!pp_shape_equal(b.ndim, b.shape, ndim, shape)) {
        char s1[160], s2[160];
        return pp_error(PP_ERR_SHAPE, "shape %s does not broadcast to %s",
                        pp_shape_str(src->ndim, src->shape, s1, sizeof s1),
                        pp_shape_str(ndim, shape, s2, sizeof s2));
    }
    pp_tensor *t;
    PP_TRY(pp_tensor_empty(src->dtype, ndim, shape, &t));
    bto_job j = {src->data, t->data, pp_dtype_size(src->dtype), b.inner_stride[0]};
    pp_bcast_run(&b, PP_GRAIN_ELEMS, bto_seg, &j);
    *out = t;
    return PP_OK;
}
