/* MatMul and Gemm. Floats go through pp_gemm_f32/f64 (lib/ops/gemm.c: OpenBLAS
 * on pippin's pool; f16 and bf16 are widened to f32 around an sgemm); integers use a plain loop with
 * wrap-around arithmetic. Inputs are contiguous, so BLAS reads them in place:
 * a batched A against a 2-D B is one tall gemm, batched-both is one gemm per
 * batch on strided pointers. */
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "gemm.h"
#include "op.h"
#include "thread_pool.h"

#include "status_internal.h"
/* BLAS takes int dimensions (OpenBLAS built without INTERFACE64). */
static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static int is_half(pp_dtype dt) { return dt == PP_F16 || dt == PP_BF16; }

static int matmul_dtype_ok(pp_dtype dt) {
    return dt == PP_F32 || dt == PP_F64 || dt == PP_F16 || dt == PP_BF16 || dt == PP_I32 ||
           dt == PP_I64;
}

/* Integer C = op(A) op(B) (C overwritten), unsigned arithmetic so overflow
 * wraps instead of being undefined. */
#define DEFINE_GEMM_INT(NAME, T, U)                                                            \
    static void NAME(int ta, int tb, int64_t M, int64_t N, int64_t K, const T *A, int64_t lda, \
                     const T *B, int64_t ldb, T *C, int64_t ldc) {                             \
        for (int64_t m = 0; m < M; m++) {                                                      \
            T *c = C + m * ldc;                                                                \
            for (int64_t n = 0; n < N; n++) c[n] = 0;                                          \
            for (int64_t k = 0; k < K; k++) {                                                  \
                U a = (U)(ta ? A[k * lda + m] : A[m * lda + k]);                               \
                if (!a) continue;                                                              \
                if (!tb) {                                                                     \
                    const T *b = B + k * ldb;                                                  \
                    for (int64_t n = 0; n < N; n++) c[n] = (T)((U)c[n] + a * (U)b[n]);         \
                } else {                                                                       \
                    for (int64_t n = 0; n < N; n++)                                            \
                        c[n] = (T)((U)c[n] + a * (U)B[n * ldb + k]);                           \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }
DEFINE_GEMM_INT(gemm_i32, int32_t, uint32_t)
DEFINE_GEMM_INT(gemm_i64, int64_t, uint64_t)

/* One plain product C = A B (alpha 1, beta 0) of contiguous matrices. */
static void gemm_plain(pp_dtype dt, int64_t M, int64_t N, int64_t K, const void *A, const void *B,
                       void *C) {
    switch (dt) {
    case PP_F32:
        pp_gemm_f32(0, 0, (int)M, (int)N, (int)K, 1.0f, A, (int)K, B, (int)N, 0.0f, C, (int)N);
        break;
    case PP_F64:
        pp_gemm_f64(0, 0, (int)M, (int)N, (int)K, 1.0, A, (int)K, B, (int)N, 0.0, C, (int)N);
        break;
    case PP_I32: gemm_i32(0, 0, M, N, K, A, K, B, N, C, N); break;
    case PP_I64: gemm_i64(0, 0, M, N, K, A, K, B, N, C, N); break;
    default: break;
    }
}

/* Half inputs are widened to f32 (NULL stays NULL, other dtypes give NULL). */
static pp_status widen(const pp_tensor *t, pp_tensor **out) {
    if (!t || !is_half(t->dtype)) {
        *out = NULL;
        return PP_OK;
    }
    return pp_tensor_cast(t, PP_F32, out);
}

/* The batched product's gemms, [lo, hi) of the broadcast batch: batch t's
 * operands sit at offsets found from t's index over the batch shape. */
#define BATCH_GRAIN_MACS (INT64_C(1) << 17) /* a piece's work worth a wake-up */

typedef struct batch_job {
    pp_dtype dt;
    int64_t M, N, K;
    int nb;
    const int64_t *shape, *astr, *bstr;
    size_t es;
    const char *ad, *bd;
    char *yd;
} batch_job;

static void batch_piece(void *arg, int64_t lo, int64_t hi) {
    const batch_job *j = arg;
    for (int64_t t = lo; t < hi; t++) {
        int64_t aoff = 0, boff = 0, rest = t;
        for (int i = j->nb - 1; i >= 0; i--) {
            int64_t k = rest % j->shape[i];
            rest /= j->shape[i];
            aoff += k * j->astr[i];
            boff += k * j->bstr[i];
        }
        gemm_plain(j->dt, j->M, j->N, j->K, j->ad + (size_t)aoff * j->es, j->bd + (size_t)boff * j->es,
                   j->yd + (size_t)(t * j->M * j->N) * j->es);
    }
}

/* ----------------------------------------------------------------- MatMul */

static pp_status matmul_compute(pp_kernel_ctx *ctx, const pp_tensor *a, const pp_tensor *b,
                                pp_tensor **out) {
    char sa[128], sb[128];
    int ra = a->ndim, rb = b->ndim;
    if (ra == 0 || rb == 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "inputs must have at least 1 dim, got %s and %s",
                               pp_shape_str(ra, a->shape, sa, sizeof sa),
                               pp_shape_str(rb, b->shape, sb, sizeof sb));
    /* numpy rules: a 1-D A is a row [1,K], a 1-D B a column [K,1]; those unit
     * dims are dropped from the result. */
    int avec = ra == 1, bvec = rb == 1;
    int64_t M = avec ? 1 : a->shape[ra - 2], K = a->shape[ra - 1];
    int64_t Kb = bvec ? b->shape[0] : b->shape[rb - 2], N = bvec ? 1 : b->shape[rb - 1];
    if (K != Kb)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot multiply %s by %s (inner dims %" PRId64
                               " and %" PRId64 ")", pp_shape_str(ra, a->shape, sa, sizeof sa),
                               pp_shape_str(rb, b->shape, sb, sizeof sb), K, Kb);
    int nba = avec ? 0 : ra - 2, nbb = bvec ? 0 : rb - 2;
    int nb = nba > nbb ? nba : nbb;
    int64_t bshape[PP_MAX_DIMS], astr[PP_MAX_DIMS], bstr[PP_MAX_DIMS];
    int64_t sa_step = M * K, sb_step = K * N; /* elements per batch matrix */
    {
        int64_t as = sa_step, bs = sb_step;
        for (int i = nb - 1; i >= 0; i--) {
            int ia = i - (nb - nba), ib = i - (nb - nbb);
            int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
            if (da != db && da != 1 && db != 1)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "batch dims of %s and %s do not broadcast",
                                       pp_shape_str(ra, a->shape, sa, sizeof sa),
                                       pp_shape_str(rb, b->shape, sb, sizeof sb));
            bshape[i] = da == 1 ? db : da;
            astr[i] = da == 1 ? 0 : as;
            bstr[i] = db == 1 ? 0 : bs;
            as *= da;
            bs *= db;
        }
    }
    int64_t oshape[PP_MAX_DIMS];
    int ond = 0;
    for (int i = 0; i < nb; i++) oshape[ond++] = bshape[i];
    if (!avec) oshape[ond++] = M;
    if (!bvec) oshape[ond++] = N;
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(a->dtype, ond, oshape, &y));
    *out = y;
    int64_t nbatch = pp_shape_numel(nb, bshape);
    if (!y->nbytes) return PP_OK;
    if (K == 0) {
        memset(y->data, 0, y->nbytes);
        return PP_OK;
    }
    size_t es = pp_dtype_size(a->dtype);
    int blas = a->dtype == PP_F32 || a->dtype == PP_F64;
    if (blas && (!fits_int(M) || !fits_int(N) || !fits_int(K))) {
        pp_tensor_free(y);
        *out = NULL;
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "matrix dims exceed BLAS int range");
    }
    int64_t bbatch = bvec ? 1 : pp_shape_numel(rb - 2, b->shape);
    /* B shared by every batch: fold the batch into M, one gemm ([B,T,K] x
     * [K,N] is a [B*T,K] x [K,N] product on the same memory). */
    if (bbatch == 1 && (!blas || fits_int(nbatch * M))) {
        gemm_plain(a->dtype, nbatch * M, N, K, a->data, b->data, y->data);
        return PP_OK;
    }
    /* One gemm per batch matrix, the batch spread over the pool (each gemm
     * then runs whole on its thread). */
    batch_job j = {a->dtype, M, N, K, nb, bshape, astr, bstr, es, a->data, b->data, y->data};
    int64_t macs = M * N * K;
    pp_parallel_for(nbatch, macs < BATCH_GRAIN_MACS ? BATCH_GRAIN_MACS / macs : 1, batch_piece, &j);
    return PP_OK;
}

