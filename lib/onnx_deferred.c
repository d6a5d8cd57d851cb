/* Weights read after the graph is split: pp_onnx_load_deferred leaves a
 * model's large float initializers unread (zero pages of their own, which
 * cost no memory until written) and this records where each lies, so a
 * command that needs only some stages' weights (a `model:` worker), or
 * none (`pippin inspect`), or all of them only after the shape probe
 * (`pippin split`) never holds the whole model beside the probe's
 * activations. Weights in the model file and in its external-data side
 * files alike: every file read from stays open (close-on-exec), so one
 * renamed over meanwhile is still the file the structure came from; one
 * cut short or rewritten in place (inode, size and modification time) is
 * an error naming it. */
#include "onnx_deferred.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_io.h"

#include "status_internal.h"

/* A file weights are read from: the model file (0) or a side file. */
typedef struct dfile {
    int fd;
    char *path;
    struct stat st; /* the file as loaded: a fill from a file rewritten since would read other bytes */
} dfile;

typedef struct entry {
    char *name;
    uint64_t off;
    size_t len;
    int file;
} entry;

struct pp_onnx_deferred {
    dfile *f;
    int nf, capf;
    entry *e;
    int n, cap;
    int sorted;
};

/* Adds the file open as fd (taken: closed on failure too). */
static pp_status add_file(pp_onnx_deferred *d, int fd, const char *path, const struct stat *st) {
    if (d->nf == d->capf) {
        int cap = d->capf ? d->capf * 2 : 4;
        dfile *f = realloc(d->f, sizeof *f * (size_t)cap);
        if (!f) {
            close(fd);
            return pp_error(PP_ERR_NOMEM, "out of memory");
        }
        d->f = f;
        d->capf = cap;
    }
    char *p = strdup(path);
    if (!p) {
        close(fd);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    d->f[d->nf++] = (dfile){fd, p, *st};
    return PP_OK;
}

pp_status pp_onnx_deferred_new(int fd, const char *path, pp_onnx_deferred **out) {
    pp_onnx_deferred *d = calloc(1, sizeof *d);
    if (!d) {
        close(fd);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    d->sorted = 1;
    struct stat st;
    pp_status s;
    if (fstat(fd, &st) != 0) {
        s = pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
        close(fd);
    } else {
        s = add_file(d, fd, path, &st); /* closes fd on failure */
    }
    if (s != PP_OK) {
        pp_onnx_deferred_free(d);
        return s;
    }
    *out = d;
    return PP_OK;
}

static pp_status add_entry(pp_onnx_deferred *d, const char *name, uint64_t off, size_t len, int file) {
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 64;
        entry *e = realloc(d->e, sizeof *e * (size_t)cap);
        if (!e) return pp_error(PP_ERR_NOMEM, "out of memory");
        d->e = e;
        d->cap = cap;
    }
    if (!(d->e[d->n].name = strdup(name))) return pp_error(PP_ERR_NOMEM, "out of memory");
    d->e[d->n].off = off;
    d->e[d->n].file = file;
    d->e[d->n++].len = len;
    d->sorted = 0;
    return PP_OK;
}

pp_status pp_onnx_deferred_add(pp_onnx_deferred *d, const char *name, uint64_t off, size_t len) {
    return add_entry(d, name, off, len, 0);
}

pp_status pp_onnx_deferred_add_external(pp_onnx_deferred *d, const char *name, int fd, const char *path,
                                        uint64_t off, size_t len) {
    struct stat st;
    if (fstat(fd, &st) != 0) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    int file = 0;
    while (file < d->nf && (d->f[file].st.st_dev != st.st_dev || d->f[file].st.st_ino != st.st_ino)) file++;
    if (file == d->nf) { /* a side file not seen yet: a descriptor of our own, kept for the fills */
        int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (own < 0) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
        PP_TRY(add_file(d, own, path, &st));
    }
    return add_entry(d, name, off, len, file);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const entry *)a)->name, ((const entry *)b)->name);
}

void pp_onnx_deferred_done(pp_onnx_deferred *d) {
    if (d && !d->sorted && d->n) qsort(d->e, (size_t)d->n, sizeof *d->e, by_name);
    if (d) d->sorted = 1;
}

/* The file is the one loaded: same inode, size and modification time (an
 * exporter saving over it in place keeps the inode, not the time). */
static pp_status same_file(const dfile *f, const char *name) {
    struct stat now;
    if (fstat(f->fd, &now) != 0) return pp_error(PP_ERR_IO, "%s: initializer '%s': %s", f->path, name, strerror(errno));
    if (now.st_ino != f->st.st_ino || now.st_dev != f->st.st_dev || now.st_size != f->st.st_size ||
        now.st_mtim.tv_sec != f->st.st_mtim.tv_sec || now.st_mtim.tv_nsec != f->st.st_mtim.tv_nsec)
        return pp_error(PP_ERR_IO, "%s changed since it was loaded (initializer '%s' not read): load it again",
                        f->path, name);
    return PP_OK;
}

pp_status pp_onnx_deferred_fill(pp_onnx_deferred *d, pp_graph *g) {
    if (!d || !g || d->n == 0) return PP_OK;
    if (!d->sorted) return pp_error(PP_ERR_INTERNAL, "%s: deferred record filled before the load finished", d->f[0].path);
    unsigned char checked[64] = {0}; /* files looked at in this fill (past 64: every time) */
    for (int v = 0; v < g->n_values; v++) {
        pp_value *val = &g->values[v];
        if ((val->kind != PP_VALUE_PARAM && val->kind != PP_VALUE_CONST) || !val->data || val->producer >= 0)
            continue;
        entry key = {val->name, 0, 0};
        const entry *e = bsearch(&key, d->e, (size_t)d->n, sizeof *d->e, by_name);
        if (!e) continue;
        /* the loader made this tensor at this size; anything else is not ours */
        const dfile *f = &d->f[e->file];
        if (val->data->nbytes != e->len)
            return pp_error(PP_ERR_INVALID, "%s: initializer '%s' is %zu bytes in graph '%s', %zu in the file",
                            f->path, val->name, val->data->nbytes, g->name ? g->name : "", e->len);
        if (e->file >= (int)sizeof checked || !checked[e->file]) {
            PP_TRY(same_file(f, val->name));
            if (e->file < (int)sizeof checked) checked[e->file] = 1;
        }
        char what[600];
        snprintf(what, sizeof what, "%s: initializer '%s'", f->path, val->name);
        PP_TRY(pp_read_at(f->fd, val->data->data, e->len, e->off, what));
    }
    return PP_OK;
}

void pp_onnx_deferred_free(pp_onnx_deferred *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) free(d->e[i].name);
    free(d->e);
    for (int i = 0; i < d->nf; i++) {
        free(d->f[i].path);
        close(d->f[i].fd);
    }
    free(d->f);
    free(d);
}
