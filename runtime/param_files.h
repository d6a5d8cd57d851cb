/* Internal: writing tensors and stage parameters as .npy files in a
 * directory (a run's outputs and trained parameters). */
#ifndef PIPPIN_RUNTIME_PARAM_FILES_H
#define PIPPIN_RUNTIME_PARAM_FILES_H

#include <stddef.h>

#include "pippin/graph.h"
#include "pippin/pipe.h"
#include "pippin/stage.h"

/* Creates a directory and its parents if missing. */
pp_status pp_mkdirs(const char *path);
/* A value name made safe for a file name ('/' and ':' become '_'). */
void pp_file_safe_name(const char *name, char *buf, size_t cap);
/* Writes t as DIR/<prefix><file-safe name>.npy. */
pp_status pp_save_named_npy(const char *dir, const char *prefix, const char *name, const pp_tensor *t);
/* Writes every trainable parameter (or its gradient) of the given stages as
 * DIR/<prefix><name>.npy; a replicated parameter once, from the first stage
 * the pipe lists for it. *count (may be NULL) gets the number written. */
pp_status pp_save_stage_params(const pp_pipe *p, int n, pp_stage *const *stages, const char *dir,
                               const char *prefix, int grads, int *count);

/* Replaces g's initializers by DIR/<file-safe name>.npy (as --save and
 * output_dir write them): every trainable parameter must have its file, of
 * the same dtype and shape; buffers without one keep their values.
 * *loaded: files read. */
pp_status pp_load_params_dir(pp_graph *g, const char *dir, int *loaded);

#endif
