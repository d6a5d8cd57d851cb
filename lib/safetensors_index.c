/* A safetensors file's header without its data (lib/safetensors_index.h). */
#include "safetensors_index.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_io.h"
#include "log_internal.h"
#include "pippin/safetensors.h"
#include "status_internal.h"

static const struct {
    pp_dtype dt;
    const char *name;
} dtypes[] = {{PP_F32, "F32"}, {PP_F64, "F64"}, {PP_F16, "F16"}, {PP_BF16, "BF16"}, {PP_I64, "I64"},
              {PP_I32, "I32"}, {PP_I8, "I8"},   {PP_U8, "U8"},    {PP_BOOL, "BOOL"}};

static pp_dtype dtype_of_tag(const char *tag) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtypes[i].name, tag) == 0) return dtypes[i].dt;
    return PP_DTYPE_UNDEFINED;
}

void pp_safetensors_index_free(pp_safetensors_index *ix) {
    if (!ix) return;
    if (ix->fd >= 0) close(ix->fd);
    for (int i = 0; i < ix->n; i++) free(ix->entries[i].name);
    for (int i = 0; i < ix->n_meta; i++) {
        free(ix->meta_keys[i]);
        free(ix->meta_values[i]);
    }
    free(ix->entries);
    free(ix->meta_keys);
    free(ix->meta_values);
    free(ix->name);
    free(ix);
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

static pp_status parse_meta(json_object *meta, const char *name, pp_safetensors_index *ix) {
    if (!json_object_is_type(meta, json_type_object))
        return pp_error(PP_ERR_PARSE, "%s: __metadata__ is not an object", name);
    int n = json_object_object_length(meta);
    ix->meta_keys = calloc((size_t)n + 1, sizeof *ix->meta_keys);
    ix->meta_values = calloc((size_t)n + 1, sizeof *ix->meta_values);
    if (!ix->meta_keys || !ix->meta_values) return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    json_object_object_foreach(meta, k, v) {
        if (!json_object_is_type(v, json_type_string))
            return pp_error(PP_ERR_PARSE, "%s: __metadata__ '%s' is not a string", name, k);
        ix->meta_keys[ix->n_meta] = strdup(k);
        ix->meta_values[ix->n_meta] = strdup(json_object_get_string(v));
        if (!ix->meta_keys[ix->n_meta++] || !ix->meta_values[ix->n_meta - 1])
            return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    }
    return PP_OK;
}

/* One entry's dtype, shape and data offsets [*begin, *end), checked
 * against the data size. */
static pp_status parse_entry(const char *name, const char *key, json_object *e, uint64_t data_len,
                             pp_safetensors_entry *out, uint64_t *begin, uint64_t *end) {
    json_object *v, *shp, *off;
    if (!json_object_is_type(e, json_type_object))
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': not an object", name, key);
    if (!json_object_object_get_ex(e, "dtype", &v) || !json_object_is_type(v, json_type_string))
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': no dtype", name, key);
    if ((out->dtype = dtype_of_tag(json_object_get_string(v))) == PP_DTYPE_UNDEFINED)
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
        out->shape[d] = (int64_t)x;
    }
    out->ndim = (int)nd;
    if (!json_object_object_get_ex(e, "data_offsets", &off) || !json_object_is_type(off, json_type_array) ||
        json_object_array_length(off) != 2 || !get_u64(json_object_array_get_idx(off, 0), data_len, begin) ||
        !get_u64(json_object_array_get_idx(off, 1), data_len, end) || *end < *begin)
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': data_offsets are not [begin, end] within the %" PRIu64 " data bytes",
                        name, key, data_len);
    size_t es = pp_dtype_size(out->dtype);
    if (numel > UINT64_MAX / es || numel * es != *end - *begin)
        return pp_error(PP_ERR_PARSE, "%s: tensor '%s': %" PRIu64 " bytes for a %s tensor of %" PRIu64 " elements", name,
                        key, *end - *begin, json_object_get_string(v), numel);
    out->nbytes = (size_t)(*end - *begin);
    return PP_OK;
}

