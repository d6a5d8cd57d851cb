/* ONNX import and export (opsets 13-17, as PyTorch 1.13's exporter writes). */
#ifndef PIPPIN_ONNX_H
#define PIPPIN_ONNX_H

#include <stddef.h>

#include "pippin/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads a model file into a new graph (ops resolved and checked). Float
 * initializers become parameters, others constants. Errors name the file
 * and, where it applies, the node (name and op type). */
pp_status pp_onnx_load(const char *path, pp_graph **out);
/* The same from bytes in memory; name is used in messages. */
pp_status pp_onnx_parse(const void *bytes, size_t len, const char *name, pp_graph **out);
/* Decodes a serialized TensorProto (the input_*.pb files of ONNX's tests). */
pp_status pp_onnx_tensor_parse(const void *bytes, size_t len, const char *name, pp_tensor **out,
                               char **tensor_name);
pp_status pp_onnx_tensor_load(const char *path, pp_tensor **out, char **tensor_name);
/* Writes g as an ONNX model (opset 17 plus the pippin domain). Node regions
 * are recorded in each node's doc_string and metadata. */
pp_status pp_onnx_save(const pp_graph *g, const char *path);

#ifdef __cplusplus
}
#endif
#endif
