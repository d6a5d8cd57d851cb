/* Internal: reading a whole file safely (a regular file, with a size cap),
 * so every loader refuses directories, devices and oversize files the same
 * way. */
#ifndef PIPPIN_LIB_FILE_IO_H
#define PIPPIN_LIB_FILE_IO_H

#include <stddef.h>
#include <stdio.h>

#include "pippin/status.h"

/* *buf is malloc'd (caller frees; at least 1 byte even for an empty file). */
pp_status pp_read_file(const char *path, size_t max_bytes, unsigned char **buf, size_t *len);

/* A whole file mapped read-only and private (its pages are read from the
 * file when touched and may be given back with madvise). mapped is 0 for
 * an empty file (bytes then points at an empty string). The file must not
 * be truncated while it is mapped. */
typedef struct pp_mapped_file {
    const unsigned char *bytes;
    size_t len;
    int mapped;
} pp_mapped_file;

/* The same checks as pp_read_file (a regular file of at most max_bytes). */
pp_status pp_map_file(const char *path, size_t max_bytes, pp_mapped_file *mf);
void pp_unmap_file(pp_mapped_file *mf);

/* Durable replacement of a file: what is written goes to a temporary file
 * beside it; commit flushes and fsyncs it, renames it over the path and
 * fsyncs the directory, so after a crash the path holds either the old
 * file or the whole new one, never a part. */
typedef struct pp_atomic_file {
    FILE *f;        /* write here */
    char *path;
    char *tmp;
} pp_atomic_file;

pp_status pp_atomic_open(const char *path, pp_atomic_file *af);
/* Closes af; on failure the temporary file is removed and path untouched. */
pp_status pp_atomic_commit(pp_atomic_file *af);
/* Closes af and removes the temporary file. */
void pp_atomic_discard(pp_atomic_file *af);
/* fsync of a directory, so a rename or unlink in it survives a crash. */
pp_status pp_fsync_dir(const char *dir);
/* fsync of the directory that holds path. */
pp_status pp_fsync_parent(const char *path);

#endif
