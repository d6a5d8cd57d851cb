/* Internal: the ONNX function bodies of pippin's own ops. A model that uses
 * pippin::X also carries a model-local FunctionProto pippin::X whose body
 * computes the same in standard ONNX ops (opset 17 semantics), so ONNX
 * Runtime and onnx.checker load the file; pippin reads the node with its own
 * kernel and ignores the function.
 *
 * A body is built from one node (its attributes, which inputs it has, the
 * ranks the graph knows). ONNX keeps one function per name: nodes of an op
 * whose bodies differ call functions "op", "op__2", ... (the written node's
 * op type; pippin reads "op__k" back as op). Geometry that differs from node
 * to node (conv pads, strides) is passed by attribute reference instead, so
 * that such nodes share one function. Bodies are lines of
 * lib/onnx_function_text.h's syntax. */
#ifndef PIPPIN_LIB_ONNX_FUNCTIONS_H
#define PIPPIN_LIB_ONNX_FUNCTIONS_H

#include <stddef.h>

#include "onnx.pb-c.h"
#include "onnx_function_text.h"
#include "pippin/graph.h"

/* The empty float tensor an absent input of a pippin-domain node is written
 * as: onnx.checker's shape inference (onnx 1.12) wants a type for every
 * input of a function call, and pippin reads the name back as absent. */
#define PP_ONNX_ABSENT "pippin.absent"

typedef struct pp_fn_body {
    const char *inputs, *outputs; /* the formal parameters, "dy, x, shape" */
    char in_buf[512], out_buf[512]; /* room for lists built per node */
    int n_in, n_out;                /* the node's counts: the formal lists are cut to them */
    char text[65536];             /* the lines, '\n'-separated */
    size_t len;
    int overflow;
} pp_fn_body;

/* Appends one line (printf format). */
void pp_fn_line(pp_fn_body *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Line "name = Constant<value_float=v>()" (a float32 scalar). */
void pp_fn_float(pp_fn_body *b, const char *name, double v);

/* Lines computing dst = src summed over the dims numpy broadcasting added
 * to reach it from shape (a 1-D int64 tensor): pippin::SumToShape. Local
 * names start with tag. */
void pp_fn_sum_to(pp_fn_body *b, const char *tag, const char *src, const char *shape, const char *dst);
/* "0, 1, 3, 2": the permutation swapping the last two of rank dims. */
const char *pp_fn_swap_last(int rank, char *buf, size_t cap);

/* The rank the graph knows for node input k, -1 if unknown or absent. */
int pp_fn_in_rank(const pp_graph *g, const pp_node *n, int k);
/* The length of node input k, a 1-D tensor (a shape, scales), when the
 * graph knows it (its shape or data, the rank of what Shape read, a
 * Constant, a Concat of those); else -1. */
int pp_fn_shape_len(const pp_graph *g, const pp_node *n, int k);
/* 1 if node input k is given. */
int pp_fn_has_in(const pp_node *n, int k);

typedef pp_status (*pp_fn_builder)(const pp_graph *g, const pp_node *n, pp_fn_body *b);

typedef struct pp_fn_entry {
    const char *op;
    pp_fn_builder build;
} pp_fn_entry;

/* The families, each ended by {NULL}. */
extern const pp_fn_entry pp_fn_act[], pp_fn_nn[], pp_fn_shape[], pp_fn_conv[], pp_fn_resize[];
extern const pp_fn_entry pp_fn_attention[]; /* lib/onnx_functions_attention.c */
extern const pp_fn_entry pp_fn_rnn[];       /* lib/onnx_functions_rnn.c */
extern const pp_fn_entry pp_fn_matmul[];    /* lib/onnx_functions_matmul.c */

/* How many inputs the writer gives node n: its own, or for an op whose
 * function takes an optional trailing input (pippin::MatMulAdd's bias)
 * every formal one: a call must pass as many inputs as the function
 * declares (lib/onnx_export.c writes zeros for the missing bias). */
int pp_onnx_node_inputs(const pp_node *n);

/* The FunctionProtos for every pippin-domain op g uses, allocated through
 * alloc; an op no body is written for is logged and left without one.
 * opset: the default-domain version the bodies import. written: the
 * NodeProtos of g's nodes (same index), whose op type a node calling a
 * variant "op__k" gets. */
pp_status pp_onnx_functions(const pp_graph *g, int64_t opset, pp_onnx_alloc_fn alloc, void *ctx,
                            Onnx__NodeProto **written, Onnx__FunctionProto ***out, size_t *n_out);

#endif
