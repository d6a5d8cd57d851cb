/* Plain TCP links beside the transport (direct_tcp.h). */
#include "direct_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log_internal.h"
#include "status_internal.h"
#include "transport_internal.h"

#define HELLO_MAGIC "pippinD1"
#define NONCE_BYTES 16
/* A connection that says nothing for this long is not one of ours. */
#define HELLO_MS 2000

typedef struct hello {
    char magic[8];
    unsigned char nonce[NONCE_BYTES];
    uint64_t run_id;
    uint32_t purpose;
    int32_t sender;
} hello;

#define MAX_PENDING 8 /* connections accepted whose hello is not in yet */

typedef struct pending {
    int fd;
    size_t got;
    int64_t since_ms;
    hello h;
} pending;

struct pp_direct_listener {
    int fd;
    uint32_t purpose;
    int32_t peer;
    uint64_t run_id;
    unsigned char nonce[NONCE_BYTES];
    pending wait[MAX_PENDING];
    int n_wait;
    unsigned refused; /* connections closed: warned at 1, 2, 4, ... */
};

/* HOST of "tcp://HOST:PORT" (brackets of an IPv6 address dropped); 0 if
 * the endpoint is not tcp or its host is a wildcard. */
static int endpoint_host(const char *ep, char *host, size_t cap) {
    if (strncmp(ep, "tcp://", 6) != 0) return 0;
    const char *h = ep + 6, *colon = strrchr(h, ':');
    if (!colon || colon == h) return 0;
    size_t n = (size_t)(colon - h);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') h++, n -= 2;
    if (n == 0 || n >= cap) return 0;
    memcpy(host, h, n);
    host[n] = 0;
    return strcmp(host, "*") != 0 && strcmp(host, "0.0.0.0") != 0 && strcmp(host, "::") != 0;
}

/* Whether ep is tcp with a wildcard host ("*", 0.0.0.0, ::). */
static int wildcard_tcp(const char *ep) {
    char host[64];
    return strncmp(ep, "tcp://", 6) == 0 && !endpoint_host(ep, host, sizeof host) &&
           (strncmp(ep + 6, "*:", 2) == 0 || strncmp(ep + 6, "0.0.0.0:", 8) == 0 || strncmp(ep + 6, "[::]:", 5) == 0);
}

/* The host a listener binds (NULL: every interface) and the host its offer
 * names: the transport's own when it is bound to one tcp address; bound to
 * every interface (bind_endpoint "tcp://" "*:5555"), every interface too,
 * offered as the host peers were told to connect to (its endpoint in the
 * list), where that is one. 0 if neither. */
static int listen_hosts(const pp_transport *t, char *bind_host, char *offer_host, size_t cap) {
    if (endpoint_host(pp_transport_endpoint(t), bind_host, cap)) {
        snprintf(offer_host, cap, "%s", bind_host);
        return 1;
    }
    bind_host[0] = 0;
    return wildcard_tcp(pp_transport_endpoint(t)) && t->advertised[0] &&
           endpoint_host(t->advertised, offer_host, cap);
}

int pp_direct_possible(const pp_transport *t, const char **why) {
    char host[64], offer[64];
    *why = "";
    if (t->curve) *why = "the transport is encrypted (CURVE) and direct links are not";
    else if (!listen_hosts(t, host, offer, sizeof host))
        *why = "the transport is not bound to one tcp address, nor to every interface with its own address in the "
               "endpoint list";
    return !**why;
}

static int set_flags(int fd) {
    int one = 1;
    int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0 &&
           setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0;
}

/* numeric: an offer's address (never a name: no lookup, the address bound) */
static pp_status resolve_as(const char *host, const char *port, int numeric, int family, struct addrinfo **ai) {
    struct addrinfo hints = {0};
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (numeric ? AI_NUMERICHOST : 0);
    int rc = getaddrinfo(host, port, &hints, ai);
    if (rc != 0) return pp_error(PP_ERR_IO, "direct link: address %s port %s: %s", host, port, gai_strerror(rc));
    return PP_OK;
}

static pp_status resolve(const char *host, const char *port, int numeric, struct addrinfo **ai) {
    return resolve_as(host, port, numeric, AF_UNSPEC, ai);
}

