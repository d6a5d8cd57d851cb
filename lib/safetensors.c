/* safetensors read and write (pippin/safetensors.h). */
#include "pippin/safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
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

static pp_dtype dtype_of_tag(const char *tag) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtypes[i].name, tag) == 0) return dtypes[i].dt;
    return PP_DTYPE_UNDEFINED;
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

/* A JSON integer in [0, max]. json-c saturates what does not fit an
 * int64 to INT64_MAX, so that value is refused too. */
static int get_u64(json_object *v, uint64_t max, uint64_t *out) {
    if (!json_object_is_type(v, json_type_int)) return 0;
    errno = 0;
    int64_t x = json_object_get_int64(v);
    if (errno || x < 0 || x == INT64_MAX || (uint64_t)x > max) return 0;
    *out = (uint64_t)x;
    return 1;
}

typedef struct span {
    uint64_t begin, end;
    int index;
} span;

static int by_begin(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

static pp_status parse_meta(json_object *meta, const char *name, pp_safetensors *st) {
    if (!json_object_is_type(meta, json_type_object))
        return pp_error(PP_ERR_PARSE, "%s: __metadata__ is not an object", name);
    int n = json_object_object_length(meta);
    st->meta_keys = calloc((size_t)n + 1, sizeof *st->meta_keys);
    st->meta_values = calloc((size_t)n + 1, sizeof *st->meta_values);
    if (!st->meta_keys || !st->meta_values) return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    json_object_object_foreach(meta, k, v) {
        if (!json_object_is_type(v, json_type_string))
            return pp_error(PP_ERR_PARSE, "%s: __metadata__ '%s' is not a string", name, k);
        st->meta_keys[st->n_meta] = strdup(k);
        st->meta_values[st->n_meta] = strdup(json_object_get_string(v));
        if (!st->meta_keys[st->n_meta++] || !st->meta_values[st->n_meta - 1])
            return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    }
    return PP_OK;
}

/* One entry's dtype, shape and offsets, checked against the data size. */
static pp_status parse_entry(const char *name, const char *key, json_object *e, uint64_t data_len, pp_dtype *dt,
                             int *ndim, int64_t *shape, span *sp) {
    json_object *v, *shp, *off;
    if (!json_object_is_type(e, json_type_object))
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': not an object", name, key);
    if (!json_object_object_get_ex(e, "dtype", &v) || !json_object_is_type(v, json_type_string))
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': no dtype", name, key);
    if ((*dt = dtype_of_tag(json_object_get_string(v))) == PP_DTYPE_UNDEFINED)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: tensor '%s': dtype '%s' is not supported", name, key,
                        json_object_get_string(v));
    if (!json_object_object_get_ex(e, "shape", &shp) || !json_object_is_type(shp, json_type_array))
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': no shape", name, key);
    size_t nd = json_object_array_length(shp);
    if (nd > PP_MAX_DIMS) return pp_error(PP_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dims (at most %d)", name, key, nd, PP_MAX_DIMS);
    uint64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        uint64_t x;
        if (!get_u64(json_object_array_get_idx(shp, d), INT64_MAX, &x))
            return pp_error(PP_ERR_PARSE, "%s: tensor '%s': shape[%zu] is not a size", name, key, d);
        if (x && numel > UINT64_MAX / x) return pp_error(PP_ERR_PARSE, "%s: tensor '%s': shape overflows", name, key);
        numel *= x;
        shape[d] = (int64_t)x;
    }
    *ndim = (int)nd;
    if (!json_object_object_get_ex(e, "data_offsets", &off) || !json_object_is_type(off, json_type_array) ||
        json_object_array_length(off) != 2 || !get_u64(json_object_array_get_idx(off, 0), data_len, &sp->begin) ||
        !get_u64(json_object_array_get_idx(off, 1), data_len, &sp->end) || sp->end < sp->begin)
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': data_offsets are not [begin, end] within the %" PRIu64 " data bytes",
                        name, key, data_len);
    size_t es = pp_dtype_size(*dt);
    if (numel > UINT64_MAX / es || numel * es != sp->end - sp->begin)
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': %" PRIu64 " bytes for a %s tensor of %" PRIu64 " elements", name,
                        key, sp->end - sp->begin, json_object_get_string(v), numel);
    return PP_OK;
}

