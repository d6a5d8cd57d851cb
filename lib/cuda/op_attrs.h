/* The attributes the CUDA backend reads, per op it claims (lib/cuda/
 * cuda_ops.c). A node with any other attribute stays on the CPU, so an
 * attribute that a gradient rule or an optimizer pass adds later (as
 * MatMulGradA/B's weight_t was) cannot be silently ignored on the device.
 * Plain C: the cuda-host suite checks the example GPT's training stages
 * against it, so a new attribute there shows without a GPU. */
#ifndef PIPPIN_CUDA_OP_ATTRS_H
#define PIPPIN_CUDA_OP_ATTRS_H

#include <string.h>

static const struct {
    const char *op;
    const char *attrs[8];
} pp_cuda_op_attrs[] = {
    {"Gelu", {"approximate"}},
    {"GeluGrad", {"approximate"}},
    {"Softmax", {"axis"}},
    {"SoftmaxGrad", {"axis", "coerce2d"}},
    {"LayerNormalization", {"axis", "epsilon", "stash_type"}},
    {"LayerNormGradInput", {"axis", "epsilon"}},
    {"LayerNormGradWeight", {"axis", "epsilon"}},
    {"Gemm", {"transA", "transB", "alpha", "beta"}},
    {"MatMulAdd", {"transB", "activation"}},
    {"MatMulGradA", {"weight_t"}},
    {"MatMulGradB", {"weight_t"}},
    {"Gather", {"axis"}},
    {"GatherGrad", {"axis"}},
    {"SoftmaxCrossEntropyLoss", {"reduction", "ignore_index"}},
    {"SoftmaxCrossEntropyLossGrad", {"reduction", "ignore_index"}},
    {"Transpose", {"perm"}},
    {"Reshape", {"allowzero"}},
    {"Flatten", {"axis"}},
    {"Squeeze", {"axes"}},
    {"Unsqueeze", {"axes"}},
    {"Concat", {"axis"}},
    {"Split", {"axis", "split", "num_outputs"}},
    {"CausalAttention", {"scale", "scale_div", "q_layout", "k_layout", "v_layout", "out_layout"}},
    {"CausalAttentionGrad", {"scale", "scale_div", "q_layout", "k_layout", "v_layout", "out_layout"}},
};

/* 1 if the backend reads attribute attr of op_type (ops not listed read none). */
static inline int pp_cuda_attr_known(const char *op_type, const char *attr) {
    for (size_t i = 0; i < sizeof pp_cuda_op_attrs / sizeof *pp_cuda_op_attrs; i++) {
        if (strcmp(pp_cuda_op_attrs[i].op, op_type) != 0) continue;
        for (int k = 0; k < 8 && pp_cuda_op_attrs[i].attrs[k]; k++)
            if (!strcmp(pp_cuda_op_attrs[i].attrs[k], attr)) return 1;
        return 0;
    }
    return 0;
}

#endif
