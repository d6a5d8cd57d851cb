/* Weights read after the graph is split: pp_onnx_load_deferred leaves a
 * model's large float initializers unread (zero pages of their own, which
 * cost no memory until written) and this records where each lies, so a
 * command that needs only some stages' weights (a `model:` worker), or
 * none (`pippin inspect`), or all of them only after the shape probe
 * (`pippin split`) never holds the whole model beside the probe's
 * activations. The model file stays open: one renamed over meanwhile is
 * still the file the structure came from, one cut short is an error. */
#include "onnx_deferred.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_io.h"

#include "status_internal.h"

typedef struct entry {
    char *name;
    uint64_t off;
    size_t len;
} entry;

struct pp_onnx_deferred {
    int fd;
    char *path;
    entry *e;
    int n, cap;
    int sorted;
    struct stat st; /* the file as loaded: a fill from a file rewritten since would read other bytes */
};

pp_status pp_onnx_deferred_new(int fd, const char *path, pp_onnx_deferred **out) {
    pp_onnx_deferred *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(path))) {
        free(d);
        close(fd);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    d->fd = fd;
    d->sorted = 1;
    if (fstat(fd, &d->st) != 0) {
        pp_status s = pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
        pp_onnx_deferred_free(d);
        return s;
    }
    *out = d;
    return PP_OK;
}

pp_status pp_onnx_deferred_add(pp_onnx_deferred *d, const char *name, uint64_t off, size_t len) {
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 64;
        entry *e = realloc(d->e, sizeof *e * (size_t)cap);
        if (!e) return pp_error(PP_ERR_NOMEM, "out of memory");
        d->e = e;
        d->cap = cap;
    }
    if (!(d->e[d->n].name = strdup(name))) return pp_error(PP_ERR_NOMEM, "out of memory");
    d->e[d->n].off = off;
    d->e[d->n++].len = len;
    d->sorted = 0;
    return PP_OK;
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
static pp_status same_file(const pp_onnx_deferred *d, const char *name) {
    struct stat now;
    if (fstat(d->fd, &now) != 0) return pp_error(PP_ERR_IO, "%s: initializer '%s': %s", d->path, name, strerror(errno));
    if (now.st_ino != d->st.st_ino || now.st_dev != d->st.st_dev || now.st_size != d->st.st_size ||
        now.st_mtim.tv_sec != d->st.st_mtim.tv_sec || now.st_mtim.tv_nsec != d->st.st_mtim.tv_nsec)
        return pp_error(PP_ERR_IO, "%s changed since it was loaded (initializer '%s' not read): load it again",
                        d->path, name);
    return PP_OK;
}

pp_status pp_onnx_deferred_fill(pp_onnx_deferred *d, pp_graph *g) {
    if (!d || !g || d->n == 0) return PP_OK;
    if (!d->sorted) return pp_error(PP_ERR_INTERNAL, "%s: deferred record filled before the load finished", d->path);
    int checked = 0;
    for (int v = 0; v < g->n_values; v++) {
        pp_value *val = &g->values[v];
        if ((val->kind != PP_VALUE_PARAM && val->kind != PP_VALUE_CONST) || !val->data || val->producer >= 0)
            continue;
        entry key = {val->name, 0, 0};
        const entry *e = bsearch(&key, d->e, (size_t)d->n, sizeof *d->e, by_name);
        if (!e) continue;
        /* the loader made this tensor at this size; anything else is not ours */
        if (val->data->nbytes != e->len)
            return pp_error(PP_ERR_INVALID, "%s: initializer '%s' is %zu bytes in graph '%s', %zu in the file",
                            d->path, val->name, val->data->nbytes, g->name ? g->name : "", e->len);
        if (!checked++) PP_TRY(same_file(d, val->name));
        char what[600];
        snprintf(what, sizeof what, "%s: initializer '%s'", d->path, val->name);
        PP_TRY(pp_read_at(d->fd, val->data->data, e->len, e->off, what));
    }
    return PP_OK;
}

void pp_onnx_deferred_free(pp_onnx_deferred *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) free(d->e[i].name);
    free(d->e);
    free(d->path);
    close(d->fd);
    free(d);
}
