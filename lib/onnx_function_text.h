/* Internal: ONNX nodes written as one line of text, for the function bodies
 * pippin writes beside its own ops (lib/onnx_export_functions.c):
 *
 *   out1, out2 = OpType<attr=value, ...>(in1, , in3)
 *
 * An empty input is an absent optional one. Values: 3 (int), 1.5 or 1e-5
 * (float: has '.', 'e' or is inf), [1, 2] (ints), [1.0, 2.0] (floats),
 * 'text' (string), @name:T (a reference to the function's attribute name,
 * T one of i f s ints floats), %name (a subgraph defined above, for Loop's
 * body). Every node is in the default domain. A text of several lines may
 * define subgraphs:
 *
 *   graph name(in1:int64[], in2:float) -> (out1:bool[], out2:float)
 *   ...node lines...
 *   end
 *
 * (element types float, int64 or bool; [] marks a scalar) whose nodes may read names of the
 * enclosing body (outer scope). */
#ifndef PIPPIN_LIB_ONNX_FUNCTION_TEXT_H
#define PIPPIN_LIB_ONNX_FUNCTION_TEXT_H

#include <stddef.h>

#include "onnx.pb-c.h"
#include "pippin/status.h"

/* Allocates zeroed memory owned by ctx (freed by the caller, all at once). */
typedef void *(*pp_onnx_alloc_fn)(void *ctx, size_t size);

/* Parses line into *out, every part allocated through alloc; what names the
 * function in errors. */
pp_status pp_onnx_node_from_text(const char *line, const char *what, pp_onnx_alloc_fn alloc, void *ctx,
                                 Onnx__NodeProto **out);

/* Parses text, lines separated by '\n', into *nodes (the top-level ones;
 * subgraph blocks go into the attributes that name them). */
pp_status pp_onnx_nodes_from_text(const char *text, const char *what, pp_onnx_alloc_fn alloc, void *ctx,
                                  Onnx__NodeProto ***nodes, size_t *n_nodes);

#endif
