/* safetensors read and write (pippin/safetensors.h). */
#include "pippin/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "safetensors_index.h"
#include "status_internal.h"

static const struct {
    pp_dtype dt;
    const char *name;
} dtypes[] = {{PP_F32, "F32"}, {PP_F64, "F64"}, {PP_F16, "F16"}, {PP_BF16, "BF16"}, {PP_I64, "I64"},
              {PP_I32, "I32"}, {PP_I8, "I8"},   {PP_U8, "U8"},    {PP_BOOL, "BOOL"}};

static const char *dtype_tag(pp_dtype dt) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].dt == dt) return dtypes[i].name;
    return NULL;
}

/* ---- writing ---- */

pp_status pp_safetensors_save(const char *path, int n, const char *const *names, pp_tensor *const *tensors,
                              int n_meta, const char *const *meta_keys, const char *const *meta_values) {
    json_object *head = json_object_new_object();
    if (!head) return pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
    pp_status s = PP_OK;
    if (n_meta > 0) {
        json_object *meta = json_object_new_object();
        for (int i = 0; i < n_meta; i++) json_object_object_add(meta, meta_keys[i], json_object_new_string(meta_values[i]));
        json_object_object_add(head, "__metadata__", meta);
    }
    uint64_t offset = 0;
    for (int i = 0; i < n && s == PP_OK; i++) {
        const pp_tensor *t = tensors[i];
        const char *tag = dtype_tag(t->dtype);
        if (!tag) s = pp_error(PP_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s has no safetensors name", path, names[i],
                               pp_dtype_name(t->dtype));
        else if (strcmp(names[i], "__metadata__") == 0 || json_object_object_get_ex(head, names[i], NULL))
            s = pp_error(PP_ERR_INVALID, "%s: tensor name '%s' is used twice or reserved", path, names[i]);
        if (s != PP_OK) break;
        json_object *e = json_object_new_object(), *shape = json_object_new_array(), *off = json_object_new_array();
        for (int d = 0; d < t->ndim; d++) json_object_array_add(shape, json_object_new_int64(t->shape[d]));
        json_object_array_add(off, json_object_new_int64((int64_t)offset));
        json_object_array_add(off, json_object_new_int64((int64_t)(offset + t->nbytes)));
        json_object_object_add(e, "dtype", json_object_new_string(tag));
        json_object_object_add(e, "shape", shape);
        json_object_object_add(e, "data_offsets", off);
        json_object_object_add(head, names[i], e);
        offset += t->nbytes;
    }
    pp_atomic_file af = {0};
    if (s == PP_OK) s = pp_atomic_open(path, &af);
    if (s == PP_OK) {
        const char *text = json_object_to_json_string_ext(head, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        size_t len = strlen(text), padded = (len + 7) / 8 * 8; /* the data starts 8-aligned */
        unsigned char size[8];
        for (int b = 0; b < 8; b++) size[b] = (unsigned char)((uint64_t)padded >> (8 * b));
        int ok = fwrite(size, 1, 8, af.f) == 8 && fwrite(text, 1, len, af.f) == len;
        for (size_t k = len; ok && k < padded; k++) ok = fputc(' ', af.f) != EOF;
        for (int i = 0; ok && i < n; i++)
            if (tensors[i]->nbytes) ok = fwrite(tensors[i]->data, 1, tensors[i]->nbytes, af.f) == tensors[i]->nbytes;
        if (!ok) {
            s = pp_error(PP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
            pp_atomic_discard(&af);
        } else {
            s = pp_atomic_commit(&af);
        }
    }
    json_object_put(head);
    return s;
}

/* ---- reading ---- */

void pp_safetensors_free(pp_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) {
        free(st->names[i]);
        pp_tensor_free(st->tensors[i]);
    }
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->names);
    free(st->tensors);
    free(st->meta_keys);
    free(st->meta_values);
    free(st);
}

/* Every entry of ix into a tensor of its own: each read once, straight
 * into place. */
static pp_status from_index(pp_safetensors_index *ix, pp_safetensors **out) {
    pp_safetensors *st = calloc(1, sizeof *st);
    pp_status s = st ? PP_OK : pp_error(PP_ERR_NOMEM, "%s: out of memory", ix->name);
    if (s == PP_OK) {
        st->names = calloc((size_t)ix->n + 1, sizeof *st->names);
        st->tensors = calloc((size_t)ix->n + 1, sizeof *st->tensors);
        if (!st->names || !st->tensors) s = pp_error(PP_ERR_NOMEM, "%s: out of memory", ix->name);
    }
    for (int i = 0; i < ix->n && s == PP_OK; i++) {
        const pp_safetensors_entry *e = &ix->entries[i];
        s = pp_tensor_empty(e->dtype, e->ndim, e->shape, &st->tensors[i]);
        if (s == PP_OK) {
            st->n = i + 1;
            s = pp_safetensors_index_read(ix, i, st->tensors[i]->data);
            st->names[i] = e->name; /* taken over from ix */
            ix->entries[i].name = NULL;
        }
    }
    if (s == PP_OK) { /* the metadata taken over too */
        st->n_meta = ix->n_meta;
        st->meta_keys = ix->meta_keys;
        st->meta_values = ix->meta_values;
        ix->n_meta = 0;
        ix->meta_keys = ix->meta_values = NULL;
    }
    if (s != PP_OK) {
        pp_safetensors_free(st);
        return s;
    }
    *out = st;
    return PP_OK;
}

pp_status pp_safetensors_parse(const void *bytes, size_t len, const char *name, pp_safetensors **out) {
    *out = NULL;
    pp_safetensors_index *ix;
    PP_TRY(pp_safetensors_index_parse(bytes, len, name, &ix));
    pp_status s = from_index(ix, out);
    pp_safetensors_index_free(ix);
    return s;
}

pp_status pp_safetensors_load(const char *path, pp_safetensors **out) {
    *out = NULL;
    pp_safetensors_index *ix;
    PP_TRY(pp_safetensors_index_open(path, &ix));
    pp_status s = from_index(ix, out);
    pp_safetensors_index_free(ix);
    return s;
}

const pp_tensor *pp_safetensors_find(const pp_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->names[i], name) == 0) return st->tensors[i];
    return NULL;
}

const char *pp_safetensors_meta(const pp_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}
