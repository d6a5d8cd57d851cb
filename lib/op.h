/* Op registry: each op is a table entry with its arity, an attribute check,
 * and a CPU kernel. Symbolic backward rules live apart, keyed by op name
 * (pippin/autodiff.h), so kernels and their derivatives stay separate concerns.
 *
 * Kernels compute output shapes from the actual input tensors and allocate
 * their outputs, so a dynamic batch dimension needs nothing special. */
#ifndef PIPPIN_OP_H
#define PIPPIN_OP_H

#include "pippin/graph.h"
#include "pippin/status.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where random ops draw from (pp_exec_set_random_stream). */
typedef struct pp_random_stream {
    uint64_t seed;
    int64_t step;
    int64_t microbatch;
} pp_random_stream;

typedef struct pp_kernel_ctx {
    const pp_graph *graph;
    const pp_node *node;
    int n_in;
    pp_tensor *const *in; /* in[i] NULL for an omitted optional input */
    int n_out;
    pp_tensor **out;      /* the kernel sets out[i] (new reference) for each
                             output whose node->out[i] >= 0 */
    const pp_random_stream *random; /* NULL: seed, step and microbatch 0 */
    pp_tensor *const *into; /* NULL, or per output NULL or a tensor the kernel may add
                               that output into (pp_exec_set_target_hook) */
    uint64_t *added;        /* with into: the kernel sets bit k when it added output
                               k into into[k] (then out[k] stays NULL) */
    struct pp_pack_cache *packs; /* NULL, or the executor's packed weights
                                    (lib/pack_cache.h, pp_exec_set_pack_weights) */
} pp_kernel_ctx;

typedef struct pp_op {
    const char *name;   /* ONNX op_type */
    const char *domain; /* "" for the default domain, "pippin" for ours */
    int min_in, max_in;
    int min_out, max_out;
    /* Validates attributes at load time (may be NULL). Errors name the node. */
    pp_status (*check)(const pp_graph *g, const pp_node *n);
    /* CPU kernel. */
    pp_status (*run)(pp_kernel_ctx *ctx);
    /* 1: a function of its inputs alone, so the executor may cache it like
     * a default-domain op (lib/exec.c); ops of other domains are taken to
     * draw random numbers or keep state unless they say so. */
    int pure;
    /* Bit k set: output 0 may be given input k's buffer (lib/inplace.c)
     * when both are float32 or float64 of one shape. The kernel then reads
     * and writes through one pointer (out->data == in[k]->data exactly,
     * never a partial overlap), and allocates output 0 (pp_tensor_empty)
     * before any other tensor of its dtype and shape. */
    unsigned inplace;
} pp_op;

/* Registry lookup; domain "" and "ai.onnx" are the same. NULL if unknown. */
const pp_op *pp_op_find(const char *domain, const char *name);

/* Frees what a node owns (names, edges, attributes), not the node itself:
 * the graph's free and the optimizer's compaction (lib/graph.c). */
void pp_node_clear(pp_node *n);
/* All registered ops, terminated by an entry with name NULL. Call with i = 0,
 * 1, ... until NULL. */
const pp_op *pp_op_at(int i);

/* Error helper for kernels: "node 'x' (Op): message". */
pp_status pp_kernel_error(const pp_kernel_ctx *ctx, pp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
pp_status pp_node_error(const pp_node *n, pp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Op families (lib/ops/<family>.c), each an array terminated by {NULL}. */
extern const pp_op pp_ops_elementwise[]; /* binary arithmetic, unary math, activations */
extern const pp_op pp_ops_reduce[];      /* reductions, softmax, norms, losses */
extern const pp_op pp_ops_reshape[];     /* Reshape, Squeeze, Transpose, Identity, Dropout... */
extern const pp_op pp_ops_slice[];       /* Concat, Split, Slice, Gather... */
extern const pp_op pp_ops_pad[];         /* Expand, Tile, Pad, Trilu, pippin::PadGrad */
extern const pp_op pp_ops_cast[];        /* Cast, CastLike */
extern const pp_op pp_ops_constant[];    /* Shape, Size, Range, ConstantOfShape, Constant */
extern const pp_op pp_ops_matmul[];      /* MatMul, Gemm */
extern const pp_op pp_ops_matmul_fused[]; /* pippin::MatMulAdd (the optimizer's fused Linear) */
extern const pp_op pp_ops_attention[];    /* pippin::CausalAttention (the optimizer's fused attention) */
extern const pp_op pp_ops_attention_grad[]; /* pippin::CausalAttentionGrad (its gradient, for training) */
extern const pp_op pp_ops_pippin[];      /* PipeSplit */
extern const pp_op pp_ops_grad[];        /* pippin-domain helper ops emitted by autodiff */
extern const pp_op pp_ops_pool[];        /* MaxPool, AveragePool, Global*Pool and their grads */
extern const pp_op pp_ops_grad_act[];    /* pippin::ClipGrad, EluGrad... (activation derivatives) */
extern const pp_op pp_ops_misc[];        /* CumSum, Mish, Scatter*, TopK, Einsum, InstanceNorm,
                                            pippin::TileGrad, GatherElementsGrad, MishGrad */
extern const pp_op pp_ops_dropout[];     /* Dropout (Philox masks in training), pippin::DropoutGrad */
extern const pp_op pp_ops_conv[];        /* Conv, pippin::ConvGradInput/ConvGradWeight */
extern const pp_op pp_ops_conv_transpose[]; /* ConvTranspose, pippin::ConvTransposeGrad{Input,Weight} */
extern const pp_op pp_ops_resize[];      /* Resize, Upsample, pippin::ResizeGrad */
extern const pp_op pp_ops_group_norm[];  /* GroupNormalization, pippin::GroupNormGrad{Input,Weight} */
extern const pp_op pp_ops_rnn[];         /* LSTM, GRU, pippin::LSTMTrain/GRUTrain (with stash) */
extern const pp_op pp_ops_grad_rnn[];    /* pippin::LSTMGrad, GRUGrad (backward through time),
                                            LSTMGradWeight, GRUGradWeight */

#ifdef __cplusplus
}
#endif
#endif
