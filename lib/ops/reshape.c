/* Reshape family: Identity, Reshape, Flatten, Squeeze, Unsqueeze and
 * Transpose (Dropout is in dropout.c). Pure reshapes return views that
 * share their input's buffer; Transpose copies unless only unit dims move. */
#include <inttypes.h>
#include <stdint.h>
#include <string.h>

#include "shape_kernels.h"

#include "status_internal.h"

/* ------------------------------------------------------------ Identity */

static pp_status identity_run(pp_kernel_ctx *ctx) {
    if (!ctx->in[0]) return pp_kernel_error(ctx, PP_ERR_INVALID, "missing input");
    ctx->out[0] = pp_tensor_retain(ctx->in[0]);
    return PP_OK;
}

/* ------------------------------------------------------------- Reshape */

static pp_status reshape_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    const pp_tensor *st = pp_kernel_input(ctx, 1);
    int64_t shape[PP_MAX_DIMS];
    int nd = 0;
    char a[128], b[128];
    if (st) {
        PP_TRY(pp_read_ints(ctx, st, "shape", shape, PP_MAX_DIMS, &nd));
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
                                       i, pp_shape_s(x, a, sizeof a));
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
                                       pp_shape_s(x, a, sizeof a));
            shape[infer] = 0;
        } else {
            if (numel % known != 0)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot reshape %s (%" PRId64
                                       " elements) with -1 and %" PRId64 " known",
                                       pp_shape_s(x, a, sizeof a), numel, known);
            shape[infer] = numel / known;
        }
    }
    if (pp_shape_numel(nd, shape) != numel)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot reshape %s into %s",
                               pp_shape_s(x, a, sizeof a), pp_shape_str(nd, shape, b, sizeof b));
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
    const pp_tensor *t = pp_kernel_input(ctx, 1);
    if (t) return pp_read_ints(ctx, t, "axes", axes, max, n);
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
            int a = pp_norm_axis(axes[i], x->ndim);
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
        int a = pp_norm_axis(axes[i], nd);
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
    pp_contiguous_strides(nd, x->shape, istr);
    pp_sc_layout L = {.nd = nd};
    pp_contiguous_strides(nd, shape, L.ds);
    for (int i = 0; i < nd; i++) {
        L.n[i] = shape[i];
        L.ss[i] = istr[perm[i]];
    }
    pp_strided_copy(y->data, x->data, pp_dtype_size(x->dtype), &L);
    ctx->out[0] = y;
    return PP_OK;
}

/* ---------------------------------------------------------------- table */

const pp_op pp_ops_reshape[] = {
    {"Identity", "", 1, 1, 1, 1, NULL, identity_run},
    {"Reshape", "", 1, 2, 1, 1, NULL, reshape_run},
    {"Flatten", "", 1, 1, 1, 1, NULL, flatten_run},
    {"Squeeze", "", 1, 2, 1, 1, NULL, squeeze_run},
    {"Unsqueeze", "", 1, 2, 1, 1, NULL, unsqueeze_run},
    {"Transpose", "", 1, 1, 1, 1, transpose_check, transpose_run},
    {NULL},
};
