/* Graph optimizer for inference: rewrites a graph once, before it runs, so
 * that it computes the same outputs (within float rounding) with fewer and
 * cheaper nodes.
 *
 * Each pass is small and named (pp_optimize_pass_name); a bit mask picks
 * which run. In order:
 *   fold       nodes fed only by constants (Constant nodes, non-trainable
 *              initializers, shapes of initializers and of fully static
 *              graph inputs) become constants, computed once here;
 *   identity   Identity, pippin::PipeSplit and inference Dropout nodes
 *              that do not make a graph output are bypassed;
 *   layernorm  LayerNorm as exporters decompose it (ReduceMean, Sub, Pow,
 *              ReduceMean, Add eps, Sqrt, Div, then Mul and Add by the
 *              affine weights) becomes one LayerNormalization;
 *   gelu       GELU as exporters decompose it (PyTorch 1.13's erf form
 *              Div/Erf/Add/Mul/Mul, and the tanh form) becomes one Gelu;
 *   attention  causal self-attention (MatMul(Q, K^T), a scale, a causal
 *              mask by Where or Add from a constant checked to be causal,
 *              Softmax, MatMul by V) becomes one pippin::CausalAttention
 *              that reads Q, K and V through the transposes around them
 *              and never holds all heads' T x T scores at once;
 *   transpose  Transpose pairs that cancel (or compose), Transpose of
 *              the last two dims feeding a MatMul operand (then a
 *              pippin::MatMulT that reads it transposed), Reshape chains
 *              collapsed into their last Reshape;
 *   matmul     MatMul(x, W) or MatMul(x, Transpose(W)) with a 2-D weight,
 *              and the Add of a bias and a Relu or Gelu after it, become
 *              one pippin::MatMulAdd (the transpose read in place by the
 *              GEMM, the bias as its C, the activation applied to each
 *              row); so does a Gemm followed by a Relu or Gelu; a
 *              transposed weight read by that MatMul alone is packed once
 *              instead (pippin::PackWeight, panels the GEMM reads);
 *   dead       nodes whose outputs nothing reads are removed;
 *   inplace    not a rewrite: executors made while it is on write an
 *              elementwise op's output into the buffer of an input that
 *              dies there (pp_exec_set_inplace), in training graphs too.
 *   pack       not a rewrite: training stages and the whole-model trainer
 *              made while it is on prepare each Linear weight once per
 *              step for the GEMM (packed panels, or W^T for OpenBLAS) and
 *              reuse it in every microbatch (pp_exec_set_pack_weights);
 *              inference packs through the matmul pass's
 *              pippin::PackWeight instead. Off by default (without
 *              PIPPIN_OPTIMIZE): it keeps a second copy of every Linear
 *              weight for the executor's life, for a step-time gain
 *              within the noise when measured; "all" or a list naming
 *              it turns it on.
 * Trainable parameters are never folded (a service may load new weights
 * into them after the graph is prepared); what depends on them alone is
 * computed once by the executor (pp_exec_set_constant_params).
 *
 * The graph keeps its inputs and outputs (the same value indices and
 * names); rewritten nodes keep the name of the node they replace. Value
 * indices of other values stay valid, though a removed node's outputs no
 * longer have a producer. Fused activations have no gradient rules: a
 * graph autodiff will differentiate gets pp_graph_optimize_for_training
 * instead (pp_autodiff runs it).
 *
 * Thread safety: pp_graph_optimize changes the graph; nothing else may use
 * it meanwhile. The process-wide switch is read and set atomically. */
#ifndef PIPPIN_OPTIMIZE_H
#define PIPPIN_OPTIMIZE_H

#include "pippin/export.h"

#include "pippin/graph.h"
#include "pippin/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    PP_OPT_FOLD = 1u << 0,
    PP_OPT_GELU = 1u << 1,
    PP_OPT_MATMUL = 1u << 2,
    PP_OPT_IDENTITY = 1u << 3,
    PP_OPT_DEAD = 1u << 4,
    PP_OPT_ATTENTION = 1u << 5,
    PP_OPT_TRANSPOSE = 1u << 6,
    PP_OPT_LAYERNORM = 1u << 7,
    PP_OPT_INPLACE = 1u << 8,
    PP_OPT_PACK = 1u << 9,
    PP_OPT_ALL = (1u << 10) - 1,
    /* the passes a training graph gets before its backward is built */
    PP_OPT_TRAINING = PP_OPT_FOLD | PP_OPT_MATMUL | PP_OPT_ATTENTION | PP_OPT_DEAD
};

#define PP_OPT_MAX_PASSES 16

typedef struct pp_optimize_report {
    int nodes_before, nodes_after;
    int n_passes;                     /* passes that ran, in order */
    const char *pass[PP_OPT_MAX_PASSES]; /* their names (static strings) */
    int rewrites[PP_OPT_MAX_PASSES];  /* what each changed: nodes folded,
                                         patterns fused, nodes removed */
} pp_optimize_report;

/* Runs the passes in `passes` (PP_OPT_* bits) over g. report may be NULL.
 * On failure g may be partly rewritten (free it); the error names the pass
 * and the node. */
PP_API pp_status pp_graph_optimize(pp_graph *g, unsigned passes, pp_optimize_report *report);

/* The rewrites a graph that will be differentiated can take, run by
 * pp_autodiff before it builds the backward: the passes of
 * PP_OPT_TRAINING that pp_optimize_default() allows, with "matmul" taking
 * MatMul(x, Transpose(W)) and the bias Add into one pippin::MatMulAdd but
 * leaving activations apart (their gradients need the value before them),
 * and "attention" fusing causal attention into pippin::CausalAttention,
 * whose gradient (pippin::CausalAttentionGrad) recomputes the probabilities
 * from Q and K instead of stashing the T x T scores of every head.
 * "fold" folds only what no initializer feeds (Constant nodes and what
 * reads them alone; parameters change every step, and any initializer may
 * be replaced after the graph is built). The backward then
 * multiplies by W in place instead of a transposed copy made every
 * microbatch, and the bias rides in the GEMM. */
PP_API pp_status pp_graph_optimize_for_training(pp_graph *g, pp_optimize_report *report);

/* The passes inference runs (stages with training off, pippin infer,
 * pp_graph_prepare_inference): PP_OPT_ALL unless the environment variable
 * PIPPIN_OPTIMIZE says otherwise ("0" or "off": none; "1" or "all": all;
 * a comma list of pass names: those) or pp_optimize_set_default was
 * called (which wins over the environment). */
PP_API unsigned pp_optimize_default(void);
PP_API void pp_optimize_set_default(unsigned passes);

/* Pass bit i's name ("fold", "gelu", ...), NULL past the last. */
PP_API const char *pp_optimize_pass_name(int i);
/* Parses "fold,gelu" (names as above, "all", "none", "0", "1") into bits;
 * PP_ERR_INVALID naming an unknown pass. */
PP_API pp_status pp_optimize_parse(const char *text, unsigned *passes);

#ifdef __cplusplus
}
#endif
#endif
