/* Internal: ONNX external data, the side files that hold the initializers
 * of models over 2 GiB (TensorProto.data_location = EXTERNAL with
 * external_data entries location, offset, length, checksum).
 *
 * Reading (lib/onnx_external.c): each side file is opened once per load
 * and each initializer's bytes are read into its own tensor (never
 * mapped: a side file truncated meanwhile is an error, not a SIGBUS).
 * Model files are untrusted: a location must be a relative
 * path that stays inside the model's directory (no absolute path, no '..',
 * no symlink leading out), and offset and length must lie inside the file
 * and match the tensor's byte size.
 *
 * Writing (lib/onnx_external_save.c): pp_onnx_save_with moves initializers
 * into one side file beside the model, each at an aligned offset. */
#ifndef PIPPIN_LIB_ONNX_EXTERNAL_H
#define PIPPIN_LIB_ONNX_EXTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "file_io.h"
#include "onnx.pb-c.h"
#include "pippin/onnx.h"
#include "pippin/tensor.h"

/* The side files of one model load. */
typedef struct pp_onnx_ext pp_onnx_ext;

/* base_dir is the directory the locations are relative to, NULL for a
 * model parsed from memory (then every external initializer is refused,
 * naming it). */
pp_status pp_onnx_ext_open(const char *base_dir, pp_onnx_ext **out);
/* Closes the side files. NULL is ignored. */
void pp_onnx_ext_close(pp_onnx_ext *x);
/* 1 if tp keeps its data in an external file. */
int pp_onnx_ext_is_external(const Onnx__TensorProto *tp);
/* Where an external initializer's bytes lie, checked as for a read (the
 * entries, the location, the side file, the length against the tensor's
 * shape, the range against the file), nothing read. fd, location and path
 * belong to x (valid until pp_onnx_ext_close). */
typedef struct pp_onnx_ext_where {
    int fd;               /* the side file, open read-only */
    uint64_t offset;
    size_t nbytes;        /* the tensor's size, as its header gives it */
    const char *location; /* as the model spells it */
    const char *path;     /* the model's directory joined with it */
} pp_onnx_ext_where;
pp_status pp_onnx_ext_locate(pp_onnx_ext *x, const Onnx__TensorProto *tp, const char *what, pp_onnx_ext_where *w);
/* The tensor tp describes, read from its side file; what names it in
 * messages ("model.onnx: initializer 'w'"). */
pp_status pp_onnx_ext_load(pp_onnx_ext *x, const Onnx__TensorProto *tp, const char *what, pp_tensor **out);

/* Offsets of tensors of at least this many bytes are multiples of it in
 * the side files pippin writes (smaller ones: of 64). */
#define PP_ONNX_EXT_ALIGN 4096

/* Moves the raw data of m's initializers of at least min_bytes (none
 * empty) into a temporary side file opened in *af, and points them at
 * PATH.data (the side file beside the model file path: location
 * 'BASENAME.data'); the caller commits *af (pp_atomic_commit) right
 * before the model file, or discards it. The entries are allocated with
 * alloc(ctx, size) (zeroed; owned by the caller). *moved counts the
 * initializers moved; with none, *af stays closed. */
pp_status pp_onnx_ext_write(Onnx__ModelProto *m, const char *path, size_t min_bytes,
                            void *(*alloc)(void *ctx, size_t size), void *ctx, pp_atomic_file *af, int *moved);

#endif
