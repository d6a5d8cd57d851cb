/* ZAP handler (ZeroMQ RFC 27): admits CURVE clients whose public key is
 * listed for the server socket's ZAP domain, refuses everybody else.
 *
 * One REP socket bound at inproc://zeromq.zap.01 per context, owned by the
 * handler thread; the thread stops when told on an inproc control socket. */
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
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_MAX_FRAMES 8

struct pp_zap_domain {
    struct pp_zap_domain *next;
    char name[64];
    int nkeys;
    uint8_t (*keys)[32];
    atomic_ullong refused;
};

struct pp_zap {
    void *ctx;
    void *rep;              /* owned by the thread */
    void *ctl;              /* PULL, owned by the thread */
    char ctl_endpoint[64];
    pthread_t thread;
    pthread_mutex_t lock;   /* guards domains */
    pp_zap_domain *domains;
};

uint64_t pp_zap_domain_refused(const pp_zap_domain *d) {
    return d ? atomic_load(&((pp_zap_domain *)d)->refused) : 0;
}

static int frame_is(const zmq_msg_t *m, const char *s) {
    size_t n = strlen(s);
    return zmq_msg_size((zmq_msg_t *)m) == n && memcmp(zmq_msg_data((zmq_msg_t *)m), s, n) == 0;
}

/* Copies a frame into buf as printable text for log messages. */
static const char *frame_text(zmq_msg_t *m, char *buf, size_t cap) {
    size_t n = zmq_msg_size(m), j = 0;
    const unsigned char *p = zmq_msg_data(m);
    for (size_t i = 0; i < n && j + 1 < cap; i++) buf[j++] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
    buf[j] = 0;
    return buf;
}

static void send_frame(void *s, const void *data, size_t len, int more) {
    zmq_send(s, data, len, more ? ZMQ_SNDMORE : 0);
}

static void handle_request(pp_zap *z) {
    zmq_msg_t f[ZAP_MAX_FRAMES];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, z->rep, 0) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (n < ZAP_MAX_FRAMES) f[n++] = m;
        else zmq_msg_close(&m);
    }
    const char *status = "400", *text = "not allowed";
    char user[41] = "";
    pp_zap_domain *dom = NULL;
    if (n < 6 || !frame_is(&f[0], "1.0")) {
        status = "500";
        text = "malformed ZAP request";
    } else if (!frame_is(&f[5], "CURVE") || n < 7 || zmq_msg_size(&f[6]) != 32) {
        text = "CURVE required";
    } else {
        const uint8_t *key = zmq_msg_data(&f[6]);
        pthread_mutex_lock(&z->lock);
        for (dom = z->domains; dom; dom = dom->next)
            if (frame_is(&f[2], dom->name)) break;
        if (dom)
            for (int i = 0; i < dom->nkeys; i++)
                if (memcmp(dom->keys[i], key, 32) == 0) {
                    status = "200";
                    text = "OK";
                    zmq_z85_encode(user, key, 32);
                    break;
                }
        if (dom && status[0] != '2') {
            unsigned long long k = atomic_fetch_add(&dom->refused, 1) + 1;
            if ((k & (k - 1)) == 0) { /* 1st, 2nd, 4th, ... refusal: the peer keeps retrying */
                char kz[41], addr[64];
                zmq_z85_encode(kz, key, 32);
                pp_warn("transport: refused CURVE client key %s from %s (not an allowed key; "
                        "%llu refusals so far)", kz, frame_text(&f[3], addr, sizeof addr), k);
            }
        }
        pthread_mutex_unlock(&z->lock);
    }
    if (status[0] != '2' && !dom && n >= 6) {
        char mech[16], addr[64];
        pp_debug("transport: ZAP refused %s client from %s", frame_text(&f[5], mech, sizeof mech),
                 frame_text(&f[3], addr, sizeof addr));
    }
    send_frame(z->rep, "1.0", 3, 1);
    if (n >= 2) send_frame(z->rep, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), 1);
    else send_frame(z->rep, "", 0, 1);
    send_frame(z->rep, status, 3, 1);
    send_frame(z->rep, text, strlen(text), 1);
    send_frame(z->rep, user, strlen(user), 1);
    send_frame(z->rep, "", 0, 0);
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static void *zap_thread(void *arg) {
    pp_zap *z = arg;
    zmq_pollitem_t items[2] = {{z->rep, 0, ZMQ_POLLIN, 0}, {z->ctl, 0, ZMQ_POLLIN, 0}};
    for (;;) {
        if (zmq_poll(items, 2, -1) < 0) {
            if (zmq_errno() == EINTR) continue;
            break; /* ETERM: cannot happen before we close, but never spin */
        }
        if (items[1].revents & ZMQ_POLLIN) break;
        if (items[0].revents & ZMQ_POLLIN) handle_request(z);
    }
    int zero = 0;
    zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(z->ctl, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(z->rep);
    zmq_close(z->ctl);
    return NULL;
}

pp_status pp_zap_start(void *ctx, pp_zap **out) {
    pp_zap *z = calloc(1, sizeof *z);
    if (!z) return pp_error(PP_ERR_NOMEM, "out of memory");
    z->ctx = ctx;
    pthread_mutex_init(&z->lock, NULL);
    snprintf(z->ctl_endpoint, sizeof z->ctl_endpoint, "inproc://pippin-zap-ctl-%p", (void *)z);
    z->rep = zmq_socket(ctx, ZMQ_REP);
    z->ctl = zmq_socket(ctx, ZMQ_PULL);
    pp_status s = PP_OK;
    if (!z->rep || !z->ctl) {
        s = pp_error(PP_ERR_IO, "ZAP handler: zmq_socket: %s", zmq_strerror(zmq_errno()));
    } else if (zmq_bind(z->rep, ZAP_ENDPOINT) != 0) {
        s = pp_error(PP_ERR_IO, "ZAP handler: cannot bind %s: %s (another ZAP handler in this "
                     "context?)", ZAP_ENDPOINT, zmq_strerror(zmq_errno()));
    } else if (zmq_bind(z->ctl, z->ctl_endpoint) != 0) {
        s = pp_error(PP_ERR_IO, "ZAP handler: bind %s: %s", z->ctl_endpoint, zmq_strerror(zmq_errno()));
    } else if (pthread_create(&z->thread, NULL, zap_thread, z) != 0) {
        s = pp_error(PP_ERR_IO, "ZAP handler: cannot start a thread");
    }
    if (s != PP_OK) {
        int zero = 0;
        if (z->rep) zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof zero), zmq_close(z->rep);
        if (z->ctl) zmq_setsockopt(z->ctl, ZMQ_LINGER, &zero, sizeof zero), zmq_close(z->ctl);
        pthread_mutex_destroy(&z->lock);
        free(z);
        return s;
    }
    *out = z;
    return PP_OK;
}

