/* Reductions and the ops built on them: Reduce{Sum,Mean,Max,Min,Prod,
 * SumSquare,L1,L2,LogSum,LogSumExp}, ArgMax/ArgMin, Softmax/LogSoftmax/
 * Hardmax, LayerNormalization, BatchNormalization, and the losses
 * SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss.
 *
 * Float sums run in PP_VEC_BLOCK partial accumulators over chunks of at
 * most SUM_CHUNK elements, and the chunk totals are added in double: that
 * vectorises and keeps long rows (a global mean) accurate. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "op.h"
#include "vec.h"
#include "widen.h"

#include "status_internal.h"
#include "thread_pool.h"
#define SUM_CHUNK 4096

static pp_status input(const pp_kernel_ctx *ctx, int i, const pp_tensor **t) {
    if (i >= ctx->n_in || !ctx->in[i])
        return pp_kernel_error(ctx, PP_ERR_INVALID, "input %d is missing", i);
    *t = ctx->in[i];
    return PP_OK;
}

static int wants_output(const pp_kernel_ctx *ctx, int i) {
    return i < ctx->n_out && ctx->node->out[i] >= 0;
}

static pp_status unsupported_dtype(const pp_kernel_ctx *ctx, pp_dtype dt) {
    return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "dtype %s is not supported",
                           pp_dtype_name(dt));
}

/* Maps axis in [-ndim, ndim) to [0, ndim). */
static pp_status norm_axis(const pp_kernel_ctx *ctx, int64_t axis, int ndim, int *out) {
    if (axis < -ndim || axis >= ndim)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "axis %lld is out of range for rank %d",
                               (long long)axis, ndim);
    *out = (int)(axis < 0 ? axis + ndim : axis);
    return PP_OK;
}

static pp_status int_attr_check(const pp_node *n, const char *name, int64_t lo, int64_t hi) {
    const pp_attr *a = pp_node_attr(n, name);
    if (!a) return PP_OK;
    if (a->type != PP_ATTR_INT)
        return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' must be an int", name);
    if (a->i < lo || a->i > hi)
        return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' is %lld (must be %lld to %lld)",
                             name, (long long)a->i, (long long)lo, (long long)hi);
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* Row primitives (f32 and f64)                                             */

#define MAXF(a, b) (((b) > (a) || (b) != (b)) ? (b) : (a)) /* NaN wins */
#define MINF(a, b) (((b) < (a) || (b) != (b)) ? (b) : (a))
#define ADD(a, b) ((a) + (b))

/* Folds the PP_VEC_BLOCK (16) lanes of p as a tree into p[0]: 4 dependent
 * steps that gcc turns into vector ops, where a running fold is 16 dependent
 * scalar steps (short softmax rows pay this once per row). */
#define LANES_FOLD(p, OP)                                                  \
    do {                                                                   \
        _Static_assert(PP_VEC_BLOCK == 16, "LANES_FOLD assumes 16 lanes"); \
        for (int j_ = 0; j_ < 8; j_++) p[j_] = OP(p[j_], p[j_ + 8]);       \
        for (int j_ = 0; j_ < 4; j_++) p[j_] = OP(p[j_], p[j_ + 4]);       \
        for (int j_ = 0; j_ < 2; j_++) p[j_] = OP(p[j_], p[j_ + 2]);       \
        p[0] = OP(p[0], p[1]);                                             \
    } while (0)

#define DEF_ROW_PRIMS(T, SUF, EXP)                                                            \
    /* Sum of MAP(x[i]) over a chunk, in PP_VEC_BLOCK lanes. */                               \
    PP_VINLINE T chunk_sum_##SUF(int64_t n, const T *restrict x, T shift, int square) {       \
        T p[PP_VEC_BLOCK] = {0};                                                              \
        int64_t i = 0;                                                                        \
        if (square) {                                                                         \
            for (; i + PP_VEC_BLOCK <= n; i += PP_VEC_BLOCK)                                  \
                for (int j = 0; j < PP_VEC_BLOCK; j++) {                                      \
                    T d = x[i + j] - shift;                                                   \
                    p[j] += d * d;                                                            \
                }                                                                             \
        } else {                                                                              \
            for (; i + PP_VEC_BLOCK <= n; i += PP_VEC_BLOCK)                                  \
                for (int j = 0; j < PP_VEC_BLOCK; j++) p[j] += x[i + j];                      \
        }                                                                                     \
        LANES_FOLD(p, ADD);                                                                   \
        T r = p[0];                                                                           \
        for (; i < n; i++) {                                                                  \
            T d = square ? x[i] - shift : x[i];                                               \
            r += square ? d * d : d;                                                          \
        }                                                                                     \
        return r;                                                                             \
    }                                                                                         \
    /* sum(x) or, with square, sum((x - shift)^2); accumulated in double. */                  \
    PP_VINLINE double row_sum_##SUF(int64_t n, const T *x, T shift, int square) {             \
        double total = 0;                                                                     \
        for (int64_t i = 0; i < n; i += SUM_CHUNK)                                            \
            total += (double)chunk_sum_##SUF(n - i < SUM_CHUNK ? n - i : SUM_CHUNK, x + i,    \
                                             shift, square);                                  \
        return total;                                                                         \
    }                                                                                         \
    PP_VINLINE T row_max_##SUF(int64_t n, const T *restrict x) {                              \
        T p[PP_VEC_BLOCK];                                                                    \
        for (int j = 0; j < PP_VEC_BLOCK; j++) p[j] = -INFINITY;                              \
        int64_t i = 0;                                                                        \
        for (; i + PP_VEC_BLOCK <= n; i += PP_VEC_BLOCK)                                      \
            for (int j = 0; j < PP_VEC_BLOCK; j++) p[j] = MAXF(p[j], x[i + j]);               \
        LANES_FOLD(p, MAXF);                                                                  \
        T r = p[0];                                                                           \
        for (; i < n; i++) r = MAXF(r, x[i]);                                                 \
        return r;                                                                             \
    }                                                                                         \
    /* y = exp(x - m); returns sum(y), accumulated as row_sum does. */                        \
    PP_VINLINE double exp_shift_##SUF(int64_t n, const T *restrict x, T m, T *restrict y) {   \
        double total = 0;                                                                     \
        for (int64_t c = 0; c < n; c += SUM_CHUNK) {                                          \
            int64_t len = n - c < SUM_CHUNK ? n - c : SUM_CHUNK;                              \
            const T *restrict xc = x + c;                                                     \
            T *restrict yc = y + c;                                                           \
            T p[PP_VEC_BLOCK] = {0};                                                          \
            int64_t i = 0;                                                                    \
            for (; i + PP_VEC_BLOCK <= len; i += PP_VEC_BLOCK)                                \
                for (int j = 0; j < PP_VEC_BLOCK; j++) {                                      \
                    T e = EXP(xc[i + j] - m);                                                 \
                    yc[i + j] = e;                                                            \
                    p[j] += e;                                                                \
                }                                                                             \
            LANES_FOLD(p, ADD);                                                               \
            T r = p[0];                                                                       \
            for (; i < len; i++) {                                                            \
                yc[i] = EXP(xc[i] - m);                                                       \
                r += yc[i];                                                                   \
            }                                                                                 \
            total += (double)r;                                                               \
        }                                                                                     \
        return total;                                                                         \
    }                                                                                         \
    PP_VINLINE void scale_##SUF(int64_t n, T *restrict y, T k) { PP_VFOR(i, n, y[i] *= k;); } \
    /* Sum of exp(x - m) without storing it. */                                               \
    PP_VINLINE double sum_exp_##SUF(int64_t n, const T *restrict x, T m) {                    \
        double total = 0;                                                                     \
        for (int64_t c = 0; c < n; c += SUM_CHUNK) {                                          \
            int64_t len = n - c < SUM_CHUNK ? n - c : SUM_CHUNK;                              \
            const T *restrict xc = x + c;                                                     \
            T p[PP_VEC_BLOCK] = {0};                                                          \
            int64_t i = 0;                                                                    \
            for (; i + PP_VEC_BLOCK <= len; i += PP_VEC_BLOCK)                                \
                for (int j = 0; j < PP_VEC_BLOCK; j++) p[j] += EXP(xc[i + j] - m);            \
            LANES_FOLD(p, ADD);                                                               \
            T r = p[0];                                                                       \
            for (; i < len; i++) r += EXP(xc[i] - m);                                         \
            total += (double)r;                                                               \
        }                                                                                     \
        return total;                                                                         \
    }                                                                                         \
    /* y = (x - m) - c */                                                                     \
    PP_VINLINE void sub2_##SUF(int64_t n, const T *restrict x, T m, T c, T *restrict y) {     \
        PP_VFOR(i, n, y[i] = (x[i] - m) - c;);                                                \
    }

