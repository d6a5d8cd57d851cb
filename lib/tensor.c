/* Tensor allocation, reference counting, element access and conversion. */
#include "pippin/tensor.h"

#include "inplace.h"
#include "mem_plan.h"
#include "tensor_pool.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"
/* Data buffers are 64-byte aligned for vector kernels and BLAS
 * (tensor_pool.c allocates them). */

int64_t pp_shape_numel(int ndim, const int64_t *shape) {
    /* A zero dim makes the product 0 whatever the others are (and must not
     * let a product of huge dims overflow first). */
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

int64_t pp_tensor_numel(const pp_tensor *t) { return pp_shape_numel(t->ndim, t->shape); }

pp_status pp_shape_bytes(pp_dtype dt, int ndim, const int64_t *shape, size_t *nbytes) {
    size_t esize = pp_dtype_size(dt);
    if (!esize) return pp_error(PP_ERR_INVALID, "unknown dtype code %d", (int)dt);
    if (ndim < 0 || ndim > PP_MAX_DIMS)
        return pp_error(PP_ERR_INVALID, "%d dims (at most %d supported)", ndim, PP_MAX_DIMS);
    size_t n = esize;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return pp_error(PP_ERR_SHAPE, "negative dimension %" PRId64, shape[i]);
        zero |= shape[i] == 0;
    }
    for (int i = 0; i < ndim && !zero; i++) {
        if (n > SIZE_MAX / (size_t)shape[i]) return pp_error(PP_ERR_NOMEM, "tensor size overflows");
        n *= (size_t)shape[i];
    }
    *nbytes = zero ? 0 : n;
    return PP_OK;
}

static pp_status tensor_alloc(pp_dtype dt, int ndim, const int64_t *shape, int zero,
                              pp_tensor **out) {
    size_t nbytes;
    PP_TRY(pp_shape_bytes(dt, ndim, shape, &nbytes));
    pp_tensor *t = calloc(1, sizeof *t);
    if (!t) return pp_error(PP_ERR_NOMEM, "out of memory allocating a tensor");
    /* an in-place op's output takes its dying input's buffer (lib/inplace.c);
     * never a zeroed one, whose memset would clear the input */
    int taken = nbytes && !zero && pp_inplace_take(t, dt, ndim, shape, nbytes);
    if (nbytes && !taken) {
        /* the running graph's memory plan first (lib/mem_plan.c), else the pool */
        t->data = pp_mem_plan_alloc(t, nbytes);
        if (!t->data) t->data = pp_pool_alloc(nbytes, &t->free_fn, &t->free_hint);
        if (!t->data) {
            free(t);
            return pp_error(PP_ERR_NOMEM, "out of memory allocating %zu bytes", nbytes);
        }
        if (zero) memset(t->data, 0, nbytes);
    }
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = nbytes;
    atomic_init((atomic_int *)&t->refcount, 1);
    *out = t;
    return PP_OK;
}

pp_status pp_tensor_new(pp_dtype dt, int ndim, const int64_t *shape, pp_tensor **out) {
    return tensor_alloc(dt, ndim, shape, 1, out);
}

pp_status pp_tensor_empty(pp_dtype dt, int ndim, const int64_t *shape, pp_tensor **out) {
    return tensor_alloc(dt, ndim, shape, 0, out);
}

pp_status pp_tensor_wrap(pp_dtype dt, int ndim, const int64_t *shape, void *data,
                         pp_free_fn free_fn, void *hint, pp_tensor **out) {
    size_t nbytes;
    PP_TRY(pp_shape_bytes(dt, ndim, shape, &nbytes));
    if (nbytes && !data) return pp_error(PP_ERR_INVALID, "wrapping NULL data of %zu bytes", nbytes);
    pp_tensor *t = calloc(1, sizeof *t);
    if (!t) return pp_error(PP_ERR_NOMEM, "out of memory allocating a tensor");
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = nbytes;
    t->free_fn = free_fn;
    t->free_hint = hint;
    atomic_init((atomic_int *)&t->refcount, 1);
    *out = t;
    return PP_OK;
}

pp_status pp_tensor_clone(const pp_tensor *src, pp_tensor **out) {
    PP_TRY(pp_tensor_empty(src->dtype, src->ndim, src->shape, out));
    if (src->nbytes) memcpy((*out)->data, src->data, src->nbytes);
    return PP_OK;
}

/* A view keeps its source alive through a reference held as the free hint. */
static void release_source(void *data, void *hint) {
    (void)data;
    pp_tensor_free(hint);
}

