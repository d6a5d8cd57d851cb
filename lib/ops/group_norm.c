/* GroupNormalization (opset 18: scale and bias per group; opset 21: per
 * channel), float32, and the gradient helpers pippin::GroupNormGradInput
 * (dx, region I) and pippin::GroupNormGradWeight (dscale and dbias, region
 * W). Without a num_groups attribute the helpers take one group per channel,
 * which makes them InstanceNormalization's gradient too.
 *
 * x [N, C, ...] is seen as [N, G, C/G * spatial]; each (n, g) row is
 * normalised by its own mean and (biased) variance, computed in double. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grad_kernels.h"
#include "shape_kernels.h"

#include "status_internal.h"

typedef struct gn_geom {
    int64_t N, C, G, S; /* batch, channels, groups, spatial size */
    int per_channel;    /* scale/bias indexed by channel, else by group */
    float eps;
} gn_geom;

static pp_status gn_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    const pp_attr *a = pp_node_attr(n, "num_groups");
    int grad = n->domain && !strcmp(n->domain, "pippin");
    if (!a && !grad) return pp_node_error(n, PP_ERR_INVALID, "attribute 'num_groups' is required");
    if (a && (a->type != PP_ATTR_INT || a->i < 1 || a->i > (INT64_C(1) << 40)))
        return pp_node_error(n, PP_ERR_INVALID, "num_groups must be a positive int");
    const pp_attr *e = pp_node_attr(n, "epsilon");
    if (e && (e->type != PP_ATTR_FLOAT || !(e->f >= 0) || !isfinite(e->f)))
        return pp_node_error(n, PP_ERR_INVALID, "epsilon must be a float >= 0");
    return PP_OK;
}

/* Geometry from x's shape, the node's num_groups (absent: one per channel)
 * and the scale's length (ns = C: per channel, G: per group). */
static pp_status gn_geom_make(const pp_kernel_ctx *ctx, int xnd, const int64_t *xs, int64_t ns,
                              gn_geom *q) {
    char a[128];
    if (xnd < 2)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "input %s has rank below 2",
                               pp_shape_str(xnd, xs, a, sizeof a));
    q->N = xs[0];
    q->C = xs[1];
    q->S = 1;
    for (int i = 2; i < xnd; i++) q->S *= xs[i];
    q->G = pp_node_attr_int(ctx->node, "num_groups", q->C);
    if (q->G < 1 || q->C % q->G)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "num_groups %" PRId64 " does not divide the %" PRId64
                               " channels of %s", q->G, q->C, pp_shape_str(xnd, xs, a, sizeof a));
    if (ns != q->C && ns != q->G)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "scale and bias must have %" PRId64 " (channels) or %"
                               PRId64 " (groups) entries, not %" PRId64, q->C, q->G, ns);
    q->per_channel = ns == q->C;
    q->eps = pp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    return PP_OK;
}

/* Mean and 1/sqrt(var + eps) of one group's m values. */
static void group_stats(const float *x, int64_t m, float eps, double *mean, double *inv) {
    double s = 0, v = 0;
    for (int64_t i = 0; i < m; i++) s += x[i];
    double mu = m ? s / (double)m : 0;
    for (int64_t i = 0; i < m; i++) v += (x[i] - mu) * (x[i] - mu);
    v = m ? v / (double)m : 0;
    *mean = mu;
    *inv = 1.0 / sqrt(v + eps);
}

static pp_status check_vec(const pp_kernel_ctx *ctx, const pp_tensor *t, const char *what) {
    if (t->dtype != PP_F32 || t->ndim != 1)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be a 1-D float32 tensor", what);
    return PP_OK;
}

/* ------------------------------------------------------ GroupNormalization */

static pp_status gn_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *sc = ctx->in[1], *bias = ctx->in[2];
    if (x->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "float32 only, not %s",
                               pp_dtype_name(x->dtype));
    PP_TRY(check_vec(ctx, sc, "scale"));
    PP_TRY(check_vec(ctx, bias, "bias"));
    gn_geom q;
    PP_TRY(gn_geom_make(ctx, x->ndim, x->shape, sc->shape[0], &q));
    if (bias->shape[0] != sc->shape[0])
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "bias has %" PRId64 " entries, scale %" PRId64,
                               bias->shape[0], sc->shape[0]);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, x->shape, &y));
    const float *xv = x->data, *sv = sc->data, *bv = bias->data;
    float *yv = y->data;
    int64_t cg = q.C / q.G, m = cg * q.S;
    for (int64_t n = 0; n < q.N; n++)
        for (int64_t g = 0; g < q.G; g++) {
            int64_t off = (n * q.G + g) * m;
            double mean, inv;
            group_stats(xv + off, m, q.eps, &mean, &inv);
            for (int64_t c = 0; c < cg; c++) {
                int64_t k = q.per_channel ? g * cg + c : g;
                double gm = sv[k] * inv, b = bv[k];
                const float *p = xv + off + c * q.S;
                float *o = yv + off + c * q.S;
                for (int64_t s = 0; s < q.S; s++) o[s] = (float)((p[s] - mean) * gm + b);
            }
        }
    ctx->out[0] = y;
    return PP_OK;
}

/* ------------------------------------------------------- GroupNormGradInput */

/* GroupNormGradInput(dy, x, scale) -> dx:
 * dx = inv * (g - mean(g) - xhat * mean(g * xhat)), g = dy * scale. */
