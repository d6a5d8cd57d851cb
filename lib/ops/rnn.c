/* ONNX LSTM and GRU (float32; forward, reverse, bidirectional; layout 0
 * and 1; sequence_lens; clip; peepholes; GRU linear_before_reset; the
 * default activations only) and their training forms pippin::LSTMTrain /
 * GRUTrain, which also give the stash the backward reads. The recurrence is
 * in rnn_core.c; the backward helpers pippin::LSTMGrad / GRUGrad in
 * grad_rnn.c. */
#include <stdlib.h>
#include <string.h>

#include "rnn.h"

#include "status_internal.h"

static pp_status check_f32_x(const pp_graph *gr, const pp_node *n) {
    if (n->n_in > 0 && n->in[0] >= 0) {
        const pp_value *x = &gr->values[n->in[0]];
        if (x->dtype != PP_DTYPE_UNDEFINED && x->dtype != PP_F32)
            return pp_node_error(n, PP_ERR_UNSUPPORTED, "%s supports float32 only, not %s",
                                 n->op_type, pp_dtype_name(x->dtype));
    }
    return PP_OK;
}

static pp_status lstm_check(const pp_graph *gr, const pp_node *n) {
    PP_TRY(check_f32_x(gr, n));
    return pp_rnn_check_attrs(n, 1);
}

static pp_status gru_check(const pp_graph *gr, const pp_node *n) {
    PP_TRY(check_f32_x(gr, n));
    return pp_rnn_check_attrs(n, 0);
}

void pp_rnn_read_inputs(const pp_kernel_ctx *ctx, int lstm, pp_rnn_inputs *in) {
    pp_tensor *const *v = ctx->in;
    int n = ctx->n_in;
    memset(in, 0, sizeof *in);
    in->x = n > 0 ? v[0] : NULL;
    in->w = n > 1 ? v[1] : NULL;
    in->r = n > 2 ? v[2] : NULL;
    in->b = n > 3 ? v[3] : NULL;
    in->seq = n > 4 ? v[4] : NULL;
    in->h0 = n > 5 ? v[5] : NULL;
    if (lstm) {
        in->c0 = n > 6 ? v[6] : NULL;
        in->p = n > 7 ? v[7] : NULL;
    }
}

static int wants(const pp_kernel_ctx *ctx, int k) { return k < ctx->n_out && ctx->node->out[k] >= 0; }

/* train: pippin::LSTMTrain / GRUTrain, whose last output is the stash
 * (rnn.h) that LSTMGrad / GRUGrad read. */
static pp_status rnn_run(pp_kernel_ctx *ctx, int lstm, int train) {
    pp_rnn_inputs in;
    pp_rnn_read_inputs(ctx, lstm, &in);
    pp_rnn_plan p;
    int64_t *lens = NULL;
    PP_TRY(pp_rnn_plan_make(ctx, lstm, &in, &p, &lens));
    int64_t ys[4] = {p.T, p.nd, p.B, p.H}, hs[3] = {p.nd, p.B, p.H};
    if (p.layout) {
        ys[0] = p.B, ys[1] = p.T, ys[2] = p.nd;
        hs[0] = p.B, hs[1] = p.nd;
    }
    pp_tensor *out[3] = {NULL, NULL, NULL};
    pp_status s = PP_OK;
    int n_out = lstm ? 3 : 2;
    for (int k = 0; k < n_out && s == PP_OK; k++)
        if (wants(ctx, k)) s = pp_tensor_empty(PP_F32, k ? 3 : 4, k ? hs : ys, &out[k]);
    pp_tensor *stash = NULL;
    if (train && s == PP_OK) {
        int64_t per = pp_rnn_stash_floats(&p), total = pp_rnn_mul3(per, p.nd, 1);
        if (per < 0 || total < 0 || pp_rnn_mul3(total, 4, 1) < 0)
            s = pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "recurrence too large to stash");
        /* rows of steps past a sequence's end are never written: zeros, as
         * the weight gradients' GEMMs run over every row */
        else if (lens) s = pp_tensor_new(PP_F32, 1, &total, &stash);
        else s = pp_tensor_empty(PP_F32, 1, &total, &stash);
    }
    for (int d = 0; d < p.nd && s == PP_OK; d++) {
        pp_rnn_stash st;
        if (stash) pp_rnn_stash_view(&p, stash->data, d, &st);
        s = pp_rnn_forward_dir(ctx, &p, d, &in, lens, out[0] ? out[0]->data : NULL,
                               out[1] ? out[1]->data : NULL, out[2] ? out[2]->data : NULL,
                               stash ? &st : NULL);
    }
    free(lens);
    for (int k = 0; k < n_out; k++) {
        if (s == PP_OK) ctx->out[k] = out[k];
        else pp_tensor_free(out[k]);
    }
    if (s == PP_OK && train) ctx->out[n_out] = stash;
    else pp_tensor_free(stash);
    return s;
}

static pp_status lstm_run(pp_kernel_ctx *ctx) { return rnn_run(ctx, 1, 0); }
static pp_status gru_run(pp_kernel_ctx *ctx) { return rnn_run(ctx, 0, 0); }
static pp_status lstm_train_run(pp_kernel_ctx *ctx) { return rnn_run(ctx, 1, 1); }
static pp_status gru_train_run(pp_kernel_ctx *ctx) { return rnn_run(ctx, 0, 1); }

const pp_op pp_ops_rnn[] = {
    /* X W R [B sequence_lens initial_h initial_c P] -> [Y Y_h Y_c] */
    {"LSTM", "", 3, 8, 0, 3, lstm_check, lstm_run},
    /* X W R [B sequence_lens initial_h] -> [Y Y_h] */
    {"GRU", "", 3, 6, 0, 2, gru_check, gru_run},
    /* the training forward (put in place by the gradient rule): the same
     * inputs -> [Y Y_h Y_c] stash, and [Y Y_h] stash */
    {"LSTMTrain", "pippin", 3, 8, 4, 4, lstm_check, lstm_train_run},
    {"GRUTrain", "pippin", 3, 6, 3, 3, gru_check, gru_train_run},
    {NULL},
};
