/* float16 / bfloat16 kernels through float32. */
#include "widen.h"

#include <string.h>

#define MAX_IO 64

static int is_half(pp_dtype dt) { return dt == PP_F16 || dt == PP_BF16; }

pp_dtype pp_kernel_half_dtype(const pp_kernel_ctx *ctx) {
    for (int i = 0; i < ctx->n_in; i++)
        if (ctx->in[i] && is_half(ctx->in[i]->dtype)) return ctx->in[i]->dtype;
    return PP_DTYPE_UNDEFINED;
}

pp_status pp_kernel_run_widened(pp_kernel_ctx *ctx, pp_status (*run)(pp_kernel_ctx *),
                                unsigned narrow) {
    if (ctx->n_in > MAX_IO || ctx->n_out > MAX_IO)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "more than %d inputs or outputs", MAX_IO);
    pp_dtype half = pp_kernel_half_dtype(ctx);
    pp_tensor *in[MAX_IO], *wide[MAX_IO] = {0}, *out[MAX_IO] = {0};
    int had_f32 = 0;
    pp_status s = PP_OK;
    for (int i = 0; i < ctx->n_in; i++) {
        in[i] = ctx->in[i];
        if (!in[i]) continue;
        if (in[i]->dtype == PP_F32) had_f32 = 1;
        if (s == PP_OK && is_half(in[i]->dtype)) {
            s = pp_tensor_cast(in[i], PP_F32, &wide[i]);
            in[i] = wide[i];
        }
    }
    if (s == PP_OK) {
        pp_kernel_ctx sub = *ctx;
        sub.in = in;
        sub.out = out;
        s = run(&sub);
    }
    for (int k = 0; k < ctx->n_out; k++) {
        pp_tensor *o = out[k];
        if (s == PP_OK && o && half != PP_DTYPE_UNDEFINED && !had_f32 && (narrow >> k & 1u) &&
            o->dtype == PP_F32) {
            s = pp_tensor_cast(o, half, &ctx->out[k]);
            pp_tensor_free(o);
        } else if (s == PP_OK) {
            ctx->out[k] = o;
        } else {
            pp_tensor_free(o);
        }
    }
    for (int i = 0; i < ctx->n_in; i++) pp_tensor_free(wide[i]);
    if (s != PP_OK)
        for (int k = 0; k < ctx->n_out; k++) {
            pp_tensor_free(ctx->out[k]);
            ctx->out[k] = NULL;
        }
    return s;
}
