/* Writing ONNX external data: the initializers of a model being saved move
 * into one side file beside it, PATH.data, each at an aligned offset (what
 * readers that map the file, ONNX Runtime's among them, want; pippin's
 * own loader reads them, lib/onnx_external.c). */
#include "onnx_external.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

#define SMALL_ALIGN 64

static const unsigned char zeros[PP_ONNX_EXT_ALIGN];

static char *dup_str(void *(*alloc)(void *, size_t), void *ctx, const char *s) {
    char *c = alloc(ctx, strlen(s) + 1);
    if (c) strcpy(c, s);
    return c;
}

static Onnx__StringStringEntryProto *entry(void *(*alloc)(void *, size_t), void *ctx, const char *key,
                                          const char *value) {
    Onnx__StringStringEntryProto *e = alloc(ctx, sizeof *e);
    if (!e) return NULL;
    onnx__string_string_entry_proto__init(e);
    e->key = dup_str(alloc, ctx, key);
    e->value = dup_str(alloc, ctx, value);
    return e->key && e->value ? e : NULL;
}

pp_status pp_onnx_ext_write(Onnx__ModelProto *m, const char *path, size_t min_bytes,
                            void *(*alloc)(void *ctx, size_t size), void *ctx, pp_atomic_file *af, int *moved) {
    memset(af, 0, sizeof *af);
    *moved = 0;
    Onnx__GraphProto *gp = m->graph;
    size_t n = strlen(path);
    char *side = malloc(n + 6);
    if (!side) return pp_error(PP_ERR_NOMEM, "out of memory");
    memcpy(side, path, n);
    memcpy(side + n, ".data", 6);
    const char *slash = strrchr(side, '/');
    const char *location = slash ? slash + 1 : side;
    pp_status s = PP_OK;
    uint64_t at = 0; /* bytes written so far */
    for (size_t i = 0; gp && i < gp->n_initializer && s == PP_OK; i++) {
        Onnx__TensorProto *tp = gp->initializer[i];
        size_t len = tp->has_raw_data ? tp->raw_data.len : 0;
        if (!len || len < min_bytes) continue;
        if (!af->f && (s = pp_atomic_open(side, af)) != PP_OK) break;
        uint64_t align = len >= PP_ONNX_EXT_ALIGN ? PP_ONNX_EXT_ALIGN : SMALL_ALIGN;
        uint64_t off = (at + align - 1) / align * align;
        if (off > at && fwrite(zeros, 1, (size_t)(off - at), af->f) != off - at) {
            s = pp_error(PP_ERR_IO, "%s: write failed: %s", side, strerror(errno));
            break;
        }
        if (fwrite(tp->raw_data.data, 1, len, af->f) != len) {
            s = pp_error(PP_ERR_IO, "%s: write failed: %s", side, strerror(errno));
            break;
        }
        at = off + len;
        char num[2][24];
        snprintf(num[0], sizeof num[0], "%" PRIu64, off);
        snprintf(num[1], sizeof num[1], "%zu", len);
        Onnx__StringStringEntryProto **es = alloc(ctx, 3 * sizeof *es);
        if (!es || !(es[0] = entry(alloc, ctx, "location", location)) ||
            !(es[1] = entry(alloc, ctx, "offset", num[0])) || !(es[2] = entry(alloc, ctx, "length", num[1]))) {
            s = pp_error(PP_ERR_NOMEM, "out of memory exporting");
            break;
        }
        tp->n_external_data = 3;
        tp->external_data = es;
        tp->has_data_location = 1;
        tp->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
        tp->has_raw_data = 0;
        tp->raw_data.len = 0;
        tp->raw_data.data = NULL;
        (*moved)++;
    }
    free(side);
    if (s != PP_OK) pp_atomic_discard(af);
    return s;
}