static pp_status matmul_run(pp_kernel_ctx *ctx) {
    const pp_tensor *a = ctx->in[0], *b = ctx->in[1];
    if (a->dtype != b->dtype)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "inputs differ in dtype (%s and %s)",
                               pp_dtype_name(a->dtype), pp_dtype_name(b->dtype));
    if (!matmul_dtype_ok(a->dtype))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "dtype %s is not supported",
                               pp_dtype_name(a->dtype));
    if (!is_half(a->dtype)) return matmul_compute(ctx, a, b, &ctx->out[0]);
    pp_tensor *a32 = NULL, *b32 = NULL, *y32 = NULL;
    pp_status s = widen(a, &a32);
    if (s == PP_OK) s = widen(b, &b32);
    if (s == PP_OK) s = matmul_compute(ctx, a32, b32, &y32);
    if (s == PP_OK) s = pp_tensor_cast(y32, a->dtype, &ctx->out[0]);
    pp_tensor_free(a32);
    pp_tensor_free(b32);
    pp_tensor_free(y32);
    return s;
}

/* ------------------------------------------------------------------- Gemm */

static pp_status gemm_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    static const char *const ints[] = {"transA", "transB"};
    for (int i = 0; i < 2; i++) {
        const pp_attr *a = pp_node_attr(n, ints[i]);
        if (a && (a->type != PP_ATTR_INT || (a->i != 0 && a->i != 1)))
            return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' must be 0 or 1", ints[i]);
    }
    return PP_OK;
}

