/* Internal: the weights pp_onnx_load_deferred leaves unread (lib/onnx_deferred.c),
 * recorded by the importer (lib/onnx_import.c). */
#ifndef PIPPIN_LIB_ONNX_DEFERRED_H
#define PIPPIN_LIB_ONNX_DEFERRED_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/onnx.h"

/* An empty record of the model file open as fd (taken: closed by
 * pp_onnx_deferred_free), named path in messages. */
pp_status pp_onnx_deferred_new(int fd, const char *path, pp_onnx_deferred **out);
/* Notes that initializer name's len bytes lie at offset off of the file. */
pp_status pp_onnx_deferred_add(pp_onnx_deferred *d, const char *name, uint64_t off, size_t len);
/* Notes that initializer name's len bytes lie at offset off of the
 * external-data side file open as fd (not taken: the record keeps a
 * close-on-exec duplicate, one per side file), named path in messages. */
pp_status pp_onnx_deferred_add_external(pp_onnx_deferred *d, const char *name, int fd, const char *path,
                                        uint64_t off, size_t len);
/* The load is complete: the record is sorted once, so fills only read it
 * (threads filling different graphs from one record do not race). */
void pp_onnx_deferred_done(pp_onnx_deferred *d);

#endif