DEF_ROW_PRIMS(float, f32, pp_vexpf)
DEF_ROW_PRIMS(double, f64, exp)

/* ------------------------------------------------------------------------ */
/* Reduce*                                                                   */

typedef enum rkind { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_SUMSQ, R_L1, R_L2, R_LOGSUM } rkind;

/* One reducer per (kind family, dtype): init fills the output, row folds a
 * contiguous row into one output element, cols folds a row element-wise
 * into a run of output elements. */
typedef struct red_impl {
    void (*init)(int64_t n, void *out);
    void (*row)(int64_t n, const void *x, void *out);
    void (*cols)(int64_t n, const void *x, void *out);
} red_impl;

#define MUL(a, b) ((a) * (b))
#define ID(v) (v)
#define SQ(v) ((v) * (v))
#define MAXI(a, b) ((b) > (a) ? (b) : (a))
#define MINI(a, b) ((b) < (a) ? (b) : (a))
#define WADD_I32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define WADD_I64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define WMUL_I32(a, b) ((int32_t)((uint32_t)(a) * (uint32_t)(b)))
#define WMUL_I64(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))

/* Generic reducer; ROW is an expression computing the folded value of row
 * x[0..n) (T r), from helpers or a plain loop. */
#define DEF_RED(NAME, T, INIT, MAP, COMB, ROWEXPR)                                 \
    static void NAME##_init(int64_t n, void *out) {                                \
        T *o = out;                                                                \
        for (int64_t i = 0; i < n; i++) o[i] = INIT;                               \
    }                                                                              \
    PP_VINLINE void NAME##_cols_t(int64_t n, const T *restrict x, T *restrict o) { \
        PP_VFOR(i, n, T v = MAP(x[i]); T a = o[i]; o[i] = COMB(a, v););            \
    }                                                                              \
    PP_VEC_CLONES static void NAME##_cols(int64_t n, const void *x, void *out) {   \
        NAME##_cols_t(n, x, out);                                                  \
    }                                                                              \
    PP_VEC_CLONES static void NAME##_row(int64_t n, const void *x_, void *out) {   \
        const T *x = x_;                                                           \
        T *o = out;                                                                \
        T r = ROWEXPR;                                                             \
        *o = COMB(*o, r);                                                          \
    }                                                                              \
    static const red_impl NAME = {NAME##_init, NAME##_row, NAME##_cols};

/* Plain-loop row folds for the integer reducers. */
#define DEF_IROW(NAME, T, INIT, COMB)                      \
    PP_VINLINE T NAME(int64_t n, const T *x) {             \
        T r = INIT;                                        \
        for (int64_t i = 0; i < n; i++) r = COMB(r, x[i]); \
        return r;                                          \
    }
DEF_IROW(row_sum_i32, int32_t, 0, WADD_I32)
DEF_IROW(row_sum_i64, int64_t, 0, WADD_I64)
DEF_IROW(row_max_i32, int32_t, INT32_MIN, MAXI)
DEF_IROW(row_max_i64, int64_t, INT64_MIN, MAXI)
DEF_IROW(row_min_i32, int32_t, INT32_MAX, MINI)
DEF_IROW(row_min_i64, int64_t, INT64_MAX, MINI)
DEF_IROW(row_prod_i32, int32_t, 1, WMUL_I32)
DEF_IROW(row_prod_i64, int64_t, 1, WMUL_I64)

PP_VINLINE float row_min_f32(int64_t n, const float *x) {
    float r = INFINITY;
    for (int64_t i = 0; i < n; i++) r = MINF(r, x[i]);
    return r;
}
PP_VINLINE double row_min_f64(int64_t n, const double *x) {
    double r = INFINITY;
    for (int64_t i = 0; i < n; i++) r = MINF(r, x[i]);
    return r;
}
PP_VINLINE float row_prod_f32(int64_t n, const float *x) {
    double r = 1;
    for (int64_t i = 0; i < n; i++) r *= x[i];
    return (float)r;
}
PP_VINLINE double row_prod_f64(int64_t n, const double *x) {
    double r = 1;
    for (int64_t i = 0; i < n; i++) r *= x[i];
    return r;
}
PP_VINLINE float row_l1_f32(int64_t n, const float *x) {
    double r = 0;
    for (int64_t i = 0; i < n; i++) r += fabsf(x[i]);
    return (float)r;
}
PP_VINLINE double row_l1_f64(int64_t n, const double *x) {
    double r = 0;
    for (int64_t i = 0; i < n; i++) r += fabs(x[i]);
    return r;
}

DEF_RED(red_sum_f32, float, 0.0f, ID, ADD, (float)row_sum_f32(n, x, 0, 0))
DEF_RED(red_sum_f64, double, 0.0, ID, ADD, row_sum_f64(n, x, 0, 0))
DEF_RED(red_sumsq_f32, float, 0.0f, SQ, ADD, (float)row_sum_f32(n, x, 0, 1))
DEF_RED(red_sumsq_f64, double, 0.0, SQ, ADD, row_sum_f64(n, x, 0, 1))
DEF_RED(red_l1_f32, float, 0.0f, fabsf, ADD, row_l1_f32(n, x))
DEF_RED(red_l1_f64, double, 0.0, fabs, ADD, row_l1_f64(n, x))
DEF_RED(red_max_f32, float, -INFINITY, ID, MAXF, row_max_f32(n, x))
DEF_RED(red_max_f64, double, -INFINITY, ID, MAXF, row_max_f64(n, x))
DEF_RED(red_min_f32, float, INFINITY, ID, MINF, row_min_f32(n, x))
DEF_RED(red_min_f64, double, INFINITY, ID, MINF, row_min_f64(n, x))
DEF_RED(red_prod_f32, float, 1.0f, ID, MUL, row_prod_f32(n, x))
DEF_RED(red_prod_f64, double, 1.0, ID, MUL, row_prod_f64(n, x))
DEF_RED(red_sum_i32, int32_t, 0, ID, WADD_I32, row_sum_i32(n, x))
DEF_RED(red_sum_i64, int64_t, 0, ID, WADD_I64, row_sum_i64(n, x))
DEF_RED(red_max_i32, int32_t, INT32_MIN, ID, MAXI, row_max_i32(n, x))
DEF_RED(red_max_i64, int64_t, INT64_MIN, ID, MAXI, row_max_i64(n, x))
DEF_RED(red_min_i32, int32_t, INT32_MAX, ID, MINI, row_min_i32(n, x))
DEF_RED(red_min_i64, int64_t, INT64_MAX, ID, MINI, row_min_i64(n, x))
DEF_RED(red_prod_i32, int32_t, 1, ID, WMUL_I32, row_prod_i32(n, x))
DEF_RED(red_prod_i64, int64_t, 1, ID, WMUL_I64, row_prod_i64(n, x))

static const red_impl *find_red(rkind k, pp_dtype dt) {
    /* Per kind: f32, f64, i32, i64 (NULL where unsupported). */
    static const red_impl *const table[][4] = {
        [R_SUM] = {&red_sum_f32, &red_sum_f64, &red_sum_i32, &red_sum_i64},
        [R_MEAN] = {&red_sum_f32, &red_sum_f64, NULL, NULL},
        [R_LOGSUM] = {&red_sum_f32, &red_sum_f64, NULL, NULL},
        [R_SUMSQ] = {&red_sumsq_f32, &red_sumsq_f64, NULL, NULL},
        [R_L2] = {&red_sumsq_f32, &red_sumsq_f64, NULL, NULL},
        [R_L1] = {&red_l1_f32, &red_l1_f64, NULL, NULL},
        [R_MAX] = {&red_max_f32, &red_max_f64, &red_max_i32, &red_max_i64},
        [R_MIN] = {&red_min_f32, &red_min_f64, &red_min_i32, &red_min_i64},
        [R_PROD] = {&red_prod_f32, &red_prod_f64, &red_prod_i32, &red_prod_i64},
    };
    int col = dt == PP_F32 ? 0 : dt == PP_F64 ? 1 : dt == PP_I32 ? 2 : dt == PP_I64 ? 3 : -1;
    return col < 0 ? NULL : table[k][col];
}

/* Reads the axes (input 1 if given, else attribute "axes") into mask.
 * *n_axes is how many were listed. */
static pp_status reduce_axes(const pp_kernel_ctx *ctx, int ndim, uint8_t *mask, int *n_axes) {
    memset(mask, 0, PP_MAX_DIMS);
    const pp_tensor *t = ctx->n_in > 1 ? ctx->in[1] : NULL;
    const int64_t *attr = NULL;
    int n;
    if (t) {
        if (t->dtype != PP_I64 && t->dtype != PP_I32)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "axes have dtype %s, not int64",
                                   pp_dtype_name(t->dtype));
        if (t->ndim > 1) return pp_kernel_error(ctx, PP_ERR_SHAPE, "axes must be 1-D");
        n = (int)pp_tensor_numel(t);
    } else {
        n = pp_node_attr_ints(ctx->node, "axes", &attr);
        if (n < 0) n = 0;
    }
    for (int i = 0; i < n; i++) {
        int64_t a = t ? pp_tensor_get_i64(t, i) : attr[i];
        int d = 0;
        PP_TRY(norm_axis(ctx, a, ndim, &d));
        if (mask[d])
            return pp_kernel_error(ctx, PP_ERR_INVALID, "axis %lld is listed twice", (long long)a);
        mask[d] = 1;
    }
    *n_axes = n;
    return PP_OK;
}

