/* .npy reader and writer. The header is a Python dict literal; we parse only
 * the three keys numpy writes and reject anything else we do not understand. */
#include "pippin/npy.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_io.h"
#include "pippin/status.h"

#include "status_internal.h"
static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

typedef struct {
    const char *p, *end;
} cursor;

static void skip_space(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n')) c->p++;
}

static int eat(cursor *c, char ch) {
    skip_space(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* Reads a quoted string ('...' or "...") into buf. */
static int read_str(cursor *c, char *buf, size_t cap) {
    skip_space(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (n + 1 >= cap) return 0;
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return 0;
    c->p++;
    buf[n] = '\0';
    return 1;
}

static pp_dtype dtype_from_descr(const char *d, const char *name, pp_status *st) {
    static const struct { const char *descr; pp_dtype dt; } table[] = {
        {"<f4", PP_F32}, {"<f8", PP_F64}, {"<f2", PP_F16}, {"<i8", PP_I64}, {"<i4", PP_I32},
        {"|i1", PP_I8},  {"|u1", PP_U8},  {"|b1", PP_BOOL}, {"<i1", PP_I8}, {"<u1", PP_U8},
        {"<b1", PP_BOOL},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].descr, d) == 0) return table[i].dt;
    if (d[0] == '>' && d[1] && strcmp(d + 2, "1") != 0)
        *st = pp_error(PP_ERR_UNSUPPORTED, "%s: big-endian data ('%s') is not supported", name, d);
    else if (strchr(d, 'O'))
        *st = pp_error(PP_ERR_UNSUPPORTED, "%s: object arrays are not supported", name);
    else
        *st = pp_error(PP_ERR_UNSUPPORTED, "%s: unsupported dtype '%s'", name, d);
    return PP_DTYPE_UNDEFINED;
}

static const char *descr_of(pp_dtype dt) {
    switch (dt) {
    case PP_F32: return "<f4";
    case PP_F64: return "<f8";
    case PP_F16: return "<f2";
    case PP_I64: return "<i8";
    case PP_I32: return "<i4";
    case PP_I8: return "|i1";
    case PP_U8: return "|u1";
    case PP_BOOL: return "|b1";
    default: return NULL;
    }
}

static pp_status parse_header(cursor *c, const char *name, pp_dtype *dt, int *ndim,
                              int64_t *shape) {
    int have_descr = 0, have_order = 0, have_shape = 0;
    if (!eat(c, '{')) return pp_error(PP_ERR_PARSE, "%s: header is not a dict", name);
    while (!eat(c, '}')) {
        char key[32], val[32];
        if (!read_str(c, key, sizeof key) || !eat(c, ':'))
            return pp_error(PP_ERR_PARSE, "%s: malformed header", name);
        if (strcmp(key, "descr") == 0) {
            if (!read_str(c, val, sizeof val))
                return pp_error(PP_ERR_UNSUPPORTED, "%s: structured dtypes are not supported", name);
            pp_status st = PP_OK;
            *dt = dtype_from_descr(val, name, &st);
            if (st) return st;
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            skip_space(c);
            if (c->end - c->p >= 5 && memcmp(c->p, "False", 5) == 0) {
                c->p += 5;
            } else if (c->end - c->p >= 4 && memcmp(c->p, "True", 4) == 0) {
                return pp_error(PP_ERR_UNSUPPORTED,
                                "%s: Fortran-order arrays are not supported (save with "
                                "np.ascontiguousarray)", name);
            } else {
                return pp_error(PP_ERR_PARSE, "%s: bad fortran_order value", name);
            }
            have_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (!eat(c, '(')) return pp_error(PP_ERR_PARSE, "%s: shape is not a tuple", name);
            *ndim = 0;
            while (!eat(c, ')')) {
                skip_space(c);
                if (*ndim >= PP_MAX_DIMS)
                    return pp_error(PP_ERR_UNSUPPORTED, "%s: more than %d dims", name, PP_MAX_DIMS);
                /* Digits by hand: strtoll could read past the header, which
                 * is not NUL-terminated (found by fuzz_npy). */
                long long v = 0;
                const char *start = c->p;
                while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
                    if (v > (INT64_MAX - 9) / 10)
                        return pp_error(PP_ERR_PARSE, "%s: shape entry too large", name);
                    v = v * 10 + (*c->p++ - '0');
                }
                if (c->p == start) return pp_error(PP_ERR_PARSE, "%s: bad shape entry", name);
                if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 longs */
                shape[(*ndim)++] = v;
                if (!eat(c, ',')) {
                    if (!eat(c, ')')) return pp_error(PP_ERR_PARSE, "%s: bad shape tuple", name);
                    break;
                }
            }
            have_shape = 1;
        } else {
            return pp_error(PP_ERR_PARSE, "%s: unknown header key '%s'", name, key);
        }
        if (!eat(c, ',')) {
            if (!eat(c, '}')) return pp_error(PP_ERR_PARSE, "%s: malformed header", name);
            break;
        }
    }
    if (!have_descr || !have_order || !have_shape)
        return pp_error(PP_ERR_PARSE, "%s: header lacks descr, fortran_order or shape", name);
    return PP_OK;
}

