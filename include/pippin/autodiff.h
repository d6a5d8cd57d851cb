/* Symbolic reverse-mode autodiff on the graph IR, with the I/W split.
 *
 * pp_autodiff appends the backward of a graph as ordinary nodes (built by
 * per-op rules that emit nodes, never compute), so a training graph can be
 * run, printed and exported like any other. Every appended node is tagged:
 *   F  a small forward-side helper (the Shape of an activation that the
 *      backward needs, so the activation itself need not be kept),
 *   I  needed for some requested input gradient (the critical path between
 *      pipeline stages),
 *   W  needed only for parameter gradients (movable into pipeline bubbles).
 * No W node feeds an I node, so running I then W computes exactly the same
 * thing, bit for bit, as running all backward nodes in order.
 *
 * Gradients are float32. Values read more than once accumulate their
 * gradients with Add nodes in a fixed order; broadcasting is undone by
 * pippin::SumToShape at run time (shapes are dynamic). Two export patterns
 * get a cheaper backward: a decomposed GELU (tanh or erf form, as PyTorch
 * writes F.gelu at opset 17) becomes one pippin::GeluGrad that keeps only
 * its input, and MatMul(x, Transpose(W)) sends its gradient straight to W,
 * so no transposed weight is kept for the backward.
 *
 * Thread safety: changes the graph it is given: one thread per graph. */
#ifndef PIPPIN_AUTODIFF_H
#define PIPPIN_AUTODIFF_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/graph.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a gradient rule sees. The rule emits nodes with the pp_grad_* helpers
 * below (or the graph builder) and sets dx[k] for each input k with need[k]
 * (leaving -1 means "zero gradient"). */
typedef struct pp_grad_ctx {
    pp_graph *g;
    int node;            /* the forward node */
    const int *dy;       /* per output of node: gradient value id, or -1 if none flows */
    int *dx;             /* per input: the rule sets the gradient value id (init -1 = none) */
    const uint8_t *need; /* per input: 1 if a gradient is wanted */
    void *priv;          /* private to the pass */
} pp_grad_ctx;

typedef pp_status (*pp_grad_rule)(pp_grad_ctx *c);

/* The rule for an op; NULL when the op is not differentiable. */
PP_API pp_grad_rule pp_grad_rule_find(const char *domain, const char *op_type);
/* Bit k set: input k of the op may carry a gradient (index and shape inputs
 * never do). 0 when the op has no rule. */
PP_API uint32_t pp_grad_rule_inputs(const char *domain, const char *op_type);
/* 1 for ops whose gradient is zero almost everywhere or whose outputs are
 * integers (Shape, Equal, ArgMax, Floor, ...): no gradient flows through them
 * and that is not an error. */
PP_API int pp_grad_op_is_constant(const char *domain, const char *op_type);

/* Helpers for rules. Every node they add is named after the forward node
 * ("<node>/grad/<Op>_<n>") and becomes part of the backward. */
/* Adds op_type(in...) with n_out outputs; out[i] receives the value ids
 * (-1 for an output left out: want[i] == 0; want may be NULL for all).
 * node (may be NULL) receives the node id, for setting attributes. */
PP_API pp_status pp_grad_emit(pp_grad_ctx *c, const char *op_type, const char *domain, int n_in,
                       const int *in, int n_out, const uint8_t *want, int *out, int *node);
/* One output, no attributes: *out = op_type(a[, b]). b < -1 means unary. */
PP_API pp_status pp_grad_op1(pp_grad_ctx *c, const char *op_type, const char *domain, int a, int b,
                      int *out);
/* A scalar float32 constant value. */
PP_API pp_status pp_grad_const_f32(pp_grad_ctx *c, float v, int *out);
/* A 1-D int64 constant value. */
PP_API pp_status pp_grad_const_i64(pp_grad_ctx *c, int n, const int64_t *vals, int *out);
/* A value holding v's shape at run time (1-D int64): a constant for
 * parameters and constants, else a Shape node run with the forward, so the
 * backward keeps a few bytes instead of the whole activation. Cached per v. */
PP_API pp_status pp_grad_shape_of(pp_grad_ctx *c, int v, int *out);
/* *out = grad summed over the dims along which `like` was broadcast
 * (pippin::SumToShape); grad itself when the shapes are known equal. */