static pp_status gn_grad_input_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "x"));
    PP_TRY(pp_grad_k_f32(ctx, 2, "scale"));
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1], *sc = ctx->in[2];
    PP_TRY(check_vec(ctx, sc, "scale"));
    char a[128], b[128];
    if (!pp_shape_equal(dy->ndim, dy->shape, x->ndim, x->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy %s and x %s differ",
                               pp_shape_s(dy, a, sizeof a), pp_shape_s(x, b, sizeof b));
    gn_geom q;
    PP_TRY(gn_geom_make(ctx, x->ndim, x->shape, sc->shape[0], &q));
    pp_tensor *dx;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, x->shape, &dx));
    const float *xv = x->data, *gv = dy->data, *sv = sc->data;
    float *dv = dx->data;
    int64_t cg = q.C / q.G, m = cg * q.S;
    for (int64_t n = 0; n < q.N; n++)
        for (int64_t g = 0; g < q.G; g++) {
            int64_t off = (n * q.G + g) * m;
            double mean, inv, sg = 0, sgx = 0;
            group_stats(xv + off, m, q.eps, &mean, &inv);
            for (int64_t c = 0; c < cg; c++) {
                double gm = sv[q.per_channel ? g * cg + c : g];
                const float *p = xv + off + c * q.S, *d = gv + off + c * q.S;
                double s1 = 0, s2 = 0;
                for (int64_t s = 0; s < q.S; s++) {
                    s1 += d[s];
                    s2 += d[s] * (p[s] - mean);
                }
                sg += gm * s1;
                sgx += gm * s2 * inv;
            }
            double mg = m ? sg / (double)m : 0, mgx = m ? sgx / (double)m : 0;
            for (int64_t c = 0; c < cg; c++) {
                double gm = sv[q.per_channel ? g * cg + c : g];
                const float *p = xv + off + c * q.S, *d = gv + off + c * q.S;
                float *o = dv + off + c * q.S;
                for (int64_t s = 0; s < q.S; s++)
                    o[s] = (float)(inv * (d[s] * gm - mg - (p[s] - mean) * inv * mgx));
            }
        }
    ctx->out[0] = dx;
    return PP_OK;
}

/* ------------------------------------------------------ GroupNormGradWeight */

/* GroupNormGradWeight(dy, x, shape_scale) -> dscale[, dbias], each shaped
 * as the scale: sums over batch and space (and the group's channels when
 * the scale is per group) of dy * xhat and of dy. */
static pp_status gn_grad_weight_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    PP_TRY(pp_grad_k_f32(ctx, 1, "x"));
    int snd;
    int64_t ss[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 2, &snd, ss));
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1];
    char a[128], b[128];
    if (!pp_shape_equal(dy->ndim, dy->shape, x->ndim, x->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy %s and x %s differ",
                               pp_shape_s(dy, a, sizeof a), pp_shape_s(x, b, sizeof b));
    if (snd != 1) return pp_kernel_error(ctx, PP_ERR_SHAPE, "the scale must be 1-D");
    gn_geom q;
    PP_TRY(gn_geom_make(ctx, x->ndim, x->shape, ss[0], &q));
    int want_s = ctx->node->out[0] >= 0, want_b = ctx->n_out > 1 && ctx->node->out[1] >= 0;
    double *acc = calloc((size_t)(2 * ss[0] + 1), sizeof(double));
    if (!acc) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory");
    const float *xv = x->data, *gv = dy->data;
    int64_t cg = q.C / q.G, m = cg * q.S;
    for (int64_t n = 0; n < q.N; n++)
        for (int64_t g = 0; g < q.G; g++) {
            int64_t off = (n * q.G + g) * m;
            double mean = 0, inv = 0;
            if (want_s) group_stats(xv + off, m, q.eps, &mean, &inv);
            for (int64_t c = 0; c < cg; c++) {
                int64_t k = q.per_channel ? g * cg + c : g;
                const float *p = xv + off + c * q.S, *d = gv + off + c * q.S;
                double s1 = 0, s2 = 0;
                for (int64_t s = 0; s < q.S; s++) {
                    s1 += d[s];
                    if (want_s) s2 += d[s] * (p[s] - mean);
                }
                acc[k] += s2 * inv;
                acc[ss[0] + k] += s1;
            }
        }
    pp_status st = PP_OK;
    for (int o = 0; o < 2 && st == PP_OK; o++) {
        if (!(o ? want_b : want_s)) continue;
        pp_tensor *t;
        st = pp_tensor_empty(PP_F32, 1, ss, &t);
        if (st != PP_OK) break;
        float *tv = t->data;
        for (int64_t k = 0; k < ss[0]; k++) tv[k] = (float)acc[o * ss[0] + k];
        ctx->out[o] = t;
    }
    free(acc);
    return st;
}

const pp_op pp_ops_group_norm[] = {
    {"GroupNormalization", "", 3, 3, 1, 1, gn_check, gn_run},
    /* dy, x, scale -> dx */
    {"GroupNormGradInput", "pippin", 3, 3, 1, 1, gn_check, gn_grad_input_run},
    /* dy, x, shape_scale -> dscale[, dbias] */
    {"GroupNormGradWeight", "pippin", 3, 3, 1, 2, gn_check, gn_grad_weight_run},
    {NULL},
};