static pp_status parse_header(json_object *head, const unsigned char *data, uint64_t data_len, const char *name,
                              pp_safetensors *st) {
    if (!json_object_is_type(head, json_type_object)) return pp_error(PP_ERR_PARSE, "%s: the header is not a JSON object", name);
    int cap = json_object_object_length(head);
    st->names = calloc((size_t)cap + 1, sizeof *st->names);
    st->tensors = calloc((size_t)cap + 1, sizeof *st->tensors);
    span *spans = calloc((size_t)cap + 1, sizeof *spans);
    pp_status s = st->names && st->tensors && spans ? PP_OK : pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    json_object_object_foreach(head, key, e) {
        if (s != PP_OK) break;
        if (strcmp(key, "__metadata__") == 0) {
            s = parse_meta(e, name, st);
            continue;
        }
        pp_dtype dt = PP_F32;
        int nd = 0;
        int64_t shape[PP_MAX_DIMS];
        span *sp = &spans[st->n];
        s = parse_entry(name, key, e, data_len, &dt, &nd, shape, sp);
        if (s == PP_OK) s = pp_tensor_empty(dt, nd, shape, &st->tensors[st->n]);
        if (s == PP_OK && !(st->names[st->n] = strdup(key))) s = pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
        if (s == PP_OK && sp->end > sp->begin) memcpy(st->tensors[st->n]->data, data + sp->begin, sp->end - sp->begin);
        if (s == PP_OK) sp->index = st->n;
        if (st->tensors[st->n] || st->names[st->n]) st->n++; /* freed with st */
    }
    /* The data is indexed entirely, without holes or overlaps (the spec). */
    if (s == PP_OK) qsort(spans, (size_t)st->n, sizeof *spans, by_begin);
    uint64_t at = 0;
    for (int i = 0; i < st->n && s == PP_OK; i++) {
        if (spans[i].begin != at)
            s = pp_error(PP_ERR_PARSE, "%s: tensor '%s' starts at data byte %" PRIu64 ", expected %" PRIu64
                         " (a hole or an overlap)", name, st->names[spans[i].index], spans[i].begin, at);
        at = spans[i].end;
    }
    if (s == PP_OK && at != data_len)
        s = pp_error(PP_ERR_PARSE, "%s: %" PRIu64 " data bytes, the tensors cover %" PRIu64, name, data_len, at);
    if (s == PP_OK) { /* file order */
        char **names = malloc(sizeof *names * ((size_t)st->n + 1));
        pp_tensor **ts = malloc(sizeof *ts * ((size_t)st->n + 1));
        if (!names || !ts) s = pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
        for (int i = 0; s == PP_OK && i < st->n; i++) {
            names[i] = st->names[spans[i].index];
            ts[i] = st->tensors[spans[i].index];
        }
        if (s == PP_OK) {
            free(st->names);
            free(st->tensors);
            st->names = names;
            st->tensors = ts;
        } else {
            free(names);
            free(ts);
        }
    }
    free(spans);
    return s;
}

pp_status pp_safetensors_parse(const void *bytes, size_t len, const char *name, pp_safetensors **out) {
    *out = NULL;
    const unsigned char *b = bytes;
    if (len < 8) return pp_error(PP_ERR_PARSE, "%s: %zu bytes, too short for a safetensors file", name, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    if (hlen > PP_SAFETENSORS_MAX_HEADER || hlen > len - 8)
        return pp_error(PP_ERR_PARSE, "%s: header of %" PRIu64 " bytes in a file of %zu", name, hlen, len);
    /* json-c would take leading blanks, invalid UTF-8 and an escaped NUL
     * (which cuts a name short, so two names could become one) */
    if (hlen == 0 || b[8] != '{') return pp_error(PP_ERR_PARSE, "%s: the header does not start with '{'", name);
    if (memmem(b + 8, hlen, "\\u0000", 6))
        return pp_error(PP_ERR_PARSE, "%s: the header holds an escaped NUL character", name);
    json_tokener *tok = json_tokener_new_ex(64);
    if (!tok) return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *head = json_tokener_parse_ex(tok, (const char *)b + 8, (int)hlen);
    enum json_tokener_error err = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    pp_status s = PP_OK;
    if (!head || err != json_tokener_success)
        s = pp_error(PP_ERR_PARSE, "%s: the header is not JSON (%s)", name, json_tokener_error_desc(err));
    for (size_t i = used; s == PP_OK && i < hlen; i++) /* only padding after the object */
        if (b[8 + i] != ' ') s = pp_error(PP_ERR_PARSE, "%s: bytes after the header's JSON", name);
    pp_safetensors *st = s == PP_OK ? calloc(1, sizeof *st) : NULL;
    if (s == PP_OK && !st) s = pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    if (s == PP_OK) s = parse_header(head, b + 8 + hlen, len - 8 - hlen, name, st);
    json_object_put(head);
    if (s != PP_OK) {
        pp_safetensors_free(st);
        return s;
    }
    *out = st;
    return PP_OK;
}

pp_status pp_safetensors_load(const char *path, pp_safetensors **out) {
    unsigned char *buf;
    size_t len;
    *out = NULL;
    PP_TRY(pp_read_file(path, SIZE_MAX / 2, &buf, &len));
    pp_status s = pp_safetensors_parse(buf, len, path, out);
    free(buf);
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