static void finalize(rkind k, pp_tensor *o, int64_t count) {
    int64_t n = pp_tensor_numel(o);
    if (k == R_MEAN) {
        /* count 0 gives 0/0 = NaN, as numpy's mean of nothing. */
        if (o->dtype == PP_F32)
            for (int64_t i = 0; i < n; i++) ((float *)o->data)[i] /= (float)count;
        else
            for (int64_t i = 0; i < n; i++) ((double *)o->data)[i] /= (double)count;
    } else if (k == R_L2 || k == R_LOGSUM) {
        double (*f)(double) = k == R_L2 ? sqrt : log;
        if (o->dtype == PP_F32)
            for (int64_t i = 0; i < n; i++)
                ((float *)o->data)[i] = (float)f(((float *)o->data)[i]);
        else
            for (int64_t i = 0; i < n; i++) ((double *)o->data)[i] = f(((double *)o->data)[i]);
    }
}

/* A reduction's iteration space: the input dims merged into alternating
 * kept / reduced groups (size-1 dims dropped). Rows of the innermost group
 * are contiguous; gstride gives each group's step in the output. */
typedef struct rwalk {
    int ng;
    int64_t gsize[PP_MAX_DIMS], gstride[PP_MAX_DIMS];
    uint8_t gred[PP_MAX_DIMS];
} rwalk;

static void rwalk_init(rwalk *w, const pp_tensor *x, const uint8_t *mask) {
    w->ng = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] == 1) continue;
        if (w->ng > 0 && w->gred[w->ng - 1] == mask[d]) {
            w->gsize[w->ng - 1] *= x->shape[d];
        } else {
            w->gsize[w->ng] = x->shape[d];
            w->gred[w->ng] = mask[d];
            w->ng++;
        }
    }
    if (w->ng == 0) { /* one element */
        w->gsize[0] = 1;
        w->gred[0] = 0;
        w->ng = 1;
    }
    int64_t st = 1;
    for (int g = w->ng - 1; g >= 0; g--) {
        w->gstride[g] = w->gred[g] ? 0 : st;
        if (!w->gred[g]) st *= w->gsize[g];
    }
}

/* Calls fn(user, r, len, reduced, off) for every row r (input elements
 * r*len .. r*len+len-1); off is the output element the row folds into
 * (reduced) or the first of len output elements (kept). */
typedef void (*rwalk_fn)(void *user, int64_t r, int64_t len, int reduced, int64_t off);

static void rwalk_run(const rwalk *w, int64_t numel, rwalk_fn fn, void *user) {
    if (numel == 0) return;
    int ng = w->ng;
    int64_t inner = w->gsize[ng - 1], rows = numel / inner, off = 0;
    int64_t idx[PP_MAX_DIMS] = {0};
    for (int64_t r = 0; r < rows; r++) {
        fn(user, r, inner, w->gred[ng - 1], off);
        for (int g = ng - 2; g >= 0; g--) {
            off += w->gstride[g];
            if (++idx[g] < w->gsize[g]) break;
            off -= w->gstride[g] * w->gsize[g];
            idx[g] = 0;
        }
    }
}

typedef struct red_walk {
    const red_impl *impl;
    const char *x;
    char *o;
    size_t es;
    int64_t len; /* the rows' length */
} red_walk;

static void red_row(void *user, int64_t r, int64_t len, int reduced, int64_t off) {
    red_walk *w = user;
    const char *row = w->x + (size_t)(r * len) * w->es;
    if (reduced) w->impl->row(len, row, w->o + (size_t)off * w->es);
    else w->impl->cols(len, row, w->o + (size_t)off * w->es);
}

/* Folds x into o (already shaped) with impl over the mask. */
/* Rows [lo, hi) of a reduction over the trailing dims alone: row r folds
 * into output r, all of it on one thread. */
static void red_rows_piece(void *arg, int64_t lo, int64_t hi) {
    red_walk *w = arg;
    for (int64_t r = lo; r < hi; r++) red_row(w, r, w->len, 1, r);
}

static void reduce_into(const pp_tensor *x, const uint8_t *mask, const red_impl *impl,
                        pp_tensor *o) {
    rwalk w;
    rwalk_init(&w, x, mask);
    impl->init(pp_tensor_numel(o), o->data);
    red_walk rw = {impl, x->data, o->data, pp_dtype_size(x->dtype), w.gsize[w.ng - 1]};
    if (w.ng == 2 && !w.gred[0] && w.gred[1])
        pp_parallel_for(w.gsize[0], pp_grain_rows(rw.len, PP_GRAIN_ELEMS), red_rows_piece, &rw);
    else
        rwalk_run(&w, pp_tensor_numel(x), red_row, &rw);
}

/* Resolves the axes of a Reduce* node into mask and the output shape.
 * *noop is set when the node asks for its input back unchanged. */
static pp_status reduce_shape(pp_kernel_ctx *ctx, const pp_tensor *x, uint8_t *mask, int *ond,
                              int64_t *oshape, int64_t *count, int *noop) {
    int n_axes = 0;
    PP_TRY(reduce_axes(ctx, x->ndim, mask, &n_axes));
    int keepdims = pp_node_attr_int(ctx->node, "keepdims", 1) != 0;
    *noop = 0;
    if (n_axes == 0) {
        if (pp_node_attr_int(ctx->node, "noop_with_empty_axes", 0)) {
            *noop = 1;
            return PP_OK;
        }
        memset(mask, 1, PP_MAX_DIMS);
    }
    *ond = 0;
    *count = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (mask[d]) {
            *count *= x->shape[d];
            if (keepdims) oshape[(*ond)++] = 1;
        } else {
            oshape[(*ond)++] = x->shape[d];
        }
    }
    return PP_OK;
}

static pp_status reduce_run(pp_kernel_ctx *ctx, rkind kind) {
    const pp_tensor *x = NULL;
    PP_TRY(input(ctx, 0, &x));
    const red_impl *impl = find_red(kind, x->dtype);
    if (!impl) return unsupported_dtype(ctx, x->dtype);
    uint8_t mask[PP_MAX_DIMS];
    int ond = 0, noop = 0;
    int64_t oshape[PP_MAX_DIMS], count = 1;
    PP_TRY(reduce_shape(ctx, x, mask, &ond, oshape, &count, &noop));
    if (noop) {
        ctx->out[0] = pp_tensor_retain(ctx->in[0]);
        return PP_OK;
    }
    pp_tensor *o;
    PP_TRY(pp_tensor_empty(x->dtype, ond, oshape, &o));
    reduce_into(x, mask, impl, o);
    finalize(kind, o, count);
    ctx->out[0] = o;
    return PP_OK;
}