void pp_zap_stop(pp_zap *z) {
    if (!z) return;
    void *s = zmq_socket(z->ctx, ZMQ_PUSH);
    if (s && zmq_connect(s, z->ctl_endpoint) == 0) zmq_send(s, "", 0, 0);
    if (s) zmq_close(s); /* default linger: the handler is alive and reads it */
    pthread_join(z->thread, NULL);
    while (z->domains) {
        pp_zap_domain *d = z->domains;
        z->domains = d->next;
        free(d->keys);
        free(d);
    }
    pthread_mutex_destroy(&z->lock);
    free(z);
}

pp_status pp_zap_add(pp_zap *z, const char *name, const uint8_t (*keys)[32], int nkeys,
                     pp_zap_domain **out) {
    pp_zap_domain *d = calloc(1, sizeof *d);
    if (!d) return pp_error(PP_ERR_NOMEM, "out of memory");
    snprintf(d->name, sizeof d->name, "%s", name);
    if (nkeys > 0) {
        d->keys = malloc((size_t)nkeys * sizeof *d->keys);
        if (!d->keys) {
            free(d);
            return pp_error(PP_ERR_NOMEM, "out of memory");
        }
        memcpy(d->keys, keys, (size_t)nkeys * sizeof *d->keys);
    }
    d->nkeys = nkeys;
    atomic_init(&d->refused, 0);
    pthread_mutex_lock(&z->lock);
    d->next = z->domains;
    z->domains = d;
    pthread_mutex_unlock(&z->lock);
    *out = d;
    return PP_OK;
}

void pp_zap_remove(pp_zap *z, pp_zap_domain *d) {
    if (!z || !d) return;
    pthread_mutex_lock(&z->lock);
    for (pp_zap_domain **p = &z->domains; *p; p = &(*p)->next)
        if (*p == d) {
            *p = d->next;
            break;
        }
    pthread_mutex_unlock(&z->lock);
    free(d->keys);
    free(d);
}
