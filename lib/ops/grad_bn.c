/* BatchNormalization's gradient helper ops (X [N, C, d...], per channel c):
 *   pippin::BatchNormGradInput(dy, x, scale, mean, var) -> dx
 *   pippin::BatchNormGradWeight(dy, x, mean, var) -> dscale, dB
 * With training_mode=1 the statistics are the batch's own (mean and biased
 * variance over N and d..., recomputed here from x, as the forward did), and
 * dx flows through them:
 *   dx = scale / sqrt(v + eps) * (dy - mean(dy) - xhat * mean(dy * xhat)).
 * With training_mode=0 the given mean and var are constants:
 *   dx = dy * scale / sqrt(var + eps).
 * Either way dscale = sum(dy * xhat), dB = sum(dy). Float32; each row is
 * summed in float lanes, the rows in double. */
#include <math.h>
#include <stdlib.h>

#include "grad_kernels.h"

#include "status_internal.h"

typedef struct bn_dims {
    int64_t n, c, inner;
} bn_dims;

static pp_status bn_check(const pp_kernel_ctx *ctx, int n_vec, const int *vec_inputs, bn_dims *d) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "x"));
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1];
    if (x->ndim < 2) return pp_kernel_error(ctx, PP_ERR_SHAPE, "x must be [N, C, ...]");
    int same = dy->ndim == x->ndim;
    for (int k = 0; same && k < x->ndim; k++) same = dy->shape[k] == x->shape[k];
    if (!same) return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and x differ in shape");
    d->n = x->shape[0];
    d->c = x->shape[1];
    d->inner = pp_shape_numel(x->ndim - 2, x->shape + 2);
    for (int k = 0; k < n_vec; k++) {
        int i = vec_inputs[k];
        PP_TRY(pp_grad_k_f32(ctx, i, "a per-channel input"));
        if (ctx->in[i]->ndim != 1 || ctx->in[i]->shape[0] != d->c)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "input %d must be a vector of %lld channels", i,
                                   (long long)d->c);
    }
    return PP_OK;
}

/* Per channel: the mean and 1/sqrt(var + eps) used by the forward. */
static void bn_stats(const pp_kernel_ctx *ctx, const bn_dims *d, const pp_tensor *mean, const pp_tensor *var,
                     double *mu, double *inv) {
    double eps = pp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    int training = pp_node_attr_int(ctx->node, "training_mode", 0) != 0;
    const float *x = ctx->in[1]->data;
    double cnt = (double)(d->n * d->inner);
    for (int64_t ch = 0; ch < d->c; ch++) {
        double m, v;
        if (training) {
            double sum = 0, sq = 0;
            for (int64_t i = 0; i < d->n; i++) sum += pp_grad_vsum(x + (i * d->c + ch) * d->inner, d->inner);
            m = cnt > 0 ? sum / cnt : 0;
            for (int64_t i = 0; i < d->n; i++)
                sq += pp_grad_vsqdev(x + (i * d->c + ch) * d->inner, (float)m, d->inner);
            v = cnt > 0 ? sq / cnt : 0;
        } else {
            m = ((const float *)mean->data)[ch];
            v = ((const float *)var->data)[ch];
        }
        mu[ch] = m;
        inv[ch] = 1.0 / sqrt(v + eps);
    }
}

/* sum of g[i] * (x[i] - m), centred first: sum(g x) - m sum(g) cancels
 * catastrophically in float when |m| is large against x's spread (a conv's
 * output often is), which put whole percents into the gradients */
PP_VINLINE float vdot_centred(const float *restrict g, const float *restrict x, float m, int64_t n) {
    float acc[PP_VEC_BLOCK] = {0}, s = 0;
    int64_t i = 0;
    for (; i + PP_VEC_BLOCK <= n; i += PP_VEC_BLOCK)
        for (int j = 0; j < PP_VEC_BLOCK; j++) acc[j] += g[i + j] * (x[i + j] - m);
    for (int j = 0; j < PP_VEC_BLOCK; j++) s += acc[j];
    for (; i < n; i++) s += g[i] * (x[i] - m);
    return s;
}