static pp_status reduce_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    PP_TRY(int_attr_check(n, "keepdims", 0, 1));
    PP_TRY(int_attr_check(n, "noop_with_empty_axes", 0, 1));
    const pp_attr *a = pp_node_attr(n, "axes");
    if (a && a->type != PP_ATTR_INTS)
        return pp_node_error(n, PP_ERR_INVALID, "attribute 'axes' must be a list of ints");
    return PP_OK;
}

#define REDUCE_KERNEL(FN, KIND) \
    static pp_status FN(pp_kernel_ctx *ctx) { return reduce_run(ctx, KIND); }
REDUCE_KERNEL(reduce_sum_run, R_SUM)
REDUCE_KERNEL(reduce_mean_run, R_MEAN)
REDUCE_KERNEL(reduce_max_run, R_MAX)
REDUCE_KERNEL(reduce_min_run, R_MIN)
REDUCE_KERNEL(reduce_prod_run, R_PROD)
REDUCE_KERNEL(reduce_sumsq_run, R_SUMSQ)
REDUCE_KERNEL(reduce_l1_run, R_L1)
REDUCE_KERNEL(reduce_l2_run, R_L2)
REDUCE_KERNEL(reduce_log_sum_run, R_LOGSUM)

/* ------------------------------------------------------------------------ */
/* ArgMax / ArgMin                                                          */

/* NaN counts as the extreme (numpy): the first NaN wins, or the last with
 * select_last_index. */
#define DEF_ARG(NAME, T, BETTER)                                                          \
    static void NAME(const void *x_, int64_t outer, int64_t len, int64_t inner, int last, \
                     int64_t *out) {                                                      \
        const T *x = x_;                                                                  \
        for (int64_t o = 0; o < outer; o++)                                               \
            for (int64_t j = 0; j < inner; j++) {                                         \
                const T *p = x + o * len * inner + j;                                     \
                int64_t best = 0;                                                         \
                T b = p[0];                                                               \
                for (int64_t l = 1; l < len; l++) {                                       \
                    T v = p[l * inner];                                                   \
                    if (BETTER(v, b) || (last && v == b)) {                               \
                        best = l;                                                         \
                        b = v;                                                            \
                    }                                                                     \
                }                                                                         \
                out[o * inner + j] = best;                                                \
            }                                                                             \
    }
#define GT_F(v, b) ((b) == (b) && ((v) > (b) || (v) != (v)))
#define LT_F(v, b) ((b) == (b) && ((v) < (b) || (v) != (v)))
#define GT_I(v, b) ((v) > (b))
#define LT_I(v, b) ((v) < (b))
DEF_ARG(argmax_f32, float, GT_F)
DEF_ARG(argmax_f64, double, GT_F)
DEF_ARG(argmax_i32, int32_t, GT_I)
DEF_ARG(argmax_i64, int64_t, GT_I)
DEF_ARG(argmin_f32, float, LT_F)
DEF_ARG(argmin_f64, double, LT_F)
DEF_ARG(argmin_i32, int32_t, LT_I)
DEF_ARG(argmin_i64, int64_t, LT_I)

/* outer / len / inner around axis. */
static void split_at(const pp_tensor *x, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
    *outer = pp_shape_numel(axis, x->shape);
    *len = x->shape[axis];
    *inner = pp_shape_numel(x->ndim - axis - 1, x->shape + axis + 1);
}

static pp_status arg_run(pp_kernel_ctx *ctx, int is_max) {
    const pp_tensor *x = NULL;
    PP_TRY(input(ctx, 0, &x));
    if (x->ndim == 0) return pp_kernel_error(ctx, PP_ERR_SHAPE, "input must have rank >= 1");
    int axis = 0;
    PP_TRY(norm_axis(ctx, pp_node_attr_int(ctx->node, "axis", 0), x->ndim, &axis));
    int keepdims = pp_node_attr_int(ctx->node, "keepdims", 1) != 0;
    int last = pp_node_attr_int(ctx->node, "select_last_index", 0) != 0;
    int64_t outer, len, inner;
    split_at(x, axis, &outer, &len, &inner);
    if (len == 0 && outer * inner > 0)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot take %s over an empty axis",
                               is_max ? "ArgMax" : "ArgMin");
    int64_t oshape[PP_MAX_DIMS];
    int ond = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (d != axis) oshape[ond++] = x->shape[d];
        else if (keepdims) oshape[ond++] = 1;
    }
    void (*f)(const void *, int64_t, int64_t, int64_t, int, int64_t *);
    switch (x->dtype) {
    case PP_F32: f = is_max ? argmax_f32 : argmin_f32; break;
    case PP_F64: f = is_max ? argmax_f64 : argmin_f64; break;
    case PP_I32: f = is_max ? argmax_i32 : argmin_i32; break;
    case PP_I64: f = is_max ? argmax_i64 : argmin_i64; break;
    default: return unsupported_dtype(ctx, x->dtype);
    }
    pp_tensor *o;
    PP_TRY(pp_tensor_empty(PP_I64, ond, oshape, &o));
    if (len > 0) f(x->data, outer, len, inner, last, o->data);
    ctx->out[0] = o;
    return PP_OK;
}

static pp_status arg_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    PP_TRY(int_attr_check(n, "keepdims", 0, 1));
    PP_TRY(int_attr_check(n, "select_last_index", 0, 1));
    return int_attr_check(n, "axis", -PP_MAX_DIMS, PP_MAX_DIMS - 1);
}

static pp_status argmax_run(pp_kernel_ctx *ctx) { return arg_run(ctx, 1); }
static pp_status argmin_run(pp_kernel_ctx *ctx) { return arg_run(ctx, 0); }

/* ------------------------------------------------------------------------ */
/* Softmax / LogSoftmax                                                     */

/* Softmax over the middle axis of [outer, len, inner]. work holds 2 * inner
 * elements when inner > 1. */
