/* ONNX import and export. Import reads default-domain opsets 7-21 and IR
 * versions up to 10 (older and newer op versions are converted or refused
 * by lib/onnx_upgrade.c); export writes the graph's opset, as PyTorch 1.13's
 * exporter does for 13-17.
 *
 * Thread safety: reentrant; each call works on its own graph. */
#ifndef PIPPIN_ONNX_H
#define PIPPIN_ONNX_H

#include "pippin/export.h"

#include <stddef.h>

#include "pippin/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Model metadata key naming the trainable initializers (a JSON list of
 * names), written by python/pippin_torch.py and by pp_onnx_save. */
#define PP_ONNX_TRAINABLE_KEY "pippin.trainable"

/* Loads a model file into a new graph (ops resolved and checked). The float
 * initializers named in the PP_ONNX_TRAINABLE_KEY metadata become parameters
 * (all float initializers when the model has no such metadata); every
 * other initializer is a constant. Errors name the file
 * and, where it applies, the node (name and op type). */
PP_API pp_status pp_onnx_load(const char *path, pp_graph **out);
/* The same from bytes in memory; name is used in messages. */
PP_API pp_status pp_onnx_parse(const void *bytes, size_t len, const char *name, pp_graph **out);
/* Decodes a serialized TensorProto (the input_*.pb files of ONNX's tests). */
PP_API pp_status pp_onnx_tensor_parse(const void *bytes, size_t len, const char *name, pp_tensor **out,
                               char **tensor_name);
PP_API pp_status pp_onnx_tensor_load(const char *path, pp_tensor **out, char **tensor_name);
/* Writes g as an ONNX model (opset 17 plus the pippin domain). Node regions
 * are recorded in each node's doc_string and metadata; the parameters are
 * listed under PP_ONNX_TRAINABLE_KEY, so constants stay constants on reload. */
PP_API pp_status pp_onnx_save(const pp_graph *g, const char *path);

#ifdef __cplusplus
}
#endif
#endif
