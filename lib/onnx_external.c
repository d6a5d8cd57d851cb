/* Reading ONNX external data: initializers whose bytes live in a side file
 * beside the model (see onnx_external.h for the rules). Each side file is
 * opened once per load and each initializer's bytes are read (pread) into
 * its tensor. They were once mapped and borrowed by the tensors, which
 * saved the copy but let any process that truncates the side file kill
 * this one with SIGBUS, at load or at any later use of a weight. */
#include "onnx_external.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grow.h"
#include "onnx_tensor.h"

#include "log_internal.h"
#include "status_internal.h"

typedef struct {
    char *location; /* as the model spells it */
    char *path;     /* the model's directory joined with it, for messages */
    int fd;
    size_t len; /* when opened */
} ext_file;

struct pp_onnx_ext {
    char *base_dir; /* NULL: parsed from memory */
    ext_file *files;
    int n_files, cap_files;
};

pp_status pp_onnx_ext_open(const char *base_dir, pp_onnx_ext **out) {
    *out = NULL;
    pp_onnx_ext *x = calloc(1, sizeof *x);
    if (!x) return pp_error(PP_ERR_NOMEM, "out of memory");
    /* Resolved when a side file is opened: most models have none. */
    if (base_dir && !(x->base_dir = strdup(base_dir[0] ? base_dir : "."))) {
        pp_onnx_ext_close(x);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    *out = x;
    return PP_OK;
}

void pp_onnx_ext_close(pp_onnx_ext *x) {
    if (!x) return;
    for (int i = 0; i < x->n_files; i++) {
        free(x->files[i].location);
        free(x->files[i].path);
        close(x->files[i].fd);
    }
    free(x->files);
    free(x->base_dir);
    free(x);
}

int pp_onnx_ext_is_external(const Onnx__TensorProto *tp) {
    return tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
}

/* A decimal count without sign, spaces or overflow. */
static int parse_u64(const char *s, uint64_t *v) {
    if (!s || !*s) return 0;
    uint64_t n = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return 0;
        unsigned d = (unsigned)(*s - '0');
        if (n > (UINT64_MAX - d) / 10) return 0;
        n = n * 10 + d;
    }
    *v = n;
    return 1;
}

typedef struct {
    const char *location;
    uint64_t offset, length;
    int has_length;
} ext_ref;

static pp_status read_entries(const Onnx__TensorProto *tp, const char *what, ext_ref *r) {
    memset(r, 0, sizeof *r);
    int seen_offset = 0;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const Onnx__StringStringEntryProto *e = tp->external_data[i];
        const char *k = e->key ? e->key : "", *v = e->value ? e->value : "";
        if (strcmp(k, "location") == 0) {
            if (r->location) return pp_error(PP_ERR_PARSE, "%s: external data key 'location' appears twice", what);
            r->location = v;
        } else if (strcmp(k, "offset") == 0) {
            if (seen_offset++) return pp_error(PP_ERR_PARSE, "%s: external data key 'offset' appears twice", what);
            if (!parse_u64(v, &r->offset))
                return pp_error(PP_ERR_PARSE, "%s: external data offset '%s' is not a byte count", what, v);
        } else if (strcmp(k, "length") == 0) {
            if (r->has_length++) return pp_error(PP_ERR_PARSE, "%s: external data key 'length' appears twice", what);
            if (!parse_u64(v, &r->length))
                return pp_error(PP_ERR_PARSE, "%s: external data length '%s' is not a byte count", what, v);
        } else if (strcmp(k, "checksum") != 0) {
            /* checksum (a SHA-1 of the whole side file) is not verified:
             * that would read the whole file once more; lengths are checked */
            pp_debug("%s: external data key '%s' ignored", what, k);
        }
    }
    if (!r->location || !r->location[0])
        return pp_error(PP_ERR_PARSE, "%s: external data without a 'location'", what);
    return PP_OK;
}

/* Lexical rules on a location: relative, no '..' component. */
static pp_status check_location(const char *what, const char *loc) {
    if (loc[0] == '/')
        return pp_error(PP_ERR_INVALID, "%s: external data '%s': an absolute path (it must be relative to the "
                        "model's directory)", what, loc);
    for (const char *p = loc; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return pp_error(PP_ERR_INVALID, "%s: external data '%s': a '..' component (it must stay inside the "
                            "model's directory)", what, loc);
        p += n;
        while (*p == '/') p++;
    }
    return PP_OK;
}

/* Resolves loc under the base directory, refusing any path whose real
 * location (symlinks followed) is outside it, and opens it read-only. */