#define DEF_SOFTMAX(T, SUF, EXP, LOG)                                                       \
    PP_VINLINE void cols_max_##SUF(int64_t n, const T *restrict x, T *restrict m) {         \
        PP_VFOR(i, n, m[i] = MAXF(m[i], x[i]););                                            \
    }                                                                                       \
    PP_VINLINE void cols_exp_##SUF(int64_t n, const T *restrict x, const T *restrict m,     \
                                      T *restrict y, T *restrict s) {                       \
        PP_VFOR(i, n, T e = EXP(x[i] - m[i]); y[i] = e; s[i] += e;);                        \
    }                                                                                       \
    PP_VINLINE void cols_sumexp_##SUF(int64_t n, const T *restrict x,                       \
                                         const T *restrict m, T *restrict s) {              \
        PP_VFOR(i, n, s[i] += EXP(x[i] - m[i]););                                           \
    }                                                                                       \
    PP_VINLINE void cols_mul_##SUF(int64_t n, T *restrict y, const T *restrict k) {         \
        PP_VFOR(i, n, y[i] *= k[i];);                                                       \
    }                                                                                       \
    PP_VINLINE void cols_logsub_##SUF(int64_t n, const T *restrict x, const T *restrict m,  \
                                         const T *restrict ls, T *restrict y) {             \
        PP_VFOR(i, n, y[i] = (x[i] - m[i]) - ls[i];);                                       \
    }                                                                                       \
    PP_VEC_CLONES static void softmax_##SUF(const T *x, int64_t outer, int64_t len,         \
                                            int64_t inner, int log_,                        \
                              T *y, T *work) {                                              \
        for (int64_t o = 0; o < outer; o++) {                                               \
            const T *xo = x + o * len * inner;                                              \
            T *yo = y + o * len * inner;                                                    \
            if (inner == 1) {                                                               \
                T m = row_max_##SUF(len, xo);                                               \
                if (log_) {                                                                 \
                    T ls = (T)log(sum_exp_##SUF(len, xo, m));                               \
                    sub2_##SUF(len, xo, m, ls, yo);                                         \
                } else {                                                                    \
                    scale_##SUF(len, yo, (T)(1.0 / exp_shift_##SUF(len, xo, m, yo)));       \
                }                                                                           \
                continue;                                                                   \
            }                                                                               \
            T *m = work, *s = work + inner;                                                 \
            for (int64_t j = 0; j < inner; j++) {                                           \
                m[j] = -INFINITY;                                                           \
                s[j] = 0;                                                                   \
            }                                                                               \
            for (int64_t l = 0; l < len; l++) cols_max_##SUF(inner, xo + l * inner, m);     \
            if (log_) {                                                                     \
                for (int64_t l = 0; l < len; l++)                                           \
                    cols_sumexp_##SUF(inner, xo + l * inner, m, s);                         \
                for (int64_t j = 0; j < inner; j++) s[j] = LOG(s[j]);                       \
                for (int64_t l = 0; l < len; l++)                                           \
                    cols_logsub_##SUF(inner, xo + l * inner, m, s, yo + l * inner);         \
            } else {                                                                        \
                for (int64_t l = 0; l < len; l++)                                           \
                    cols_exp_##SUF(inner, xo + l * inner, m, yo + l * inner, s);            \
                for (int64_t j = 0; j < inner; j++) s[j] = 1 / s[j];                        \
                for (int64_t l = 0; l < len; l++) cols_mul_##SUF(inner, yo + l * inner, s); \
            }                                                                               \
        }                                                                                   \
    }

DEF_SOFTMAX(float, f32, pp_vexpf, logf)
DEF_SOFTMAX(double, f64, exp, log)

typedef struct softmax_job {
    pp_dtype dt;
    const void *x;
    void *y;
    int64_t len;
    int log_;
} softmax_job;

/* Rows [lo, hi) of a softmax over the last axis. */
static void softmax_piece(void *arg, int64_t lo, int64_t hi) {
    const softmax_job *j = arg;
    if (j->dt == PP_F32)
        softmax_f32((const float *)j->x + lo * j->len, hi - lo, j->len, 1, j->log_,
                    (float *)j->y + lo * j->len, NULL);
    else
        softmax_f64((const double *)j->x + lo * j->len, hi - lo, j->len, 1, j->log_,
                    (double *)j->y + lo * j->len, NULL);
}

/* Softmax of x over axis (already normalised) into a new tensor. */
static pp_status softmax_tensor(const pp_kernel_ctx *ctx, const pp_tensor *x, int64_t outer,
                                int64_t len, int64_t inner, int log_, pp_tensor **out) {
    if (x->dtype != PP_F32 && x->dtype != PP_F64) return unsupported_dtype(ctx, x->dtype);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(x->dtype, x->ndim, x->shape, &y));
    void *work = NULL;
    if (inner > 1 && outer * len > 0) {
        work = malloc((size_t)inner * 2 * pp_dtype_size(x->dtype));
        if (!work) {
            pp_tensor_free(y);
            return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory");
        }
    }
    if (len > 0 && inner == 1) {
        /* Rows apart: each row on one thread, as on one. */
        softmax_job j = {x->dtype, x->data, y->data, len, log_};
        pp_parallel_for(outer, pp_grain_rows(len, PP_GRAIN_ROW_ELEMS), softmax_piece, &j);
    } else if (len > 0 && inner > 0) {
        if (x->dtype == PP_F32)
            softmax_f32(x->data, outer, len, inner, log_, y->data, work);
        else
            softmax_f64(x->data, outer, len, inner, log_, y->data, work);
    }
    free(work);
    *out = y;
    return PP_OK;
}

static pp_status softmax_run_common(pp_kernel_ctx *ctx, int log_) {
    const pp_tensor *x = NULL;
    PP_TRY(input(ctx, 0, &x));
    int64_t outer, len, inner;
    if (x->ndim == 0) {
        /* A scalar is its own single-element axis. */
        outer = len = inner = 1;
    } else if (ctx->graph && ctx->graph->opset < 13) {
        /* Opset 1-12: coerced to 2-D [prod(dims < axis), prod(dims >= axis)]. */
        int axis = 0;
        PP_TRY(norm_axis(ctx, pp_node_attr_int(ctx->node, "axis", 1), x->ndim, &axis));
        outer = pp_shape_numel(axis, x->shape);
        len = pp_shape_numel(x->ndim - axis, x->shape + axis);
        inner = 1;
    } else {
        int axis = 0;
        PP_TRY(norm_axis(ctx, pp_node_attr_int(ctx->node, "axis", -1), x->ndim, &axis));
        split_at(x, axis, &outer, &len, &inner);
    }
    return softmax_tensor(ctx, x, outer, len, inner, log_, &ctx->out[0]);
}

static pp_status softmax_run(pp_kernel_ctx *ctx) { return softmax_run_common(ctx, 0); }
static pp_status log_softmax_run(pp_kernel_ctx *ctx) { return softmax_run_common(ctx, 1); }

static pp_status softmax_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    return int_attr_check(n, "axis", -PP_MAX_DIMS, PP_MAX_DIMS - 1);
}

/* ------------------------------------------------------------------------ */
/* ReduceLogSumExp: max first, then log(sum(exp(x - max))) + max            */

typedef struct lse_walk {
    const void *x, *shift;
    void *s;
    pp_dtype dt;
} lse_walk;

PP_VEC_CLONES static void lse_row(void *user, int64_t r, int64_t len, int reduced,
                                  int64_t off) {
    lse_walk *w = user;
    if (w->dt == PP_F32) {
        const float *x = (const float *)w->x + r * len, *m = (const float *)w->shift + off;
        float *s = (float *)w->s + off;
        if (reduced) *s += (float)sum_exp_f32(len, x, *m);
        else cols_sumexp_f32(len, x, m, s);
    } else {
        const double *x = (const double *)w->x + r * len, *m = (const double *)w->shift + off;
        double *s = (double *)w->s + off;
        if (reduced) *s += sum_exp_f64(len, x, *m);
        else cols_sumexp_f64(len, x, m, s);
    }
}

static pp_status reduce_log_sum_exp_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = NULL;
    PP_TRY(input(ctx, 0, &x));
    if (x->dtype != PP_F32 && x->dtype != PP_F64) return unsupported_dtype(ctx, x->dtype);
    uint8_t mask[PP_MAX_DIMS];
    int ond = 0, noop = 0;
    int64_t oshape[PP_MAX_DIMS], count = 1;
    PP_TRY(reduce_shape(ctx, x, mask, &ond, oshape, &count, &noop));
    if (noop) {
        ctx->out[0] = pp_tensor_retain(ctx->in[0]);
        return PP_OK;
    }
    pp_tensor *m = NULL, *o = NULL;
    pp_status st = pp_tensor_empty(x->dtype, ond, oshape, &m);
    if (st == PP_OK) st = pp_tensor_new(x->dtype, ond, oshape, &o);
    if (st != PP_OK) {
        pp_tensor_free(m);
        return st;
    }
    reduce_into(x, mask, find_red(R_MAX, x->dtype), m);
    /* Shift by the max where it is finite; an infinite or NaN max shifts by
     * 0 so that exp() yields 0, inf or NaN as the plain formula would. */
    int64_t on = pp_tensor_numel(m);
    for (int64_t i = 0; i < on; i++)
        if (!isfinite(pp_tensor_get_f64(m, i))) pp_tensor_set_f64(m, i, 0);
    rwalk w;
    rwalk_init(&w, x, mask);
    lse_walk lw = {x->data, m->data, o->data, x->dtype};
    rwalk_run(&w, pp_tensor_numel(x), lse_row, &lw);
    for (int64_t i = 0; i < on; i++)
        pp_tensor_set_f64(o, i, pp_tensor_get_f64(m, i) + log(pp_tensor_get_f64(o, i)));
    pp_tensor_free(m);
    ctx->out[0] = o;
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* Hardmax (opset 13): 1 at the first maximum along axis, else 0            */

static pp_status hardmax_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = NULL;
    PP_TRY(input(ctx, 0, &x));
    if (x->dtype != PP_F32 && x->dtype != PP_F64) return unsupported_dtype(ctx, x->dtype);
    if (x->ndim == 0) return pp_kernel_error(ctx, PP_ERR_SHAPE, "input must have rank >= 1");
    int axis = 0;
    int64_t outer, len, inner;
    if (ctx->graph && ctx->graph->opset < 13) {
        /* Opset 1-12: coerced to 2-D at axis (default 1), as Softmax. */
        PP_TRY(norm_axis(ctx, pp_node_attr_int(ctx->node, "axis", 1), x->ndim, &axis));
        outer = pp_shape_numel(axis, x->shape);
        len = pp_shape_numel(x->ndim - axis, x->shape + axis);
        inner = 1;
    } else {
        PP_TRY(norm_axis(ctx, pp_node_attr_int(ctx->node, "axis", -1), x->ndim, &axis));
        split_at(x, axis, &outer, &len, &inner);
    }
    pp_tensor *y;
    PP_TRY(pp_tensor_new(x->dtype, x->ndim, x->shape, &y));
    for (int64_t o = 0; o < outer && len > 0; o++)
        for (int64_t j = 0; j < inner; j++) {
            int64_t base = o * len * inner + j, best = 0;
            double b = pp_tensor_get_f64(x, base);
            for (int64_t l = 1; l < len; l++) {
                double v = pp_tensor_get_f64(x, base + l * inner);
                if (v > b) {
                    b = v;
                    best = l;
                }
            }
            pp_tensor_set_f64(y, base + best * inner, 1);
        }
    ctx->out[0] = y;
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* LayerNormalization (opset 17)                                            */

