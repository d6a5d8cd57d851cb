/* pippin-domain helper ops that autodiff emits: the op table, shared input
 * checks, and the fused derivatives of unary activations
 * (dx = dy * f'(x), written from x or from the forward output y). */
#include <math.h>
#include <string.h>

#include "grad_kernels.h"
#include "vec.h"

#include "status_internal.h"
#include "thread_pool.h"
pp_status pp_grad_k_f32(const pp_kernel_ctx *ctx, int k, const char *what) {
    if (k >= ctx->n_in || !ctx->in[k])
        return pp_kernel_error(ctx, PP_ERR_INVALID, "missing input %s", what);
    if (ctx->in[k]->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "%s is %s; gradients are float32 only",
                               what, pp_dtype_name(ctx->in[k]->dtype));
    return PP_OK;
}

float *pp_grad_k_target(pp_kernel_ctx *ctx, int k, int64_t numel) {
    pp_tensor *t = ctx->into && k < ctx->n_out ? ctx->into[k] : NULL;
    if (!t || t->dtype != PP_F32 || pp_tensor_numel(t) != numel) return NULL;
    *ctx->added |= (uint64_t)1 << k;
    return t->data;
}

pp_status pp_grad_k_shape(const pp_kernel_ctx *ctx, int k, int *ndim, int64_t *shape) {
    const pp_tensor *t = k < ctx->n_in ? ctx->in[k] : NULL;
    if (!t || (t->dtype != PP_I64 && t->dtype != PP_I32) || t->ndim != 1 ||
        t->shape[0] > PP_MAX_DIMS)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "input %d must be a 1-D integer shape", k);
    *ndim = (int)t->shape[0];
    for (int d = 0; d < *ndim; d++) {
        shape[d] = pp_tensor_get_i64(t, d);
        if (shape[d] < 0)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "shape input %d has a negative dim", k);
    }
    return PP_OK;
}

/* ------------------------------------------------------------------------ */
/* Unary activation gradients: inputs (dy, t) of equal shape, t being x or y. */

typedef void (*unary_grad_fn)(int64_t n, float alpha, const float *restrict dy,
                              const float *restrict t, float *restrict dx);

typedef void (*unary_grad_io_fn)(int64_t n, float alpha, float *io, const float *restrict t);

/* dx[i] = r, where BODY computes r from g = dy[i], v = t[i] (and alpha); for
 * AVX2 and for the baseline. NAME##_io is the same with dx in dy's buffer
 * (in place, lib/inplace.c): read and written through one pointer. */
#define UNARY_GRAD(NAME, ...)                                                           \
    PP_VEC_CLONES static void NAME(int64_t n, float alpha, const float *restrict dy,    \
                                   const float *restrict t, float *restrict dx) {       \
        (void)alpha;                                                                    \
        PP_VFOR(i, n, const float g = dy[i]; const float v = t[i]; float r;             \
                __VA_ARGS__ dx[i] = r;);                                                \
    }                                                                                   \
    PP_VEC_CLONES static void NAME##_io(int64_t n, float alpha, float *io,              \
                                        const float *restrict t) {                      \
        (void)alpha;                                                                    \
        PP_VFOR(i, n, const float g = io[i]; const float v = t[i]; float r;             \
                __VA_ARGS__ io[i] = r;);                                                \
    }

UNARY_GRAD(tanh_grad, r = g * (1.0f - v * v);)              /* t = y */
UNARY_GRAD(sigmoid_grad, r = g * (v * (1.0f - v));)         /* t = y */
UNARY_GRAD(relu_grad, r = v > 0.0f ? g : 0.0f;)             /* t = y */
UNARY_GRAD(sqrt_grad, r = g / (2.0f * v);)                  /* t = y */
UNARY_GRAD(leaky_relu_grad, r = v > 0.0f ? g : alpha * g;)  /* t = x */
/* t = x: 2/sqrt(pi) exp(-x^2) */
UNARY_GRAD(erf_grad, r = g * 1.12837916709551257f * pp_vexpf(-v * v);)
/* t = x: Phi(x) + x phi(x) */
UNARY_GRAD(gelu_grad, float cdf = 0.5f * (1.0f + pp_verff(v * 0.70710678118654752f));
           float pdf = 0.39894228040143268f * pp_vexpf(-0.5f * v * v);
           r = g * (cdf + v * pdf);)
/* t = x: derivative of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) */
UNARY_GRAD(gelu_tanh_grad, const float k0 = 0.79788456080286536f; const float k1 = 0.044715f;
           float th = pp_vtanhf(k0 * (v + k1 * v * v * v));
           float du = k0 * (1.0f + 3.0f * k1 * v * v);
           r = g * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);)

typedef struct ugrad_job {
    unary_grad_fn fn;
    unary_grad_io_fn io_fn; /* dx is dy */
    float alpha;
    const float *dy, *t;
    float *dx;
} ugrad_job;

static void ugrad_piece(void *arg, int64_t lo, int64_t hi) {
    const ugrad_job *j = arg;
    if (j->dx == j->dy) j->io_fn(hi - lo, j->alpha, j->dx + lo, j->t + lo);
    else j->fn(hi - lo, j->alpha, j->dy + lo, j->t + lo, j->dx + lo);
}

