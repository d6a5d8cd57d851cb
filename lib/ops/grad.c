/* pippin-domain helper ops that autodiff emits: the op table, shared input
 * checks, and the fused derivatives of unary activations
 * (dx = dy * f'(x), written from x or from the forward output y). */
#include <math.h>
#include <string.h>

#include "grad_kernels.h"
#include "vec.h"

pp_status pp_grad_k_f32(const pp_kernel_ctx *ctx, int k, const char *what) {
    if (k >= ctx->n_in || !ctx->in[k])
        return pp_kernel_error(ctx, PP_ERR_INVALID, "missing input %s", what);
    if (ctx->in[k]->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "%s is %s; gradients are float32 only",
                               what, pp_dtype_name(ctx->in[k]->dtype));
    return PP_OK;
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

typedef enum {
    UG_TANH,       /* t = y: dy * (1 - y^2) */
    UG_SIGMOID,    /* t = y: dy * y * (1 - y) */
    UG_RELU,       /* t = y: y > 0 ? dy : 0 */
    UG_SQRT,       /* t = y: dy / (2 y) */
    UG_ERF,        /* t = x: dy * 2/sqrt(pi) * exp(-x^2) */
    UG_GELU,       /* t = x: dy * (Phi(x) + x phi(x)) */
    UG_GELU_TANH,  /* t = x: derivative of the tanh approximation */
    UG_LEAKY_RELU  /* t = x: x > 0 ? dy : alpha dy */
} unary_grad_kind;

static void unary_grad_loop(unary_grad_kind k, int64_t n, float alpha, const float *restrict dy,
                            const float *restrict t, float *restrict dx) {
    const float two_over_sqrt_pi = 1.12837916709551257f;
    const float inv_sqrt2 = 0.70710678118654752f;
    const float inv_sqrt_2pi = 0.39894228040143268f;
    const float k0 = 0.79788456080286536f; /* sqrt(2/pi) */
    const float k1 = 0.044715f;
    switch (k) {
    case UG_TANH:
        PP_VFOR(i, n, float y = t[i]; dx[i] = dy[i] * (1.0f - y * y););
        break;
    case UG_SIGMOID:
        PP_VFOR(i, n, float y = t[i]; dx[i] = dy[i] * (y * (1.0f - y)););
        break;
    case UG_RELU:
        PP_VFOR(i, n, dx[i] = t[i] > 0.0f ? dy[i] : 0.0f;);
        break;
    case UG_SQRT:
        PP_VFOR(i, n, dx[i] = dy[i] / (2.0f * t[i]););
        break;
    case UG_ERF:
        PP_VFOR(i, n, float x = t[i]; dx[i] = dy[i] * two_over_sqrt_pi * pp_vexpf(-x * x););
        break;
    case UG_GELU:
        PP_VFOR(i, n, float x = t[i];
                float cdf = 0.5f * (1.0f + pp_verff(x * inv_sqrt2));
                float pdf = inv_sqrt_2pi * pp_vexpf(-0.5f * x * x);
                dx[i] = dy[i] * (cdf + x * pdf););
        break;
    case UG_GELU_TANH:
        PP_VFOR(i, n, float x = t[i]; float x2 = x * x;
                float th = pp_vtanhf(k0 * (x + k1 * x2 * x));
                float du = k0 * (1.0f + 3.0f * k1 * x2);
                dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du););
        break;
    case UG_LEAKY_RELU:
        PP_VFOR(i, n, dx[i] = t[i] > 0.0f ? dy[i] : alpha * dy[i];);
        break;
    }
}

static pp_status unary_grad(pp_kernel_ctx *ctx, unary_grad_kind k, float alpha) {
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
    unary_grad_loop(k, pp_tensor_numel(t), alpha, dy->data, t->data, dx->data);
    ctx->out[0] = dx;
    return PP_OK;
}

static pp_status tanh_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, UG_TANH, 0); }
static pp_status sigmoid_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, UG_SIGMOID, 0); }
static pp_status relu_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, UG_RELU, 0); }
static pp_status sqrt_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, UG_SQRT, 0); }
static pp_status erf_grad_run(pp_kernel_ctx *ctx) { return unary_grad(ctx, UG_ERF, 0); }

static pp_status gelu_grad_run(pp_kernel_ctx *ctx) {
    const char *approx = pp_node_attr_string(ctx->node, "approximate", "none");
    if (strcmp(approx, "none") != 0 && strcmp(approx, "tanh") != 0)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "approximate must be 'none' or 'tanh'");
    return unary_grad(ctx, strcmp(approx, "tanh") == 0 ? UG_GELU_TANH : UG_GELU, 0);
}

static pp_status leaky_relu_grad_run(pp_kernel_ctx *ctx) {
    return unary_grad(ctx, UG_LEAKY_RELU, pp_node_attr_float(ctx->node, "alpha", 0.01f));
}

const pp_op pp_ops_grad[] = {
    /* dy, y -> dx */
    {"TanhGrad", "pippin", 2, 2, 1, 1, NULL, tanh_grad_run},
    {"SigmoidGrad", "pippin", 2, 2, 1, 1, NULL, sigmoid_grad_run},
    {"ReluGrad", "pippin", 2, 2, 1, 1, NULL, relu_grad_run},
    {"SqrtGrad", "pippin", 2, 2, 1, 1, NULL, sqrt_grad_run},
    /* dy, x -> dx */
    {"ErfGrad", "pippin", 2, 2, 1, 1, NULL, erf_grad_run},
    {"GeluGrad", "pippin", 2, 2, 1, 1, NULL, gelu_grad_run},
    {"LeakyReluGrad", "pippin", 2, 2, 1, 1, NULL, leaky_relu_grad_run},
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
    /* dloss, scores, labels[, weights] -> dscores */
    {"SoftmaxCrossEntropyLossGrad", "pippin", 3, 4, 1, 1, NULL, pp_grad_sce_loss_run},
    {NULL},
};
