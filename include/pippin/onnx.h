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
 * and, where it applies, the node (name and op type). The file is read,
 * not mapped: one truncated while it is read (another process saving
 * over it) gives PP_ERR_IO naming the file, never a SIGBUS. */
PP_API pp_status pp_onnx_load(const char *path, pp_graph **out);
/* pp_onnx_load with the weights read later: the parameters (trainable
 * float initializers) of 64 KiB and up, in the model file itself or in an
 * external-data side file, are not read (constants are: the optimizer
 * reads some, such as a causal mask; a parameter frozen after loading
 * should be filled first);
 * their tensors are zero pages of their own (no memory until written) and
 * *deferred records where each lies, keeping the files open (renamed over
 * meanwhile, they still give the bytes the structure came from; one cut
 * short or rewritten in place fails the fill naming it). Shapes do
 * not depend on such weights, so the graph can be split, its shapes
 * probed and its memory measured as it is; pp_onnx_deferred_fill then
 * reads the recorded initializers of g (the model, or a stage graph split
 * from it: by name) straight into their tensors. Fill before anything
 * reads the values or writes the tensors: a copy taken earlier (flat
 * parameters, a replicated shared parameter is filled by name too) holds
 * zeros. Frees with pp_onnx_deferred_free (after the fills; the graphs
 * stay valid). */
typedef struct pp_onnx_deferred pp_onnx_deferred;
PP_API pp_status pp_onnx_load_deferred(const char *path, pp_graph **out, pp_onnx_deferred **deferred);
PP_API pp_status pp_onnx_deferred_fill(pp_onnx_deferred *deferred, pp_graph *g);
PP_API void pp_onnx_deferred_free(pp_onnx_deferred *deferred);
/* The same from bytes in memory; name is used in messages. */
PP_API pp_status pp_onnx_parse(const void *bytes, size_t len, const char *name, pp_graph **out);
/* Decodes a serialized TensorProto (the input_*.pb files of ONNX's tests). */
PP_API pp_status pp_onnx_tensor_parse(const void *bytes, size_t len, const char *name, pp_tensor **out,
                               char **tensor_name);
PP_API pp_status pp_onnx_tensor_load(const char *path, pp_tensor **out, char **tensor_name);
/* Writes g as an ONNX model (opset 17 plus the pippin domain). Node regions
 * are recorded in each node's doc_string and metadata; the parameters are
 * listed under PP_ONNX_TRAINABLE_KEY, so constants stay constants on reload.
 * The file is replaced durably (temporary file, fsync, rename). Default
 * options: initializers go to the side file PATH.data when the model would
 * exceed PP_ONNX_EXTERNAL_THRESHOLD bytes (see pp_onnx_save_with). */
PP_API pp_status pp_onnx_save(const pp_graph *g, const char *path);

/* External data (ONNX's format for models over 2 GiB): initializers kept in
 * a side file that the model names by a path relative to its own
 * directory. pp_onnx_load reads them (a location must stay inside the
 * model's directory, offsets and lengths must fit);
 * pp_onnx_parse and pp_onnx_tensor_parse refuse them (bytes in memory have
 * no directory). */
typedef enum pp_onnx_external_mode {
    PP_ONNX_EXTERNAL_AUTO = 0, /* external when the model would exceed the threshold */
    PP_ONNX_EXTERNAL_ALWAYS,   /* external (initializers of at least external_min_bytes) */
    PP_ONNX_EXTERNAL_NEVER     /* all in the model file (fails past 2 GiB) */
} pp_onnx_external_mode;

/* Model size (bytes) past which PP_ONNX_EXTERNAL_AUTO moves the
 * initializers out: about 1.8 GiB, below protobuf's 2 GiB limit. */
#define PP_ONNX_EXTERNAL_THRESHOLD ((size_t)1932735283u)

typedef struct pp_onnx_save_options {
    pp_onnx_external_mode external_data; /* default PP_ONNX_EXTERNAL_AUTO */
    /* Initializers smaller than this stay in the model file when the others
     * move out (default 1024, as onnx's size_threshold; 0 moves all but
     * empty ones). */
    size_t external_min_bytes;
} pp_onnx_save_options;

PP_API void pp_onnx_save_options_init(pp_onnx_save_options *o);
/* pp_onnx_save with options (NULL: the defaults). With external data the
 * initializers go to PATH.data (recorded as location 'BASENAME.data'), each
 * at an offset that is a multiple of 4096 (of 64 under 4096 bytes), as
 * readers that map the file want; the side file is renamed into place
 * just before the model file. */
PP_API pp_status pp_onnx_save_with(const pp_graph *g, const char *path, const pp_onnx_save_options *o);

#ifdef __cplusplus
}
#endif
#endif