#define DEF_LAYERNORM(T, SUF)                                                        \
    PP_VINLINE void ln_apply_##SUF(int64_t n, const T *restrict x, T mean, T inv,    \
                                      const T *restrict w, const T *restrict b,      \
                                      T *restrict y) {                               \
        if (b)                                                                       \
            PP_VFOR(i, n, y[i] = (x[i] - mean) * inv * w[i] + b[i];);                \
        else                                                                         \
            PP_VFOR(i, n, y[i] = (x[i] - mean) * inv * w[i];);                       \
    }                                                                                \
    PP_VEC_CLONES static void layernorm_##SUF(const T *x, int64_t rows, int64_t len, \
                                              const T *w,                            \
                                const T *b, double eps, T *y, void *mean_out,        \
                                void *inv_out, int stash_f64) {                      \
        for (int64_t r = 0; r < rows; r++) {                                         \
            const T *xr = x + r * len;                                               \
            double mean = row_sum_##SUF(len, xr, 0, 0) / (double)len;                \
            double var = row_sum_##SUF(len, xr, (T)mean, 1) / (double)len;           \
            double inv = 1.0 / sqrt(var + eps);                                      \
            ln_apply_##SUF(len, xr, (T)mean, (T)inv, w, b, y + r * len);             \
            if (mean_out) {                                                          \
                if (stash_f64) ((double *)mean_out)[r] = mean;                       \
                else ((float *)mean_out)[r] = (float)mean;                           \
            }                                                                        \
            if (inv_out) {                                                           \
                if (stash_f64) ((double *)inv_out)[r] = inv;                         \
                else ((float *)inv_out)[r] = (float)inv;                             \
            }                                                                        \
        }                                                                            \
    }

DEF_LAYERNORM(float, f32)
DEF_LAYERNORM(double, f64)

typedef struct ln_job {
    pp_dtype dt;
    const void *x;
    void *y;
    const void *w, *b;
    double eps;
    int64_t len;
    void *mean, *inv;
    int stash_f64;
} ln_job;

/* Rows [lo, hi): each row's statistics and output on one thread. */
static void ln_piece(void *arg, int64_t lo, int64_t hi) {
    const ln_job *j = arg;
    size_t ss = j->stash_f64 ? sizeof(double) : sizeof(float);
    void *m = j->mean ? (char *)j->mean + (size_t)lo * ss : NULL;
    void *v = j->inv ? (char *)j->inv + (size_t)lo * ss : NULL;
    if (j->dt == PP_F32)
        layernorm_f32((const float *)j->x + lo * j->len, hi - lo, j->len, j->w, j->b, j->eps,
                      (float *)j->y + lo * j->len, m, v, j->stash_f64);
    else
        layernorm_f64((const double *)j->x + lo * j->len, hi - lo, j->len, j->w, j->b, j->eps,
                      (double *)j->y + lo * j->len, m, v, j->stash_f64);
}

/* Scale or bias as exactly len elements in the normalised shape, by
 * reference when it already is, else broadcast into *tmp. */
static pp_status ln_param(const pp_kernel_ctx *ctx, const pp_tensor *p, const char *what,
                          const pp_tensor *x, int axis, pp_tensor **tmp, const void **data) {
    char s1[160], s2[160];
    if (p->dtype != x->dtype)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s has dtype %s, X has %s", what,
                               pp_dtype_name(p->dtype), pp_dtype_name(x->dtype));
    int nd = x->ndim - axis;
    const int64_t *ns = x->shape + axis;
    if (pp_shape_equal(p->ndim, p->shape, nd, ns)) {
        *data = p->data;
        return PP_OK;
    }
    /* Unidirectional broadcast to the normalised shape. */
    int ok = p->ndim <= nd;
    for (int d = 0; ok && d < p->ndim; d++) {
        int64_t want = ns[nd - p->ndim + d];
        if (p->shape[d] != 1 && p->shape[d] != want) ok = 0;
    }
    if (!ok)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s shape %s does not fit normalised shape %s",
                               what, pp_shape_str(p->ndim, p->shape, s1, sizeof s1),
                               pp_shape_str(nd, ns, s2, sizeof s2));
    pp_tensor *t;
    PP_TRY(pp_tensor_empty(p->dtype, nd, ns, &t));
    int64_t n = pp_tensor_numel(t);
    /* Index into p by the trailing coordinates (rare path: plain loop). */
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, src = 0, st = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t c = rem % ns[d];
            rem /= ns[d];
            int pd = d - (nd - p->ndim);
            if (pd >= 0) {
                if (p->shape[pd] != 1) src += c * st;
                st *= p->shape[pd];
            }
        }
        pp_tensor_set_f64(t, i, pp_tensor_get_f64(p, src));
    }
    *tmp = t;
    *data = t->data;
    return PP_OK;
}

static pp_status layernorm_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    PP_TRY(int_attr_check(n, "axis", -PP_MAX_DIMS, PP_MAX_DIMS - 1));
    const pp_attr *a = pp_node_attr(n, "stash_type");
    if (a && (a->type != PP_ATTR_INT || (a->i != PP_F32 && a->i != PP_F64)))
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "stash_type must be 1 (float) or 11 (double)");
    const pp_attr *e = pp_node_attr(n, "epsilon");
    if (e && e->type != PP_ATTR_FLOAT)
        return pp_node_error(n, PP_ERR_INVALID, "attribute 'epsilon' must be a float");
    return PP_OK;
}

static pp_status layernorm_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = NULL, *w = NULL;
    PP_TRY(input(ctx, 0, &x));
    PP_TRY(input(ctx, 1, &w));
    const pp_tensor *b = ctx->n_in > 2 ? ctx->in[2] : NULL;
    if (x->dtype != PP_F32 && x->dtype != PP_F64) return unsupported_dtype(ctx, x->dtype);
    if (x->ndim == 0) return pp_kernel_error(ctx, PP_ERR_SHAPE, "X must have rank >= 1");
    int axis = 0;
    PP_TRY(norm_axis(ctx, pp_node_attr_int(ctx->node, "axis", -1), x->ndim, &axis));
    double eps = pp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    int64_t stash = pp_node_attr_int(ctx->node, "stash_type", PP_F32);
    if (stash != PP_F32 && stash != PP_F64)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "stash_type %lld is not supported",
                               (long long)stash);
    int64_t rows = pp_shape_numel(axis, x->shape);
    int64_t len = pp_shape_numel(x->ndim - axis, x->shape + axis);

    pp_tensor *wt = NULL, *bt = NULL, *y = NULL, *mean = NULL, *inv = NULL;
    const void *wd = NULL, *bd = NULL;
    pp_status s = ln_param(ctx, w, "Scale", x, axis, &wt, &wd);
    if (s == PP_OK && b) s = ln_param(ctx, b, "B", x, axis, &bt, &bd);
    if (s == PP_OK) s = pp_tensor_empty(x->dtype, x->ndim, x->shape, &y);
    int64_t sshape[PP_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) sshape[d] = d < axis ? x->shape[d] : 1;
    if (s == PP_OK && wants_output(ctx, 1))
        s = pp_tensor_empty((pp_dtype)stash, x->ndim, sshape, &mean);
    if (s == PP_OK && wants_output(ctx, 2))
        s = pp_tensor_empty((pp_dtype)stash, x->ndim, sshape, &inv);
    if (s == PP_OK && len > 0) {
        ln_job j = {x->dtype, x->data, y->data, wd, bd, eps, len, mean ? mean->data : NULL,
                    inv ? inv->data : NULL, stash == PP_F64};
        pp_parallel_for(rows, pp_grain_rows(len, PP_GRAIN_ROW_ELEMS), ln_piece, &j);
    } else if (s == PP_OK) {
        /* Normalising over nothing: mean 0/0 and 1/sqrt(0/0 + eps) are NaN. */
        for (int64_t r = 0; mean && r < rows; r++) pp_tensor_set_f64(mean, r, NAN);
        for (int64_t r = 0; inv && r < rows; r++) pp_tensor_set_f64(inv, r, NAN);
    }
    pp_tensor_free(wt);
    pp_tensor_free(bt);
    if (s != PP_OK) {
        pp_tensor_free(y);
        pp_tensor_free(mean);
        pp_tensor_free(inv);
        return s;
    }
    ctx->out[0] = y;
    if (ctx->n_out > 1) ctx->out[1] = mean;
    else pp_tensor_free(mean);
    if (ctx->n_out > 2) ctx->out[2] = inv;
    else pp_tensor_free(inv);
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss                  */

