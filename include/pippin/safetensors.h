/* safetensors files (the format of Hugging Face's safetensors library):
 * an 8-byte little-endian header length, a JSON header mapping each tensor
 * name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the
 * data that follows) plus an optional "__metadata__" object of strings,
 * then the raw little-endian bytes of every tensor, without holes.
 * pippin's checkpoints are safetensors files (pippin/checkpoint.h), so
 * `safetensors.torch.load_file` reads them.
 *
 * Thread safety: reentrant; a loaded file is read-only. */
#ifndef PIPPIN_SAFETENSORS_H
#define PIPPIN_SAFETENSORS_H

#include <stddef.h>

#include "pippin/export.h"
#include "pippin/status.h"
#include "pippin/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Headers longer than this are refused (safetensors' own limit). */
#define PP_SAFETENSORS_MAX_HEADER ((size_t)100 << 20)

typedef struct pp_safetensors {
    int n;                  /* tensors, in file order (by offset) */
    char **names;
    pp_tensor **tensors;    /* owned copies of the data */
    int n_meta;             /* "__metadata__" entries */
    char **meta_keys;
    char **meta_values;
} pp_safetensors;

/* Writes n tensors (names unique, not "__metadata__") and n_meta metadata
 * strings, durably (a file beside path, fsynced, renamed over it). dtypes:
 * F32 F64 F16 BF16 I64 I32 I8 U8 BOOL. */
PP_API pp_status pp_safetensors_save(const char *path, int n, const char *const *names, pp_tensor *const *tensors,
                                     int n_meta, const char *const *meta_keys, const char *const *meta_values);
/* Reads the header, then each tensor once, straight into its own tensor
 * (the file is never held whole). Offsets are checked against the file's
 * size; a file cut short while it is read gives PP_ERR_IO naming the file
 * and the tensor. */
PP_API pp_status pp_safetensors_load(const char *path, pp_safetensors **out);
/* Parses a file image in memory; name is used in messages. Every offset,
 * shape and dtype is checked before a tensor is built. */
PP_API pp_status pp_safetensors_parse(const void *bytes, size_t len, const char *name, pp_safetensors **out);
PP_API void pp_safetensors_free(pp_safetensors *st);

/* The tensor called name (borrowed), or NULL. */
PP_API const pp_tensor *pp_safetensors_find(const pp_safetensors *st, const char *name);
/* The metadata value of key (borrowed), or NULL. */
PP_API const char *pp_safetensors_meta(const pp_safetensors *st, const char *key);

#ifdef __cplusplus
}
#endif
#endif
