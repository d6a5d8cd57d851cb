/* Internal: recycling of large tensor buffers (see tensor_pool.c). */
#ifndef PIPPIN_TENSOR_POOL_H
#define PIPPIN_TENSOR_POOL_H

#include <stddef.h>

#include "pippin/tensor.h"

/* A 64-byte aligned buffer of at least nbytes (> 0). *free_fn and *hint are
 * what the tensor must call to give it back. NULL when out of memory. */
void *pp_pool_alloc(size_t nbytes, pp_free_fn *free_fn, void **hint);

/* 1 if free_fn is one pp_pool_alloc hands out (the buffer is the
 * tensor's own, not caller memory or another tensor's). */
int pp_pool_owns(pp_free_fn free_fn);

/* Frees the cached buffers (pp_tensor_cache_release without the arena). */
void pp_pool_release(void);

#endif
