/* Elementwise ops: broadcasting arithmetic, comparisons and logic, unary math
 * and activations, Where, Clip, and the variadic Max/Min/Sum/Mean.
 *
 * Every kernel is a table of typed loops picked by dtype. Binary loops come
 * in three forms (vector-vector, vector-scalar, scalar-vector) so that a
 * broadcast row (pp_bcast) runs as one tight loop; see broadcast.h. Signed
 * integer arithmetic wraps (done in unsigned) instead of being undefined. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "op.h"
#include "broadcast.h"
#include "vec.h"
#include "widen.h"

#include "status_internal.h"
#include "thread_pool.h"
/* ------------------------------------------------------------------------ */
/* Binary loops                                                              */

typedef void (*bin_fn)(int64_t n, const void *a, const void *b, void *o);
typedef struct bin_impl {
    pp_dtype dt;
    bin_fn vv, vs, sv;
} bin_impl;

/* The typed loops take restrict parameters (gcc ignores restrict on local
 * pointers when deciding whether a loop needs alias checks); the void*
 * wrappers go into the dispatch tables. */
#define DEF_BIN(NAME, TI, TO, EXPR)                                                         \
    PP_VINLINE void NAME##_vv_t(int64_t n, const TI *restrict a, const TI *restrict b,      \
                                TO *restrict o) {                                           \
        PP_VFOR(i, n, TI x = a[i]; TI y = b[i]; o[i] = (TO)(EXPR););                        \
    }                                                                                       \
    PP_VINLINE void NAME##_vs_t(int64_t n, const TI *restrict a, const TI y,                \
                                TO *restrict o) {                                           \
        PP_VFOR(i, n, TI x = a[i]; o[i] = (TO)(EXPR););                                     \
    }                                                                                       \
    PP_VINLINE void NAME##_sv_t(int64_t n, const TI x, const TI *restrict b,                \
                                TO *restrict o) {                                           \
        PP_VFOR(i, n, TI y = b[i]; o[i] = (TO)(EXPR););                                     \
    }                                                                                       \
    PP_VEC_CLONES static void NAME##_vv(int64_t n, const void *a, const void *b, void *o) { \
        NAME##_vv_t(n, a, b, o);                                                            \
    }                                                                                       \
    PP_VEC_CLONES static void NAME##_vs(int64_t n, const void *a, const void *b, void *o) { \
        NAME##_vs_t(n, a, *(const TI *)b, o);                                               \
    }                                                                                       \
    PP_VEC_CLONES static void NAME##_sv(int64_t n, const void *a, const void *b, void *o) { \
        NAME##_sv_t(n, *(const TI *)a, b, o);                                               \
    }

#define BIN(DT, NAME) {DT, NAME##_vv, NAME##_vs, NAME##_sv}

/* In-place forms (lib/inplace.c): the output is operand a (_a) or b (_b)
 * exactly, read and written through the one pointer io, so nothing is
 * restrict-qualified that may alias; the other operand is a different
 * buffer. The same expression, so the same bits as the forms above. */
typedef void (*bin_io_fn)(int64_t n, void *io, const void *other);
typedef struct bin_io_impl {
    pp_dtype dt;
    bin_io_fn vv_a, vs_a, vv_b, sv_b; /* vs_a, sv_b: other is one element */
} bin_io_impl;

#define DEF_BIN_IO(NAME, T, EXPR)                                                           \
    PP_VINLINE void NAME##_vv_a_t(int64_t n, T *io, const T *restrict b) {                  \
        PP_VFOR(i, n, T x = io[i]; T y = b[i]; io[i] = (T)(EXPR););                         \
    }                                                                                       \
    PP_VINLINE void NAME##_vs_a_t(int64_t n, T *io, const T y) {                            \
        PP_VFOR(i, n, T x = io[i]; io[i] = (T)(EXPR););                                     \
    }                                                                                       \
    PP_VINLINE void NAME##_vv_b_t(int64_t n, T *io, const T *restrict a) {                  \
        PP_VFOR(i, n, T x = a[i]; T y = io[i]; io[i] = (T)(EXPR););                         \
    }                                                                                       \
    PP_VINLINE void NAME##_sv_b_t(int64_t n, T *io, const T x) {                            \
        PP_VFOR(i, n, T y = io[i]; io[i] = (T)(EXPR););                                     \
    }                                                                                       \
    PP_VEC_CLONES static void NAME##_vv_a(int64_t n, void *io, const void *o) {             \
        NAME##_vv_a_t(n, io, o);                                                            \
    }                                                                                       \
    PP_VEC_CLONES static void NAME##_vs_a(int64_t n, void *io, const void *o) {             \
        NAME##_vs_a_t(n, io, *(const T *)o);                                                \
    }                                                                                       \
    PP_VEC_CLONES static void NAME##_vv_b(int64_t n, void *io, const void *o) {             \
        NAME##_vv_b_t(n, io, o);                                                            \
    }                                                                                       \
    PP_VEC_CLONES static void NAME##_sv_b(int64_t n, void *io, const void *o) {             \
        NAME##_sv_b_t(n, io, *(const T *)o);                                                \
    }

#define BIN_IO(DT, NAME) {DT, NAME##_vv_a, NAME##_vs_a, NAME##_vv_b, NAME##_sv_b}

/* Same-type ops over the numeric dtypes; IEXPR is used for integers. The
 * float ones have in-place forms too (NAME##_io_impls). */
