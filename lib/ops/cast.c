/* Cast family: Cast, CastLike, with numpy's conversions (floats saturate
 * to integers, f16/bf16 round to nearest even straight from double). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "shape_kernels.h"

#include "status_internal.h"

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
pp_status pp_cast_tensor(const pp_tensor *src, pp_dtype dt, pp_tensor **out) {
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
    return pp_cast_tensor(x, dt, &ctx->out[0]);
}

static pp_status cast_run(pp_kernel_ctx *ctx) {
    return cast_to(ctx, (pp_dtype)pp_node_attr_int(ctx->node, "to", 0));
}

static pp_status castlike_run(pp_kernel_ctx *ctx) { return cast_to(ctx, ctx->in[1]->dtype); }

/* ---------------------------------------------------------------- table */

const pp_op pp_ops_cast[] = {
    {"Cast", "", 1, 1, 1, 1, cast_check, cast_run},
    {"CastLike", "", 2, 2, 1, 1, NULL, castlike_run},
    {NULL},
};
