/* Reference-counted ZeroMQ contexts shared by the transports of a process. */
#include "context.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "pippin/log.h"

#include "status_internal.h"
#include "log_internal.h"
struct pp_zctx {
    struct pp_zctx *next;
    void *ctx;
    int owned;      /* pippin's process-wide context: terminated with the last reference */
    int refs;
    pp_zap *zap;    /* started by the first CURVE transport */
};

/* A draft option of libzmq 4.3 that its stable builds accept. */
#ifndef ZMQ_ZERO_COPY_RECV
#define ZMQ_ZERO_COPY_RECV 10
#endif

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pp_zctx *table;
static atomic_uint domain_counter;

pp_status pp_zctx_acquire(void *user_ctx, int io_threads, pp_zctx **out) {
    pthread_mutex_lock(&table_lock);
    pp_zctx *z = table;
    for (; z; z = z->next)
        if (user_ctx ? z->ctx == user_ctx : z->owned) break;
    if (!z) {
        z = calloc(1, sizeof *z);
        if (!z) {
            pthread_mutex_unlock(&table_lock);
            return pp_error(PP_ERR_NOMEM, "out of memory");
        }
        if (user_ctx) {
            z->ctx = user_ctx;
        } else {
            z->ctx = zmq_ctx_new();
            if (!z->ctx) {
                free(z);
                pthread_mutex_unlock(&table_lock);
                return pp_error(PP_ERR_IO, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
            }
            z->owned = 1;
            if (io_threads > 0 && zmq_ctx_set(z->ctx, ZMQ_IO_THREADS, io_threads) != 0)
                pp_warn("zmq: cannot set %d I/O threads: %s", io_threads, zmq_strerror(zmq_errno()));
            pp_zctx_tune(z->ctx);
        }
        z->next = table;
        table = z;
    }
    z->refs++;
    pthread_mutex_unlock(&table_lock);
    *out = z;
    return PP_OK;
}

/* By default libzmq's receiver lets a small frame (our envelope) point into
 * its 8 KiB read buffer, so while we handle a message that buffer is pinned
 * and the next read mallocs another one in the I/O thread's arena, between
 * the large data frames. Freeing them then leaves 32 MiB and more free at
 * the arena's top, which glibc trims (MADV_DONTNEED), and the next 16 MiB
 * tensors are received into fresh pages: a page fault per 4 KiB. Raw
 * libzmq with one frame per message never trims; given a 120-byte frame
 * before each 16 MiB one it faulted 1.6-3.8x as often. Off, a small frame
 * is copied out (it is small) and the read buffer is reused: faults at 16
 * MiB tensors median 29k against 43k (8 runs each). */
void pp_zctx_tune(void *ctx) {
    if (zmq_ctx_set(ctx, ZMQ_ZERO_COPY_RECV, 0) != 0)
        pp_debug("zmq: cannot turn off zero-copy receive of small frames: %s", zmq_strerror(zmq_errno()));
}

void *pp_zctx_handle(const pp_zctx *z) { return z->ctx; }

void pp_zctx_release(pp_zctx *z) {
    if (!z) return;
    pthread_mutex_lock(&table_lock);
    if (--z->refs > 0) {
        pthread_mutex_unlock(&table_lock);
        return;
    }
    for (pp_zctx **p = &table; *p; p = &(*p)->next)
        if (*p == z) {
            *p = z->next;
            break;
        }
    pthread_mutex_unlock(&table_lock);
    /* Nobody else can find z now. */
    pp_zap_stop(z->zap);
    if (z->owned) {
        while (zmq_ctx_term(z->ctx) != 0 && zmq_errno() == EINTR) {
        }
    }
    free(z);
}

pp_status pp_zctx_add_domain(pp_zctx *z, const uint8_t (*keys)[32], int nkeys,
                             pp_zap_domain **out, char *name, size_t cap) {
    pthread_mutex_lock(&table_lock);
    pp_status s = PP_OK;
    if (!z->zap) s = pp_zap_start(z->ctx, &z->zap);
    if (s == PP_OK) {
        snprintf(name, cap, "pippin.%u", atomic_fetch_add(&domain_counter, 1) + 1);
        s = pp_zap_add(z->zap, name, keys, nkeys, out);
    }
    pthread_mutex_unlock(&table_lock);
    return s;
}

void pp_zctx_remove_domain(pp_zctx *z, pp_zap_domain *d) {
    if (!d) return;
    pthread_mutex_lock(&table_lock);
    pp_zap_remove(z->zap, d);
    pthread_mutex_unlock(&table_lock);
}
