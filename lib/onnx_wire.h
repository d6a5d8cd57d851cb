/* Internal: a ModelProto's bytes with the raw_data of its graph initializers
 * left where they are. protobuf-c copies every bytes field it decodes, so a
 * model decoded as it is costs its file plus a copy of every weight before
 * the tensors are even made. pp_onnx_wire_strip writes the model again
 * without those payloads: each initializer's last raw_data (if at least
 * min_bytes) becomes an empty raw_data and a fixed64 field of a reserved
 * number holding where the bytes are in the input. The importer decodes
 * the stripped bytes and reads (or copies) each payload straight into its
 * tensor (pp_onnx_wire_raw_data). Everything else is copied verbatim, so
 * protobuf-c sees the same message but for those payloads. */
#ifndef PIPPIN_LIB_ONNX_WIRE_H
#define PIPPIN_LIB_ONNX_WIRE_H

#include <stddef.h>

#include "onnx.pb-c.h"
#include "pippin/status.h"

/* *out (malloc'd, caller frees) holds the stripped model, *out_len its
 * size. PP_ERR_PARSE when the input is not well-formed where it is walked
 * (the model, its graph and initializer messages) or already uses the
 * reserved field: the caller then decodes the input as it is, which gives
 * the same result as before for any input. */
pp_status pp_onnx_wire_strip(const unsigned char *in, size_t len, size_t min_bytes, unsigned char **out,
                             size_t *out_len);

/* The same, the input being the len bytes of the file open as fd (name
 * names it in messages). Only what the walk needs is read (pp_read_at,
 * in 64 KiB chunks, into memory given back on return), never the payloads
 * it strips, which the importer then reads into their tensors; the file
 * is never mapped. PP_ERR_IO when the file is shorter than len (cut short
 * since it was measured). */
pp_status pp_onnx_wire_strip_fd(int fd, size_t len, const char *name, size_t min_bytes, unsigned char **out,
                                size_t *out_len);

/* Where a stripped initializer's raw_data lies in the input given to
 * pp_onnx_wire_strip: 1 and *offset, *len (bounds-checked against
 * in_len) if tp was stripped, 0 if not, -1 if its record is broken. */
int pp_onnx_wire_raw_data(const Onnx__TensorProto *tp, size_t in_len, size_t *offset, size_t *len);

#endif
