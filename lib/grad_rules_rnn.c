/* Gradient rules of LSTM and GRU (helpers in lib/ops/grad_rnn.c). The rule
 * turns the forward node into its training form pippin::LSTMTrain /
 * GRUTrain (lib/ops/rnn.c: the same outputs and one more, the stash of gate
 * activations and states), so the backward never reruns the recurrence.
 * Region I: pippin::LSTMGrad / GRUGrad sweeps back through time and gives
 * the input gradients (X, initial_h, initial_c) and the gate gradients dG;
 * region W: pippin::LSTMGradWeight / GRUGradWeight makes the weight
 * gradients (W, R, B, P) from dG, X and the stash (a few GEMMs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff_internal.h"

#include "status_internal.h"

static pp_status copy_attrs(pp_grad_ctx *c, int id) {
    int na = c->g->nodes[c->node].n_attr;
    for (int a = 0; a < na; a++) {
        pp_attr copy;
        PP_TRY(pp_attr_clone(&c->g->nodes[c->node].attrs[a], &copy));
        PP_TRY(pp_node_add_attr(c->g, id, &copy));
    }
    return PP_OK;
}

/* Makes the forward node (n_fwd_out ONNX outputs) its training form, with
 * the stash as output n_fwd_out, and sets *stash to that value. A node that
 * is already in that form keeps its stash. */
static pp_status training_forward(pp_grad_ctx *c, const char *train_op, int n_fwd_out,
                                  int *stash) {
    pp_graph *g = c->g;
    pp_node *n = &g->nodes[c->node];
    if (!strcmp(n->domain, "pippin") && !strcmp(n->op_type, train_op)) {
        *stash = n->n_out > n_fwd_out ? n->out[n_fwd_out] : -1;
        return PP_OK;
    }
    if (n->n_out > n_fwd_out)
        return pp_node_error(n, PP_ERR_INVALID, "has %d outputs (at most %d)", n->n_out, n_fwd_out);
    char *op = strdup(train_op), *dom = strdup("pippin");
    int v;
    pp_status st = op && dom ? pp_node_add_output(g, c->node, n_fwd_out, &v) : pp_error(PP_ERR_NOMEM, "out of memory");
    if (st != PP_OK) {
        free(op);
        free(dom);
        return st;
    }
    n = &g->nodes[c->node];
    free(n->op_type);
    free(n->domain);
    n->op_type = op;
    n->domain = dom;
    n->op = NULL; /* resolved again before it runs */
    g->values[v].dtype = PP_F32; /* a flat float buffer, its length known at run time */
    g->values[v].ndim = 1;
    g->values[v].shape[0] = -1;
    *stash = v;
    return PP_OK;
}

/* n_fwd_in forward inputs, n_dy output gradients (helper inputs: those, then
 * the stash); the sweep's outputs dX dW dR dB dinitial_h [dinitial_c dP] dG,
 * of which the weight ones (is_w) go to the weight helper instead. */
static pp_status rnn_rule(pp_grad_ctx *c, const char *op, const char *op_w, const char *train_op,
                          int n_fwd_in, int n_dy, const int *grad_of, const uint8_t *is_w,
                          int n_grads) {
    const pp_node *n = &c->g->nodes[c->node];
    int in[12], any_dy = 0;
    for (int k = 0; k < n_fwd_in; k++) in[k] = pp_ad_in(c, k);
    for (int k = 0; k < n_dy; k++) {
        in[n_fwd_in + k] = k < n->n_out && n->out[k] >= 0 ? c->dy[k] : -1;
        any_dy |= in[n_fwd_in + k] >= 0;
    }
    if (!any_dy) return PP_OK;
    uint8_t want[8], want_w[4];
    int any_w = 0, any_i = 0, nw = 0;
    for (int k = 0; k < n_grads; k++) {
        int i = grad_of[k];
        uint8_t w = (uint8_t)(i < n->n_in && n->in[i] >= 0 && c->need[i]);
        want[k] = (uint8_t)(w && !is_w[k]);
        if (is_w[k]) want_w[nw++] = w;
        any_w |= w && is_w[k];
        any_i |= want[k];
    }
    if (!any_w && !any_i) return PP_OK;
    int stash = -1;
    PP_TRY(training_forward(c, train_op, n_dy, &stash));
    in[n_fwd_in + n_dy] = stash;
    want[n_grads] = (uint8_t)any_w; /* dG for the weight helper */
    int outs[8], id;
    PP_TRY(pp_grad_emit(c, op, "pippin", n_fwd_in + n_dy + 1, in, n_grads + 1, want, outs, &id));
    PP_TRY(copy_attrs(c, id));
    for (int k = 0; k < n_grads; k++)
        if (want[k]) c->dx[grad_of[k]] = outs[k];
    if (!any_w) return PP_OK;
    /* X W R B, no sequence_lens or initial states, [P], stash, dG */
    int win[10], nwin = 0;
    for (int k = 0; k < n_fwd_in; k++)
        win[nwin++] = k < 4 || k == 7 ? in[k] : -1;
    win[nwin++] = stash;
    win[nwin++] = outs[n_grads];
    int wouts[4];
    PP_TRY(pp_grad_emit(c, op_w, "pippin", nwin, win, nw, want_w, wouts, &id));
    PP_TRY(copy_attrs(c, id));
    for (int k = 0, j = 0; k < n_grads; k++)
        if (is_w[k] && want_w[j++]) c->dx[grad_of[k]] = wouts[j - 1];
    return PP_OK;
}

PP_GRAD_RULE(lstm) {
    static const int grad_of[7] = {0, 1, 2, 3, 5, 6, 7}; /* X W R B initial_h initial_c P */
    static const uint8_t is_w[7] = {0, 1, 1, 1, 0, 0, 1};
    return rnn_rule(c, "LSTMGrad", "LSTMGradWeight", "LSTMTrain", 8, 3, grad_of, is_w, 7);
}

PP_GRAD_RULE(gru) {
    static const int grad_of[5] = {0, 1, 2, 3, 5}; /* X W R B initial_h */
    static const uint8_t is_w[5] = {0, 1, 1, 1, 0};
    return rnn_rule(c, "GRUGrad", "GRUGradWeight", "GRUTrain", 6, 2, grad_of, is_w, 5);
}
