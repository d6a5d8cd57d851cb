/* Internal: the recurrence shared by the ONNX LSTM/GRU kernels (rnn.c) and
 * their backward helpers pippin::LSTMGrad / pippin::GRUGrad (grad_rnn.c).
 *
 * Rows: X, Y and every per-step buffer are addressed by (t, b). X's rows
 * (and the stash's, and the gate gradients') lie at t*st + b*sb: layout 0
 * ([T,B,...]) has st = B, sb = 1; layout 1 ([B,T,...]) st = 1, sb = T. So the
 * B rows of one step are equally spaced (pitch sb rows) and one GEMM with a
 * leading dimension takes them, while all T*B rows are one matrix for the
 * big GEMMs (X W^T up front; dW, dR, dX after the backward sweep). */
#ifndef PIPPIN_OPS_RNN_H
#define PIPPIN_OPS_RNN_H

#include "op.h"

#define PP_RNN_HIDDEN_MAX (1 << 20) /* hidden_size: far above any real model */

typedef struct pp_rnn_plan {
    int lstm;          /* 1 LSTM (gates i o f c), 0 GRU (gates z r h) */
    int64_t T, B, In, H; /* steps, batch, input size, hidden size */
    int64_t nd, G;     /* directions (1 or 2), gates (4 or 3) */
    int direction;     /* 0 forward, 1 reverse, 2 bidirectional */
    int layout;        /* 0: [T,B,..], 1: [B,T,..] */
    int lbr;           /* GRU linear_before_reset */
    float clip;        /* 0: none */
    int64_t st, sb;    /* row of (t, b) in X order: t*st + b*sb */
    /* Y: float offset of (t, b, direction d) = t*yt + b*yb + d*yd;
     * Y_h/Y_c/initial_h/initial_c: (d, b) at d*hd + b*hb. */
    int64_t yt, yb, yd, hd, hb;
} pp_rnn_plan;

/* Attribute checks at load time (errors name the node). */
pp_status pp_rnn_check_attrs(const pp_node *n, int lstm);

/* The inputs in ONNX order: X W R B sequence_lens initial_h initial_c P
 * (GRU: the first 6); absent ones NULL. */
typedef struct pp_rnn_inputs {
    const pp_tensor *x, *w, *r, *b, *seq, *h0, *c0, *p;
} pp_rnn_inputs;

/* Reads ctx->in[0..] (GRU: 6 entries, LSTM: 8) into in. */
void pp_rnn_read_inputs(const pp_kernel_ctx *ctx, int lstm, pp_rnn_inputs *in);

/* Checks dtypes and shapes against the attributes and fills the plan; the
 * sequence lengths (if given) go to *lens (caller frees; NULL without). */
pp_status pp_rnn_plan_make(const pp_kernel_ctx *ctx, int lstm, const pp_rnn_inputs *in,
                           pp_rnn_plan *p, int64_t **lens);

/* What the backward needs of one direction's forward, rows in X order.
 * LSTM: hprev, cprev, cnew [TB,H]; gates [TB,4H] activated (i o f c);
 * GRU: hprev [TB,H]; gates [TB,3H] activated (z r h); q [TB,H]: with
 * linear_before_reset hprev R_h^T + Rb_h, else r * hprev. mask [TB,G*H]: 1
 * where clip cut a pre-activation (NULL without clip). Rows of steps past a
 * sequence's length are left as they are, but for the gates, which hold
 * junk there (the step's GEMM writes every row in place). */
typedef struct pp_rnn_stash {
    float *hprev, *cprev, *cnew, *gates, *q;
    uint8_t *mask;
} pp_rnn_stash;

/* The stash as one float tensor: output 3 of pippin::LSTMTrain (2 of
 * GRUTrain), the training forward that the gradient rule puts in place of
 * the LSTM/GRU, read by LSTMGrad/GRUGrad instead of rerunning the forward.
 * Per direction, pp_rnn_stash_floats floats: LSTM hprev cprev cnew [TB,H],
 * gates [TB,4H]; GRU hprev q [TB,H], gates [TB,3H]; with clip the mask bytes
 * [TB,G*H] after them. Returns -1 on overflow. */
int64_t pp_rnn_stash_floats(const pp_rnn_plan *p);
/* Points st into direction d's part of a stash of nd * pp_rnn_stash_floats
 * floats. */
void pp_rnn_stash_view(const pp_rnn_plan *p, float *base, int d, pp_rnn_stash *st);

/* One direction d of the forward. y (NULL: not wanted) is Y's data, yh/yc
 * (NULL: not wanted) Y_h's/Y_c's. st (NULL: none) receives the stash. */
pp_status pp_rnn_forward_dir(const pp_kernel_ctx *ctx, const pp_rnn_plan *p, int d,
                             const pp_rnn_inputs *in, const int64_t *lens, float *y, float *yh,
                             float *yc, const pp_rnn_stash *st);

/* n = a * b * c, or -1 on overflow (negative inputs give -1 too). */
int64_t pp_rnn_mul3(int64_t a, int64_t b, int64_t c);

#endif