/* Writes C broadcast to [M,N] into y (element size es). */
static void broadcast_bias(const pp_tensor *c, int64_t M, int64_t N, size_t es, char *y) {
    int64_t cm = c->ndim == 2 ? c->shape[0] : 1;
    int64_t cn = c->ndim >= 1 ? c->shape[c->ndim - 1] : 1;
    const char *cd = c->data;
    for (int64_t m = 0; m < M; m++) {
        const char *row = cd + (size_t)((cm == 1 ? 0 : m) * cn) * es;
        char *d = y + (size_t)(m * N) * es;
        if (cn == N) {
            memcpy(d, row, (size_t)N * es);
        } else {
            for (int64_t n = 0; n < N; n++) memcpy(d + (size_t)n * es, row, es);
        }
    }
}

static pp_status gemm_compute(pp_kernel_ctx *ctx, const pp_tensor *a, const pp_tensor *b,
                              const pp_tensor *c, pp_tensor **out) {
    char sa[128], sb[128];
    int ta = pp_node_attr_int(ctx->node, "transA", 0) != 0;
    int tb = pp_node_attr_int(ctx->node, "transB", 0) != 0;
    double alpha = pp_node_attr_float(ctx->node, "alpha", 1.0f);
    double beta = pp_node_attr_float(ctx->node, "beta", 1.0f);
    if (a->ndim != 2 || b->ndim != 2)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "A and B must be 2-D, got %s and %s",
                               pp_shape_str(a->ndim, a->shape, sa, sizeof sa),
                               pp_shape_str(b->ndim, b->shape, sb, sizeof sb));
    int64_t M = ta ? a->shape[1] : a->shape[0], K = ta ? a->shape[0] : a->shape[1];
    int64_t Kb = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    if (K != Kb)
        return pp_kernel_error(ctx, PP_ERR_SHAPE,
                               "cannot multiply %s%s by %s%s (inner dims %" PRId64 " and %" PRId64 ")",
                               pp_shape_str(2, a->shape, sa, sizeof sa), ta ? "^T" : "",
                               pp_shape_str(2, b->shape, sb, sizeof sb), tb ? "^T" : "", K, Kb);
    if (c) {
        int ok = c->dtype == a->dtype && c->ndim <= 2;
        if (ok && c->ndim >= 1 && c->shape[c->ndim - 1] != N && c->shape[c->ndim - 1] != 1) ok = 0;
        if (ok && c->ndim == 2 && c->shape[0] != M && c->shape[0] != 1) ok = 0;
        if (!ok) {
            int64_t ys[2] = {M, N};
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "C %s%s does not broadcast to %s%s",
                                   pp_dtype_name(c->dtype), pp_shape_str(c->ndim, c->shape, sa, sizeof sa),
                                   pp_dtype_name(a->dtype), pp_shape_str(2, ys, sb, sizeof sb));
        }
    }
    if (!fits_int(M) || !fits_int(N) || !fits_int(K))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "matrix dims exceed BLAS int range");
    int64_t shape[2] = {M, N};
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(a->dtype, 2, shape, &y));
    *out = y;
    if (!y->nbytes) return PP_OK;
    size_t es = pp_dtype_size(a->dtype);
    int use_c = c && beta != 0 && pp_tensor_numel(c) > 0;
    if (use_c) broadcast_bias(c, M, N, es, y->data);
    else memset(y->data, 0, y->nbytes);
    int lda = (int)a->shape[1], ldb = (int)b->shape[1];
    if (K == 0) { /* no product: y = beta * C */
        if (use_c && beta != 1) {
            int64_t n = M * N;
            for (int64_t i = 0; i < n; i++) pp_tensor_set_f64(y, i, beta * pp_tensor_get_f64(y, i));
        }
        return PP_OK;
    }
    if (a->dtype == PP_F32) {
        pp_gemm_f32(ta, tb, (int)M, (int)N, (int)K, (float)alpha, a->data, lda, b->data, ldb,
                 use_c ? (float)beta : 0.0f, y->data, (int)N);
        return PP_OK;
    }
    if (a->dtype == PP_F64) {
        pp_gemm_f64(ta, tb, (int)M, (int)N, (int)K, alpha, a->data, lda, b->data, ldb,
                 use_c ? beta : 0.0, y->data, (int)N);
        return PP_OK;
    }
    /* Integers: exact product, then alpha/beta (exact when they are 1). */
    pp_tensor *p;
    pp_status s = pp_tensor_empty(a->dtype, 2, shape, &p);
    if (s != PP_OK) {
        pp_tensor_free(y);
        *out = NULL;
        return s;
    }
    if (a->dtype == PP_I32) gemm_i32(ta, tb, M, N, K, a->data, lda, b->data, ldb, p->data, N);
    else gemm_i64(ta, tb, M, N, K, a->data, lda, b->data, ldb, p->data, N);
    int64_t n = M * N;
    for (int64_t i = 0; i < n; i++) {
        if (alpha == 1 && (!use_c || beta == 1)) {
            if (a->dtype == PP_I32) {
                int32_t *yv = y->data;
                yv[i] = (int32_t)((uint32_t)yv[i] + (uint32_t)((int32_t *)p->data)[i]);
            } else {
                int64_t *yv = y->data;
                yv[i] = (int64_t)((uint64_t)yv[i] + (uint64_t)((int64_t *)p->data)[i]);
            }
        } else {
            double v = alpha * pp_tensor_get_f64(p, i) + (use_c ? beta * pp_tensor_get_f64(y, i) : 0);
            pp_tensor_set_f64(y, i, v);
        }
    }
    pp_tensor_free(p);
    return PP_OK;
}