pp_status pp_direct_listen(pp_transport *t, uint32_t purpose, int32_t peer, char *offer, pp_direct_listener **out) {
    *out = NULL;
    const char *why;
    if (!pp_direct_possible(t, &why)) return pp_error(PP_ERR_UNSUPPORTED, "direct link: %s", why);
    char bind_host[64], host[64];
    listen_hosts(t, bind_host, host, sizeof host);
    struct addrinfo *ai;
    if (resolve(host, "0", 1, &ai) != PP_OK) PP_TRY(resolve(host, "0", 0, &ai)); /* a name: looked up once */
    pp_direct_listener *l = calloc(1, sizeof *l);
    if (!l) {
        freeaddrinfo(ai);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    struct sockaddr_storage at; /* where it listens: host's address, or every interface of its family */
    socklen_t at_len = (socklen_t)ai->ai_addrlen;
    memcpy(&at, ai->ai_addr, ai->ai_addrlen);
    if (!bind_host[0] && at.ss_family == AF_INET) ((struct sockaddr_in *)&at)->sin_addr.s_addr = htonl(INADDR_ANY);
    if (!bind_host[0] && at.ss_family == AF_INET6) ((struct sockaddr_in6 *)&at)->sin6_addr = in6addr_any;
    l->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char bound[64], port[8];
    int ok = l->fd >= 0 && bind(l->fd, (struct sockaddr *)&at, at_len) == 0 && listen(l->fd, MAX_PENDING) == 0 &&
             getsockname(l->fd, (struct sockaddr *)&sa, &len) == 0;
    int e = errno;
    /* the offer names the address bound, as a number; on every interface,
     * host's address (the one peers reach this rank at) with the port bound */
    if (ok && !bind_host[0]) {
        char ignored[8];
        if (getnameinfo(ai->ai_addr, (socklen_t)ai->ai_addrlen, bound, sizeof bound, ignored, sizeof ignored,
                        NI_NUMERICHOST | NI_NUMERICSERV) != 0 ||
            getnameinfo((struct sockaddr *)&sa, len, NULL, 0, port, sizeof port, NI_NUMERICSERV) != 0)
            ok = 0, e = EINVAL;
    } else if (ok && getnameinfo((struct sockaddr *)&sa, len, bound, sizeof bound, port, sizeof port,
                                 NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        ok = 0, e = EINVAL;
    freeaddrinfo(ai);
    if (!ok) {
        if (l->fd >= 0) close(l->fd);
        free(l);
        return pp_error(PP_ERR_IO, "direct link: listening on %s: %s", host, strerror(e));
    }
    if (getrandom(l->nonce, sizeof l->nonce, 0) != (ssize_t)sizeof l->nonce) {
        close(l->fd);
        free(l);
        return pp_error(PP_ERR_IO, "direct link: no random bytes for its nonce");
    }
    l->purpose = purpose;
    l->peer = peer;
    l->run_id = pp_transport_run_id(t);
    int n = snprintf(offer, PP_DIRECT_OFFER_CAP, "tcp %s %s ", bound, port);
    for (int i = 0; i < NONCE_BYTES && n > 0 && n + 2 < PP_DIRECT_OFFER_CAP; i++)
        n += snprintf(offer + n, PP_DIRECT_OFFER_CAP - (size_t)n, "%02x", l->nonce[i]);
    *out = l;
    return PP_OK;
}

int pp_direct_listener_fd(const pp_direct_listener *l) { return l->fd; }

void pp_direct_listener_free(pp_direct_listener *l) {
    if (!l) return;
    for (int i = 0; i < l->n_wait; i++) close(l->wait[i].fd);
    close(l->fd);
    free(l);
}

const char *pp_direct_hello_check(const void *buf, size_t n, const unsigned char nonce[16], uint64_t run_id,
                                  uint32_t purpose, int32_t peer) {
    hello h;
    if (n != sizeof h) return "sent a hello of another size";
    memcpy(&h, buf, sizeof h);
    if (memcmp(h.magic, HELLO_MAGIC, 8) != 0) return "is not a pippin direct link";
    if (memcmp(h.nonce, nonce, NONCE_BYTES) != 0) return "does not carry the nonce offered";
    if (run_id && h.run_id && h.run_id != run_id) return "belongs to another run";
    if (h.purpose != purpose || h.sender != peer) return "is for another link";
    return "";
}

static void refuse_fd(pp_direct_listener *l, int fd, const char *what) {
    unsigned n = ++l->refused;
    if ((n & (n - 1)) == 0) /* 1, 2, 4, ...: not every stranger's attempt */
        pp_warn("direct link: closed a connection that %s (expected sender %d; %u closed so far)", what,
                (int)l->peer, n);
    close(fd);
}

static void refuse(pp_direct_listener *l, int i, const char *what) {
    refuse_fd(l, l->wait[i].fd, what);
    l->wait[i] = l->wait[--l->n_wait];
}

/* Every waiting hello read as far as it came; 1 with *fd the first that
 * matches (taken out), else those that failed or went silent closed. */
static int check_hellos(pp_direct_listener *l, int *fd) {
    for (int i = 0; i < l->n_wait;) {
        pending *p = &l->wait[i];
        ssize_t k = p->got < sizeof p->h ? recv(p->fd, (char *)&p->h + p->got, sizeof p->h - p->got, MSG_DONTWAIT) : 0;
        if (k > 0) p->got += (size_t)k;
        if (p->got == sizeof p->h) {
            const char *what = pp_direct_hello_check(&p->h, sizeof p->h, l->nonce, l->run_id, l->purpose, l->peer);
            if (!*what) {
                *fd = p->fd;
                l->wait[i] = l->wait[--l->n_wait];
                return 1;
            }
            refuse(l, i, what);
        } else if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            refuse(l, i, "closed before its hello");
        } else if (now_ms() - p->since_ms > HELLO_MS) {
            refuse(l, i, "sent no hello");
        } else {
            i++;
        }
    }
    return 0;
}

/* One pass without blocking: new connections taken in, every waiting hello
 * read as far as it came; *fd the first that matches. With MAX_PENDING
 * waiting, their hellos are read first, and if none is done a newcomer is
 * closed: never one that waits (the expected sender, whose hello may be on
 * its way, cannot be pushed out by strangers connecting after it). */
static void accept_pass(pp_direct_listener *l, int *fd) {
    for (;;) {
        if (l->n_wait == MAX_PENDING && check_hellos(l, fd)) return;
        int c = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) break; /* EAGAIN, or an aborted connection: the next pass looks again */
        if (l->n_wait == MAX_PENDING) {
            refuse_fd(l, c, "came while too many waited");
            continue;
        }
        if (!set_flags(c)) {
            close(c);
            continue;
        }
        l->wait[l->n_wait++] = (pending){c, 0, now_ms(), {{0}}};
    }
    check_hellos(l, fd);
}

pp_status pp_direct_accept(pp_direct_listener *l, int timeout_ms, int *fd) {
    *fd = -1;
    int64_t until = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        accept_pass(l, fd);
        int64_t left = until - now_ms();
        if (*fd >= 0 || left <= 0) return PP_OK;
        struct pollfd pf[1 + MAX_PENDING];
        pf[0] = (struct pollfd){l->fd, POLLIN, 0};
        for (int i = 0; i < l->n_wait; i++) pf[1 + i] = (struct pollfd){l->wait[i].fd, POLLIN, 0};
        poll(pf, (nfds_t)(1 + l->n_wait), (int)(left > 100 ? 100 : left));
    }
}

