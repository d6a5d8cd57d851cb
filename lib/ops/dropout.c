/* Dropout, and its gradient helper pippin::DropoutGrad(dy, mask) -> dx.
 *
 * Inference (no training_mode input, or false): a pass-through, the mask
 * all true. Training with ratio r: element i is kept when a uniform draw
 * u_i in [0, 1) is >= r, and then scaled by 1 / (1 - r) (r = 1 drops all).
 * The draws come from Philox4x32-10 (lib/philox.h) keyed by the executor's
 * random stream (run seed, step, microbatch: pp_exec_set_random_stream) and
 * the name of the node's output, so a mask is the same whatever the schedule, the ranks,
 * the timing, or a resume from a checkpoint. The node's own 'seed'
 * attribute, when given, is mixed into the key. */
#include <string.h>

#include "grad_kernels.h"
#include "hash.h"
#include "philox.h"
#include "shape_kernels.h"

#include "status_internal.h"

/* training-mode ratio of the node (inputs 1 and 2), -1 when not training */
static pp_status dropout_ratio(const pp_kernel_ctx *ctx, double *ratio) {
    const pp_tensor *tr = pp_kernel_input(ctx, 1), *tm = pp_kernel_input(ctx, 2);
    *ratio = -1;
    if (!tm) return PP_OK;
    if (pp_tensor_numel(tm) != 1) return pp_kernel_error(ctx, PP_ERR_SHAPE, "training_mode must be a scalar");
    if (pp_tensor_get_f64(tm, 0) == 0) return PP_OK;
    if (tr && pp_tensor_numel(tr) != 1) return pp_kernel_error(ctx, PP_ERR_SHAPE, "ratio must be a scalar");
    double r = tr ? pp_tensor_get_f64(tr, 0) : pp_node_attr_float(ctx->node, "ratio", 0.5f);
    if (!(r >= 0 && r <= 1)) return pp_kernel_error(ctx, PP_ERR_INVALID, "ratio %g is outside [0, 1]", r);
    *ratio = r;
    return PP_OK;
}

static void draw_mask(const pp_kernel_ctx *ctx, double ratio, int64_t n, uint8_t *keep) {
    const pp_random_stream *rs = ctx->random;
    pp_random_stream none = {0, 0, 0};
    if (!rs) rs = &none;
    /* the output's name: unique in a graph (node names need not be), and
     * the same in every stage graph and on every rank */
    int y = ctx->node->n_out > 0 ? ctx->node->out[0] : -1;
    const char *name = y >= 0 && ctx->graph ? ctx->graph->values[y].name : ctx->node->name ? ctx->node->name : "";
    uint64_t k = pp_hash64(PP_HASH64_SEED ^ rs->seed, name, strlen(name));
    uint64_t hi[3] = {(uint64_t)rs->step >> 32, (uint64_t)rs->microbatch >> 32,
                      (uint64_t)pp_node_attr_int(ctx->node, "seed", 0)};
    k = pp_hash64(k, hi, sizeof hi);
    uint32_t key[2] = {(uint32_t)k, (uint32_t)(k >> 32)};
    /* u >= ratio with u = r / 2^32: keep iff r >= ceil(ratio * 2^32) */
    double t = ratio * 4294967296.0;
    uint64_t threshold = (uint64_t)t + ((double)(uint64_t)t < t);
    for (int64_t b = 0; b * 4 < n; b++) {
        uint32_t ctr[4] = {(uint32_t)b, (uint32_t)((uint64_t)b >> 32), (uint32_t)rs->microbatch,
                           (uint32_t)rs->step}, r[4];
        pp_philox4x32(key, ctr, r);
        for (int j = 0; j < 4 && b * 4 + j < n; j++) keep[b * 4 + j] = (uint64_t)r[j] >= threshold;
    }
}

static pp_status dropout_run(pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    double ratio;
    PP_TRY(dropout_ratio(ctx, &ratio));
    if (ratio <= 0) { /* inference, or nothing to drop */
        if (pp_kernel_want_out(ctx, 1)) {
            pp_tensor *mask;
            PP_TRY(pp_tensor_empty(PP_BOOL, x->ndim, x->shape, &mask));
            if (mask->nbytes) memset(mask->data, 1, mask->nbytes);
            ctx->out[1] = mask;
        }
        ctx->out[0] = pp_tensor_retain(x);
        return PP_OK;
    }
    if (x->dtype != PP_F32 && x->dtype != PP_F64)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "training-mode dropout of %s (float32 and float64 only)",
                               pp_dtype_name(x->dtype));
    pp_tensor *mask = NULL, *y = NULL;
    pp_status s = pp_tensor_empty(PP_BOOL, x->ndim, x->shape, &mask);
    if (s == PP_OK) s = pp_tensor_empty(x->dtype, x->ndim, x->shape, &y);
    if (s != PP_OK) {
        pp_tensor_free(mask);
        return s;
    }
    int64_t n = pp_tensor_numel(x);
    uint8_t *keep = mask->data;
    draw_mask(ctx, ratio, n, keep);
    double scale = ratio < 1 ? 1.0 / (1.0 - ratio) : 0;
    if (x->dtype == PP_F32) {
        const float *xs = x->data;
        float *ys = y->data, k = (float)scale;
        PP_VFOR(i, n, ys[i] = keep[i] ? xs[i] * k : 0.0f;);
    } else {
        const double *xs = x->data;
        double *ys = y->data;
        for (int64_t i = 0; i < n; i++) ys[i] = keep[i] ? xs[i] * scale : 0.0;
    }
    ctx->out[0] = y;
    if (pp_kernel_want_out(ctx, 1)) ctx->out[1] = mask;
    else pp_tensor_free(mask);
    return PP_OK;
}

/* dy, mask -> dx = dy * mask * scale (attribute 'scale' = 1 / (1 - ratio)) */
static pp_status dropout_grad_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    const pp_tensor *dy = ctx->in[0], *mask = ctx->in[1];
    if (!mask || mask->dtype != PP_BOOL || pp_tensor_numel(mask) != pp_tensor_numel(dy))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "mask must be a bool tensor shaped like dy");
    pp_tensor *dx;
    PP_TRY(pp_tensor_empty(PP_F32, dy->ndim, dy->shape, &dx));
    const float *g = dy->data;
    const uint8_t *keep = mask->data;
    float *o = dx->data, k = pp_node_attr_float(ctx->node, "scale", 1.0f);
    int64_t n = pp_tensor_numel(dy);
    PP_VFOR(i, n, o[i] = keep[i] ? g[i] * k : 0.0f;);
    ctx->out[0] = dx;
    return PP_OK;
}

const pp_op pp_ops_dropout[] = {
    {"Dropout", "", 1, 3, 1, 2, NULL, dropout_run},
    {"DropoutGrad", "pippin", 2, 2, 1, 1, NULL, dropout_grad_run},
    {NULL},
};
