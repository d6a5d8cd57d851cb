/* A stage's gradient ring over direct TCP links (grad_tcp.h). */
#include "grad_tcp.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "pippin/exec.h"
#include "direct_tcp.h"
#include "grad_ring.h"
#include "group_offer.h"
#include "log_internal.h"
#include "status_internal.h"
#include "vec.h"

#define OFFER_MICROBATCH (PP_GRAD_RING_MICROBATCH - 3)
#define OFFER_NAME "pippin:tcp:offer"
#define DECLINE "-"
#define PURPOSE_GRAD 0x47000000u /* | stage: a link of the gradient ring */
#define WIRE_TAG 0x31545050u    /* "PPT1" */
/* Received values to be added go through a buffer this size, added as
 * each fills, so the sum reads them while they are still in cache. */
#define STAGE_BYTES ((size_t)256 << 10)
#define POLL_SLICE_MS 100 /* between looks at the transport for a peer that is gone */
#define SETUP_SLICE_MS 10 /* while the links come up (once per group) */
/* A call that does not wait moves at most this much before it returns,
 * so that the rank's next action is not held up by a whole bucket. */
#define NOWAIT_BUDGET ((size_t)4 << 20)

typedef struct wire_header {
    uint32_t tag;
    int32_t phase;
    int64_t seq;   /* the group's collective number */
    int64_t count; /* float32 values that follow */
    int32_t bucket;
    int32_t pad;
} wire_header;

enum { OFFERING, IN_USE, DECLINED };

struct pp_grad_tcp {
    pp_grad_tcp_options o;
    int64_t step; /* of the agreement */
    int state;
    pp_direct_listener *listener; /* until the previous replica's link is accepted */
    pp_direct_conn *conn;         /* until the link to the next replica is up */
    char *offered;                /* [R]: 0 not yet, 1 an offer, 2 declined */
    char next_offer[PP_DIRECT_OFFER_CAP];
    int send_fd, recv_fd;
    int broken;
    int64_t seq; /* collectives done */
    /* the collective in progress */
    int busy, sp, rp;        /* phases sent, received */
    size_t sdone, rdone;     /* bytes of the current phase's message, header included */
    wire_header shdr, rhdr;
    float *staging;
};

static int mod(int a, int r) { return ((a % r) + r) % r; }