/* dx may take dy's buffer (pp_op.inplace bit 0), never t's. */
static pp_status unary_grad(pp_kernel_ctx *ctx, unary_grad_fn fn, unary_grad_io_fn io_fn, float alpha) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "the forward value"));
    const pp_tensor *dy = ctx->in[0], *t = ctx->in[1];
    if (!pp_shape_equal(dy->ndim, dy->shape, t->ndim, t->shape)) {
        char a[128], b[128];
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy %s and forward value %s differ in shape",
                               pp_shape_str(dy->ndim, dy->shape, a, sizeof a),
                               pp_shape_str(t->ndim, t->shape, b, sizeof b));
    }
    pp_tensor *dx;
    PP_TRY(pp_tensor_empty(PP_F32, t->ndim, t->shape, &dx));
    ugrad_job j = {fn, io_fn, alpha, dy->data, t->data, dx->data};
    pp_parallel_elems(pp_tensor_numel(t), PP_GRAIN_ELEMS, ugrad_piece, &j);
    ctx->out[0] = dx;
    return PP_OK;
}

static pp_status tanh_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, tanh_grad, tanh_grad_io, 0); }
static pp_status sigmoid_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, sigmoid_grad, sigmoid_grad_io, 0); }
static pp_status relu_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, relu_grad, relu_grad_io, 0); }
static pp_status sqrt_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, sqrt_grad, sqrt_grad_io, 0); }
static pp_status erf_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, erf_grad, erf_grad_io, 0); }

static pp_status gelu_grad_run(pp_kernel_ctx *ctx) {
    const char *approx = pp_node_attr_string(ctx->node, "approximate", "none");
    if (strcmp(approx, "none") != 0 && strcmp(approx, "tanh") != 0)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "approximate must be 'none' or 'tanh'");
    int tanh_form = strcmp(approx, "tanh") == 0;
    return unary_grad(ctx, tanh_form ? gelu_tanh_grad : gelu_grad, tanh_form ? gelu_tanh_grad_io : gelu_grad_io, 0);
}

static pp_status leaky_relu_grad_run(pp_kernel_ctx *ctx) {
    return unary_grad(ctx, leaky_relu_grad, leaky_relu_grad_io, pp_node_attr_float(ctx->node, "alpha", 0.01f));
}

const pp_op pp_ops_grad[] = {
    /* dy, y -> dx */
    {"TanhGrad", "pippin", 2, 2, 1, 1, NULL, tanh_grad_run, .inplace = 1},
    {"SigmoidGrad", "pippin", 2, 2, 1, 1, NULL, sigmoid_grad_run, .inplace = 1},
    {"ReluGrad", "pippin", 2, 2, 1, 1, NULL, relu_grad_run, .inplace = 1},
    {"SqrtGrad", "pippin", 2, 2, 1, 1, NULL, sqrt_grad_run, .inplace = 1},
    /* dy, x -> dx */
    {"ErfGrad", "pippin", 2, 2, 1, 1, NULL, erf_grad_run, .inplace = 1},
    {"GeluGrad", "pippin", 2, 2, 1, 1, NULL, gelu_grad_run, .inplace = 1},
    {"LeakyReluGrad", "pippin", 2, 2, 1, 1, NULL, leaky_relu_grad_run, .inplace = 1},
    /* grad, shape -> grad summed over broadcast dims */
    {"SumToShape", "pippin", 2, 2, 1, 1, NULL, pp_grad_sum_to_shape_run},
    /* dy, shape_x[, axes] -> dy broadcast back over reduced axes */
    {"ExpandReduced", "pippin", 2, 3, 1, 1, NULL, pp_grad_expand_reduced_run},
    /* dy, shape_x, starts, ends[, axes[, steps]] -> dx */
    {"SliceGrad", "pippin", 4, 6, 1, 1, NULL, pp_grad_slice_run},
    /* dy, indices, shape_data -> ddata (scatter-add) */
    {"GatherGrad", "pippin", 3, 3, 1, 1, NULL, pp_grad_gather_run},
    /* dy, shape_0 .. shape_n-1 -> n pieces along axis */
    {"SplitLike", "pippin", 2, 64, 1, 63, NULL, pp_grad_split_like_run},
    /* dy, b, shape_a -> da;  dy, a, shape_b -> db */
    {"MatMulGradA", "pippin", 3, 3, 1, 1, NULL, pp_grad_matmul_a_run},
    {"MatMulGradB", "pippin", 3, 3, 1, 1, NULL, pp_grad_matmul_b_run},
    /* dy, y -> dx */
    {"SoftmaxGrad", "pippin", 2, 2, 1, 1, NULL, pp_grad_softmax_run},
    {"LogSoftmaxGrad", "pippin", 2, 2, 1, 1, NULL, pp_grad_log_softmax_run},
    /* dy, x, scale -> dx;  dy, x -> dscale, dbias */
    {"LayerNormGradInput", "pippin", 3, 3, 1, 1, NULL, pp_grad_layer_norm_input_run},
    {"LayerNormGradWeight", "pippin", 2, 2, 1, 2, NULL, pp_grad_layer_norm_weight_run},
    /* dy, x, scale, mean, var -> dx;  dy, x, mean, var -> dscale, dB */
    {"BatchNormGradInput", "pippin", 3, 5, 1, 1, NULL, pp_grad_batch_norm_input_run},
    {"BatchNormGradWeight", "pippin", 2, 4, 1, 2, NULL, pp_grad_batch_norm_weight_run},
    /* dloss, scores, labels[, weights] -> dscores */
    {"SoftmaxCrossEntropyLossGrad", "pippin", 3, 4, 1, 1, NULL, pp_grad_sce_loss_run},
    {NULL},
};
