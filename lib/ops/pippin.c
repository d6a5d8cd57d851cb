/* pippin-domain ops that the forward graph carries. */
#include "op.h"

/* PipeSplit marks a stage boundary; run unsplit it is an identity on each of
 * its n inputs (n may be 0). */
static pp_status pipe_split_run(pp_kernel_ctx *ctx) {
    if (ctx->n_out != ctx->n_in)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "has %d inputs but %d outputs", ctx->n_in,
                               ctx->n_out);
    for (int i = 0; i < ctx->n_in; i++) ctx->out[i] = pp_tensor_retain(ctx->in[i]);
    return PP_OK;
}

const pp_op pp_ops_pippin[] = {
    {"PipeSplit", "pippin", 0, 64, 0, 64, NULL, pipe_split_run},
    {NULL},
};