/* Per channel: sum(dy) and sum(dy * xhat). */
static void bn_sums(const bn_dims *d, const float *dy, const float *x, const double *mu, const double *inv,
                    double *s_dy, double *s_dyx) {
    for (int64_t ch = 0; ch < d->c; ch++) {
        double a = 0, b = 0;
        for (int64_t i = 0; i < d->n; i++) {
            const float *g = dy + (i * d->c + ch) * d->inner, *xr = x + (i * d->c + ch) * d->inner;
            float m = (float)mu[ch], sg = pp_grad_vsum(g, d->inner);
            a += sg;
            b += vdot_centred(g, xr, m, d->inner) + ((double)m - mu[ch]) * sg; /* centred on mu, not its float */
        }
        s_dy[ch] = a;
        s_dyx[ch] = b * inv[ch];
    }
}

pp_status pp_grad_batch_norm_input_run(pp_kernel_ctx *ctx) {
    int training = pp_node_attr_int(ctx->node, "training_mode", 0) != 0;
    static const int vec_train[1] = {2}, vec_eval[3] = {2, 3, 4};
    bn_dims d;
    PP_TRY(bn_check(ctx, training ? 1 : 3, training ? vec_train : vec_eval, &d));
    double *buf = calloc((size_t)(4 * d.c + 1), sizeof *buf);
    if (!buf) return pp_error(PP_ERR_NOMEM, "out of memory");
    double *mu = buf, *inv = buf + d.c, *s_dy = buf + 2 * d.c, *s_dyx = buf + 3 * d.c;
    bn_stats(ctx, &d, training ? NULL : ctx->in[3], training ? NULL : ctx->in[4], mu, inv);
    const float *dy = ctx->in[0]->data, *x = ctx->in[1]->data, *scale = ctx->in[2]->data;
    if (training) bn_sums(&d, dy, x, mu, inv, s_dy, s_dyx);
    pp_tensor *out;
    pp_status s = pp_tensor_empty(PP_F32, ctx->in[1]->ndim, ctx->in[1]->shape, &out);
    if (s != PP_OK) {
        free(buf);
        return s;
    }
    float *dx = out->data;
    double cnt = (double)(d.n * d.inner);
    for (int64_t ch = 0; ch < d.c; ch++) {
        float k = (float)(scale[ch] * inv[ch]);
        float mdy = training && cnt > 0 ? (float)(s_dy[ch] / cnt) : 0;
        float mdyx = training && cnt > 0 ? (float)(s_dyx[ch] / cnt) : 0;
        float m = (float)mu[ch], iv = (float)inv[ch];
        for (int64_t i = 0; i < d.n; i++) {
            int64_t off = (i * d.c + ch) * d.inner;
            const float *g = dy + off, *xr = x + off;
            float *o = dx + off;
            if (training) {
                PP_VFOR(j, d.inner, o[j] = k * (g[j] - mdy - (xr[j] - m) * iv * mdyx););
            } else {
                PP_VFOR(j, d.inner, o[j] = k * g[j];);
            }
        }
    }
    free(buf);
    ctx->out[0] = out;
    return PP_OK;
}

pp_status pp_grad_batch_norm_weight_run(pp_kernel_ctx *ctx) {
    int training = pp_node_attr_int(ctx->node, "training_mode", 0) != 0;
    static const int vec_eval[2] = {2, 3};
    bn_dims d;
    PP_TRY(bn_check(ctx, training ? 0 : 2, vec_eval, &d));
    double *buf = calloc((size_t)(4 * d.c + 1), sizeof *buf);
    if (!buf) return pp_error(PP_ERR_NOMEM, "out of memory");
    double *mu = buf, *inv = buf + d.c, *s_dy = buf + 2 * d.c, *s_dyx = buf + 3 * d.c;
    bn_stats(ctx, &d, training ? NULL : ctx->in[2], training ? NULL : ctx->in[3], mu, inv);
    bn_sums(&d, ctx->in[0]->data, ctx->in[1]->data, mu, inv, s_dy, s_dyx);
    pp_status s = PP_OK;
    const double *sums[2] = {s_dyx, s_dy}; /* dscale, dB */
    for (int k = 0; k < 2 && s == PP_OK; k++) {
        if (k >= ctx->n_out || ctx->node->out[k] < 0) continue;
        pp_tensor *o;
        s = pp_tensor_empty(PP_F32, 1, &d.c, &o);
        if (s != PP_OK) break;
        float *v = o->data;
        for (int64_t ch = 0; ch < d.c; ch++) v[ch] = (float)sums[k][ch];
        ctx->out[k] = o;
    }
    free(buf);
    return s;
}
