/* Internal: reading files safely (a regular file, with a size cap, read
 * rather than mapped), so every loader refuses directories, devices,
 * oversize files and files cut short the same way. */
#ifndef PIPPIN_LIB_FILE_IO_H
#define PIPPIN_LIB_FILE_IO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pippin/status.h"

/* *buf is malloc'd (caller frees; at least 1 byte even for an empty file). */
pp_status pp_read_file(const char *path, size_t max_bytes, unsigned char **buf, size_t *len);

/* A regular file of at most max_bytes opened read-only (the same checks
 * as pp_read_file): *fd (the caller closes it) and *size, its size when
 * opened. */
pp_status pp_open_file(const char *path, size_t max_bytes, int *fd, size_t *size);

/* Reads exactly n bytes at offset off of fd into dst; what names the file
 * (and what is read) in messages. A file that has become shorter than that
 * since it was measured (another process saving over it in place, a
 * partial copy) gives PP_ERR_IO "WHAT: expected N bytes at offset O, got
 * M". Loaders read model and weight files with this rather than mapping
 * them: a mapped file that shrinks kills the process with SIGBUS when a
 * page past its new end is touched, a read just comes back short. */
pp_status pp_read_at(int fd, void *dst, size_t n, uint64_t off, const char *what);

/* Durable replacement of a file: what is written goes to a temporary file
 * beside it; commit flushes and fsyncs it, renames it over the path and
 * fsyncs the directory, so after a crash the path holds either the old
 * file or the whole new one, never a part. The temporary file is
 * PATH.tmp.RANDOM, locked (flock) while it is written; a commit of PATH
 * removes the unlocked ones older than a minute (a writer killed
 * mid-write), so crashes leave no litter once the file is written again. */
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
