/* Internal: conversions between ONNX TensorProto and pp_tensor, shared by
 * the importer and the exporter. */
#ifndef PIPPIN_LIB_ONNX_TENSOR_H
#define PIPPIN_LIB_ONNX_TENSOR_H

#include "onnx.pb-c.h"
#include "pippin/tensor.h"

/* Checks tp's data type and dims (what names it in messages) and gives
 * them with the byte size they need; the data itself is not looked at. */
pp_status pp_onnx_tensor_header(const Onnx__TensorProto *tp, const char *what, pp_dtype *dtype, int *ndim,
                                int64_t *shape, size_t *nbytes);
/* Decodes tp; what names it in messages ("initializer 'w'"). */
pp_status pp_onnx_tensor_from_proto(const Onnx__TensorProto *tp, const char *what, pp_tensor **out);
/* The tensor tp describes (its dims and data type; its own data is
 * ignored) with its len bytes of little-endian raw data read from offset
 * off of file fd straight into place (pp_read_at: a file cut short is an
 * error naming what, the offset and the bytes read). */
pp_status pp_onnx_tensor_read_raw(const Onnx__TensorProto *tp, const char *what, int fd, uint64_t off, size_t len,
                                  pp_tensor **out);
/* 1 when a weight of nbytes may be left unread (pp_onnx_load_deferred). */
int pp_onnx_tensor_may_defer(size_t nbytes);
/* As pp_onnx_tensor_read_raw, with nothing read: the tensor (pages of its
 * own, len at least pp_onnx_tensor_may_defer's size) holds zeros. */
pp_status pp_onnx_tensor_unread_raw(const Onnx__TensorProto *tp, const char *what, size_t len, pp_tensor **out);
/* Fills tp (already initialised with onnx__tensor_proto__init) pointing at
 * t's data (raw_data borrows t->data; keep t alive while tp is used). */
pp_status pp_onnx_tensor_to_proto(const pp_tensor *t, const char *name, Onnx__TensorProto *tp);

#endif