/* An offer's fields ("tcp HOST PORT NONCE"); 0 if it has not three. */
static int offer_fields(const char *text, char host[64], char port[8], char nonce[2 * NONCE_BYTES + 2]) {
    return sscanf(text, "tcp %63s %7s %33s", host, port, nonce) == 3;
}

int pp_direct_offer_valid(const char *text) {
    char host[64], port[8], nonce[2 * NONCE_BYTES + 2];
    if (!offer_fields(text, host, port, nonce)) return 0;
    char *end;
    long pn = strtol(port, &end, 10);
    if (*end || pn <= 0 || pn > 65535 || strlen(nonce) != 2 * NONCE_BYTES) return 0;
    for (const char *p = nonce; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    return 1;
}

static int write_all(int fd, const void *buf, size_t n, int ms) {
    size_t put = 0;
    int64_t until = now_ms() + ms;
    while (put < n) {
        ssize_t k = send(fd, (const char *)buf + put, n - put, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            put += (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 0;
        int64_t left = until - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {fd, POLLOUT, 0};
        poll(&p, 1, (int)left);
    }
    return 1;
}

/* Test hook: connects look in progress for this long. */
static atomic_int connect_lag_ms;
void pp_direct_test_connect_lag(int ms) { atomic_store(&connect_lag_ms, ms); }

struct pp_direct_conn {
    int fd;
    int64_t lag_until;
    char host[256], port[8]; /* the peer's endpoint's host, the offer's port */
    hello h;
};

pp_status pp_direct_connect_start(pp_transport *t, const char *offer, uint32_t purpose, int32_t me, int peer,
                                  pp_direct_conn **out) {
    *out = NULL;
    char nonce[2 * NONCE_BYTES + 2];
    pp_direct_conn *c = calloc(1, sizeof *c);
    if (!c) return pp_error(PP_ERR_NOMEM, "out of memory");
    c->fd = -1;
    char offered_host[64];
    if (!pp_direct_offer_valid(offer) || !offer_fields(offer, offered_host, c->port, nonce)) {
        free(c);
        return pp_error(PP_ERR_PEER, "direct link: malformed offer \"%.80s\"", offer);
    }
    if (peer < 0 || peer >= t->nranks) {
        free(c);
        return pp_error(PP_ERR_INVALID, "direct link to rank %d: no such rank", peer);
    }
    c->h = (hello){{0}, {0}, pp_transport_run_id(t), purpose, me};
    memcpy(c->h.magic, HELLO_MAGIC, 8);
    for (int i = 0; i < NONCE_BYTES; i++) {
        unsigned v;
        sscanf(nonce + 2 * i, "%2x", &v);
        c->h.nonce[i] = (unsigned char)v;
    }
    /* The host this rank reaches the peer at, not the offer's (see the
     * header): a number, or a name looked up for IPv4 as libzmq does
     * (pippin sets no ZMQ_IPV6; "localhost" may list ::1 first). Only an
     * endpoint that names no host this way (a wildcard, an interface, a
     * "src;dst" form) leaves the offer's, a number its rank bound. */
    struct addrinfo *ai = NULL;
    pp_status s = PP_ERR_INVALID;
    if (endpoint_host(peer_ep(t, peer), c->host, sizeof c->host) &&
        (s = resolve(c->host, c->port, 1, &ai)) != PP_OK)
        s = resolve_as(c->host, c->port, 0, AF_INET, &ai);
    if (s != PP_OK) {
        snprintf(c->host, sizeof c->host, "%s", offered_host);
        s = resolve(c->host, c->port, 1, &ai);
    }
    if (s != PP_OK) {
        free(c);
        return s;
    }
    c->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok = c->fd >= 0 && set_flags(c->fd) && (connect(c->fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS);
    int e = errno;
    freeaddrinfo(ai);
    if (!ok) {
        s = pp_error(PP_ERR_IO, "direct link to %s port %s: connect: %s", c->host, c->port, strerror(e));
        pp_direct_conn_free(c);
        return s;
    }
    int lag = atomic_load(&connect_lag_ms);
    c->lag_until = lag > 0 ? now_ms() + lag : 0;
    *out = c;
    return PP_OK;
}

int pp_direct_conn_fd(const pp_direct_conn *c) { return c->fd; }

pp_status pp_direct_connect_finish(pp_direct_conn *c, int timeout_ms, int *fd) {
    *fd = -1;
    if (c->lag_until) {
        int64_t left = c->lag_until - now_ms();
        if (left > 0) {
            if (timeout_ms <= 0) return PP_OK;
            struct timespec ts = {0, (long)((left < timeout_ms ? left : timeout_ms) * 1000000L)};
            nanosleep(&ts, NULL);
            if (c->lag_until > now_ms()) return PP_OK;
        }
        c->lag_until = 0;
    }
    struct pollfd p = {c->fd, POLLOUT, 0};
    if (poll(&p, 1, timeout_ms > 0 ? timeout_ms : 0) != 1) return PP_OK; /* still connecting */
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    /* the hello: 40 bytes into an empty socket buffer */
    if (!err && !write_all(c->fd, &c->h, sizeof c->h, HELLO_MS)) err = errno ? errno : EIO;
    if (err)
        return pp_error(PP_ERR_IO, "direct link to %s port %s: connect: %s (a firewall? "
                        "gradient_buckets.direct_links: false keeps the sums in the transport)",
                        c->host, c->port, strerror(err));
    *fd = c->fd;
    c->fd = -1; /* the caller's now */
    return PP_OK;
}

void pp_direct_conn_free(pp_direct_conn *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    free(c);
}
