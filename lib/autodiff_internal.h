/* Internal: state shared by the autodiff pass (autodiff.c), the rule
 * helpers (grad_build.c) and the rules (grad_rules*.c). */
#ifndef PIPPIN_AUTODIFF_INTERNAL_H
#define PIPPIN_AUTODIFF_INTERNAL_H

#include "pippin/autodiff.h"
#include "op.h"

typedef struct pp_ad_state {
    int n_fwd_nodes;   /* nodes of the graph before the pass */
    int n_fwd_values;  /* values of the graph before the pass */
    int *shape_of;     /* per forward value: the value holding its shape, or -1 */
    uint8_t *side;     /* per node: added for the forward (region F) */
    int cap_side;
    int n_extra;       /* gradients a rule gives to values other than its node's inputs */
    int extra_v[4], extra_g[4];
    int n_consts;      /* cache of scalar float constants */
    uint32_t const_bits[16];
    int const_ids[16];
} pp_ad_state;

pp_status pp_ad_state_init(pp_ad_state *st, const pp_graph *g);
void pp_ad_state_clear(pp_ad_state *st);
/* From a rule: gv is (a part of) the gradient of value v, which is not an
 * input of the rule's node (it lies further up, e.g. the W of b = W^T). */
pp_status pp_ad_contribute(pp_grad_ctx *c, int v, int gv);
/* 1 if node was added as a forward-side helper. */
int pp_ad_is_side(const pp_ad_state *st, int node);

/* Recognises node as the output of a decomposed GELU (grad_fuse.c) whose
 * intermediates have no other use (uses[v]: readers of value v, graph
 * outputs and seeds included). Returns 1 (tanh form) or 2 (erf form) and
 * sets *x to the GELU's input; 0 if no match. */
int pp_ad_match_gelu(const pp_graph *g, int node, const int *uses, int *x);

/* The forward node's input k and output k, -1 if absent. (Rules read ids
 * through these rather than keep a node pointer: adding nodes moves the
 * node array.) */
static inline int pp_ad_in(const pp_grad_ctx *c, int k) {
    const pp_node *n = &c->g->nodes[c->node];
    return k < n->n_in ? n->in[k] : -1;
}
static inline int pp_ad_out(const pp_grad_ctx *c, int k) {
    const pp_node *n = &c->g->nodes[c->node];
    return k < n->n_out ? n->out[k] : -1;
}

/* Rules (grad_rules_*.c), looked up through the table in grad_rules.c. */
#define PP_GRAD_RULE(name) pp_status pp_grad_rule_##name(pp_grad_ctx *c)
PP_GRAD_RULE(add);
PP_GRAD_RULE(sub);
PP_GRAD_RULE(mul);
PP_GRAD_RULE(div);
PP_GRAD_RULE(pow);
PP_GRAD_RULE(neg);
PP_GRAD_RULE(exp);
PP_GRAD_RULE(log);
PP_GRAD_RULE(unary_y);   /* Tanh Sigmoid Relu Sqrt: pippin::<Op>Grad(dy, y) */
PP_GRAD_RULE(unary_x);   /* Erf Gelu LeakyRelu: pippin::<Op>Grad(dy, x) */
PP_GRAD_RULE(reduce);    /* ReduceSum ReduceMean */
/* v (shaped as the reduction node's result) broadcast back to shape, with its
 * axes and keepdims; mean: divided by the reduced count (grad_rules_math.c). */
pp_status pp_grad_expand_reduced(pp_grad_ctx *c, int v, int shape, int mean, int *out);
PP_GRAD_RULE(where);
PP_GRAD_RULE(matmul);
PP_GRAD_RULE(gemm);
PP_GRAD_RULE(matmul_add); /* pippin::MatMulAdd without activation */
PP_GRAD_RULE(causal_attention); /* pippin::CausalAttention: pippin::CausalAttentionGrad */
PP_GRAD_RULE(softmax);   /* Softmax LogSoftmax */
PP_GRAD_RULE(layer_norm);
PP_GRAD_RULE(sce_loss);
PP_GRAD_RULE(maxpool);   /* pippin::MaxPoolGrad(dy, indices, shape_x) */
PP_GRAD_RULE(avgpool);   /* pippin::AveragePoolGrad(dy, shape_x) */
PP_GRAD_RULE(global_avgpool);
PP_GRAD_RULE(global_maxpool);
PP_GRAD_RULE(activation); /* Clip HardSigmoid HardSwish Elu Selu Softplus Softsign */
PP_GRAD_RULE(prelu);
PP_GRAD_RULE(conv);      /* Conv: pippin::ConvGradInput, ConvGradWeight */
PP_GRAD_RULE(conv_transpose); /* pippin::ConvTransposeGradInput, ConvTransposeGradWeight */
PP_GRAD_RULE(resize);    /* Resize Upsample: pippin::ResizeGrad */
PP_GRAD_RULE(group_norm); /* GroupNormalization InstanceNormalization */
PP_GRAD_RULE(pad);       /* pippin::PadGrad */
PP_GRAD_RULE(reciprocal);
PP_GRAD_RULE(abs);
PP_GRAD_RULE(lstm);      /* LSTM: pippin::LSTMGrad */
PP_GRAD_RULE(gru);       /* GRU: pippin::GRUGrad */
PP_GRAD_RULE(identity);  /* Identity PipeSplit Dropout: dx[k] = dy[k] */
PP_GRAD_RULE(reshape);   /* Reshape Flatten Squeeze Unsqueeze */
PP_GRAD_RULE(expand);
PP_GRAD_RULE(transpose);
PP_GRAD_RULE(concat);
PP_GRAD_RULE(split);
PP_GRAD_RULE(slice);
PP_GRAD_RULE(gather);
PP_GRAD_RULE(cast);
PP_GRAD_RULE(sin);
PP_GRAD_RULE(cos);
PP_GRAD_RULE(trilu);
PP_GRAD_RULE(cumsum);
PP_GRAD_RULE(tile);
PP_GRAD_RULE(reduce_ext); /* ReduceMax ReduceMin ReduceProd ReduceL2 ReduceLogSumExp */
PP_GRAD_RULE(gather_elements);
PP_GRAD_RULE(topk);
PP_GRAD_RULE(dropout);    /* training: pippin::DropoutGrad(dy, mask) (grad_rules_train.c) */
PP_GRAD_RULE(batch_norm); /* pippin::BatchNormGradInput, BatchNormGradWeight */
/* Gives every training-mode Dropout a mask output (the backward reads it). */
pp_status pp_ad_prepare_training_ops(pp_graph *g);

#endif
