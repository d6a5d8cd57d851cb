/* Recycling of large tensor buffers.
 *
 * A training step allocates and frees the same activation-sized buffers
 * every step. Left to malloc, buffers of 128 KiB and up are mmap'd or sit at
 * the top of the heap that free() trims back to the kernel, so every step
 * page-faults them in again: a third of a small model's step time. Freed
 * buffers of 64 KiB and up are therefore kept in size classes (4 per
 * power of two, so at most 25% slack) and handed out again, up to
 * PIPPIN_TENSOR_CACHE_MB (default 256) in all; pp_tensor_cache_release()
 * gives them back. */
#include "tensor_pool.h"

#include "mem_plan.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define POOL_ALIGN 64
#define POOL_MIN_LOG2 16 /* 64 KiB */
#define POOL_CLASSES 64  /* up to 2^32 bytes */
#define POOL_PER_CLASS 32

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static void *pool_slots[POOL_CLASSES][POOL_PER_CLASS];
static int pool_count[POOL_CLASSES];
static size_t pool_bytes, pool_cap = (size_t)-1;

static void plain_free(void *data, void *hint) {
    (void)hint;
    free(data);
}

/* Class of a request and its rounded size; -1 if not pooled. */
static int size_class(size_t n, size_t *rounded) {
    if (n < ((size_t)1 << POOL_MIN_LOG2)) return -1;
    int k = 63 - __builtin_clzll((unsigned long long)n);
    size_t base = (size_t)1 << k, step = base / 4;
    size_t sub = (n - base + step - 1) / step;
    if (sub == 4) {
        k++;
        sub = 0;
        base <<= 1;
        step <<= 1;
    }
    int c = (k - POOL_MIN_LOG2) * 4 + (int)sub;
    if (c >= POOL_CLASSES) return -1;
    *rounded = base + sub * step;
    return c;
}

static size_t class_size(int c) {
    size_t base = (size_t)1 << (POOL_MIN_LOG2 + c / 4);
    return base + (size_t)(c % 4) * (base / 4);
}

static void pool_free(void *data, void *hint) {
    int c = (int)(intptr_t)hint;
    size_t size = class_size(c);
    pthread_mutex_lock(&pool_mu);
    if (pool_count[c] < POOL_PER_CLASS && pool_bytes + size <= pool_cap) {
        pool_slots[c][pool_count[c]++] = data;
        pool_bytes += size;
        data = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    free(data);
}

int pp_pool_owns(pp_free_fn free_fn) { return free_fn == plain_free || free_fn == pool_free; }

void *pp_pool_alloc(size_t nbytes, pp_free_fn *free_fn, void **hint) {
    size_t rounded;
    int c = size_class(nbytes, &rounded);
    *hint = NULL;
    if (c < 0) {
        *free_fn = plain_free;
        return aligned_alloc(POOL_ALIGN, (nbytes + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN);
    }
    void *p = NULL;
    pthread_mutex_lock(&pool_mu);
    if (pool_cap == (size_t)-1) {
        const char *env = getenv("PIPPIN_TENSOR_CACHE_MB");
        pool_cap = (env ? (size_t)strtoull(env, NULL, 10) : 256) << 20;
    }
    if (pool_count[c] > 0) {
        p = pool_slots[c][--pool_count[c]];
        pool_bytes -= rounded;
    }
    pthread_mutex_unlock(&pool_mu);
    if (!p) p = aligned_alloc(POOL_ALIGN, rounded);
    *free_fn = pool_free;
    *hint = (void *)(intptr_t)c;
    return p;
}

void pp_tensor_cache_release(void) {
    pp_mem_plan_release_thread();
    pp_pool_release();
}

void pp_pool_release(void) {
    pthread_mutex_lock(&pool_mu);
    for (int c = 0; c < POOL_CLASSES; c++) {
        while (pool_count[c] > 0) free(pool_slots[c][--pool_count[c]]);
    }
    pool_bytes = 0;
    pthread_mutex_unlock(&pool_mu);
}
