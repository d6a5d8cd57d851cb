/* pippin-domain derivatives of the activations mobilenet/resnet exports use
 * (Clip, HardSigmoid, HardSwish, Elu, Selu, Softplus, Softsign):
 * dx = dy * f'(x), inputs (dy, x) of equal shape, float32. The forward's
 * attributes are copied onto the helper node. */
#include <math.h>
#include <string.h>

#include "grad_kernels.h"
#include "vec.h"

#include "status_internal.h"

typedef void (*act_grad_fn)(int64_t n, float a, float b, const float *restrict dy,
                            const float *restrict x, float *restrict dx);

#define ACT_GRAD(NAME, ...)                                                              \
    PP_VEC_CLONES static void NAME(int64_t n, float a, float b, const float *restrict dy, \
                                   const float *restrict x, float *restrict dx) {         \
        (void)a;                                                                          \
        (void)b;                                                                          \
        PP_VFOR(i, n, const float g = dy[i]; const float v = x[i]; float r;               \
                __VA_ARGS__ dx[i] = r;);                                                  \
    }

/* a = min, b = max: passes strictly inside the bounds */
ACT_GRAD(clip_grad, r = (v > a && v < b) ? g : 0.0f;)
/* a = alpha, b = beta */
ACT_GRAD(hard_sigmoid_grad, float u = a * v + b; r = (u > 0.0f && u < 1.0f) ? a * g : 0.0f;)
ACT_GRAD(hard_swish_grad,
         r = v < -3.0f ? 0.0f : (v > 3.0f ? g : g * (v * (1.0f / 3.0f) + 0.5f));)
/* a = alpha */
ACT_GRAD(elu_grad, r = v < 0.0f ? g * a * pp_vexpf(v) : g;)
/* a = alpha, b = gamma */
ACT_GRAD(selu_grad, r = v <= 0.0f ? g * b * a * pp_vexpf(v) : g * b;)
ACT_GRAD(softplus_grad, r = g / (1.0f + pp_vexpf(-v));)
ACT_GRAD(softsign_grad, float q = 1.0f + fabsf(v); r = g / (q * q);)

static pp_status act_grad(pp_kernel_ctx *ctx, act_grad_fn fn, float a, float b) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "x"));
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1];
    if (!pp_shape_equal(dy->ndim, dy->shape, x->ndim, x->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and x differ in shape");
    pp_tensor *dx;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, x->shape, &dx));
    fn(pp_tensor_numel(x), a, b, dy->data, x->data, dx->data);
    ctx->out[0] = dx;
    return PP_OK;
}

/* Bound k (input 2 or 3, else attribute), else +-inf. */
static pp_status clip_bound(pp_kernel_ctx *ctx, int k, const char *name, float def, float *v) {
    const pp_tensor *t = k < ctx->n_in ? ctx->in[k] : NULL;
    if (t) {
        if (t->dtype != PP_F32 || pp_tensor_numel(t) != 1)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be a float32 scalar", name);
        *v = ((const float *)t->data)[0];
    } else {
        *v = pp_node_attr_float(ctx->node, name, def);
    }
    return PP_OK;
}

/* pippin::ClipGrad(dy, x[, min[, max]]) */
static pp_status clip_grad_run(pp_kernel_ctx *ctx) {
    float lo = -INFINITY, hi = INFINITY;
    PP_TRY(clip_bound(ctx, 2, "min", -INFINITY, &lo));
    PP_TRY(clip_bound(ctx, 3, "max", INFINITY, &hi));
    return act_grad(ctx, clip_grad, lo, hi);
}

static float attr(const pp_kernel_ctx *ctx, const char *name, float def) {
    return pp_node_attr_float(ctx->node, name, def);
}

static pp_status hard_sigmoid_grad_run(pp_kernel_ctx *ctx) {
    return act_grad(ctx, hard_sigmoid_grad, attr(ctx, "alpha", 0.2f), attr(ctx, "beta", 0.5f));
}
static pp_status hard_swish_grad_run(pp_kernel_ctx *ctx) {
    return act_grad(ctx, hard_swish_grad, 0, 0);
}
static pp_status elu_grad_run(pp_kernel_ctx *ctx) {
    return act_grad(ctx, elu_grad, attr(ctx, "alpha", 1.0f), 0);
}
static pp_status selu_grad_run(pp_kernel_ctx *ctx) {
    return act_grad(ctx, selu_grad, attr(ctx, "alpha", 1.67326319217681884765625f),
                    attr(ctx, "gamma", 1.05070102214813232421875f));
}
static pp_status softplus_grad_run(pp_kernel_ctx *ctx) {
    return act_grad(ctx, softplus_grad, 0, 0);
}
static pp_status softsign_grad_run(pp_kernel_ctx *ctx) {
    return act_grad(ctx, softsign_grad, 0, 0);
}

const pp_op pp_ops_grad_act[] = {
    /* dy, x[, min[, max]] -> dx */
    {"ClipGrad", "pippin", 2, 4, 1, 1, NULL, clip_grad_run},
    /* dy, x -> dx */
    {"HardSigmoidGrad", "pippin", 2, 2, 1, 1, NULL, hard_sigmoid_grad_run},
    {"HardSwishGrad", "pippin", 2, 2, 1, 1, NULL, hard_swish_grad_run},
    {"EluGrad", "pippin", 2, 2, 1, 1, NULL, elu_grad_run},
    {"SeluGrad", "pippin", 2, 2, 1, 1, NULL, selu_grad_run},
    {"SoftplusGrad", "pippin", 2, 2, 1, 1, NULL, softplus_grad_run},
    {"SoftsignGrad", "pippin", 2, 2, 1, 1, NULL, softsign_grad_run},
    {NULL},
};
