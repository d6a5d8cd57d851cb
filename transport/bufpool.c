/* A small cache of large anonymous mappings for reassembled tensors. */
#include "bufpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "status_internal.h"
#define HUGE_PAGE ((size_t)2 << 20)
#define MAX_CACHED 64

typedef struct buf {
    struct pp_bufpool *pool;
    size_t size;    /* mapping size (a multiple of the page size) */
    void *base;     /* the mapping; data is at base */
} buf;

struct pp_bufpool {
    pthread_mutex_t lock;
    int refs;               /* the creator (until released) + each buffer out */
    int closed;
    size_t cache_bytes, cached_bytes;
    int ncached;
    buf *cached[MAX_CACHED];
};

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void unmap(buf *b) {
    munmap(b->base, b->size);
    free(b);
}

/* Drops one reference with the lock held; frees the pool at zero (the lock
 * is released either way). */
static void unref_locked(pp_bufpool *p) {
    int last = --p->refs == 0;
    pthread_mutex_unlock(&p->lock);
    if (last) {
        pthread_mutex_destroy(&p->lock);
        free(p);
    }
}

pp_status pp_bufpool_new(size_t cache_bytes, pp_bufpool **out) {
    pp_bufpool *p = calloc(1, sizeof *p);
    if (!p) return pp_error(PP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&p->lock, NULL);
    p->refs = 1;
    p->cache_bytes = cache_bytes;
    *out = p;
    return PP_OK;
}

void pp_bufpool_release(pp_bufpool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->closed = 1;
    for (int i = 0; i < p->ncached; i++) unmap(p->cached[i]);
    p->ncached = 0;
    p->cached_bytes = 0;
    unref_locked(p);
}

static void give_back(void *data, void *hint) {
    (void)data;
    buf *b = hint;
    pp_bufpool *p = b->pool;
    pthread_mutex_lock(&p->lock);
    if (!p->closed && p->ncached < MAX_CACHED && p->cached_bytes + b->size <= p->cache_bytes) {
        p->cached[p->ncached++] = b;
        p->cached_bytes += b->size;
    } else {
        unmap(b);
    }
    unref_locked(p);
}

static buf *take(pp_bufpool *p, size_t size) {
    pthread_mutex_lock(&p->lock);
    buf *b = NULL;
    for (int i = 0; i < p->ncached; i++)
        if (p->cached[i]->size == size) {
            b = p->cached[i];
            p->cached[i] = p->cached[--p->ncached];
            p->cached_bytes -= size;
            break;
        }
    /* a buffer of another size that does not fit the budget with this one goes */
    while (!b && p->ncached && p->cached_bytes + size > p->cache_bytes) {
        buf *old = p->cached[--p->ncached];
        p->cached_bytes -= old->size;
        unmap(old);
    }
    p->refs++;
    pthread_mutex_unlock(&p->lock);
    return b;
}

pp_status pp_bufpool_tensor(pp_bufpool *p, pp_dtype dt, int ndim, const int64_t *shape,
                            pp_tensor **out) {
    size_t nbytes;
    PP_TRY(pp_shape_bytes(dt, ndim, shape, &nbytes));
    size_t size = round_up(nbytes ? nbytes : 1, HUGE_PAGE);
    buf *b = take(p, size);
    if (!b) {
        b = calloc(1, sizeof *b);
        void *base = b ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                       : MAP_FAILED;
        if (base == MAP_FAILED) {
            free(b);
            pthread_mutex_lock(&p->lock);
            unref_locked(p);
            return pp_error(PP_ERR_NOMEM, "out of memory mapping %zu bytes", size);
        }
#ifdef MADV_HUGEPAGE
        madvise(base, size, MADV_HUGEPAGE); /* fewer page faults; fine if refused */
#endif
        b->pool = p;
        b->size = size;
        b->base = base;
    }
    pp_status s = pp_tensor_wrap(dt, ndim, shape, b->base, give_back, b, out);
    if (s != PP_OK) give_back(b->base, b);
    return s;
}
