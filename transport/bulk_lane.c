/* Both ends of a bulk lane (bulk_lane.h). */
#include "bulk_lane.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "status_internal.h"

/* How often a writer waiting for room looks whether it is being stopped. */
#define STOP_POLL_MS 50
/* Most bytes a lane's reader waits for before it wakes (set_lowat). */
#define LOWAT_MAX (1 << 20)
/* Bytes read past at a time when skipping a dropped message's tensor. */
#define SKIP_CHUNK 65536

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- sending ---- */

typedef struct entry {
    uint8_t head[PP_BULK_HEADER_BYTES];
    pp_tensor *x;
    size_t done; /* bytes of head + tensor already written (by the pushing thread) */
} entry;

struct pp_bulk_tx {
    int fd, efd;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake, drained;
    entry *q;            /* ring of cap entries */
    size_t cap, head, n;
    int closing;         /* finish the queue, then stop */
    int hold;            /* pp_bulk_tx_hold: write nothing for now */
    atomic_int stop;     /* stop now */
    char error[160];     /* set once, under lock */
    char error_seen[160]; /* the pushing thread's copy (pp_bulk_tx_error) */
};

static void signal_event(pp_bulk_tx *tx) {
    uint64_t one = 1;
    ssize_t k = write(tx->efd, &one, sizeof one);
    (void)k; /* a full counter is readable anyway */
}