#define DEF_BIN_NUM(NAME, FEXPR, IEXPR)                                            \
    DEF_BIN(NAME##_f32, float, float, FEXPR)                                       \
    DEF_BIN(NAME##_f64, double, double, FEXPR)                                     \
    DEF_BIN_IO(NAME##_f32, float, FEXPR)                                           \
    DEF_BIN_IO(NAME##_f64, double, FEXPR)                                          \
    __attribute__((unused)) static const bin_io_impl NAME##_io_impls[] = {         \
        BIN_IO(PP_F32, NAME##_f32), BIN_IO(PP_F64, NAME##_f64),                    \
        {PP_DTYPE_UNDEFINED, NULL, NULL, NULL, NULL}};                             \
    DEF_BIN(NAME##_i32, int32_t, int32_t, IEXPR(int32_t, uint32_t))                \
    DEF_BIN(NAME##_i64, int64_t, int64_t, IEXPR(int64_t, uint64_t))                \
    DEF_BIN(NAME##_i8, int8_t, int8_t, IEXPR(int8_t, uint8_t))                     \
    DEF_BIN(NAME##_u8, uint8_t, uint8_t, IEXPR(uint8_t, uint8_t))                  \
    static const bin_impl NAME##_impls[] = {                                       \
        BIN(PP_F32, NAME##_f32), BIN(PP_F64, NAME##_f64), BIN(PP_I32, NAME##_i32), \
        BIN(PP_I64, NAME##_i64), BIN(PP_I8, NAME##_i8),   BIN(PP_U8, NAME##_u8),   \
        {PP_DTYPE_UNDEFINED, NULL, NULL, NULL}};

#define WADD(T, U) (T)(U)((U)x + (U)y)
#define WSUB(T, U) (T)(U)((U)x - (U)y)
#define WMUL(T, U) (T)(U)((U)x * (U)y)
#define IMAX(T, U) (x > y ? x : y)
#define IMIN(T, U) (x < y ? x : y)
#define IDIV(T, U) idiv_##T(x, y)
#define IPOW(T, U) ipow_##T(x, y)

/* Integer division truncates (as C and ONNX's reference do); division by
 * zero gives 0 and MIN / -1 wraps, instead of trapping. */
PP_VINLINE int32_t idiv_int32_t(int32_t x, int32_t y) {
    return y == 0 ? 0 : y == -1 ? (int32_t)(0u - (uint32_t)x) : x / y;
}
PP_VINLINE int64_t idiv_int64_t(int64_t x, int64_t y) {
    return y == 0 ? 0 : y == -1 ? (int64_t)(0u - (uint64_t)x) : x / y;
}
PP_VINLINE int8_t idiv_int8_t(int8_t x, int8_t y) { return y == 0 ? 0 : (int8_t)(x / y); }
PP_VINLINE uint8_t idiv_uint8_t(uint8_t x, uint8_t y) { return y == 0 ? 0 : (uint8_t)(x / y); }

/* x^y by squaring, wrapping on overflow; a negative y gives the truncated
 * 1 / x^|y|, which is 0 unless |x| == 1. */
#define DEF_IPOW(T, U)                                                   \
    PP_VINLINE T ipow_##T(T x, T y) {                                    \
        if (y < 0) return x == 1 ? 1 : x == -1 ? ((y & 1) ? -1 : 1) : 0; \
        U r = 1, b = (U)x;                                               \
        for (T e = y; e > 0; e >>= 1) {                                  \
            if (e & 1) r = (U)(r * b);                                   \
            b = (U)(b * b);                                              \
        }                                                                \
        return (T)r;                                                     \
    }
DEF_IPOW(int32_t, uint32_t)
DEF_IPOW(int64_t, uint64_t)

DEF_BIN_NUM(add, x + y, WADD)
DEF_BIN_NUM(sub, x - y, WSUB)
DEF_BIN_NUM(mul, x * y, WMUL)
DEF_BIN_NUM(div, x / y, IDIV)
/* Float max/min propagate NaN from either side, as numpy and PyTorch do. */
DEF_BIN_NUM(max, (x > y || x != x) ? x : y, IMAX)
DEF_BIN_NUM(min, (x < y || x != x) ? x : y, IMIN)

/* Mod: fmod=1 keeps the dividend's sign (C, np.fmod); fmod=0 the divisor's
 * (Python, np.mod; integers only). x mod 0 gives 0 for integers. */
PP_VINLINE int32_t irem_int32_t(int32_t x, int32_t y) { return y == 0 || y == -1 ? 0 : x % y; }
PP_VINLINE int64_t irem_int64_t(int64_t x, int64_t y) { return y == 0 || y == -1 ? 0 : x % y; }
PP_VINLINE int8_t irem_int8_t(int8_t x, int8_t y) { return y == 0 ? 0 : (int8_t)(x % y); }
PP_VINLINE uint8_t irem_uint8_t(uint8_t x, uint8_t y) { return y == 0 ? 0 : (uint8_t)(x % y); }
#define IFMOD(T, U) irem_##T(x, y)
#define IPYMOD(T, U) pymod_##T(x, y)
#define DEF_PYMOD(T)                                            \
    PP_VINLINE T pymod_##T(T x, T y) {                          \
        T r = irem_##T(x, y);                                   \
        return (T)(r != 0 && ((r < 0) != (y < 0)) ? r + y : r); \
    }
DEF_PYMOD(int32_t)
DEF_PYMOD(int64_t)
DEF_PYMOD(int8_t)
PP_VINLINE uint8_t pymod_uint8_t(uint8_t x, uint8_t y) { return irem_uint8_t(x, y); }
DEF_BIN_NUM(fmod, fmod(x, y), IFMOD)
DEF_BIN_NUM(pymod, fmod(x, y), IPYMOD)

/* PRelu: y is the slope. */
#define IPRELU(T, U) (x < 0 ? (T)(U)((U)x * (U)y) : x)
DEF_BIN(prelu_f32, float, float, x < 0 ? x * y : x)
DEF_BIN(prelu_f64, double, double, x < 0 ? x * y : x)
DEF_BIN(prelu_i32, int32_t, int32_t, IPRELU(int32_t, uint32_t))
DEF_BIN(prelu_i64, int64_t, int64_t, IPRELU(int64_t, uint64_t))
static const bin_impl prelu_impls[] = {BIN(PP_F32, prelu_f32), BIN(PP_F64, prelu_f64),
                                       BIN(PP_I32, prelu_i32), BIN(PP_I64, prelu_i64),
                                       {PP_DTYPE_UNDEFINED, NULL, NULL, NULL}};

DEF_BIN(pow_f32, float, float, powf(x, y))
DEF_BIN(pow_f64, double, double, pow(x, y))
DEF_BIN(pow_i32, int32_t, int32_t, IPOW(int32_t, uint32_t))
DEF_BIN(pow_i64, int64_t, int64_t, IPOW(int64_t, uint64_t))
static const bin_impl pow_impls[] = {
    BIN(PP_F32, pow_f32), BIN(PP_F64, pow_f64), BIN(PP_I32, pow_i32), BIN(PP_I64, pow_i64),
    {PP_DTYPE_UNDEFINED, NULL, NULL, NULL}};

/* Comparisons give bool (one byte, 0 or 1). */
#define DEF_BIN_CMP(NAME, OP)                                                      \
    DEF_BIN(NAME##_f32, float, uint8_t, x OP y)                                    \
    DEF_BIN(NAME##_f64, double, uint8_t, x OP y)                                   \
    DEF_BIN(NAME##_i32, int32_t, uint8_t, x OP y)                                  \
    DEF_BIN(NAME##_i64, int64_t, uint8_t, x OP y)                                  \
    DEF_BIN(NAME##_i8, int8_t, uint8_t, x OP y)                                    \
    DEF_BIN(NAME##_u8, uint8_t, uint8_t, x OP y)                                   \
    static const bin_impl NAME##_impls[] = {                                       \
        BIN(PP_F32, NAME##_f32), BIN(PP_F64, NAME##_f64), BIN(PP_I32, NAME##_i32), \
        BIN(PP_I64, NAME##_i64), BIN(PP_I8, NAME##_i8),   BIN(PP_U8, NAME##_u8),   \
        BIN(PP_BOOL, NAME##_u8), {PP_DTYPE_UNDEFINED, NULL, NULL, NULL}};

DEF_BIN_CMP(eq, ==)
DEF_BIN_CMP(lt, <)
DEF_BIN_CMP(gt, >)
DEF_BIN_CMP(le, <=)
DEF_BIN_CMP(ge, >=)

DEF_BIN(and_b, uint8_t, uint8_t, (x != 0) & (y != 0))
DEF_BIN(or_b, uint8_t, uint8_t, (x | y) != 0)
DEF_BIN(xor_b, uint8_t, uint8_t, (x != 0) ^ (y != 0))
static const bin_impl and_impls[] = {BIN(PP_BOOL, and_b), {PP_DTYPE_UNDEFINED, NULL, NULL, NULL}};
static const bin_impl or_impls[] = {BIN(PP_BOOL, or_b), {PP_DTYPE_UNDEFINED, NULL, NULL, NULL}};
static const bin_impl xor_impls[] = {BIN(PP_BOOL, xor_b), {PP_DTYPE_UNDEFINED, NULL, NULL, NULL}};

static const bin_impl *find_bin(const bin_impl *impls, pp_dtype dt) {
    for (; impls->vv; impls++)
        if (impls->dt == dt) return impls;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Binary driver                                                             */

static pp_status input(const pp_kernel_ctx *ctx, int i, const pp_tensor **t) {
    if (i >= ctx->n_in || !ctx->in[i])
        return pp_kernel_error(ctx, PP_ERR_INVALID, "input %d is missing", i);
    *t = ctx->in[i];
    return PP_OK;
}

static pp_status unsupported_dtype(const pp_kernel_ctx *ctx, pp_dtype dt) {
    return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "dtype %s is not supported",
                           pp_dtype_name(dt));
}

typedef struct bin_job {
    bin_fn f;
    const char *pa, *pb;
    char *po;
    size_t ea, eb, eo;
} bin_job;

static void bin_seg(void *user, int64_t len, const int64_t *off, int64_t out) {
    const bin_job *j = user;
    j->f(len, j->pa + (size_t)off[0] * j->ea, j->pb + (size_t)off[1] * j->eb, j->po + (size_t)out * j->eo);
}

typedef struct bin_io_job {
    bin_io_fn f;
    int other; /* the operand that is not the output: 0 (a) or 1 (b) */
    const char *po_other;
    char *io;
    size_t es;
} bin_io_job;

/* The output's operand has the output's shape, so its offsets are the
 * output's: only the other operand's are read from off. */
static void bin_io_seg(void *user, int64_t len, const int64_t *off, int64_t out) {
    const bin_io_job *j = user;
    j->f(len, j->io + (size_t)out * j->es, j->po_other + (size_t)off[j->other] * j->es);
}

/* o took a's or b's buffer (lib/inplace.c): the in-place loop for it. */
static pp_status run_bin_inplace(const pp_kernel_ctx *ctx, const pp_bcast *bc, const pp_tensor *a,
                                 const pp_tensor *b, const bin_io_impl *io, pp_tensor *o) {
    while (io && io->vv_a && io->dt != o->dtype) io++;
    if (!io || !io->vv_a)
        return pp_kernel_error(ctx, PP_ERR_INTERNAL, "output shares an input's buffer, but %s has no in-place loop",
                               pp_dtype_name(o->dtype));
    int on_a = o->data == a->data;
    bin_io_job j = {on_a ? (bc->inner_stride[1] ? io->vv_a : io->vs_a) : (bc->inner_stride[0] ? io->vv_b : io->sv_b),
                    on_a ? 1 : 0, on_a ? b->data : a->data, o->data, pp_dtype_size(o->dtype)};
    pp_bcast_run(bc, PP_GRAIN_ELEMS, bin_io_seg, &j);
    return PP_OK;
}

/* Runs loops l over a (op) b with broadcasting into a new tensor of dtype
 * odt; io: the in-place loops, if the op has them (pp_op.inplace). */
static pp_status run_bin(const pp_kernel_ctx *ctx, const pp_tensor *a, const pp_tensor *b,
                         pp_dtype odt, const bin_impl *l, const bin_io_impl *io, pp_tensor **out) {
    const pp_tensor *ops[2] = {a, b};
    pp_bcast bc;
    if (pp_bcast_init(&bc, 2, ops) != PP_OK)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s", pp_last_error());
    pp_tensor *o;
    PP_TRY(pp_tensor_empty(odt, bc.ndim, bc.shape, &o));
    if (o->data && (o->data == a->data || o->data == b->data)) {
        pp_status s = run_bin_inplace(ctx, &bc, a, b, io, o);
        if (s == PP_OK) *out = o;
        else pp_tensor_free(o);
        return s;
    }
    /* Both inner strides 0 only happens for rows of one element. */
    bin_fn f = bc.inner_stride[0] && bc.inner_stride[1] ? l->vv
               : bc.inner_stride[0]                     ? l->vs
               : bc.inner_stride[1]                     ? l->sv
                                                        : l->vs;
    bin_job j = {f, a->data, b->data, o->data, pp_dtype_size(a->dtype), pp_dtype_size(b->dtype),
                 pp_dtype_size(odt)};
    pp_bcast_run(&bc, PP_GRAIN_ELEMS, bin_seg, &j);
    *out = o;
    return PP_OK;
}

/* Checks both inputs share a dtype that impls supports. */
static pp_status bin_pick(const pp_kernel_ctx *ctx, const pp_tensor *a, const pp_tensor *b,
                          const bin_impl *impls, const bin_impl **l) {
    if (a->dtype != b->dtype)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "input dtypes %s and %s differ",
                               pp_dtype_name(a->dtype), pp_dtype_name(b->dtype));
    *l = find_bin(impls, a->dtype);
    return *l ? PP_OK : unsupported_dtype(ctx, a->dtype);
}

static pp_status binary(pp_kernel_ctx *ctx, const bin_impl *impls, const bin_io_impl *io, int bool_out) {
    const pp_tensor *a = NULL, *b = NULL;
    const bin_impl *l;
    PP_TRY(input(ctx, 0, &a));
    PP_TRY(input(ctx, 1, &b));
    PP_TRY(bin_pick(ctx, a, b, impls, &l));
    return run_bin(ctx, a, b, bool_out ? PP_BOOL : a->dtype, l, io, &ctx->out[0]);
}

#define BIN_KERNEL(FN, IMPLS, IO, BOOL_OUT) \
    static pp_status FN(pp_kernel_ctx *ctx) { return binary(ctx, IMPLS, IO, BOOL_OUT); }

BIN_KERNEL(add_run, add_impls, add_io_impls, 0)
BIN_KERNEL(sub_run, sub_impls, sub_io_impls, 0)
BIN_KERNEL(mul_run, mul_impls, mul_io_impls, 0)
BIN_KERNEL(div_run, div_impls, div_io_impls, 0)
BIN_KERNEL(equal_run, eq_impls, NULL, 1)
BIN_KERNEL(less_run, lt_impls, NULL, 1)
BIN_KERNEL(greater_run, gt_impls, NULL, 1)
BIN_KERNEL(less_equal_run, le_impls, NULL, 1)
BIN_KERNEL(greater_equal_run, ge_impls, NULL, 1)
BIN_KERNEL(and_run, and_impls, NULL, 1)
BIN_KERNEL(or_run, or_impls, NULL, 1)
BIN_KERNEL(xor_run, xor_impls, NULL, 1)

static pp_status mod_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const pp_attr *a = pp_node_attr(n, "fmod");
    if (a && (a->type != PP_ATTR_INT || (a->i != 0 && a->i != 1)))
        return pp_node_error(n, PP_ERR_INVALID, "attribute 'fmod' must be 0 or 1");
    return PP_OK;
}

static pp_status mod_run(pp_kernel_ctx *ctx) {
    int fmod_ = pp_node_attr_int(ctx->node, "fmod", 0) != 0;
    if (!fmod_ && ctx->n_in > 0 && ctx->in[0] && pp_dtype_is_float(ctx->in[0]->dtype))
        return pp_kernel_error(ctx, PP_ERR_INVALID, "floating-point Mod needs fmod=1");
    return binary(ctx, fmod_ ? fmod_impls : pymod_impls, NULL, 0);
}

/* PRelu broadcasts the slope to X's shape only (unidirectionally). */
static pp_status prelu_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = NULL, *slope = NULL;
    PP_TRY(input(ctx, 0, &x));
    PP_TRY(input(ctx, 1, &slope));
    int nd;
    int64_t shape[PP_MAX_DIMS];
    char s1[160], s2[160];
    if (pp_broadcast_shape(x->ndim, x->shape, slope->ndim, slope->shape, &nd, shape) != PP_OK ||
        !pp_shape_equal(nd, shape, x->ndim, x->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "slope shape %s does not broadcast to X shape %s",
                               pp_shape_str(slope->ndim, slope->shape, s1, sizeof s1),
                               pp_shape_str(x->ndim, x->shape, s2, sizeof s2));
    return binary(ctx, prelu_impls, NULL, 0);
}

/* ------------------------------------------------------------------------ */
/* Unary loops                                                               */

/* Attribute values a unary op reads (alpha, beta / gamma). */
typedef struct un_param {
    float alpha, beta;
} un_param;
typedef void (*un_fn)(int64_t n, const void *a, void *o, const un_param *p);
typedef struct un_impl {
    pp_dtype dt;
    un_fn f;
} un_impl;

#define DEF_UN(NAME, TI, TO, EXPR)                                                         \
    PP_VINLINE void NAME##_t(int64_t n, const TI *restrict a, TO *restrict o,              \
                                const float alpha, const float beta) {                     \
        (void)alpha;                                                                       \
        (void)beta;                                                                        \
        PP_VFOR(i, n, TI x = a[i]; o[i] = (TO)(EXPR););                                    \
    }                                                                                      \
    PP_VEC_CLONES static void NAME(int64_t n, const void *a, void *o, const un_param *p) { \
        NAME##_t(n, a, o, p ? p->alpha : 0.0f, p ? p->beta : 0.0f);                        \
    }

/* In-place form (lib/inplace.c): the output is the input exactly, read
 * and written through the one pointer io. */
typedef void (*un_io_fn)(int64_t n, void *io, const un_param *p);
typedef struct un_io_impl {
    pp_dtype dt;
    un_io_fn f;
} un_io_impl;

#define DEF_UN_IO(NAME, T, EXPR)                                                           \
    PP_VINLINE void NAME##_io_t(int64_t n, T *io, const float alpha, const float beta) {   \
        (void)alpha;                                                                       \
        (void)beta;                                                                        \
        PP_VFOR(i, n, T x = io[i]; io[i] = (T)(EXPR););                                    \
    }                                                                                      \
    PP_VEC_CLONES static void NAME##_io(int64_t n, void *io, const un_param *p) {          \
        NAME##_io_t(n, io, p ? p->alpha : 0.0f, p ? p->beta : 0.0f);                       \
    }

/* The float loops, with their in-place forms (NAME##_io_impls). */
#define DEF_UN_FLOAT_IO(NAME, FEXPR, DEXPR)                    \
    DEF_UN_IO(NAME##_f32, float, FEXPR)                        \
    DEF_UN_IO(NAME##_f64, double, DEXPR)                       \
    static const un_io_impl NAME##_io_impls[] = {              \
        {PP_F32, NAME##_f32_io}, {PP_F64, NAME##_f64_io}, {PP_DTYPE_UNDEFINED, NULL}};

#define DEF_UN_FLOAT(NAME, FEXPR, DEXPR)      \
    DEF_UN(NAME##_f32, float, float, FEXPR)   \
    DEF_UN(NAME##_f64, double, double, DEXPR) \
    DEF_UN_FLOAT_IO(NAME, FEXPR, DEXPR)       \
    static const un_impl NAME##_impls[] = {   \
        {PP_F32, NAME##_f32}, {PP_F64, NAME##_f64}, {PP_DTYPE_UNDEFINED, NULL}};

/* Float ops plus the signed integers; IEXPR(T, U) for the integers. */
#define DEF_UN_SIGNED(NAME, FEXPR, DEXPR, IEXPR)                          \
    DEF_UN(NAME##_f32, float, float, FEXPR)                               \
    DEF_UN(NAME##_f64, double, double, DEXPR)                             \
    DEF_UN(NAME##_i32, int32_t, int32_t, IEXPR(int32_t, uint32_t))        \
    DEF_UN(NAME##_i64, int64_t, int64_t, IEXPR(int64_t, uint64_t))        \
    DEF_UN(NAME##_i8, int8_t, int8_t, IEXPR(int8_t, uint8_t))             \
    DEF_UN_FLOAT_IO(NAME, FEXPR, DEXPR)                                   \
    static const un_impl NAME##_impls[] = {                               \
        {PP_F32, NAME##_f32}, {PP_F64, NAME##_f64}, {PP_I32, NAME##_i32}, \
        {PP_I64, NAME##_i64}, {PP_I8, NAME##_i8},   {PP_DTYPE_UNDEFINED, NULL}};

#define INEG(T, U) (T)(U)((U)0 - (U)x)
#define IABS(T, U) (x < 0 ? (T)(U)((U)0 - (U)x) : x)
#define IRELU(T, U) (x < 0 ? 0 : x)

PP_VINLINE float gelu_tanh_scalar_f32(float x) {
    return 0.5f * x * (1.0f + pp_vtanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
PP_VINLINE double gelu_tanh_scalar_f64(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

DEF_UN_SIGNED(neg, -x, -x, INEG)
DEF_UN_SIGNED(relu, x < 0 ? 0.0f : x, x < 0 ? 0.0 : x, IRELU)
DEF_UN(abs_f32, float, float, fabsf(x))
DEF_UN(abs_f64, double, double, fabs(x))
DEF_UN(abs_i32, int32_t, int32_t, IABS(int32_t, uint32_t))
DEF_UN(abs_i64, int64_t, int64_t, IABS(int64_t, uint64_t))
DEF_UN(abs_i8, int8_t, int8_t, IABS(int8_t, uint8_t))
DEF_UN(abs_u8, uint8_t, uint8_t, x)
static const un_impl abs_impls[] = {{PP_F32, abs_f32}, {PP_F64, abs_f64}, {PP_I32, abs_i32},
                                    {PP_I64, abs_i64}, {PP_I8, abs_i8},   {PP_U8, abs_u8},
                                    {PP_DTYPE_UNDEFINED, NULL}};
DEF_UN_FLOAT(sqrt, sqrtf(x), sqrt(x))
DEF_UN_FLOAT(exp, pp_vexpf(x), exp(x))
DEF_UN_FLOAT(log, logf(x), log(x))
DEF_UN_FLOAT(erf, pp_verff(x), erf(x))
DEF_UN_FLOAT(tanh, pp_vtanhf(x), tanh(x))
DEF_UN_FLOAT(sigmoid, 1.0f / (1.0f + pp_vexpf(-x)), 1.0 / (1.0 + exp(-x)))
DEF_UN_FLOAT(reciprocal, 1.0f / x, 1.0 / x)
DEF_UN_FLOAT(leaky_relu, x < 0 ? x * alpha : x, x < 0 ? x * (double)alpha : x)
DEF_UN_FLOAT(gelu, 0.5f * x * (1.0f + pp_verff(x * 0.70710678118654752f)),
             0.5 * x * (1.0 + erf(x * 0.70710678118654752)))
DEF_UN_FLOAT(gelu_tanh, gelu_tanh_scalar_f32(x), gelu_tanh_scalar_f64(x))
DEF_UN(not_b, uint8_t, uint8_t, x == 0)
static const un_impl not_impls[] = {{PP_BOOL, not_b}, {PP_DTYPE_UNDEFINED, NULL}};

DEF_UN_FLOAT(cos, cosf(x), cos(x))
DEF_UN_FLOAT(sin, sinf(x), sin(x))
DEF_UN_FLOAT(floor, floorf(x), floor(x))
DEF_UN_FLOAT(ceil, ceilf(x), ceil(x))
/* rint rounds half to even in the default rounding mode, as ONNX Round. */
DEF_UN_FLOAT(round, rintf(x), rint(x))
#define ISIGN(T, U) (T)((x > 0) - (x < 0))
DEF_UN_SIGNED(sign, x > 0 ? 1.0f : (x < 0 ? -1.0f : x), x > 0 ? 1.0 : (x < 0 ? -1.0 : x), ISIGN)
DEF_UN(isnan_f32, float, uint8_t, x != x)
DEF_UN(isnan_f64, double, uint8_t, x != x)
static const un_impl isnan_impls[] = {{PP_F32, isnan_f32}, {PP_F64, isnan_f64},
                                      {PP_DTYPE_UNDEFINED, NULL}};
/* alpha / beta: detect_positive / detect_negative as 0 or 1. */
DEF_UN(isinf_f32, float, uint8_t, (alpha != 0 && x == INFINITY) || (beta != 0 && x == -INFINITY))
DEF_UN(isinf_f64, double, uint8_t, (alpha != 0 && x == INFINITY) || (beta != 0 && x == -INFINITY))
static const un_impl isinf_impls[] = {{PP_F32, isinf_f32}, {PP_F64, isinf_f64},
                                      {PP_DTYPE_UNDEFINED, NULL}};
PP_VINLINE float clamp01f(float v) { return v < 0 ? 0.0f : (v > 1 ? 1.0f : v); }
PP_VINLINE double clamp01(double v) { return v < 0 ? 0.0 : (v > 1 ? 1.0 : v); }
DEF_UN_FLOAT(hard_sigmoid, clamp01f(alpha * x + beta), clamp01((double)alpha * x + (double)beta))
DEF_UN_FLOAT(hard_swish, x * clamp01f(x * (1.0f / 6) + 0.5f), x * clamp01(x / 6 + 0.5))
/* log(1 + e^x) without overflow for large x. */
DEF_UN_FLOAT(softplus, (x > 0 ? x : 0.0f) + log1pf(expf(-fabsf(x))),
             (x > 0 ? x : 0.0) + log1p(exp(-fabs(x))))
DEF_UN_FLOAT(softsign, x / (1.0f + fabsf(x)), x / (1.0 + fabs(x)))
DEF_UN_FLOAT(elu, x < 0 ? alpha * expm1f(x) : x, x < 0 ? (double)alpha * expm1(x) : x)
/* beta holds gamma. */
DEF_UN_FLOAT(selu, x <= 0 ? beta * alpha * expm1f(x) : beta * x,
             x <= 0 ? (double)beta * (double)alpha * expm1(x) : (double)beta * x)
DEF_UN_FLOAT(celu, (x > 0 ? x : 0.0f) + (x < 0 ? alpha * expm1f(x / alpha) : 0.0f),
             (x > 0 ? x : 0.0) + (x < 0 ? (double)alpha * expm1(x / (double)alpha) : 0.0))
DEF_UN_FLOAT(thresholded_relu, x > alpha ? x : 0.0f, x > (double)alpha ? x : 0.0)

/* Elementwise loops run in pieces (thread_pool.h): the same arithmetic
 * per element whatever the cut. */
typedef struct un_job {
    un_fn f;
    const char *a;
    char *o;
    size_t ea, eo;
    const un_param *p;
} un_job;

static void un_piece(void *arg, int64_t lo, int64_t hi) {
    const un_job *j = arg;
    j->f(hi - lo, j->a + (size_t)lo * j->ea, j->o + (size_t)lo * j->eo, j->p);
}

typedef struct un_io_job {
    un_io_fn f;
    char *io;
    size_t es;
    const un_param *p;
} un_io_job;

static void un_io_piece(void *arg, int64_t lo, int64_t hi) {
    const un_io_job *j = arg;
    j->f(hi - lo, j->io + (size_t)lo * j->es, j->p);
}

/* io: the in-place loops, if the op has them (pp_op.inplace). */
static pp_status unary_with(pp_kernel_ctx *ctx, const un_impl *impls, const un_io_impl *io, const un_param *p) {
    const pp_tensor *a = NULL;
    PP_TRY(input(ctx, 0, &a));
    const un_impl *l = impls;
    while (l->f && l->dt != a->dtype) l++;
    if (!l->f) return unsupported_dtype(ctx, a->dtype);
    pp_tensor *o;
    PP_TRY(pp_tensor_empty(a->dtype, a->ndim, a->shape, &o));
    if (o->data && o->data == a->data) { /* o took a's buffer (lib/inplace.c) */
        while (io && io->f && io->dt != a->dtype) io++;
        if (!io || !io->f) {
            pp_tensor_free(o);
            return pp_kernel_error(ctx, PP_ERR_INTERNAL,
                                   "output shares the input's buffer, but %s has no in-place loop",
                                   pp_dtype_name(a->dtype));
        }
        un_io_job j = {io->f, o->data, pp_dtype_size(a->dtype), p};
        pp_parallel_elems(pp_tensor_numel(a), PP_GRAIN_ELEMS, un_io_piece, &j);
    } else {
        un_job j = {l->f, a->data, o->data, pp_dtype_size(a->dtype), pp_dtype_size(o->dtype), p};
        pp_parallel_elems(pp_tensor_numel(a), PP_GRAIN_ELEMS, un_piece, &j);
    }
    ctx->out[0] = o;
    return PP_OK;
}

#define UN_KERNEL(FN, IMPLS, IO) \
    static pp_status FN(pp_kernel_ctx *ctx) { return unary_with(ctx, IMPLS, IO, NULL); }

UN_KERNEL(neg_run, neg_impls, neg_io_impls)
UN_KERNEL(relu_run, relu_impls, relu_io_impls)
UN_KERNEL(abs_run, abs_impls, NULL)
UN_KERNEL(sqrt_run, sqrt_impls, sqrt_io_impls)
UN_KERNEL(exp_run, exp_impls, exp_io_impls)
UN_KERNEL(log_run, log_impls, log_io_impls)
UN_KERNEL(erf_run, erf_impls, erf_io_impls)
UN_KERNEL(tanh_run, tanh_impls, tanh_io_impls)
UN_KERNEL(sigmoid_run, sigmoid_impls, sigmoid_io_impls)
UN_KERNEL(reciprocal_run, reciprocal_impls, reciprocal_io_impls)
UN_KERNEL(not_run, not_impls, NULL)
UN_KERNEL(gelu_ms_run, gelu_impls, gelu_io_impls)
UN_KERNEL(cos_run, cos_impls, cos_io_impls)
UN_KERNEL(sin_run, sin_impls, sin_io_impls)
UN_KERNEL(floor_run, floor_impls, floor_io_impls)
UN_KERNEL(ceil_run, ceil_impls, ceil_io_impls)
UN_KERNEL(round_run, round_impls, round_io_impls)
UN_KERNEL(sign_run, sign_impls, sign_io_impls)
UN_KERNEL(hard_swish_run, hard_swish_impls, hard_swish_io_impls)
UN_KERNEL(softplus_run, softplus_impls, softplus_io_impls)
UN_KERNEL(softsign_run, softsign_impls, softsign_io_impls)

static pp_status float_attr_check(const pp_node *n, const char *name) {
    const pp_attr *a = pp_node_attr(n, name);
    if (a && a->type != PP_ATTR_FLOAT && a->type != PP_ATTR_INT)
        return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' must be a float", name);
    return PP_OK;
}

/* IsNaN / IsInf give bool. */
static pp_status unary_bool(pp_kernel_ctx *ctx, const un_impl *impls, const un_param *p) {
    const pp_tensor *a = NULL;
    PP_TRY(input(ctx, 0, &a));
    const un_impl *l = impls;
    while (l->f && l->dt != a->dtype) l++;
    if (!l->f) return unsupported_dtype(ctx, a->dtype);
    pp_tensor *o;
    PP_TRY(pp_tensor_empty(PP_BOOL, a->ndim, a->shape, &o));
    l->f(pp_tensor_numel(a), a->data, o->data, p);
    ctx->out[0] = o;
    return PP_OK;
}

static pp_status isnan_run(pp_kernel_ctx *ctx) { return unary_bool(ctx, isnan_impls, NULL); }

static pp_status isinf_run(pp_kernel_ctx *ctx) {
    un_param p = {pp_node_attr_int(ctx->node, "detect_positive", 1) != 0 ? 1.0f : 0.0f,
                  pp_node_attr_int(ctx->node, "detect_negative", 1) != 0 ? 1.0f : 0.0f};
    return unary_bool(ctx, isinf_impls, &p);
}

/* Unary ops whose attributes are alpha (and beta), with their defaults. */
#define UN_ATTR_KERNEL(FN, NAME, ALPHA, BETA_NAME, BETA)                               \
    static pp_status FN(pp_kernel_ctx *ctx) {                                          \
        un_param p = {pp_node_attr_float(ctx->node, "alpha", ALPHA),                   \
                      BETA_NAME ? pp_node_attr_float(ctx->node, BETA_NAME, BETA) : 0}; \
        return unary_with(ctx, NAME##_impls, NAME##_io_impls, &p);                     \
    }
UN_ATTR_KERNEL(hard_sigmoid_run, hard_sigmoid, 0.2f, "beta", 0.5f)
UN_ATTR_KERNEL(elu_run, elu, 1.0f, NULL, 0)
UN_ATTR_KERNEL(selu_run, selu, 1.67326319217681884765625f, "gamma",
               1.05070102214813232421875f)
UN_ATTR_KERNEL(celu_run, celu, 1.0f, NULL, 0)
UN_ATTR_KERNEL(thresholded_relu_run, thresholded_relu, 1.0f, NULL, 0)

static pp_status alpha_beta_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    PP_TRY(float_attr_check(n, "alpha"));
    PP_TRY(float_attr_check(n, "beta"));
    return float_attr_check(n, "gamma");
}

static pp_status leaky_relu_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    return float_attr_check(n, "alpha");
}

static pp_status leaky_relu_run(pp_kernel_ctx *ctx) {
    un_param p = {pp_node_attr_float(ctx->node, "alpha", 0.01f), 0.0f};
    return unary_with(ctx, leaky_relu_impls, leaky_relu_io_impls, &p);
}

static pp_status gelu_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const pp_attr *a = pp_node_attr(n, "approximate");
    if (a && (a->type != PP_ATTR_STRING || !a->s ||
              (strcmp(a->s, "none") != 0 && strcmp(a->s, "tanh") != 0)))
        return pp_node_error(n, PP_ERR_INVALID,
                             "attribute 'approximate' must be \"none\" or \"tanh\"");
    return PP_OK;
}

static pp_status gelu_run(pp_kernel_ctx *ctx) {
    const char *approx = pp_node_attr_string(ctx->node, "approximate", "none");
    if (strcmp(approx, "tanh") == 0) return unary_with(ctx, gelu_tanh_impls, gelu_tanh_io_impls, NULL);
    if (strcmp(approx, "none") == 0) return unary_with(ctx, gelu_impls, gelu_io_impls, NULL);
    return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "approximate=\"%s\" is not supported", approx);
}

/* ------------------------------------------------------------------------ */
/* Pow: the exponent may have another dtype than the base                   */

PP_VEC_CLONES static void pow_f32_scalar(int64_t n, const float *restrict a, float e,
                                         float *restrict o) {
    /* The common exponents as exact products (GELU's tanh form uses x^3). */
    if (e == 2.0f) PP_VFOR(i, n, o[i] = a[i] * a[i];);
    else if (e == 3.0f) PP_VFOR(i, n, o[i] = a[i] * a[i] * a[i];);
    else if (e == 1.0f) PP_VFOR(i, n, o[i] = a[i];);
    else if (e == 0.5f) PP_VFOR(i, n, o[i] = sqrtf(a[i]););
    else for (int64_t i = 0; i < n; i++) o[i] = powf(a[i], e);
}

static pp_status pow_same(pp_kernel_ctx *ctx, const pp_tensor *a, const pp_tensor *b,
                          pp_tensor **out) {
    const bin_impl *l;
    PP_TRY(bin_pick(ctx, a, b, pow_impls, &l));
    if (a->dtype == PP_F32 && pp_tensor_numel(b) == 1 && b->ndim <= a->ndim) {
        pp_tensor *o;
        PP_TRY(pp_tensor_empty(a->dtype, a->ndim, a->shape, &o));
        pow_f32_scalar(pp_tensor_numel(a), a->data, *(const float *)b->data, o->data);
        *out = o;
        return PP_OK;
    }
    return run_bin(ctx, a, b, a->dtype, l, NULL, out);
}

static pp_status pow_run(pp_kernel_ctx *ctx) {
    const pp_tensor *a = NULL, *b = NULL;
    PP_TRY(input(ctx, 0, &a));
    PP_TRY(input(ctx, 1, &b));
    if (!find_bin(pow_impls, a->dtype)) return unsupported_dtype(ctx, a->dtype);
    if (a->dtype == b->dtype) return pow_same(ctx, a, b, &ctx->out[0]);
    int af = pp_dtype_is_float(a->dtype), bf = pp_dtype_is_float(b->dtype);
    pp_tensor *ca = NULL, *cb = NULL, *r = NULL;
    pp_status s;
    if (af || !bf) {
        /* Float base, or two integer types: the exponent takes the base's type. */
        s = pp_tensor_cast(b, a->dtype, &cb);
        if (s == PP_OK) s = pow_same(ctx, a, cb, &ctx->out[0]);
    } else {
        /* Integer base, float exponent: compute in double and truncate back,
         * like numpy's power(x, y).astype(x.dtype). */
        s = pp_tensor_cast(a, PP_F64, &ca);
        if (s == PP_OK) s = pp_tensor_cast(b, PP_F64, &cb);
        if (s == PP_OK) s = pow_same(ctx, ca, cb, &r);
        if (s == PP_OK) s = pp_tensor_cast(r, a->dtype, &ctx->out[0]);
    }
    pp_tensor_free(ca);
    pp_tensor_free(cb);
    pp_tensor_free(r);
    return s;
}

/* ------------------------------------------------------------------------ */
/* Variadic Max / Min / Sum / Mean                                           */

static pp_status fold(pp_kernel_ctx *ctx, const bin_impl *impls, pp_tensor **out) {
    if (ctx->n_in < 1 || !ctx->in[0])
        return pp_kernel_error(ctx, PP_ERR_INVALID, "needs at least one input");
    pp_tensor *acc = pp_tensor_retain(ctx->in[0]);
    if (!find_bin(impls, acc->dtype)) {
        pp_tensor_free(acc);
        return unsupported_dtype(ctx, ctx->in[0]->dtype);
    }
    for (int i = 1; i < ctx->n_in; i++) {
        const pp_tensor *b = NULL;
        const bin_impl *l;
        pp_tensor *next = NULL;
        pp_status s = input(ctx, i, &b);
        if (s == PP_OK) s = bin_pick(ctx, acc, b, impls, &l);
        if (s == PP_OK) s = run_bin(ctx, acc, b, acc->dtype, l, NULL, &next);
        pp_tensor_free(acc);
        if (s != PP_OK) return s;
        acc = next;
    }
    *out = acc;
    return PP_OK;
}

static pp_status max_run(pp_kernel_ctx *ctx) { return fold(ctx, max_impls, &ctx->out[0]); }
static pp_status min_run(pp_kernel_ctx *ctx) { return fold(ctx, min_impls, &ctx->out[0]); }

static pp_status require_float(const pp_kernel_ctx *ctx) {
    for (int i = 0; i < ctx->n_in; i++)
        if (ctx->in[i] && ctx->in[i]->dtype != PP_F32 && ctx->in[i]->dtype != PP_F64)
            return unsupported_dtype(ctx, ctx->in[i]->dtype);
    return PP_OK;
}

static pp_status sum_run(pp_kernel_ctx *ctx) {
    PP_TRY(require_float(ctx));
    return fold(ctx, add_impls, &ctx->out[0]);
}

PP_VEC_CLONES static void scale_f32(int64_t n, const float *restrict x, float k,
                                    float *restrict y) {
    PP_VFOR(i, n, y[i] = x[i] * k;);
}
PP_VEC_CLONES static void scale_f64(int64_t n, const double *restrict x, double k,
                                    double *restrict y) {
    PP_VFOR(i, n, y[i] = x[i] * k;);
}

static pp_status mean_run(pp_kernel_ctx *ctx) {
    PP_TRY(require_float(ctx));
    pp_tensor *sum;
    PP_TRY(fold(ctx, add_impls, &sum));
    pp_tensor *o;
    pp_status s = pp_tensor_empty(sum->dtype, sum->ndim, sum->shape, &o);
    if (s == PP_OK) {
        int64_t n = pp_tensor_numel(sum);
        if (sum->dtype == PP_F32)
            scale_f32(n, sum->data, 1.0f / (float)ctx->n_in, o->data);
        else
            scale_f64(n, sum->data, 1.0 / ctx->n_in, o->data);
        ctx->out[0] = o;
    }
    pp_tensor_free(sum);
    return s;
}

/* ------------------------------------------------------------------------ */
/* Clip                                                                      */

#define DEF_CLIP(NAME, T)                                                               \
    PP_VINLINE void NAME##_t(int64_t n, const T *restrict a, T *restrict o, const T lo, \
                                const T hi) {                                           \
        PP_VFOR(i, n, T v = a[i]; v = v < lo ? lo : v; o[i] = v > hi ? hi : v;);        \
    }                                                                                   \
    PP_VEC_CLONES static void NAME(int64_t n, const void *a, void *o, const void *lo,   \
                                   const void *hi) {                                    \
        NAME##_t(n, a, o, *(const T *)lo, *(const T *)hi);                              \
    }
DEF_CLIP(clip_f32, float)
DEF_CLIP(clip_f64, double)
DEF_CLIP(clip_i32, int32_t)
DEF_CLIP(clip_i64, int64_t)
DEF_CLIP(clip_i8, int8_t)
DEF_CLIP(clip_u8, uint8_t)

typedef union clip_bound_u {
    float f32;
    double f64;
    int32_t i32;
    int64_t i64;
    int8_t i8;
    uint8_t u8;
} clip_bound_u;

/* The bound from input idx, else from attribute name (Clip before opset 11,
 * float types only), else the dtype's extreme. */
static pp_status clip_bound(pp_kernel_ctx *ctx, int idx, const char *name, int upper, pp_dtype dt,
                            clip_bound_u *b) {
    const pp_tensor *t = idx < ctx->n_in ? ctx->in[idx] : NULL;
    if (t) {
        if (t->dtype != dt)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s has dtype %s, input has %s", name,
                                   pp_dtype_name(t->dtype), pp_dtype_name(dt));
        if (pp_tensor_numel(t) != 1)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be a scalar", name);
        memcpy(b, t->data, pp_dtype_size(dt));
        return PP_OK;
    }
    const pp_attr *attr = pp_node_attr(ctx->node, name);
    float v = attr ? pp_node_attr_float(ctx->node, name, 0.0f) : (upper ? INFINITY : -INFINITY);
    switch (dt) {
    case PP_F32: b->f32 = v; break;
    case PP_F64: b->f64 = v; break;
    case PP_I32: b->i32 = upper ? INT32_MAX : INT32_MIN; break;
    case PP_I64: b->i64 = upper ? INT64_MAX : INT64_MIN; break;
    case PP_I8: b->i8 = upper ? INT8_MAX : INT8_MIN; break;
    case PP_U8: b->u8 = upper ? UINT8_MAX : 0; break;
    default: return unsupported_dtype(ctx, dt);
    }
    return PP_OK;
}

typedef struct clip_job {
    void (*f)(int64_t, const void *, void *, const void *, const void *);
    const char *a;
    char *o;
    size_t es;
    const clip_bound_u *lo, *hi;
} clip_job;

static void clip_piece(void *arg, int64_t lo, int64_t hi) {
    const clip_job *j = arg;
    j->f(hi - lo, j->a + (size_t)lo * j->es, j->o + (size_t)lo * j->es, j->lo, j->hi);
}

static pp_status clip_run(pp_kernel_ctx *ctx) {
    const pp_tensor *a = NULL;
    PP_TRY(input(ctx, 0, &a));
    void (*f)(int64_t, const void *, void *, const void *, const void *);
    switch (a->dtype) {
    case PP_F32: f = clip_f32; break;
    case PP_F64: f = clip_f64; break;
    case PP_I32: f = clip_i32; break;
    case PP_I64: f = clip_i64; break;
    case PP_I8: f = clip_i8; break;
    case PP_U8: f = clip_u8; break;
    default: return unsupported_dtype(ctx, a->dtype);
    }
    clip_bound_u lo, hi;
    PP_TRY(clip_bound(ctx, 1, "min", 0, a->dtype, &lo));
    PP_TRY(clip_bound(ctx, 2, "max", 1, a->dtype, &hi));
    pp_tensor *o;
    PP_TRY(pp_tensor_empty(a->dtype, a->ndim, a->shape, &o));
    clip_job j = {f, a->data, o->data, pp_dtype_size(a->dtype), &lo, &hi};
    pp_parallel_elems(pp_tensor_numel(a), PP_GRAIN_ELEMS, clip_piece, &j);
    ctx->out[0] = o;
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* Where                                                                     */

/* A row of Where: c, x, y step by sc, sx, sy (0 or 1). The forms with a
 * contiguous condition get tight loops (a masked_fill exports as Where with
 * a broadcast scalar x); anything else takes the strided loop, as does an
 * output that is x or y exactly (in place, lib/inplace.c: no restrict). */
#define DEF_WHERE(NAME, T)                                                                 \
    PP_VINLINE void NAME##_t(int64_t n, const uint8_t *restrict c, const T *restrict x,    \
                             int64_t sx, const T *restrict y, int64_t sy, T *restrict o) { \
        if (sx && sy) {                                                                    \
            PP_VFOR(i, n, o[i] = c[i] ? x[i] : y[i];);                                     \
        } else if (sy) {                                                                   \
            const T xv = x[0];                                                             \
            PP_VFOR(i, n, o[i] = c[i] ? xv : y[i];);                                       \
        } else if (sx) {                                                                   \
            const T yv = y[0];                                                             \
            PP_VFOR(i, n, o[i] = c[i] ? x[i] : yv;);                                       \
        } else {                                                                           \
            const T xv = x[0], yv = y[0];                                                  \
            PP_VFOR(i, n, o[i] = c[i] ? xv : yv;);                                         \
        }                                                                                  \
    }                                                                                      \
    PP_VEC_CLONES static void NAME(int64_t n, const uint8_t *c, int64_t sc, const void *x, \
                                   int64_t sx, const void *y, int64_t sy, void *o_) {      \
        if (sc && o_ != x && o_ != y) {                                                    \
            NAME##_t(n, c, x, sx, y, sy, o_);                                              \
            return;                                                                        \
        }                                                                                  \
        const T *xt = x, *yt = y;                                                          \
        T *o = o_;                                                                         \
        for (int64_t i = 0; i < n; i++) o[i] = c[i * sc] ? xt[i * sx] : yt[i * sy];        \
    }
DEF_WHERE(where_1, uint8_t)
DEF_WHERE(where_2, uint16_t)
DEF_WHERE(where_4, uint32_t)
DEF_WHERE(where_8, uint64_t)

typedef struct where_job {
    void (*f)(int64_t, const uint8_t *, int64_t, const void *, int64_t, const void *, int64_t, void *);
    const pp_bcast *bc;
    const uint8_t *c;
    const char *x, *y;
    char *o;
    size_t es;
} where_job;

static void where_seg(void *user, int64_t len, const int64_t *off, int64_t out) {
    const where_job *j = user;
    j->f(len, j->c + off[0], j->bc->inner_stride[0], j->x + (size_t)off[1] * j->es, j->bc->inner_stride[1],
         j->y + (size_t)off[2] * j->es, j->bc->inner_stride[2], j->o + (size_t)out * j->es);
}

static pp_status where_run(pp_kernel_ctx *ctx) {
    const pp_tensor *c = NULL, *x = NULL, *y = NULL;
    PP_TRY(input(ctx, 0, &c));
    PP_TRY(input(ctx, 1, &x));
    PP_TRY(input(ctx, 2, &y));
    if (c->dtype != PP_BOOL)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "condition has dtype %s, not bool",
                               pp_dtype_name(c->dtype));
    if (x->dtype != y->dtype)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "input dtypes %s and %s differ",
                               pp_dtype_name(x->dtype), pp_dtype_name(y->dtype));
    size_t es = pp_dtype_size(x->dtype);
    void (*f)(int64_t, const uint8_t *, int64_t, const void *, int64_t, const void *, int64_t,
              void *);
    switch (es) {
    case 1: f = where_1; break;
    case 2: f = where_2; break;
    case 4: f = where_4; break;
    case 8: f = where_8; break;
    default: return unsupported_dtype(ctx, x->dtype);
    }
    const pp_tensor *ops[3] = {c, x, y};
    pp_bcast bc;
    if (pp_bcast_init(&bc, 3, ops) != PP_OK)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s", pp_last_error());
    pp_tensor *o;
    PP_TRY(pp_tensor_empty(x->dtype, bc.ndim, bc.shape, &o));
    where_job j = {f, &bc, c->data, x->data, y->data, o->data, es};
    pp_bcast_run(&bc, PP_GRAIN_ELEMS, where_seg, &j);
    ctx->out[0] = o;
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* float16 / bfloat16 through float32 (widen.h)                             */

#define WIDEN(FN)                                                                        \
    static pp_status FN##_w(pp_kernel_ctx *ctx) {                                        \
        return pp_kernel_half_dtype(ctx) ? pp_kernel_run_widened(ctx, FN, 1u) : FN(ctx); \
    }
WIDEN(add_run)
WIDEN(sub_run)
WIDEN(mul_run)
WIDEN(div_run)
WIDEN(pow_run)
WIDEN(mod_run)
WIDEN(prelu_run)
WIDEN(equal_run)
WIDEN(less_run)
WIDEN(greater_run)
WIDEN(less_equal_run)
WIDEN(greater_equal_run)
WIDEN(neg_run)
WIDEN(abs_run)
WIDEN(sqrt_run)
WIDEN(exp_run)
WIDEN(log_run)
WIDEN(erf_run)
WIDEN(tanh_run)
WIDEN(sigmoid_run)
WIDEN(reciprocal_run)
WIDEN(relu_run)
WIDEN(leaky_relu_run)
WIDEN(gelu_run)
WIDEN(gelu_ms_run)
WIDEN(cos_run)
WIDEN(sin_run)
WIDEN(floor_run)
WIDEN(ceil_run)
WIDEN(round_run)
WIDEN(sign_run)
WIDEN(isnan_run)
WIDEN(isinf_run)
WIDEN(hard_sigmoid_run)
WIDEN(hard_swish_run)
WIDEN(softplus_run)
WIDEN(softsign_run)
WIDEN(elu_run)
WIDEN(selu_run)
WIDEN(celu_run)
WIDEN(thresholded_relu_run)
WIDEN(clip_run)
WIDEN(max_run)
WIDEN(min_run)
WIDEN(sum_run)
WIDEN(mean_run)

/* ------------------------------------------------------------------------ */

/* .inplace: the inputs whose buffer the output may take (lib/op.h). */
const pp_op pp_ops_elementwise[] = {
    {"Add", "", 2, 2, 1, 1, NULL, add_run_w, .inplace = 3},
    {"Sub", "", 2, 2, 1, 1, NULL, sub_run_w, .inplace = 3},
    {"Mul", "", 2, 2, 1, 1, NULL, mul_run_w, .inplace = 3},
    {"Div", "", 2, 2, 1, 1, NULL, div_run_w, .inplace = 3},
    {"Pow", "", 2, 2, 1, 1, NULL, pow_run_w},
    {"Mod", "", 2, 2, 1, 1, mod_check, mod_run_w},
    {"PRelu", "", 2, 2, 1, 1, NULL, prelu_run_w},
    {"Equal", "", 2, 2, 1, 1, NULL, equal_run_w},
    {"Less", "", 2, 2, 1, 1, NULL, less_run_w},
    {"Greater", "", 2, 2, 1, 1, NULL, greater_run_w},
    {"LessOrEqual", "", 2, 2, 1, 1, NULL, less_equal_run_w},
    {"GreaterOrEqual", "", 2, 2, 1, 1, NULL, greater_equal_run_w},
    {"And", "", 2, 2, 1, 1, NULL, and_run},
    {"Or", "", 2, 2, 1, 1, NULL, or_run},
    {"Xor", "", 2, 2, 1, 1, NULL, xor_run},
    {"Not", "", 1, 1, 1, 1, NULL, not_run},
    {"Neg", "", 1, 1, 1, 1, NULL, neg_run_w, .inplace = 1},
    {"Abs", "", 1, 1, 1, 1, NULL, abs_run_w},
    {"Sqrt", "", 1, 1, 1, 1, NULL, sqrt_run_w, .inplace = 1},
    {"Exp", "", 1, 1, 1, 1, NULL, exp_run_w, .inplace = 1},
    {"Log", "", 1, 1, 1, 1, NULL, log_run_w, .inplace = 1},
    {"Erf", "", 1, 1, 1, 1, NULL, erf_run_w, .inplace = 1},
    {"Tanh", "", 1, 1, 1, 1, NULL, tanh_run_w, .inplace = 1},
    {"Sigmoid", "", 1, 1, 1, 1, NULL, sigmoid_run_w, .inplace = 1},
    {"Reciprocal", "", 1, 1, 1, 1, NULL, reciprocal_run_w, .inplace = 1},
    {"Relu", "", 1, 1, 1, 1, NULL, relu_run_w, .inplace = 1},
    {"LeakyRelu", "", 1, 1, 1, 1, leaky_relu_check, leaky_relu_run_w, .inplace = 1},
    {"Gelu", "", 1, 1, 1, 1, gelu_check, gelu_run_w, .inplace = 1},
    {"Gelu", "com.microsoft", 1, 1, 1, 1, NULL, gelu_ms_run_w, .inplace = 1},
    {"Cos", "", 1, 1, 1, 1, NULL, cos_run_w, .inplace = 1},
    {"Sin", "", 1, 1, 1, 1, NULL, sin_run_w, .inplace = 1},
    {"Floor", "", 1, 1, 1, 1, NULL, floor_run_w, .inplace = 1},
    {"Ceil", "", 1, 1, 1, 1, NULL, ceil_run_w, .inplace = 1},
    {"Round", "", 1, 1, 1, 1, NULL, round_run_w, .inplace = 1},
    {"Sign", "", 1, 1, 1, 1, NULL, sign_run_w, .inplace = 1},
    {"IsNaN", "", 1, 1, 1, 1, NULL, isnan_run_w},
    {"IsInf", "", 1, 1, 1, 1, NULL, isinf_run_w},
    {"HardSigmoid", "", 1, 1, 1, 1, alpha_beta_check, hard_sigmoid_run_w, .inplace = 1},
    {"HardSwish", "", 1, 1, 1, 1, NULL, hard_swish_run_w, .inplace = 1},
    {"Softplus", "", 1, 1, 1, 1, NULL, softplus_run_w, .inplace = 1},
    {"Softsign", "", 1, 1, 1, 1, NULL, softsign_run_w, .inplace = 1},
    {"Elu", "", 1, 1, 1, 1, alpha_beta_check, elu_run_w, .inplace = 1},
    {"Selu", "", 1, 1, 1, 1, alpha_beta_check, selu_run_w, .inplace = 1},
    {"Celu", "", 1, 1, 1, 1, alpha_beta_check, celu_run_w, .inplace = 1},
    {"ThresholdedRelu", "", 1, 1, 1, 1, alpha_beta_check, thresholded_relu_run_w, .inplace = 1},
    {"Clip", "", 1, 3, 1, 1, NULL, clip_run_w},
    {"Where", "", 3, 3, 1, 1, NULL, where_run, .inplace = 6},
    {"Max", "", 1, 64, 1, 1, NULL, max_run_w},
    {"Min", "", 1, 64, 1, 1, NULL, min_run_w},
    {"Sum", "", 1, 64, 1, 1, NULL, sum_run_w},
    {"Mean", "", 1, 64, 1, 1, NULL, mean_run_w},
    {NULL},
};