typedef enum loss_reduction { LOSS_NONE, LOSS_SUM, LOSS_MEAN } loss_reduction;

static int parse_reduction(const char *s, loss_reduction *r) {
    if (strcmp(s, "mean") == 0) *r = LOSS_MEAN;
    else if (strcmp(s, "sum") == 0) *r = LOSS_SUM;
    else if (strcmp(s, "none") == 0) *r = LOSS_NONE;
    else return 0;
    return 1;
}

static pp_status loss_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    loss_reduction r;
    const pp_attr *a = pp_node_attr(n, "reduction");
    if (a && (a->type != PP_ATTR_STRING || !a->s || !parse_reduction(a->s, &r)))
        return pp_node_error(n, PP_ERR_INVALID,
                             "attribute 'reduction' is \"%s\"; it must be \"mean\", \"sum\" or \"none\"",
                             a->type == PP_ATTR_STRING && a->s ? a->s : "(not a string)");
    const pp_attr *ii = pp_node_attr(n, "ignore_index");
    if (ii && ii->type != PP_ATTR_INT)
        return pp_node_error(n, PP_ERR_INVALID, "attribute 'ignore_index' must be an int");
    return PP_OK;
}

/* Both losses: scores (SCE: logits; NLL: log-probabilities) [N, C, d...],
 * labels [N, d...], optional class weights [C]. loss = -lp[n, t, d] * w[t]
 * for labels t other than ignore_index; mean divides by the summed weights
 * of the labels that count (their number without weights). */
static pp_status loss_run(pp_kernel_ctx *ctx, int softmax) {
    const pp_tensor *x = NULL, *lab = NULL;
    PP_TRY(input(ctx, 0, &x));
    PP_TRY(input(ctx, 1, &lab));
    const pp_tensor *w = ctx->n_in > 2 ? ctx->in[2] : NULL;
    char s1[160], s2[160];
    if (x->dtype != PP_F32 && x->dtype != PP_F64) return unsupported_dtype(ctx, x->dtype);
    if (lab->dtype != PP_I64 && lab->dtype != PP_I32)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "labels have dtype %s, not int64 or int32",
                               pp_dtype_name(lab->dtype));
    if (x->ndim < 2)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "scores must be [N, C, ...], got %s",
                               pp_shape_str(x->ndim, x->shape, s1, sizeof s1));
    /* Labels are scores' shape without the class dim. */
    int ok = lab->ndim == x->ndim - 1 && lab->shape[0] == x->shape[0];
    for (int d = 1; ok && d < lab->ndim; d++)
        if (lab->shape[d] != x->shape[d + 1]) ok = 0;
    if (!ok)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "labels shape %s does not fit scores shape %s",
                               pp_shape_str(lab->ndim, lab->shape, s1, sizeof s1),
                               pp_shape_str(x->ndim, x->shape, s2, sizeof s2));
    int64_t n = x->shape[0], c = x->shape[1];
    int64_t inner = pp_shape_numel(x->ndim - 2, x->shape + 2);
    if (w && (w->dtype != x->dtype || w->ndim != 1 || w->shape[0] != c))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "weights must be %s [%lld], got %s %s",
                               pp_dtype_name(x->dtype), (long long)c, pp_dtype_name(w->dtype),
                               pp_shape_str(w->ndim, w->shape, s1, sizeof s1));
    loss_reduction red;
    const char *rs = pp_node_attr_string(ctx->node, "reduction", "mean");
    if (!parse_reduction(rs, &red))
        return pp_kernel_error(ctx, PP_ERR_INVALID, "unknown reduction \"%s\"", rs);
    const pp_attr *ii_attr = pp_node_attr(ctx->node, "ignore_index");
    int has_ii = ii_attr != NULL;
    int64_t ii = has_ii ? ii_attr->i : 0;

    /* Validate labels before doing any work. */
    int64_t nl = n * inner;
    for (int64_t i = 0; i < nl; i++) {
        int64_t t = pp_tensor_get_i64(lab, i);
        if (has_ii && t == ii) continue;
        if (t < 0 || t >= c)
            return pp_kernel_error(ctx, PP_ERR_INVALID,
                                   "label %lld at position %lld is out of range [0, %lld)",
                                   (long long)t, (long long)i, (long long)c);
    }

    pp_tensor *lp = NULL, *loss = NULL;
    if (softmax) PP_TRY(softmax_tensor(ctx, x, n, c, inner, 1, &lp));
    else lp = pp_tensor_retain(ctx->in[0]);
    pp_status s = red == LOSS_NONE ? pp_tensor_empty(x->dtype, lab->ndim, lab->shape, &loss)
                                   : pp_tensor_empty(x->dtype, 0, NULL, &loss);
    if (s != PP_OK) {
        pp_tensor_free(lp);
        return s;
    }
    double total = 0, denom = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < inner; j++) {
            int64_t pos = i * inner + j;
            int64_t t = pp_tensor_get_i64(lab, pos);
            double l = 0, wt = 0;
            if (!(has_ii && t == ii)) {
                wt = w ? pp_tensor_get_f64(w, t) : 1.0;
                l = -pp_tensor_get_f64(lp, (i * c + t) * inner + j) * wt;
            }
            if (red == LOSS_NONE) pp_tensor_set_f64(loss, pos, l);
            total += l;
            denom += wt;
        }
    /* All labels ignored: mean is 0/0 = NaN, as in PyTorch. */
    if (red == LOSS_SUM) pp_tensor_set_f64(loss, 0, total);
    if (red == LOSS_MEAN) pp_tensor_set_f64(loss, 0, total / denom);
    ctx->out[0] = loss;
    if (softmax && wants_output(ctx, 1)) ctx->out[1] = lp;
    else pp_tensor_free(lp);
    return PP_OK;
}

static pp_status sce_run(pp_kernel_ctx *ctx) { return loss_run(ctx, 1); }
static pp_status nll_run(pp_kernel_ctx *ctx) { return loss_run(ctx, 0); }

/* ------------------------------------------------------------------------ */
/* BatchNormalization (opset 15)                                            */

#define DEF_AFFINE(T, SUF)                                                           \
    PP_VEC_CLONES static void affine_##SUF(int64_t n, const T *restrict x, T a, T b, \
                                           T *restrict y) {                          \
        PP_VFOR(i, n, y[i] = x[i] * a + b;);                                         \
    }
DEF_AFFINE(float, f32)
DEF_AFFINE(double, f64)

static pp_status batchnorm_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    PP_TRY(int_attr_check(n, "training_mode", 0, 1));
    const pp_attr *e = pp_node_attr(n, "epsilon");
    if (e && e->type != PP_ATTR_FLOAT)
        return pp_node_error(n, PP_ERR_INVALID, "attribute 'epsilon' must be a float");
    const pp_attr *m = pp_node_attr(n, "momentum");
    if (m && m->type != PP_ATTR_FLOAT)
        return pp_node_error(n, PP_ERR_INVALID, "attribute 'momentum' must be a float");
    return PP_OK;
}

/* X [N, C, d...] normalised per channel with (inference) the given mean and
 * var, or (training_mode=1) the batch's own mean and biased variance; then
 * outputs 1 and 2 are the updated running mean and variance. */
