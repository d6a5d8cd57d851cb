/* NumPy .npy files, format versions 1.0, 2.0 and 3.0.
 *
 * Supported dtypes: float32/64/16, int64/32/8, uint8, bool (little-endian,
 * C order). Fortran order, big-endian data, object arrays, unsupported dtypes
 * and truncated files are errors that name the file and the problem.
 *
 * Thread safety: reentrant; no shared state. */
#ifndef PIPPIN_NPY_H
#define PIPPIN_NPY_H

#include "pippin/export.h"

#include <stddef.h>

#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

PP_API pp_status pp_npy_load(const char *path, pp_tensor **out);
/* Parses an in-memory .npy image; name is used in error messages. */
PP_API pp_status pp_npy_parse(const void *bytes, size_t len, const char *name, pp_tensor **out);
/* Writes version 1.0 (2.0 if the header needs it), durably: to a file
 * beside path, fsynced, then renamed over it (a crash leaves the old file
 * or the whole new one). */
PP_API pp_status pp_npy_save(const char *path, const pp_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
