/* The gradient rule table: which ops are differentiable, through which
 * inputs, and which ops pass no gradient by nature. */
#include <string.h>

#include "autodiff_internal.h"

#define ALL 0xffffffffu

typedef struct rule_entry {
    const char *domain;
    const char *op;
    pp_grad_rule fn;
    uint32_t inputs; /* differentiable inputs; bit 31 stands for 31 and up */
} rule_entry;

static const rule_entry rules[] = {
    {"", "Add", pp_grad_rule_add, 3},
    {"", "Sub", pp_grad_rule_sub, 3},
    {"", "Mul", pp_grad_rule_mul, 3},
    {"", "Div", pp_grad_rule_div, 3},
    {"", "Pow", pp_grad_rule_pow, 3},
    {"", "Neg", pp_grad_rule_neg, 1},
    {"", "Exp", pp_grad_rule_exp, 1},
    {"", "Log", pp_grad_rule_log, 1},
    {"", "Sqrt", pp_grad_rule_unary_y, 1},
    {"", "Tanh", pp_grad_rule_unary_y, 1},
    {"", "Sigmoid", pp_grad_rule_unary_y, 1},
    {"", "Relu", pp_grad_rule_unary_y, 1},
    {"", "Erf", pp_grad_rule_unary_x, 1},
    {"", "Gelu", pp_grad_rule_unary_x, 1},
    {"", "LeakyRelu", pp_grad_rule_unary_x, 1},
    {"", "ReduceSum", pp_grad_rule_reduce, 1},
    {"", "ReduceMean", pp_grad_rule_reduce, 1},
    {"", "Where", pp_grad_rule_where, 6},
    {"", "MatMul", pp_grad_rule_matmul, 3},
    {"", "Gemm", pp_grad_rule_gemm, 7},
    {"", "Softmax", pp_grad_rule_softmax, 1},
    {"", "LogSoftmax", pp_grad_rule_softmax, 1},
    {"", "LayerNormalization", pp_grad_rule_layer_norm, 7},
    {"", "SoftmaxCrossEntropyLoss", pp_grad_rule_sce_loss, 1},
    {"", "MaxPool", pp_grad_rule_maxpool, 1},
    {"", "AveragePool", pp_grad_rule_avgpool, 1},
    {"", "GlobalAveragePool", pp_grad_rule_global_avgpool, 1},
    {"", "GlobalMaxPool", pp_grad_rule_global_maxpool, 1},
    {"", "Clip", pp_grad_rule_activation, 1},
    {"", "HardSigmoid", pp_grad_rule_activation, 1},
    {"", "HardSwish", pp_grad_rule_activation, 1},
    {"", "Elu", pp_grad_rule_activation, 1},
    {"", "Selu", pp_grad_rule_activation, 1},
    {"", "Softplus", pp_grad_rule_activation, 1},
    {"", "Softsign", pp_grad_rule_activation, 1},
    {"", "PRelu", pp_grad_rule_prelu, 3},
    {"", "Conv", pp_grad_rule_conv, 7},
    {"", "ConvTranspose", pp_grad_rule_conv_transpose, 7},
    {"", "Resize", pp_grad_rule_resize, 1},
    {"", "Upsample", pp_grad_rule_resize, 1},
    {"", "GroupNormalization", pp_grad_rule_group_norm, 7},
    {"", "InstanceNormalization", pp_grad_rule_group_norm, 7},
    {"", "Pad", pp_grad_rule_pad, 1},
    {"", "Reciprocal", pp_grad_rule_reciprocal, 1},
    {"", "Abs", pp_grad_rule_abs, 1},
    {"", "LSTM", pp_grad_rule_lstm, 0xef}, /* X W R B initial_h initial_c P */
    {"", "GRU", pp_grad_rule_gru, 0x2f},   /* X W R B initial_h */
    {"pippin", "LSTMTrain", pp_grad_rule_lstm, 0xef}, /* their training forms */
    {"pippin", "GRUTrain", pp_grad_rule_gru, 0x2f},
    {"", "Identity", pp_grad_rule_identity, 1},
    {"", "Dropout", pp_grad_rule_dropout, 1},
    {"", "BatchNormalization", pp_grad_rule_batch_norm, 7},
    {"pippin", "PipeSplit", pp_grad_rule_identity, ALL},
    {"pippin", "MatMulAdd", pp_grad_rule_matmul_add, 7}, /* pp_graph_optimize_for_training's fusion */
    {"pippin", "CausalAttention", pp_grad_rule_causal_attention, 7}, /* likewise */
    {"", "Reshape", pp_grad_rule_reshape, 1},
    {"", "Flatten", pp_grad_rule_reshape, 1},
    {"", "Squeeze", pp_grad_rule_reshape, 1},
    {"", "Unsqueeze", pp_grad_rule_reshape, 1},
    {"", "Expand", pp_grad_rule_expand, 1},
    {"", "Transpose", pp_grad_rule_transpose, 1},
    {"", "Concat", pp_grad_rule_concat, ALL},
    {"", "Split", pp_grad_rule_split, 1},
    {"", "Slice", pp_grad_rule_slice, 1},
    {"", "Gather", pp_grad_rule_gather, 1},
    {"", "Cast", pp_grad_rule_cast, 1},
    {"", "Sin", pp_grad_rule_sin, 1},
    {"", "Cos", pp_grad_rule_cos, 1},
    {"", "Trilu", pp_grad_rule_trilu, 1},
    {"", "CumSum", pp_grad_rule_cumsum, 1},
    {"", "Tile", pp_grad_rule_tile, 1},
    {"", "ReduceMax", pp_grad_rule_reduce_ext, 1},
    {"", "ReduceMin", pp_grad_rule_reduce_ext, 1},
    {"", "ReduceProd", pp_grad_rule_reduce_ext, 1},
    {"", "ReduceL2", pp_grad_rule_reduce_ext, 1},
    {"", "ReduceLogSumExp", pp_grad_rule_reduce_ext, 1},
    {"", "GatherElements", pp_grad_rule_gather_elements, 1},
    {"", "Mish", pp_grad_rule_unary_x, 1},
    {"", "TopK", pp_grad_rule_topk, 1},
};

