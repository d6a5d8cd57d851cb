/* Internal: what the optimizer's passes share (lib/opt_*.c): the use
 * counts of values, node rewrites that keep them right, and the removal of
 * dead nodes at the end. Not installed.
 *
 * Passes never add values or nodes: they fold values into constants,
 * rewrite a node in place (new op, inputs, output) and mark nodes dead.
 * pp_opt_compact then drops the dead nodes, so node indices move only
 * there, and value indices never. */
#ifndef PIPPIN_OPT_INTERNAL_H
#define PIPPIN_OPT_INTERNAL_H

#include <stdint.h>

#include "pippin/graph.h"
#include "pippin/status.h"

typedef struct pp_opt_ctx {
    pp_graph *g;
    int *uses;     /* per value: readers among live nodes, plus 1 per graph output */
    uint8_t *dead; /* per node */
    int n_dead;
    int training;  /* only rewrites autodiff can differentiate (no fused activations) */
} pp_opt_ctx;

pp_status pp_opt_ctx_init(pp_opt_ctx *c, pp_graph *g);
void pp_opt_ctx_clear(pp_opt_ctx *c);

/* 1 if v is one of the graph's outputs. */
int pp_opt_is_output(const pp_graph *g, int v);
/* The tensor of an initializer (constant or parameter with data), else NULL. */
const pp_tensor *pp_opt_initializer(const pp_graph *g, int v);
/* 1 if node n is op_type in the default domain ("" or "ai.onnx"). */
int pp_opt_is_op(const pp_node *n, const char *op_type);
/* The live node that makes v if it is op_type (default domain), else -1. */
int pp_opt_producer(const pp_opt_ctx *c, int v, const char *op_type);
/* The one live node that reads v when v has exactly one use and is not a
 * graph output, else -1. */
int pp_opt_sole_reader(const pp_opt_ctx *c, int v);

/* Marks node i dead and takes its reads off the use counts. */
void pp_opt_kill(pp_opt_ctx *c, int i);
/* Value v lost a reader: when nothing reads it any more, kills its
 * producer once none of its outputs is read, and so on up the graph. */
void pp_opt_drop(pp_opt_ctx *c, int v);
/* Node i becomes op_type (domain) with no attributes and the given inputs
 * (use counts moved; the old inputs dropped as by pp_opt_drop). */
pp_status pp_opt_rewrite(pp_opt_ctx *c, int i, const char *op_type, const char *domain, int n_in,
                         const int *in);
/* Node i's only output becomes value v (made by a node after i that the
 * caller kills): its old output is left without a producer. */
void pp_opt_take_output(pp_opt_ctx *c, int i, int v);
/* Node i's outputs become vs[0..n) (made by a node after i that the
 * caller kills; -1: none); its old outputs are left without a producer. */
pp_status pp_opt_take_outputs(pp_opt_ctx *c, int i, int n, const int *vs);
/* Readers of `from` read `to` instead (from must not be a graph output). */
void pp_opt_replace_uses(pp_opt_ctx *c, int from, int to);

/* Removes the dead nodes, renumbers producers, and checks that every live
 * node reads values that exist before it (PP_ERR_INTERNAL naming the pass
 * and node otherwise). */
pp_status pp_opt_compact(pp_opt_ctx *c, const char *pass);

/* The passes. Each returns how many rewrites it made in *count. */
pp_status pp_opt_fold(pp_opt_ctx *c, int *count);
pp_status pp_opt_identity(pp_opt_ctx *c, int *count);
pp_status pp_opt_gelu(pp_opt_ctx *c, int *count);
pp_status pp_opt_matmul(pp_opt_ctx *c, int *count);
pp_status pp_opt_dead(pp_opt_ctx *c, int *count);
pp_status pp_opt_attention(pp_opt_ctx *c, int *count);
pp_status pp_opt_transpose(pp_opt_ctx *c, int *count);
pp_status pp_opt_layernorm(pp_opt_ctx *c, int *count);

#endif