/* Writes n bytes, waiting for room; 0, or -1 with errno (ECANCELED: stopped). */
static int write_all(pp_bulk_tx *tx, const uint8_t *p, size_t n) {
    if (!n) return 0;
    while (n) {
        if (atomic_load(&tx->stop)) {
            errno = ECANCELED;
            return -1;
        }
        ssize_t k = send(tx->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        struct pollfd pf = {tx->fd, POLLOUT, 0};
        poll(&pf, 1, STOP_POLL_MS);
    }
    return 0;
}

static void *writer(void *arg) {
    pp_bulk_tx *tx = arg;
    pthread_mutex_lock(&tx->lock);
    for (;;) {
        while ((tx->hold || (!tx->n && !tx->closing)) && !atomic_load(&tx->stop))
            pthread_cond_wait(&tx->wake, &tx->lock);
        if (!tx->n || atomic_load(&tx->stop)) break;
        entry e = tx->q[tx->head];
        pthread_mutex_unlock(&tx->lock);
        size_t hd = e.done < sizeof e.head ? e.done : sizeof e.head, xd = e.done - hd;
        int rc = write_all(tx, e.head + hd, sizeof e.head - hd);
        if (rc == 0) rc = write_all(tx, (const uint8_t *)e.x->data + xd, e.x->nbytes - xd);
        int err = errno;
        pthread_mutex_lock(&tx->lock);
        if (rc != 0) {
            if (!tx->error[0])
                snprintf(tx->error, sizeof tx->error, "%s", err == ECANCELED ? "closed" : strerror(err));
            break;
        }
        tx->head = (tx->head + 1) % tx->cap;
        tx->n--;
        pthread_mutex_unlock(&tx->lock);
        pp_tensor_free(e.x); /* the reference the queue held */
        signal_event(tx);
        pthread_mutex_lock(&tx->lock);
        if (!tx->n) pthread_cond_broadcast(&tx->drained);
    }
    if (!tx->error[0] && tx->n) snprintf(tx->error, sizeof tx->error, "closed");
    pthread_cond_broadcast(&tx->drained);
    pthread_mutex_unlock(&tx->lock);
    signal_event(tx);
    return NULL;
}

pp_status pp_bulk_tx_start(int fd, size_t max_queue, pp_bulk_tx **out) {
    *out = NULL;
    pp_bulk_tx *tx = calloc(1, sizeof *tx);
    if (tx) tx->q = calloc(max_queue ? max_queue : 1, sizeof *tx->q);
    if (!tx || !tx->q) {
        if (tx) free(tx);
        close(fd);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    tx->cap = max_queue ? max_queue : 1;
    tx->fd = fd;
    tx->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&tx->lock, NULL);
    pthread_cond_init(&tx->wake, NULL);
    pthread_cond_init(&tx->drained, NULL);
    /* the writer takes no signals: a rank's handler (the CLI's SIGINT/SIGTERM)
     * must run on a thread of its own, as libzmq's threads leave them */
    int e = tx->efd < 0 ? errno : 0;
    if (!e) {
        sigset_t all, was;
        sigfillset(&all);
        for (int sig = 0; sig < 5; sig++) /* faults stay with the thread that makes them */
            sigdelset(&all, (int[]){SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}[sig]);
        pthread_sigmask(SIG_SETMASK, &all, &was);
        e = pthread_create(&tx->thread, NULL, writer, tx);
        pthread_sigmask(SIG_SETMASK, &was, NULL);
    }
    if (e) {
        if (tx->efd >= 0) close(tx->efd);
        close(fd);
        pthread_mutex_destroy(&tx->lock);
        pthread_cond_destroy(&tx->wake);
        pthread_cond_destroy(&tx->drained);
        free(tx->q);
        free(tx);
        return pp_error(PP_ERR_IO, "bulk lane: cannot start its writer: %s", strerror(e));
    }
    *out = tx;
    return PP_OK;
}

/* With nothing queued the writer is idle, so the pushing thread writes
 * what the socket takes at once itself: a tensor that fits in the socket's
 * buffers costs no hand-over to the writer (a wake-up each side). */
static size_t write_now(pp_bulk_tx *tx, entry *e) {
    struct iovec iov[2] = {{e->head, sizeof e->head}, {e->x->data, e->x->nbytes}};
    struct msghdr mh = {0};
    mh.msg_iov = iov;
    mh.msg_iovlen = 2;
    ssize_t k = sendmsg(tx->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    return k > 0 ? (size_t)k : 0; /* a failure shows again in the writer, which reports it */
}

int pp_bulk_tx_push(pp_bulk_tx *tx, const pp_bulk_header *h, pp_tensor *x) {
    pthread_mutex_lock(&tx->lock);
    int rc = tx->error[0] ? -1 : tx->n == tx->cap ? 0 : 1;
    if (rc == 1) {
        entry *e = &tx->q[(tx->head + tx->n) % tx->cap];
        pp_bulk_header_pack(h, e->head);
        e->x = x;
        e->done = tx->n == 0 && !tx->hold ? write_now(tx, e) : 0;
        if (e->done == sizeof e->head + x->nbytes) {
            pthread_mutex_unlock(&tx->lock);
            return 1;
        }
        pp_tensor_retain(x);
        if (tx->n++ == 0) pthread_cond_signal(&tx->wake);
    }
    pthread_mutex_unlock(&tx->lock);
    return rc;
}

void pp_bulk_tx_hold(pp_bulk_tx *tx, int on) {
    pthread_mutex_lock(&tx->lock);
    tx->hold = on;
    pthread_cond_signal(&tx->wake);
    pthread_mutex_unlock(&tx->lock);
}

int pp_bulk_tx_event_fd(const pp_bulk_tx *tx) { return tx->efd; }

void pp_bulk_tx_clear(pp_bulk_tx *tx) {
    uint64_t v;
    ssize_t k = read(tx->efd, &v, sizeof v);
    (void)k;
}

size_t pp_bulk_tx_queued(pp_bulk_tx *tx) {
    pthread_mutex_lock(&tx->lock);
    size_t n = tx->n;
    pthread_mutex_unlock(&tx->lock);
    return n;
}

const char *pp_bulk_tx_error(pp_bulk_tx *tx) {
    pthread_mutex_lock(&tx->lock);
    memcpy(tx->error_seen, tx->error, sizeof tx->error_seen); /* the writer may set it any time */
    pthread_mutex_unlock(&tx->lock);
    return tx->error_seen;
}

size_t pp_bulk_tx_close(pp_bulk_tx *tx, int linger_ms) {
    if (!tx) return 0;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += linger_ms / 1000;
    until.tv_nsec += (long)(linger_ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
    pthread_mutex_lock(&tx->lock);
    tx->closing = 1;
    pthread_cond_signal(&tx->wake);
    while (tx->n && !tx->error[0] && linger_ms > 0 &&
           pthread_cond_timedwait(&tx->drained, &tx->lock, &until) == 0) {
    }
    atomic_store(&tx->stop, 1);
    pthread_cond_signal(&tx->wake);
    pthread_mutex_unlock(&tx->lock);
    pthread_join(tx->thread, NULL);
    size_t lost = tx->n;
    for (size_t i = 0; i < tx->n; i++) pp_tensor_free(tx->q[(tx->head + i) % tx->cap].x);
    close(tx->fd);
    close(tx->efd);
    pthread_mutex_destroy(&tx->lock);
    pthread_cond_destroy(&tx->wake);
    pthread_cond_destroy(&tx->drained);
    free(tx->q);
    free(tx);
    return lost;
}

/* ---- receiving ---- */

/* The socket wakes its reader once this many bytes wait (SO_RCVLOWAT), at
 * most LOWAT_MAX: a tensor's bytes are taken in a few large reads rather
 * than a wake-up per segment that arrives. */
static void set_lowat(pp_bulk_rx *rx, uint64_t want) {
    int v = want > LOWAT_MAX ? LOWAT_MAX : (int)want;
    if (v < 1) v = 1;
    if (v != rx->lowat && setsockopt(rx->fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v) == 0) rx->lowat = v;
}

/* Reads what is there (without waiting) of the n bytes still wanted into
 * dst (NULL: reads past them), adding to *got. 1: all n came; 2: the rest
 * is not there yet; -1 with rx->why set. */
static int read_some(pp_bulk_rx *rx, void *dst, uint64_t n, uint64_t *got, const char *what) {
    static _Thread_local uint8_t sink[SKIP_CHUNK];
    uint8_t *p = dst;
    while (n) {
        size_t want = n > SIZE_MAX ? SIZE_MAX : (size_t)n;
        if (!p && want > sizeof sink) want = sizeof sink;
        ssize_t k = recv(rx->fd, p ? (void *)p : (void *)sink, want, MSG_DONTWAIT);
        if (k > 0) {
            if (p) p += k;
            n -= (uint64_t)k;
            *got += (uint64_t)k;
            rx->received += (uint64_t)k;
            continue;
        }
        if (k == 0) {
            snprintf(rx->why, sizeof rx->why, "the lane closed in the middle of %s", what);
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(rx->why, sizeof rx->why, "reading %s: %s", what, strerror(errno));
            return -1;
        }
        rx->what = what;
        set_lowat(rx, n); /* all of it must come: never more than that */
        return 2;
    }
    return 1;
}

/* The header of the lane's next tensor into rx->hdr (rx->have set): 1,
 * 2 (not all there yet), -1. */
static int read_header(pp_bulk_rx *rx) {
    uint64_t got = rx->hgot;
    int rc = read_some(rx, rx->hbuf + rx->hgot, sizeof rx->hbuf - rx->hgot, &got, "a tensor header");
    rx->hgot = (uint32_t)got;
    if (rc != 1) return rc;
    rx->hgot = 0;
    const char *bad = pp_bulk_header_parse(rx->hbuf, sizeof rx->hbuf, &rx->hdr);
    if (*bad) {
        snprintf(rx->why, sizeof rx->why, "%s", bad);
        return -1;
    }
    rx->have = 1;
    rx->body = 0;
    return 1;
}

int pp_bulk_rx_step(pp_bulk_rx *rx, uint64_t seq, uint32_t index, void *dst, uint64_t nbytes) {
    for (;;) {
        if (!rx->have) {
            int rc = read_header(rx);
            if (rc != 1) return rc;
        }
        pp_bulk_header *h = &rx->hdr;
        if (h->seq > seq || (h->seq == seq && h->index > index)) return 0; /* kept for its message */
        if (h->seq == seq && h->index == index) {
            if (h->nbytes != nbytes) {
                snprintf(rx->why, sizeof rx->why, "tensor %u of message %llu has %llu bytes on the lane, its "
                         "envelope says %llu", (unsigned)index, (unsigned long long)seq,
                         (unsigned long long)h->nbytes, (unsigned long long)nbytes);
                return -1;
            }
            int rc = read_some(rx, (uint8_t *)dst + rx->body, nbytes - rx->body, &rx->body, "a tensor");
            if (rc == 1) rx->have = 0;
            return rc;
        }
        /* an earlier message's tensor, whose envelope was dropped */
        int rc = read_some(rx, NULL, h->nbytes - rx->body, &rx->body, "a dropped message's tensor");
        if (rc != 1) return rc;
        rx->have = 0;
        rx->skipped += h->nbytes;
    }
}

int pp_bulk_rx_read(pp_bulk_rx *rx, uint64_t seq, uint32_t index, void *dst, uint64_t nbytes,
                    int64_t deadline_ms) {
    for (;;) {
        int rc = pp_bulk_rx_step(rx, seq, index, dst, nbytes);
        if (rc != 2) return rc;
        int64_t left = deadline_ms - mono_ms();
        if (left <= 0) {
            snprintf(rx->why, sizeof rx->why, "%s did not come in time", rx->what);
            return -1;
        }
        struct pollfd pf = {rx->fd, POLLIN, 0};
        poll(&pf, 1, left > 1000 ? 1000 : (int)left);
    }
}