static pp_status batchnorm_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = NULL, *sc = NULL, *bias = NULL, *mean = NULL, *var = NULL;
    PP_TRY(input(ctx, 0, &x));
    PP_TRY(input(ctx, 1, &sc));
    PP_TRY(input(ctx, 2, &bias));
    PP_TRY(input(ctx, 3, &mean));
    PP_TRY(input(ctx, 4, &var));
    if (x->dtype != PP_F32 && x->dtype != PP_F64) return unsupported_dtype(ctx, x->dtype);
    if (x->ndim < 2) return pp_kernel_error(ctx, PP_ERR_SHAPE, "X must be [N, C, ...]");
    int64_t n = x->shape[0], c = x->shape[1], inner = pp_shape_numel(x->ndim - 2, x->shape + 2);
    const pp_tensor *params[4] = {sc, bias, mean, var};
    static const char *const names[4] = {"scale", "B", "input_mean", "input_var"};
    for (int k = 0; k < 4; k++)
        if (pp_tensor_numel(params[k]) != c || params[k]->ndim != 1 ||
            !pp_dtype_is_float(params[k]->dtype))
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be a float vector of %lld channels",
                                   names[k], (long long)c);
    double eps = pp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    double momentum = pp_node_attr_float(ctx->node, "momentum", 0.9f);
    int training = pp_node_attr_int(ctx->node, "training_mode", 0) != 0;
    int unbiased = pp_node_attr_int(ctx->node, "unbiased_running_var", 0) != 0;
    if (!training && (wants_output(ctx, 1) || wants_output(ctx, 2)))
        return pp_kernel_error(ctx, PP_ERR_INVALID,
                               "running mean and variance outputs need training_mode=1");
    pp_tensor *y = NULL, *rm = NULL, *rv = NULL;
    pp_status s = pp_tensor_empty(x->dtype, x->ndim, x->shape, &y);
    if (s == PP_OK && training && wants_output(ctx, 1))
        s = pp_tensor_empty(mean->dtype, 1, &c, &rm);
    if (s == PP_OK && training && wants_output(ctx, 2)) s = pp_tensor_empty(var->dtype, 1, &c, &rv);
    if (s != PP_OK) {
        pp_tensor_free(y);
        pp_tensor_free(rm);
        return s;
    }
    size_t es = pp_dtype_size(x->dtype);
    for (int64_t ch = 0; ch < c; ch++) {
        double m = pp_tensor_get_f64(mean, ch), v = pp_tensor_get_f64(var, ch);
        if (training) {
            double sum = 0, sq = 0, cnt = (double)(n * inner);
            if (cnt <= 1) { /* no variance to speak of; PyTorch refuses it too */
                pp_tensor_free(y);
                pp_tensor_free(rm);
                pp_tensor_free(rv);
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "training mode needs more than 1 value per channel "
                                       "(%lld here: batch %lld); use larger microbatches", (long long)cnt,
                                       (long long)n);
            }
            for (int pass = 0; pass < 2; pass++) {
                for (int64_t i = 0; i < n; i++) {
                    const char *row = (const char *)x->data + (size_t)((i * c + ch) * inner) * es;
                    if (pass == 0)
                        sum += x->dtype == PP_F32 ? row_sum_f32(inner, (const float *)row, 0, 0)
                                                  : row_sum_f64(inner, (const double *)row, 0, 0);
                    else
                        sq += x->dtype == PP_F32
                                  ? row_sum_f32(inner, (const float *)row, (float)(sum / cnt), 1)
                                  : row_sum_f64(inner, (const double *)row, sum / cnt, 1);
                }
            }
            m = sum / cnt;
            v = sq / cnt;
            double m0 = pp_tensor_get_f64(mean, ch), v0 = pp_tensor_get_f64(var, ch);
            if (rm) pp_tensor_set_f64(rm, ch, m0 * momentum + m * (1 - momentum));
            /* unbiased_running_var (set by pippin's training stages): the
             * running variance takes the batch's unbiased variance, as
             * PyTorch's BatchNorm does; ONNX's reference takes the biased */
            double vr = unbiased && cnt > 1 ? v * cnt / (cnt - 1) : v;
            if (rv) pp_tensor_set_f64(rv, ch, v0 * momentum + vr * (1 - momentum));
        }
        double a = pp_tensor_get_f64(sc, ch) / sqrt(v + eps);
        double b = pp_tensor_get_f64(bias, ch) - m * a;
        for (int64_t i = 0; i < n; i++) {
            size_t off = (size_t)((i * c + ch) * inner) * es;
            if (x->dtype == PP_F32)
                affine_f32(inner, (const float *)((const char *)x->data + off), (float)a, (float)b,
                           (float *)((char *)y->data + off));
            else
                affine_f64(inner, (const double *)((const char *)x->data + off), a, b,
                           (double *)((char *)y->data + off));
        }
    }
    ctx->out[0] = y;
    if (ctx->n_out > 1) ctx->out[1] = rm;
    else pp_tensor_free(rm);
    if (ctx->n_out > 2) ctx->out[2] = rv;
    else pp_tensor_free(rv);
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* float16 / bfloat16 through float32 (widen.h)                             */

#define WIDEN(FN, NARROW)                                                                    \
    static pp_status FN##_w(pp_kernel_ctx *ctx) {                                            \
        return pp_kernel_half_dtype(ctx) ? pp_kernel_run_widened(ctx, FN, NARROW) : FN(ctx); \
    }
WIDEN(reduce_sum_run, 1u)
WIDEN(reduce_mean_run, 1u)
WIDEN(reduce_max_run, 1u)
WIDEN(reduce_min_run, 1u)
WIDEN(reduce_prod_run, 1u)
WIDEN(reduce_sumsq_run, 1u)
WIDEN(reduce_l1_run, 1u)
WIDEN(reduce_l2_run, 1u)
WIDEN(reduce_log_sum_run, 1u)
WIDEN(reduce_log_sum_exp_run, 1u)
WIDEN(argmax_run, 0u)
WIDEN(argmin_run, 0u)
WIDEN(softmax_run, 1u)
WIDEN(log_softmax_run, 1u)
WIDEN(hardmax_run, 1u)
WIDEN(layernorm_run, 1u) /* Mean and InvStdDev keep stash_type */
WIDEN(sce_run, 3u)
WIDEN(nll_run, 1u)
WIDEN(batchnorm_run, 7u)

/* ------------------------------------------------------------------------ */

const pp_op pp_ops_reduce[] = {
    {"ReduceSum", "", 1, 2, 1, 1, reduce_check, reduce_sum_run_w},
    {"ReduceMean", "", 1, 2, 1, 1, reduce_check, reduce_mean_run_w},
    {"ReduceMax", "", 1, 2, 1, 1, reduce_check, reduce_max_run_w},
    {"ReduceMin", "", 1, 2, 1, 1, reduce_check, reduce_min_run_w},
    {"ReduceProd", "", 1, 2, 1, 1, reduce_check, reduce_prod_run_w},
    {"ReduceSumSquare", "", 1, 2, 1, 1, reduce_check, reduce_sumsq_run_w},
    {"ReduceL1", "", 1, 2, 1, 1, reduce_check, reduce_l1_run_w},
    {"ReduceL2", "", 1, 2, 1, 1, reduce_check, reduce_l2_run_w},
    {"ReduceLogSum", "", 1, 2, 1, 1, reduce_check, reduce_log_sum_run_w},
    {"ReduceLogSumExp", "", 1, 2, 1, 1, reduce_check, reduce_log_sum_exp_run_w},
    {"ArgMax", "", 1, 1, 1, 1, arg_check, argmax_run_w},
    {"ArgMin", "", 1, 1, 1, 1, arg_check, argmin_run_w},
    {"Softmax", "", 1, 1, 1, 1, softmax_check, softmax_run_w},
    {"LogSoftmax", "", 1, 1, 1, 1, softmax_check, log_softmax_run_w},
    {"Hardmax", "", 1, 1, 1, 1, softmax_check, hardmax_run_w},
    {"LayerNormalization", "", 2, 3, 1, 3, layernorm_check, layernorm_run_w},
    {"BatchNormalization", "", 5, 5, 1, 3, batchnorm_check, batchnorm_run_w},
    {"SoftmaxCrossEntropyLoss", "", 2, 3, 1, 2, loss_check, sce_run_w},
    {"NegativeLogLikelihoodLoss", "", 2, 3, 1, 1, loss_check, nll_run_w},
    {NULL},
};
