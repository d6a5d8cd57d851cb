/* Internal: reading a whole file safely (a regular file, with a size cap),
 * so every loader refuses directories, devices and oversize files the same
 * way. */
#ifndef PIPPIN_LIB_FILE_IO_H
#define PIPPIN_LIB_FILE_IO_H

#include <stddef.h>

#include "pippin/status.h"

/* *buf is malloc'd (caller frees; at least 1 byte even for an empty file). */
pp_status pp_read_file(const char *path, size_t max_bytes, unsigned char **buf, size_t *len);

#endif