pp_status pp_npy_parse(const void *bytes, size_t len, const char *name, pp_tensor **out) {
    const unsigned char *b = bytes;
    *out = NULL;
    if (len < 10 || memcmp(b, npy_magic, 6) != 0)
        return pp_error(PP_ERR_PARSE, "%s: not a .npy file (bad magic)", name);
    int major = b[6];
    size_t hlen, hstart;
    if (major == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) return pp_error(PP_ERR_PARSE, "%s: truncated header", name);
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        hstart = 12;
    } else {
        return pp_error(PP_ERR_UNSUPPORTED, "%s: .npy format version %d.%d not supported", name,
                        major, b[7]);
    }
    if (hlen > len - hstart) return pp_error(PP_ERR_PARSE, "%s: truncated header", name);
    cursor c = {(const char *)b + hstart, (const char *)b + hstart + hlen};
    pp_dtype dt = PP_DTYPE_UNDEFINED;
    int ndim = 0;
    int64_t shape[PP_MAX_DIMS];
    PP_TRY(parse_header(&c, name, &dt, &ndim, shape));
    size_t nbytes;
    if (pp_shape_bytes(dt, ndim, shape, &nbytes) != PP_OK)
        return pp_error_context(PP_ERR_PARSE, "%s", name);
    size_t avail = len - hstart - hlen;
    if (nbytes > avail)
        return pp_error(PP_ERR_PARSE, "%s: truncated data (%zu of %zu bytes)", name, avail, nbytes);
    PP_TRY(pp_tensor_empty(dt, ndim, shape, out));
    if (nbytes) memcpy((*out)->data, b + hstart + hlen, nbytes);
    return PP_OK;
}

pp_status pp_npy_load(const char *path, pp_tensor **out) {
    unsigned char *buf;
    size_t len;
    *out = NULL;
    PP_TRY(pp_read_file(path, SIZE_MAX / 2, &buf, &len));
    pp_status st = pp_npy_parse(buf, len, path, out);
    free(buf);
    return st;
}

pp_status pp_npy_save(const char *path, const pp_tensor *t) {
    const char *descr = descr_of(t->dtype);
    if (!descr)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: dtype %s cannot be saved as .npy", path,
                        pp_dtype_name(t->dtype));
    char dict[512], shape[256];
    size_t n = 0;
    shape[0] = '\0';
    for (int i = 0; i < t->ndim; i++)
        n += (size_t)snprintf(shape + n, sizeof shape - n, "%lld,%s", (long long)t->shape[i],
                              (i + 1 < t->ndim) ? " " : "");
    if (t->ndim > 1) shape[n - 1] = '\0'; /* numpy writes (2, 3) but (4,) */
    int dlen = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                        descr, shape);
    /* Total header (magic + version + length + dict + padding + \n) is a multiple of 64. */
    size_t pre = 10;
    size_t total = (pre + (size_t)dlen + 1 + 63) / 64 * 64;
    int major = 1;
    if (total - pre > 65535) {
        pre = 12;
        total = (pre + (size_t)dlen + 1 + 63) / 64 * 64;
        major = 2;
    }
    size_t hlen = total - pre;
    pp_atomic_file af; /* never a truncated file in place of a good one */
    PP_TRY(pp_atomic_open(path, &af));
    FILE *f = af.f;
    unsigned char head[12];
    memcpy(head, npy_magic, 6);
    head[6] = (unsigned char)major;
    head[7] = 0;
    head[8] = hlen & 0xff;
    head[9] = (hlen >> 8) & 0xff;
    head[10] = (hlen >> 16) & 0xff;
    head[11] = (hlen >> 24) & 0xff;
    int ok = fwrite(head, 1, pre, f) == pre && fwrite(dict, 1, (size_t)dlen, f) == (size_t)dlen;
    for (size_t i = (size_t)dlen; ok && i + 1 < hlen; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    if (ok && t->nbytes) ok = fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
    if (!ok) {
        pp_status s = pp_error(PP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        pp_atomic_discard(&af);
        return s;
    }
    return pp_atomic_commit(&af);
}