static pp_status open_side_file(pp_onnx_ext *x, const char *what, const char *loc, int *fd_out, off_t *size) {
    *fd_out = -1;
    if (!x->base_dir)
        return pp_error(PP_ERR_UNSUPPORTED, "%s: data is in external file '%s', but a model parsed from memory "
                        "has no directory to find it in (load the model from its file)", what, loc);
    PP_TRY(check_location(what, loc));
    char base[PATH_MAX], joined[2 * PATH_MAX + 2], real[PATH_MAX];
    if (!realpath(x->base_dir, base))
        return pp_error(PP_ERR_IO, "%s: external data '%s': model directory '%s': %s", what, loc, x->base_dir,
                        strerror(errno));
    if ((size_t)snprintf(joined, sizeof joined, "%s/%s", base, loc) >= sizeof joined)
        return pp_error(PP_ERR_INVALID, "%s: external data '%s': path too long", what, loc);
    if (!realpath(joined, real))
        return pp_error(PP_ERR_IO, "%s: external data file '%s': %s", what, loc, strerror(errno));
    size_t bl = strcmp(base, "/") == 0 ? 0 : strlen(base);
    if (strncmp(real, base, bl) != 0 || real[bl] != '/')
        return pp_error(PP_ERR_INVALID, "%s: external data file '%s' resolves to '%s', outside the model's "
                        "directory '%s'", what, loc, real, base);
    /* O_NOFOLLOW: real has no symlink left unless one was swapped in since;
     * O_NONBLOCK: a FIFO must not hang the load (refused below) */
    int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return pp_error(PP_ERR_IO, "%s: external data file '%s': %s", what, loc, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pp_error(PP_ERR_IO, "%s: external data file '%s': %s", what, loc, strerror(e));
    }
    /* the file opened is still beneath the directory: an intermediate
     * directory swapped for a symlink between realpath and open would show
     * here (O_NOFOLLOW guards the last component only) */
    char proc[64], opened[PATH_MAX];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    ssize_t plen = readlink(proc, opened, sizeof opened - 1);
    if (plen > 0) {
        opened[plen] = 0;
        if (strncmp(opened, base, bl) != 0 || opened[bl] != '/') {
            close(fd);
            return pp_error(PP_ERR_INVALID, "%s: external data file '%s' opened as '%s', outside the model's "
                            "directory '%s' (moved while it was being opened?)", what, loc, opened, base);
        }
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pp_error(PP_ERR_IO, "%s: external data file '%s': not a regular file", what, loc);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return pp_error(PP_ERR_UNSUPPORTED, "%s: external data file '%s': too large", what, loc);
    }
    *fd_out = fd;
    *size = st.st_size;
    return PP_OK;
}

/* The side file loc, opened on first use. */
static pp_status get_file(pp_onnx_ext *x, const char *what, const char *loc, ext_file **out) {
    for (int i = 0; i < x->n_files; i++)
        if (strcmp(x->files[i].location, loc) == 0) {
            *out = &x->files[i];
            return PP_OK;
        }
    int fd;
    off_t size;
    PP_TRY(open_side_file(x, what, loc, &fd, &size));
    char *name = strdup(loc), *path = malloc(strlen(x->base_dir) + strlen(loc) + 2);
    if (!name || !path || PP_GROW(x->files, x->cap_files, x->n_files) != PP_OK) {
        free(name);
        free(path);
        close(fd);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    snprintf(path, strlen(x->base_dir) + strlen(loc) + 2, "%s/%s", x->base_dir, loc);
    ext_file *f = &x->files[x->n_files++];
    f->location = name;
    f->path = path;
    f->fd = fd;
    f->len = (size_t)size;
    *out = f;
    return PP_OK;
}

pp_status pp_onnx_ext_locate(pp_onnx_ext *x, const Onnx__TensorProto *tp, const char *what, pp_onnx_ext_where *w) {
    memset(w, 0, sizeof *w);
    w->fd = -1;
    pp_dtype dt;
    int ndim;
    int64_t shape[PP_MAX_DIMS];
    size_t nbytes;
    PP_TRY(pp_onnx_tensor_header(tp, what, &dt, &ndim, shape, &nbytes));
    if (tp->has_raw_data || tp->n_float_data || tp->n_int32_data || tp->n_int64_data || tp->n_double_data ||
        tp->n_uint64_data || tp->n_string_data)
        return pp_error(PP_ERR_PARSE, "%s: holds data of its own besides its external data", what);
    ext_ref r;
    PP_TRY(read_entries(tp, what, &r));
    ext_file *f = NULL;
    PP_TRY(get_file(x, what, r.location, &f));
    uint64_t length = r.has_length ? r.length : (r.offset <= f->len ? f->len - r.offset : 0);
    if (length != nbytes) {
        char sh[128];
        return pp_error(PP_ERR_PARSE, "%s: external data '%s' gives %llu bytes, but %s %s needs %zu", what,
                        r.location, (unsigned long long)length, pp_dtype_name(dt),
                        pp_shape_str(ndim, shape, sh, sizeof sh), nbytes);
    }
    if (r.offset > f->len || length > f->len - r.offset)
        return pp_error(PP_ERR_PARSE, "%s: external data '%s': bytes %llu..%llu lie past its end (%zu bytes)", what,
                        r.location, (unsigned long long)r.offset,
                        (unsigned long long)(r.offset + length < r.offset ? UINT64_MAX : r.offset + length), f->len);
    w->fd = f->fd;
    w->offset = r.offset;
    w->nbytes = nbytes;
    w->location = f->location;
    w->path = f->path;
    return PP_OK;
}

pp_status pp_onnx_ext_load(pp_onnx_ext *x, const Onnx__TensorProto *tp, const char *what, pp_tensor **out) {
    *out = NULL;
    pp_onnx_ext_where w;
    PP_TRY(pp_onnx_ext_locate(x, tp, what, &w));
    /* little-endian, as raw_data (the only byte order pippin reads) */
    char where[1400];
    snprintf(where, sizeof where, "%s: external data file '%s'", what, w.location);
    return pp_onnx_tensor_read_raw(tp, where, w.fd, w.offset, w.nbytes, out);
}