pp_status pp_tensor_view(pp_tensor *src, int ndim, const int64_t *shape, pp_tensor **out) {
    if (ndim < 0 || ndim > PP_MAX_DIMS)
        return pp_error(PP_ERR_INVALID, "%d dims (at most %d supported)", ndim, PP_MAX_DIMS);
    if (pp_shape_numel(ndim, shape) != pp_tensor_numel(src)) {
        char a[128], b[128];
        return pp_error(PP_ERR_SHAPE, "cannot view %s as %s",
                        pp_shape_str(src->ndim, src->shape, a, sizeof a),
                        pp_shape_str(ndim, shape, b, sizeof b));
    }
    PP_TRY(pp_tensor_wrap(src->dtype, ndim, shape, src->data, release_source, src, out));
    pp_tensor_retain(src);
    return PP_OK;
}

pp_status pp_tensor_slice0(pp_tensor *src, int64_t start, int64_t len, pp_tensor **out) {
    if (src->ndim < 1) return pp_error(PP_ERR_SHAPE, "cannot slice a scalar along dim 0");
    if (start < 0 || len < 0 || start + len > src->shape[0])
        return pp_error(PP_ERR_SHAPE, "rows %lld..%lld out of range (dim 0 is %lld)", (long long)start,
                        (long long)(start + len), (long long)src->shape[0]);
    int64_t shape[PP_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[0] = len;
    size_t row = src->shape[0] ? src->nbytes / (size_t)src->shape[0] : 0;
    char *base = (char *)src->data + (size_t)start * row;
    PP_TRY(pp_tensor_wrap(src->dtype, src->ndim, shape, len && row ? base : NULL, release_source, src, out));
    pp_tensor_retain(src);
    return PP_OK;
}

pp_tensor *pp_tensor_retain(pp_tensor *t) {
    if (t) atomic_fetch_add((atomic_int *)&t->refcount, 1);
    return t;
}

void pp_tensor_free(pp_tensor *t) {
    if (!t) return;
    if (atomic_fetch_sub((atomic_int *)&t->refcount, 1) != 1) return;
    if (t->free_fn) t->free_fn(t->data, t->free_hint);
    free(t);
}

double pp_tensor_get_f64(const pp_tensor *t, int64_t i) {
    const void *p = t->data;
    switch (t->dtype) {
    case PP_F32: return ((const float *)p)[i];
    case PP_F64: return ((const double *)p)[i];
    case PP_F16: return pp_f16_to_f32(((const uint16_t *)p)[i]);
    case PP_BF16: return pp_bf16_to_f32(((const uint16_t *)p)[i]);
    case PP_I64: return (double)((const int64_t *)p)[i];
    case PP_I32: return ((const int32_t *)p)[i];
    case PP_I8: return ((const int8_t *)p)[i];
    case PP_U8: return ((const uint8_t *)p)[i];
    case PP_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0;
    }
}

int64_t pp_tensor_get_i64(const pp_tensor *t, int64_t i) {
    switch (t->dtype) {
    case PP_I64: return ((const int64_t *)t->data)[i];
    case PP_I32: return ((const int32_t *)t->data)[i];
    default: {
        double v = pp_tensor_get_f64(t, i);
        if (v != v) return 0;
        if (v >= 9.2233720368547758e18) return INT64_MAX;
        if (v <= -9.2233720368547758e18) return INT64_MIN;
        return (int64_t)v;
    }
    }
}

/* Float to integer: truncation toward zero, NaN -> 0, saturating at the
 * target's range (C leaves out-of-range conversions undefined). */
static int64_t float_to_int(double v, double lo, double hi) {
    if (v != v) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)v;
}

void pp_tensor_set_f64(pp_tensor *t, int64_t i, double v) {
    void *p = t->data;
    switch (t->dtype) {
    case PP_F32: ((float *)p)[i] = (float)v; break;
    case PP_F64: ((double *)p)[i] = v; break;
    case PP_F16: ((uint16_t *)p)[i] = pp_f32_to_f16((float)v); break;
    case PP_BF16: ((uint16_t *)p)[i] = pp_f32_to_bf16((float)v); break;
    case PP_I64: ((int64_t *)p)[i] = float_to_int(v, -9223372036854775808.0, 9223372036854774784.0); break;
    case PP_I32: ((int32_t *)p)[i] = (int32_t)float_to_int(v, -2147483648.0, 2147483647.0); break;
    case PP_I8: ((int8_t *)p)[i] = (int8_t)float_to_int(v, -128.0, 127.0); break;
    case PP_U8: ((uint8_t *)p)[i] = (uint8_t)float_to_int(v, 0.0, 255.0); break;
    case PP_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: break;
    }
}