static pp_status gemm_run(pp_kernel_ctx *ctx) {
    const pp_tensor *a = ctx->in[0], *b = ctx->in[1];
    const pp_tensor *c = ctx->n_in > 2 ? ctx->in[2] : NULL;
    if (a->dtype != b->dtype)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "A and B differ in dtype (%s and %s)",
                               pp_dtype_name(a->dtype), pp_dtype_name(b->dtype));
    if (!matmul_dtype_ok(a->dtype))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "dtype %s is not supported",
                               pp_dtype_name(a->dtype));
    if (!is_half(a->dtype)) return gemm_compute(ctx, a, b, c, &ctx->out[0]);
    if (c && c->dtype != a->dtype)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "C is %s but A is %s", pp_dtype_name(c->dtype),
                               pp_dtype_name(a->dtype));
    pp_tensor *a32 = NULL, *b32 = NULL, *c32 = NULL, *y32 = NULL;
    pp_status s = widen(a, &a32);
    if (s == PP_OK) s = widen(b, &b32);
    if (s == PP_OK) s = widen(c, &c32);
    if (s == PP_OK) s = gemm_compute(ctx, a32, b32, c32, &y32);
    if (s == PP_OK) s = pp_tensor_cast(y32, a->dtype, &ctx->out[0]);
    pp_tensor_free(a32);
    pp_tensor_free(b32);
    pp_tensor_free(c32);
    pp_tensor_free(y32);
    return s;
}

const pp_op pp_ops_matmul[] = {
    {"MatMul", "", 2, 2, 1, 1, NULL, matmul_run},
    {"Gemm", "", 2, 3, 1, 1, gemm_check, gemm_run},
    {NULL},
};
