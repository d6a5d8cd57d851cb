/* Internal: a safetensors file's header, read and checked without its data
 * (each tensor's name, dtype, shape and where its bytes lie), so a loader
 * reads each tensor once, straight into its final place: pp_safetensors_load
 * into its own tensors, checkpoints into a stage's parameters and optimizer
 * state. Reading the whole file first and copying out of it peaked at twice
 * the file. */
#ifndef PIPPIN_LIB_SAFETENSORS_INDEX_H
#define PIPPIN_LIB_SAFETENSORS_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"
#include "pippin/tensor.h"

typedef struct pp_safetensors_entry {
    char *name;
    pp_dtype dtype;
    int ndim;
    int64_t shape[PP_MAX_DIMS];
    uint64_t offset; /* of its first byte, from the file's start */
    size_t nbytes;   /* checked: the dtype's size times the elements */
} pp_safetensors_entry;

typedef struct pp_safetensors_index {
    char *name;                   /* the path, or the name given to a memory image */
    int fd;                       /* the open file; -1 for a memory image */
    const unsigned char *bytes;   /* the memory image (borrowed), or NULL */
    uint64_t size;                /* the file's size when opened, or the image's */
    int n;                        /* tensors, in file order (by offset) */
    pp_safetensors_entry *entries;
    int n_meta;                   /* "__metadata__" entries */
    char **meta_keys;
    char **meta_values;
} pp_safetensors_index;

/* Opens path and reads its header only; every offset, shape and dtype is
 * checked against the file's size (errors name the file and the tensor).
 * The file stays open until pp_safetensors_index_free. */
pp_status pp_safetensors_index_open(const char *path, pp_safetensors_index **out);
/* The same for a file image in memory (borrowed: it must outlive *out). */
pp_status pp_safetensors_index_parse(const void *bytes, size_t len, const char *name, pp_safetensors_index **out);
/* Reads entry i's bytes into dst (entries[i].nbytes of them). A file cut
 * short since it was opened gives PP_ERR_IO "FILE: tensor 'NAME': expected
 * N bytes at offset O, got M ...", never a signal. */
pp_status pp_safetensors_index_read(const pp_safetensors_index *ix, int i, void *dst);
/* The metadata value of key (borrowed), or NULL. */
const char *pp_safetensors_index_meta(const pp_safetensors_index *ix, const char *key);
void pp_safetensors_index_free(pp_safetensors_index *ix);

#endif