pp_status pp_tensor_cast(const pp_tensor *src, pp_dtype dt, pp_tensor **out) {
    if (!pp_dtype_is_valid(dt)) return pp_error(PP_ERR_INVALID, "cast to unknown dtype %d", (int)dt);
    PP_TRY(pp_tensor_empty(dt, src->ndim, src->shape, out));
    pp_tensor *t = *out;
    int64_t n = pp_tensor_numel(src);
    if (dt == src->dtype) {
        if (src->nbytes) memcpy(t->data, src->data, src->nbytes);
    } else if (!pp_dtype_is_float(dt) && dt != PP_BOOL && !pp_dtype_is_float(src->dtype)) {
        /* Integer to integer: exact through int64, wrapping like numpy. */
        for (int64_t i = 0; i < n; i++) {
            uint64_t v = (uint64_t)pp_tensor_get_i64(src, i);
            switch (dt) {
            case PP_I64: ((int64_t *)t->data)[i] = (int64_t)v; break;
            case PP_I32: ((uint32_t *)t->data)[i] = (uint32_t)v; break;
            default: ((uint8_t *)t->data)[i] = (uint8_t)v; break;
            }
        }
    } else if (src->dtype == PP_F32 && dt == PP_F64) {
        for (int64_t i = 0; i < n; i++) ((double *)t->data)[i] = ((const float *)src->data)[i];
    } else {
        for (int64_t i = 0; i < n; i++) pp_tensor_set_f64(t, i, pp_tensor_get_f64(src, i));
    }
    return PP_OK;
}

pp_status pp_tensor_scalar_f32(float v, pp_tensor **out) {
    PP_TRY(pp_tensor_empty(PP_F32, 0, NULL, out));
    *(float *)(*out)->data = v;
    return PP_OK;
}

pp_status pp_tensor_scalar_i64(int64_t v, pp_tensor **out) {
    PP_TRY(pp_tensor_empty(PP_I64, 0, NULL, out));
    *(int64_t *)(*out)->data = v;
    return PP_OK;
}

int pp_shape_equal(int na, const int64_t *a, int nb, const int64_t *b) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

const char *pp_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t len = 0;
    if (cap == 0) return buf;
    buf[0] = '\0';
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, i ? "," : "", shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    return buf;
}

int pp_tensor_allclose(const pp_tensor *a, const pp_tensor *b, double rtol, double atol,
                       char *why, size_t why_cap) {
    char sa[128], sb[128];
    if (a->dtype != b->dtype || !pp_shape_equal(a->ndim, a->shape, b->ndim, b->shape)) {
        if (why)
            snprintf(why, why_cap, "%s%s vs %s%s", pp_dtype_name(a->dtype),
                     pp_shape_str(a->ndim, a->shape, sa, sizeof sa), pp_dtype_name(b->dtype),
                     pp_shape_str(b->ndim, b->shape, sb, sizeof sb));
        return 0;
    }
    int64_t n = pp_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) {
        double x = pp_tensor_get_f64(a, i), y = pp_tensor_get_f64(b, i);
        if (isnan(x) && isnan(y)) continue;
        if (x == y) continue; /* also equal infinities */
        if (!(fabs(x - y) <= atol + rtol * fabs(y))) {
            if (why)
                snprintf(why, why_cap, "element %" PRId64 ": %.9g vs %.9g (|diff| %.3g)", i, x,
                         y, fabs(x - y));
            return 0;
        }
    }
    return 1;
}

pp_status pp_tensor_sum(pp_tensor *const *ts, int n, pp_tensor **out) {
    if (n < 1) return pp_error(PP_ERR_INVALID, "sum of no tensors");
    for (int i = 0; i < n; i++)
        if (ts[i]->dtype != PP_F32 || !pp_shape_equal(ts[i]->ndim, ts[i]->shape, ts[0]->ndim, ts[0]->shape)) {
            char a[128], b[128];
            return pp_error(PP_ERR_SHAPE, "cannot add %s%s to %s%s", pp_dtype_name(ts[i]->dtype),
                            pp_shape_str(ts[i]->ndim, ts[i]->shape, a, sizeof a), pp_dtype_name(ts[0]->dtype),
                            pp_shape_str(ts[0]->ndim, ts[0]->shape, b, sizeof b));
        }
    if (n == 1) {
        *out = pp_tensor_retain(ts[0]);
        return PP_OK;
    }
    PP_TRY(pp_tensor_clone(ts[0], out));
    float *d = (*out)->data;
    int64_t count = pp_tensor_numel(ts[0]);
    for (int i = 1; i < n; i++) {
        const float *x = ts[i]->data;
        for (int64_t k = 0; k < count; k++) d[k] += x[k];
    }
    return PP_OK;
}
