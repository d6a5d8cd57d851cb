/* Constant family: Shape, Size, Range, ConstantOfShape, Constant: kernels
 * that make a tensor from shapes, scalars or attributes. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "shape_kernels.h"

#include "status_internal.h"

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
    PP_TRY(pp_read_ints(ctx, ctx->in[0], "shape", shape, PP_MAX_DIMS, &nd));
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
    pp_fill_elem(y->data, v->data, pp_tensor_numel(y), pp_dtype_size(dt));
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

/* ---------------------------------------------------------------- table */

const pp_op pp_ops_constant[] = {
    {"Shape", "", 1, 1, 1, 1, NULL, shape_run},
    {"Size", "", 1, 1, 1, 1, NULL, size_run},
    {"Range", "", 3, 3, 1, 1, NULL, range_run},
    {"ConstantOfShape", "", 1, 1, 1, 1, constant_of_shape_check, constant_of_shape_run},
    {"Constant", "", 0, 0, 1, 1, constant_check, constant_run},
    {NULL},
};