static int world_rank(const pp_grad_tcp *s, int k) {
    return s->o.t ? pp_transport_stage_rank(s->o.t, k * s->o.n_stages + s->o.stage) : -1;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static pp_group_offer offer_group(const pp_grad_tcp *s) {
    return (pp_group_offer){s->o.t, s->step, OFFER_MICROBATCH, OFFER_NAME, "a direct link", s->o.replicas,
                            s->o.replica, s->o.n_stages, s->o.stage};
}

static void close_links(pp_grad_tcp *s) {
    pp_direct_listener_free(s->listener);
    s->listener = NULL;
    pp_direct_conn_free(s->conn);
    s->conn = NULL;
    if (s->send_fd >= 0) close(s->send_fd);
    if (s->recv_fd >= 0) close(s->recv_fd);
    s->send_fd = s->recv_fd = -1;
}

void pp_grad_tcp_free(pp_grad_tcp *s) {
    if (!s) return;
    close_links(s);
    free(s->offered);
    free(s->staging);
    free(s);
}

pp_status pp_grad_tcp_new(const pp_grad_tcp_options *o, int64_t step, pp_grad_tcp **out) {
    *out = NULL;
    if (o->replicas < 2 || o->replica < 0 || o->replica >= o->replicas || o->stage < 0 || o->stage >= (1 << 24))
        return pp_error(PP_ERR_INVALID, "gradient ring over direct links: replica %d of %d, stage %d", o->replica,
                        o->replicas, o->stage);
    pp_grad_tcp *s = calloc(1, sizeof *s);
    if (s) s->offered = calloc((size_t)o->replicas, 1);
    if (!s || !s->offered) {
        free(s);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    s->o = *o;
    s->step = step;
    s->state = OFFERING;
    s->send_fd = s->recv_fd = -1;
    char text[PP_DIRECT_OFFER_CAP] = DECLINE;
    const char *why = "the ring was told not to";
    if (o->offer && pp_direct_possible(o->t, &why)) {
        int prev = mod(o->replica - 1, o->replicas);
        if (pp_direct_listen(o->t, PURPOSE_GRAD | (uint32_t)o->stage, prev, text, &s->listener) != PP_OK) {
            why = pp_last_error();
            snprintf(text, sizeof text, DECLINE);
        }
    }
    if (!s->listener)
        pp_debug("stage %d replica %d: no direct links for the gradient ring (%s)", o->stage, o->replica, why);
    s->offered[o->replica] = s->listener ? 1 : 2;
    pp_group_offer og = offer_group(s);
    pp_status st = pp_group_offer_send(&og, text);
    if (st != PP_OK) {
        pp_grad_tcp_free(s);
        return st;
    }
    *out = s;
    return PP_OK;
}

pp_status pp_grad_tcp_new_connected(const pp_grad_tcp_options *o, int send_fd, int recv_fd, pp_grad_tcp **out) {
    *out = NULL;
    pp_grad_tcp *s = calloc(1, sizeof *s);
    if (s) s->offered = calloc((size_t)(o->replicas > 0 ? o->replicas : 1), 1);
    if (s && s->offered) s->staging = malloc(STAGE_BYTES);
    if (!s || !s->offered || !s->staging) {
        if (s) free(s->offered);
        free(s);
        close(send_fd);
        close(recv_fd);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    s->o = *o;
    s->state = IN_USE;
    s->send_fd = send_fd;
    s->recv_fd = recv_fd;
    *out = s;
    return PP_OK;
}

static pp_status fail(pp_grad_tcp *s, pp_status st) {
    s->broken = 1;
    return st;
}

/* Every offer is in: connect to the next replica, or give up on links if
 * anyone declined. */
static pp_status decide(pp_grad_tcp *s) {
    int all = 1;
    for (int k = 0; k < s->o.replicas; k++) all &= s->offered[k] == 1;
    if (!all) {
        s->state = DECLINED;
        close_links(s);
        pp_debug("stage %d replica %d: a replica offered no direct link: gradients summed through the transport",
                 s->o.stage, s->o.replica);
        return PP_OK;
    }
    int next = mod(s->o.replica + 1, s->o.replicas);
    if (!(s->staging = malloc(STAGE_BYTES))) return fail(s, pp_error(PP_ERR_NOMEM, "out of memory"));
    /* started here, finished by the first collective (a round trip away
     * on another host: a progress pass must not wait for it) */
    pp_status st = pp_direct_connect_start(s->o.t, s->next_offer, PURPOSE_GRAD | (uint32_t)s->o.stage, s->o.replica,
                                           world_rank(s, next), &s->conn);
    if (st != PP_OK)
        return fail(s, pp_error_context(st, "stage %d: the gradient ring's link to replica %d (rank %d)", s->o.stage,
                                        next, world_rank(s, next)));
    s->state = IN_USE;
    pp_debug("stage %d replica %d: the %d replicas sum gradients over direct links", s->o.stage, s->o.replica,
             s->o.replicas);
    return PP_OK;
}

pp_status pp_grad_tcp_agree(pp_grad_tcp *s, int wait, int timeout_ms, int *decided) {
    *decided = s->state != OFFERING;
    if (*decided) return PP_OK;
    if (s->broken) return pp_error(PP_ERR_STATE, "stage %d: the direct-link agreement failed before", s->o.stage);
    int tmo = timeout_ms < 0 ? pp_transport_timeout_ms(s->o.t) : timeout_ms;
    int next = mod(s->o.replica + 1, s->o.replicas);
    pp_group_offer og = offer_group(s);
    for (int k = 0; k < s->o.replicas; k++) {
        if (s->offered[k]) continue;
        char text[PP_DIRECT_OFFER_CAP];
        int got;
        pp_status st = pp_group_offer_take(&og, k, wait, tmo, text, sizeof text, &got);
        if (st != PP_OK) return fail(s, st);
        if (!got) return PP_OK;
        if (strcmp(text, DECLINE) == 0) {
            s->offered[k] = 2;
            continue;
        }
        if (!pp_direct_offer_valid(text))
            return fail(s, pp_error(PP_ERR_PEER, "stage %d: replica %d (rank %d) sent a malformed direct-link offer",
                                    s->o.stage, k, world_rank(s, k)));
        if (k == next) memcpy(s->next_offer, text, sizeof text);
        s->offered[k] = 1;
    }
    *decided = 1;
    return decide(s);
}

int pp_grad_tcp_in_use(const pp_grad_tcp *s) { return s->state == IN_USE; }
int pp_grad_tcp_broken(const pp_grad_tcp *s) { return s->broken || s->busy || s->state == OFFERING; }

/* ---- one collective ---- */

PP_VEC_CLONES static void add_block(float *restrict dst, const float *restrict src, int64_t n) {
    PP_VFOR(i, n, dst[i] += src[i];);
}

static pp_status peer_error(pp_grad_tcp *s, int k, int bucket, const char *what, int err) {
    return fail(s, pp_error(err == ETIMEDOUT ? PP_ERR_TIMEOUT : PP_ERR_PEER,
                            "stage %d: summing gradients over direct links (bucket %d): replica %d (rank %d) %s%s%s",
                            s->o.stage, bucket, k, world_rank(s, k), what, err && err != ETIMEDOUT ? ": " : "",
                            err && err != ETIMEDOUT ? strerror(err) : ""));
}

/* Writes as much of the phases' messages as the socket takes. */
static pp_status pump_send(pp_grad_tcp *s, const pp_grad_tcp_phase *ph, int n, int bucket, size_t *moved) {
    int next = mod(s->o.replica + 1, s->o.replicas);
    while (s->sp < n && (s->sp == 0 || s->rp >= s->sp)) {
        const pp_grad_tcp_phase *p = &ph[s->sp];
        size_t payload = (size_t)p->nsend * sizeof(float), total = sizeof(wire_header) + payload;
        if (s->sdone == 0) s->shdr = (wire_header){WIRE_TAG, s->sp, s->seq, p->nsend, bucket, 0};
        struct iovec iov[2];
        int niov = 0;
        if (s->sdone < sizeof(wire_header))
            iov[niov++] = (struct iovec){(char *)&s->shdr + s->sdone, sizeof(wire_header) - s->sdone};
        size_t from = s->sdone > sizeof(wire_header) ? s->sdone - sizeof(wire_header) : 0;
        if (payload > from) iov[niov++] = (struct iovec){(char *)p->send + from, payload - from};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t k = sendmsg(s->send_fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return PP_OK;
            return peer_error(s, next, bucket, "cannot be written to", errno);
        }
        s->sdone += (size_t)k;
        *moved += (size_t)k;
        if (s->sdone == total) s->sp++, s->sdone = 0;
    }
    return PP_OK;
}

/* Reads as much of the phases' messages as has arrived, adding or
 * copying the values into place. */
static pp_status pump_recv(pp_grad_tcp *s, const pp_grad_tcp_phase *ph, int n, int bucket, size_t *moved) {
    int prev = mod(s->o.replica - 1, s->o.replicas);
    while (s->rp < n) {
        const pp_grad_tcp_phase *p = &ph[s->rp];
        size_t payload = (size_t)p->nrecv * sizeof(float);
        void *dst;
        size_t want, at = s->rdone - sizeof(wire_header);
        if (s->rdone < sizeof(wire_header)) {
            dst = (char *)&s->rhdr + s->rdone;
            want = sizeof(wire_header) - s->rdone;
        } else if (p->add) {
            dst = (char *)s->staging + at % STAGE_BYTES;
            want = STAGE_BYTES - at % STAGE_BYTES;
            if (want > payload - at) want = payload - at;
        } else {
            dst = (char *)p->recv + at;
            want = payload - at;
        }
        ssize_t k = want ? recv(s->recv_fd, dst, want, MSG_DONTWAIT) : 0;
        if (want && k <= 0) {
            if (k < 0 && errno == EINTR) continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return PP_OK;
            return peer_error(s, prev, bucket, k == 0 ? "closed its link" : "cannot be read from", k == 0 ? 0 : errno);
        }
        s->rdone += (size_t)k;
        *moved += (size_t)k + !k; /* a header-only phase moves too */
        if (s->rdone == sizeof(wire_header) && k > 0) {
            const wire_header *h = &s->rhdr;
            if (h->tag != WIRE_TAG || h->phase != s->rp || h->seq != s->seq || h->count != p->nrecv ||
                h->bucket != bucket) {
                char what[200];
                snprintf(what, sizeof what, "sent phase %d of collective %lld (bucket %d, %lld values) where phase %d "
                         "of collective %lld (bucket %d, %lld values) was due (do the replicas hold the same stage "
                         "and gradient ring options?)", (int)h->phase, (long long)h->seq, (int)h->bucket,
                         (long long)h->count, s->rp, (long long)s->seq, bucket, (long long)p->nrecv);
                return peer_error(s, prev, bucket, h->tag == WIRE_TAG ? what : "sent something that is not a "
                                  "gradient chunk", 0);
            }
        }
        size_t now = s->rdone - sizeof(wire_header);
        if (s->rdone > sizeof(wire_header) && p->add && (now % STAGE_BYTES == 0 || now == payload)) {
            size_t block = (now - 1) / STAGE_BYTES * STAGE_BYTES;
            add_block(p->recv + block / sizeof(float), s->staging, (int64_t)((now - block) / sizeof(float)));
        }
        if (s->rdone == sizeof(wire_header) + payload) s->rp++, s->rdone = 0;
    }
    return PP_OK;
}

/* Between slices of a wait: the transport's view of replica k (a peer
 * whose host is gone never closes its link). */
static pp_status look_at_transport(pp_grad_tcp *s, int k, int bucket) {
    if (!s->o.t) return PP_OK;
    pp_status st = pp_transport_poll(s->o.t, 0);
    if (st != PP_OK)
        return fail(s, pp_error_context(st, "stage %d: summing gradients over direct links (bucket %d) with replica %d",
                                        s->o.stage, bucket, k));
    pp_peer_state ps = pp_transport_peer_state(s->o.t, world_rank(s, k));
    if (ps == PP_PEER_DOWN || ps == PP_PEER_CLOSED || ps == PP_PEER_REJECTED) {
        char what[64];
        snprintf(what, sizeof what, "is gone (%s)", pp_peer_state_name(ps));
        return peer_error(s, k, bucket, what, 0);
    }
    return PP_OK;
}

/* Brings both links up: the one to the next replica (started by the
 * agreement) connected and its hello sent, the previous replica's
 * accepted. *up 0 while either is still under way (wait 0 returns then). */
static pp_status links_up(pp_grad_tcp *s, int wait, int timeout_ms, int bucket, int *up) {
    int prev = mod(s->o.replica - 1, s->o.replicas), next = mod(s->o.replica + 1, s->o.replicas);
    int64_t deadline = now_ms() + timeout_ms, look = now_ms() + POLL_SLICE_MS;
    for (;;) {
        if (s->conn) {
            pp_status st = pp_direct_connect_finish(s->conn, 0, &s->send_fd);
            if (st != PP_OK)
                return fail(s, pp_error_context(st, "stage %d: the gradient ring's link to replica %d (rank %d)",
                                                s->o.stage, next, world_rank(s, next)));
            if (s->send_fd >= 0) {
                pp_direct_conn_free(s->conn);
                s->conn = NULL;
            }
        }
        if (s->recv_fd < 0) {
            pp_status st = pp_direct_accept(s->listener, 0, &s->recv_fd);
            if (st != PP_OK)
                return fail(s, pp_error_context(st, "stage %d: the gradient ring's link from replica %d (rank %d)",
                                                s->o.stage, prev, world_rank(s, prev)));
            if (s->recv_fd >= 0) {
                pp_direct_listener_free(s->listener);
                s->listener = NULL;
            }
        }
        *up = s->send_fd >= 0 && s->recv_fd >= 0;
        if (*up || !wait) return PP_OK;
        int64_t now = now_ms();
        if (now >= deadline)
            return peer_error(s, s->recv_fd < 0 ? prev : next, bucket,
                              s->recv_fd < 0 ? "did not connect its link" : "did not take our link", ETIMEDOUT);
        if (now >= look) {
            PP_TRY(look_at_transport(s, s->recv_fd < 0 ? prev : next, bucket));
            look = now + POLL_SLICE_MS;
        }
        struct pollfd pf[2];
        int np = 0;
        if (s->conn) pf[np++] = (struct pollfd){pp_direct_conn_fd(s->conn), POLLOUT, 0};
        if (s->recv_fd < 0) pf[np++] = (struct pollfd){pp_direct_listener_fd(s->listener), POLLIN, 0};
        poll(pf, (nfds_t)np, SETUP_SLICE_MS);
    }
}

pp_status pp_grad_tcp_run(pp_grad_tcp *s, const pp_grad_tcp_phase *ph, int nphases, int bucket, int wait,
                          int timeout_ms, int *done) {
    *done = 0;
    if (s->state != IN_USE || s->broken)
        return pp_error(PP_ERR_STATE, "stage %d: the gradient ring's direct links are not in use", s->o.stage);
    int prev = mod(s->o.replica - 1, s->o.replicas), next = mod(s->o.replica + 1, s->o.replicas);
    int up;
    PP_TRY(links_up(s, wait, timeout_ms, bucket, &up));
    if (!up) return PP_OK;
    if (!s->busy) {
        s->busy = 1;
        s->sp = s->rp = 0;
        s->sdone = s->rdone = 0;
    }
    int64_t deadline = now_ms() + timeout_ms;
    size_t budget = 0;
    for (;;) {
        size_t moved = 0;
        PP_TRY(pump_send(s, ph, nphases, bucket, &moved));
        PP_TRY(pump_recv(s, ph, nphases, bucket, &moved));
        if (s->sp == nphases && s->rp == nphases) {
            s->busy = 0;
            s->seq++;
            *done = 1;
            return PP_OK;
        }
        budget += moved;
        if (!wait && (!moved || budget >= NOWAIT_BUDGET)) return PP_OK;
        if (moved) {
            deadline = now_ms() + timeout_ms;
            continue;
        }
        /* stuck: on the previous replica's chunk if one is due, else on
         * the next replica taking ours */
        int sending = s->sp < nphases && (s->sp == 0 || s->rp >= s->sp), receiving = s->rp < nphases;
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            char what[64];
            snprintf(what, sizeof what, "%s for %d ms", receiving ? "sent nothing" : "took nothing", timeout_ms);
            return peer_error(s, receiving ? prev : next, bucket, what, ETIMEDOUT);
        }
        struct pollfd pf[2];
        int np = 0;
        if (sending) pf[np++] = (struct pollfd){s->send_fd, POLLOUT, 0};
        if (receiving) pf[np++] = (struct pollfd){s->recv_fd, POLLIN, 0};
        pp_share_cores_idle(1); /* asleep: lend this rank's threads, as a blocking receive does */
        int rc = poll(pf, (nfds_t)np, (int)(left < POLL_SLICE_MS ? left : POLL_SLICE_MS));
        pp_share_cores_idle(0);
        if (rc == 0) PP_TRY(look_at_transport(s, receiving ? prev : next, bucket));
    }
}