/* Ops through which no gradient flows, by nature (integer or boolean
 * results, or piecewise constant functions). */
static const char *const constant_ops[] = {
    "Shape", "Size", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And",
    "Or", "Xor", "ArgMax", "ArgMin", "NonZero", "IsNaN", "IsInf", "Sign", "Floor", "Ceil",
    "Round", "ConstantOfShape", "Range", "EyeLike", "Constant", "RandomNormalLike",
    "RandomUniformLike", "Bernoulli",
};

static int onnx_domain(const char *d) { return !d || !d[0] || strcmp(d, "ai.onnx") == 0; }

static const rule_entry *find(const char *domain, const char *op) {
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const rule_entry *r = &rules[i];
        int same = r->domain[0] ? (domain && strcmp(domain, r->domain) == 0) : onnx_domain(domain);
        if (same && strcmp(op, r->op) == 0) return r;
    }
    return NULL;
}

pp_grad_rule pp_grad_rule_find(const char *domain, const char *op_type) {
    const rule_entry *r = find(domain, op_type);
    return r ? r->fn : NULL;
}

uint32_t pp_grad_rule_inputs(const char *domain, const char *op_type) {
    const rule_entry *r = find(domain, op_type);
    return r ? r->inputs : 0;
}

int pp_grad_op_is_constant(const char *domain, const char *op_type) {
    if (!onnx_domain(domain)) return 0;
    for (size_t i = 0; i < sizeof constant_ops / sizeof constant_ops[0]; i++)
        if (strcmp(op_type, constant_ops[i]) == 0) return 1;
    return 0;
}