PP_API pp_status pp_grad_sum_to(pp_grad_ctx *c, int grad, int like, int *out);

/* What to differentiate. */
typedef struct pp_backward_spec {
    int loss;                        /* scalar loss value id, or -1 */
    int n_seeds; const int *seeds;   /* forward values whose incoming gradients are given
                                        (outputs of a non-final stage) */
    int n_wrt; const int *wrt;       /* graph inputs to produce gradients for (may be 0) */
    /* every float PARAM reached by a gradient gets one */
} pp_backward_spec;

/* No loss (-1), no seeds, no input gradients. */
PP_API void pp_backward_spec_init(pp_backward_spec *s);

/* What pp_autodiff built (value and node ids of the graph). */
typedef struct pp_backward {
    /* seed_grads[i]: NEW graph input carrying dL/d(seed_values[i]). For the
     * loss (listed first) it is a float32 scalar the caller feeds with 1/M
     * for M microbatches (1 for a whole batch). */
    int n_seeds; int *seed_values; int *seed_grads;
    int n_wrt; int *wrt_values; int *wrt_grads;        /* requested input gradients */
    int n_params; int *params; int *param_grads;        /* PARAMs that got gradients */
    int n_forward; int *forward_nodes;                  /* region F, in order */
    int n_i; int *i_nodes;                              /* region I, in order */
    int n_w; int *w_nodes;                              /* region W, in order */
    /* Forward values (graph inputs and F-node outputs) that I or W read and
     * so must be kept per microbatch. stash_static[i] = 1 when the value
     * depends on parameters and constants only (a weight-derived value):
     * the same for every microbatch of a step. */
    int n_stash; int *stash; uint8_t *stash_static;
    /* Values made by I that W reads: keep them between the two. */
    int n_handoff; int *handoff;
    /* PARAM values that no gradient reaches (buffers such as a causal mask):
     * not trainable. */
    int n_frozen; int *frozen;
    /* Graph sizes before the pass: the first n_inputs_before inputs are the
     * model's own, the first n_outputs_before outputs too. */
    int n_values_before, n_inputs_before, n_outputs_before;
} pp_backward;

/* First fuses what has a gradient rule (pp_graph_optimize_for_training:
 * MatMul by a transposed weight and its bias Add become one
 * pippin::MatMulAdd; forward node indices change, value indices do not;
 * only when the loss and every seed are graph outputs), then appends the
 * backward of g's nodes to g and tags node->region.
 * The gradient values are also appended to g's outputs (input gradients,
 * then parameter gradients, typed like their values) and the seed
 * gradients to its inputs, so
 * pp_exec_run on g runs a whole training step. Errors: a loss that is not a
 * float scalar, a gradient asked for an integer input, an op without a rule
 * on a gradient path (named). On failure g may hold some added nodes, and
 * stays fused. */
PP_API pp_status pp_autodiff(pp_graph *g, const pp_backward_spec *spec, pp_backward **out);
PP_API void pp_backward_free(pp_backward *b);

/* The loss output of a model: the output named loss_name, or (NULL) the
 * output called "loss", else the only float scalar output. */
PP_API pp_status pp_autodiff_find_loss(const pp_graph *g, const char *loss_name, int *value);
/* Training graph of a whole model: pp_autodiff with the loss found as above
 * and, if wrt_float_inputs, the gradients of every float graph input (which
 * makes region I non-empty, as for a pipeline stage). For `pippin inspect
 * --backward`: call this, then pp_onnx_save. */
PP_API pp_status pp_autodiff_model(pp_graph *g, const char *loss_name, int wrt_float_inputs,
                            pp_backward **out);

/* Stashed bytes for one forward run on the given inputs (inputs[i] feeds
 * g->inputs[i] for the inputs that existed before pp_autodiff). */
PP_API pp_status pp_backward_stash_bytes(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs,
                                  int64_t *bytes);
/* The phases of a backward, as the memory plan reports them apart. */
enum { PP_PHASE_F, PP_PHASE_I, PP_PHASE_W, PP_PHASES };