static int by_offset(const void *a, const void *b) {
    const pp_safetensors_entry *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* The header's entries, in file order; data_at: the data's first byte in
 * the file, data_len: its size. */
static pp_status parse_header(json_object *head, uint64_t data_at, uint64_t data_len, pp_safetensors_index *ix) {
    const char *name = ix->name;
    if (!json_object_is_type(head, json_type_object)) return pp_error(PP_ERR_PARSE, "%s: the header is not a JSON object", name);
    int cap = json_object_object_length(head);
    if (!(ix->entries = calloc((size_t)cap + 1, sizeof *ix->entries))) return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    pp_status s = PP_OK;
    json_object_object_foreach(head, key, e) {
        if (s != PP_OK) break;
        if (strcmp(key, "__metadata__") == 0) {
            s = parse_meta(e, name, ix);
            continue;
        }
        pp_safetensors_entry *en = &ix->entries[ix->n];
        uint64_t begin = 0, end = 0;
        s = parse_entry(name, key, e, data_len, en, &begin, &end);
        en->offset = data_at + begin;
        if (s == PP_OK && !(en->name = strdup(key))) s = pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
        if (en->name) ix->n++; /* freed with ix */
    }
    /* The data is indexed entirely, without holes or overlaps (the spec). */
    if (s == PP_OK) qsort(ix->entries, (size_t)ix->n, sizeof *ix->entries, by_offset);
    uint64_t at = data_at;
    for (int i = 0; i < ix->n && s == PP_OK; i++) {
        if (ix->entries[i].offset != at)
            s = pp_error(PP_ERR_PARSE, "%s: tensor '%s' starts at data byte %" PRIu64 ", expected %" PRIu64
                         " (a hole or an overlap)", name, ix->entries[i].name, ix->entries[i].offset - data_at,
                         at - data_at);
        at = ix->entries[i].offset + ix->entries[i].nbytes;
    }
    if (s == PP_OK && at - data_at != data_len)
        s = pp_error(PP_ERR_PARSE, "%s: %" PRIu64 " data bytes, the tensors cover %" PRIu64, name, data_len, at - data_at);
    return s;
}

/* The header text of hlen bytes (read from the file or pointing into the
 * image) parsed into ix. */
static pp_status parse_text(const unsigned char *text, uint64_t hlen, pp_safetensors_index *ix) {
    const char *name = ix->name;
    /* json-c would take leading blanks, invalid UTF-8 and an escaped NUL
     * (which cuts a name short, so two names could become one) */
    if (hlen == 0 || text[0] != '{') return pp_error(PP_ERR_PARSE, "%s: the header does not start with '{'", name);
    if (memmem(text, hlen, "\\u0000", 6))
        return pp_error(PP_ERR_PARSE, "%s: the header holds an escaped NUL character", name);
    json_tokener *tok = json_tokener_new_ex(64);
    if (!tok) return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *head = json_tokener_parse_ex(tok, (const char *)text, (int)hlen);
    enum json_tokener_error err = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    pp_status s = PP_OK;
    if (!head || err != json_tokener_success)
        s = pp_error(PP_ERR_PARSE, "%s: the header is not JSON (%s)", name, json_tokener_error_desc(err));
    for (size_t i = used; s == PP_OK && i < hlen; i++) /* only padding after the object */
        if (text[i] != ' ') s = pp_error(PP_ERR_PARSE, "%s: bytes after the header's JSON", name);
    if (s == PP_OK) s = parse_header(head, 8 + hlen, ix->size - 8 - hlen, ix);
    json_object_put(head);
    return s;
}

/* The 8-byte header length, checked against the file's size. */
static pp_status header_len(const unsigned char b[8], const pp_safetensors_index *ix, uint64_t *hlen) {
    *hlen = 0;
    for (int i = 7; i >= 0; i--) *hlen = (*hlen << 8) | b[i];
    if (*hlen > PP_SAFETENSORS_MAX_HEADER || *hlen > ix->size - 8)
        return pp_error(PP_ERR_PARSE, "%s: header of %" PRIu64 " bytes in a file of %" PRIu64, ix->name, *hlen, ix->size);
    return PP_OK;
}

static pp_status new_index(const char *name, uint64_t size, pp_safetensors_index **out) {
    pp_safetensors_index *ix = calloc(1, sizeof *ix);
    if (ix) ix->fd = -1;
    if (!ix || !(ix->name = strdup(name))) {
        free(ix);
        return pp_error(PP_ERR_NOMEM, "%s: out of memory", name);
    }
    ix->size = size;
    if (size < 8) {
        pp_status s = pp_error(PP_ERR_PARSE, "%s: %" PRIu64 " bytes, too short for a safetensors file", name, size);
        pp_safetensors_index_free(ix);
        return s;
    }
    *out = ix;
    return PP_OK;
}

pp_status pp_safetensors_index_parse(const void *bytes, size_t len, const char *name, pp_safetensors_index **out) {
    *out = NULL;
    pp_safetensors_index *ix;
    PP_TRY(new_index(name, len, &ix));
    ix->bytes = bytes;
    uint64_t hlen;
    pp_status s = header_len(ix->bytes, ix, &hlen);
    if (s == PP_OK) s = parse_text(ix->bytes + 8, hlen, ix);
    if (s != PP_OK) {
        pp_safetensors_index_free(ix);
        return s;
    }
    *out = ix;
    return PP_OK;
}

pp_status pp_safetensors_index_open(const char *path, pp_safetensors_index **out) {
    *out = NULL;
    int fd;
    size_t size;
    PP_TRY(pp_open_file(path, SIZE_MAX / 2, &fd, &size));
    pp_safetensors_index *ix;
    pp_status s = new_index(path, size, &ix);
    if (s != PP_OK) {
        close(fd);
        return s;
    }
    ix->fd = fd;
    unsigned char len8[8], *text = NULL;
    uint64_t hlen = 0;
    s = pp_read_at(fd, len8, 8, 0, path);
    if (s == PP_OK) s = header_len(len8, ix, &hlen);
    if (s == PP_OK && !(text = malloc(hlen + 1))) s = pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
    if (s == PP_OK) s = pp_read_at(fd, text, hlen, 8, path);
    if (s == PP_OK) s = parse_text(text, hlen, ix);
    free(text);
    if (s != PP_OK) {
        pp_safetensors_index_free(ix);
        return s;
    }
    pp_debug("%s: header read: %d tensors, %" PRIu64 " data bytes", path, ix->n, ix->size - 8 - hlen);
    *out = ix;
    return PP_OK;
}

pp_status pp_safetensors_index_read(const pp_safetensors_index *ix, int i, void *dst) {
    const pp_safetensors_entry *e = &ix->entries[i];
    if (!e->nbytes) return PP_OK;
    if (ix->bytes) { /* the image's size bounds every entry (parse_header) */
        memcpy(dst, ix->bytes + e->offset, e->nbytes);
        return PP_OK;
    }
    char what[512];
    snprintf(what, sizeof what, "%s: tensor '%s'", ix->name, e->name);
    return pp_read_at(ix->fd, dst, e->nbytes, e->offset, what);
}

const char *pp_safetensors_index_meta(const pp_safetensors_index *ix, const char *key) {
    for (int i = 0; i < ix->n_meta; i++)
        if (strcmp(ix->meta_keys[i], key) == 0) return ix->meta_values[i];
    return NULL;
}