/* The memory plan (pippin/exec.h: the arena that holds the buffers living
 * and dying inside one run) of each of F, I and W on the given inputs, with
 * output gradients of zeros, run as a pipeline stage runs them: W hands
 * each parameter's gradient over as soon as it is made (the stage adds it
 * into its flat buffer), so W's plan holds the parameter gradients. */
PP_API pp_status pp_backward_plan_phase_bytes(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs,
                                              int64_t bytes[PP_PHASES]);
/* The largest of the three. */
PP_API pp_status pp_backward_plan_bytes(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs,
                                        int64_t *bytes);
/* The bytes in-place elementwise ops did not allocate (pp_exec_set_inplace:
 * outputs written into a dying input's buffer) in that run of F, I and W;
 * 0 with the optimizer's "inplace" bit off. */
PP_API pp_status pp_backward_inplace_bytes(pp_graph *g, const pp_backward *b, pp_tensor *const *inputs,
                                           int64_t *bytes);
/* Stashed bytes per sample: runs the forward on zero inputs with a batch
 * (dim 0 of inputs whose dim 0 is dynamic) of 1 and of 2 and takes the
 * difference; other dynamic dims get other_dims (1 if <= 0). *fixed gets
 * the batch-independent part (may be NULL). */
PP_API pp_status pp_backward_stash_per_sample(pp_graph *g, const pp_backward *b, int64_t other_dims,
                                       int64_t *per_sample, int64_t *fixed);
/* The same with the dynamic input dims sized by name: dims lists "name=N"
 * (as pp_pipe_probe_shapes leaves in p->dims); dims named batch_name run at
 * 1 and 2 (NULL: dim 0 of every input with a dynamic dim 0, as above); a dim
 * written as a product of names and numbers ("batch*seq", "2*seq", as
 * probed edges are) multiplies them; other dynamic dims get 1 (dim 0: the
 * batch). */
PP_API pp_status pp_backward_stash_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name,
                                            int n_dims, const char *const *dims, int64_t *per_sample,
                                            int64_t *fixed);
/* The same for the forward's inputs alone (what a recomputing stage keeps
 * from F to I): their bytes per sample with the dims sized as above. */
PP_API pp_status pp_backward_input_bytes_per_sample_dims(pp_graph *g, const pp_backward *b,
                                                  const char *batch_name, int n_dims,
                                                  const char *const *dims, int64_t *per_sample,
                                                  int64_t *fixed);
/* The same for each phase's memory plan (pp_backward_plan_phase_bytes):
 * its bytes per sample and (fixed) at no batch, phase by phase (W's fixed
 * part holds the parameter gradients, F's is small: taking the largest
 * plan at two batch sizes mixed phases). */
PP_API pp_status pp_backward_plan_phases_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name,
                                                         int n_dims, const char *const *dims,
                                                         int64_t per_sample[PP_PHASES], int64_t fixed[PP_PHASES]);
/* A bound on the memory plan of F, I and W at any batch B: per_sample * B +
 * fixed is at least every phase's plan (per_sample: the largest of the
 * phases' per-sample bytes, fixed: the largest of their fixed bytes). */
PP_API pp_status pp_backward_plan_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name,
                                                  int n_dims, const char *const *dims, int64_t *per_sample,
                                                  int64_t *fixed);
/* That bound from the phases' figures. */
PP_API void pp_backward_plan_bound(const int64_t per_sample[PP_PHASES], const int64_t fixed[PP_PHASES],
                                   int64_t *bound_per_sample, int64_t *bound_fixed);
/* The same for the bytes in-place ops did not allocate in F, I and W
 * (pp_backward_inplace_bytes). */
PP_API pp_status pp_backward_inplace_per_sample_dims(pp_graph *g, const pp_backward *b, const char *batch_name,
                                                     int n_dims, const char *const *dims, int64_t *per_sample,
                                                     int64_t *fixed);

/* Keep masks (one byte per graph value, caller frees) for running the
 * regions apart with pp_exec_run_nodes: keep_f after F (stash and graph
 * outputs), keep_i after I (what W still reads, and I's results). */
PP_API pp_status pp_backward_keep_masks(const pp_graph *g, const pp_backward *b, uint8_t **keep_f,
                                 uint8_t **keep_i);

#ifdef __cplusplus
}
#endif
#endif
