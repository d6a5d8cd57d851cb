/* Plain TCP links beside the transport (direct_tcp.h). */
#include "direct_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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

struct pp_direct_listener {
    int fd;
    uint32_t purpose;
    int32_t peer;
    uint64_t run_id;
    unsigned char nonce[NONCE_BYTES];
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

int pp_direct_possible(const pp_transport *t, const char **why) {
    char host[64];
    *why = "";
    if (t->curve) *why = "the transport is encrypted (CURVE) and direct links are not";
    else if (!endpoint_host(pp_transport_endpoint(t), host, sizeof host))
        *why = "the transport is not bound to one tcp address";
    return !**why;
}

static int set_flags(int fd) {
    int one = 1;
    int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0 &&
           setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0;
}

static pp_status resolve(const char *host, const char *port, struct addrinfo **ai) {
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, ai);
    if (rc != 0) return pp_error(PP_ERR_IO, "direct link: address %s port %s: %s", host, port, gai_strerror(rc));
    return PP_OK;
}

pp_status pp_direct_listen(pp_transport *t, uint32_t purpose, int32_t peer, char *offer, pp_direct_listener **out) {
    *out = NULL;
    const char *why;
    if (!pp_direct_possible(t, &why)) return pp_error(PP_ERR_UNSUPPORTED, "direct link: %s", why);
    char host[64];
    endpoint_host(pp_transport_endpoint(t), host, sizeof host);
    struct addrinfo *ai;
    PP_TRY(resolve(host, "0", &ai));
    pp_direct_listener *l = calloc(1, sizeof *l);
    if (!l) {
        freeaddrinfo(ai);
        return pp_error(PP_ERR_NOMEM, "out of memory");
    }
    l->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    int ok = l->fd >= 0 && bind(l->fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(l->fd, 8) == 0 &&
             getsockname(l->fd, (struct sockaddr *)&sa, &len) == 0;
    int e = errno;
    freeaddrinfo(ai);
    if (!ok) {
        if (l->fd >= 0) close(l->fd);
        free(l);
        return pp_error(PP_ERR_IO, "direct link: listening on %s: %s", host, strerror(e));
    }
    int fl = fcntl(l->fd, F_GETFL);
    if (fl >= 0) fcntl(l->fd, F_SETFL, fl | O_NONBLOCK);
    int port = sa.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&sa)->sin6_port)
                                        : ntohs(((struct sockaddr_in *)&sa)->sin_port);
    if (getrandom(l->nonce, sizeof l->nonce, 0) != (ssize_t)sizeof l->nonce) {
        close(l->fd);
        free(l);
        return pp_error(PP_ERR_IO, "direct link: no random bytes for its nonce");
    }
    l->purpose = purpose;
    l->peer = peer;
    l->run_id = pp_transport_run_id(t);
    int n = snprintf(offer, PP_DIRECT_OFFER_CAP, "tcp %s %d ", host, port);
    for (int i = 0; i < NONCE_BYTES && n > 0 && n + 2 < PP_DIRECT_OFFER_CAP; i++)
        n += snprintf(offer + n, PP_DIRECT_OFFER_CAP - (size_t)n, "%02x", l->nonce[i]);
    *out = l;
    return PP_OK;
}

void pp_direct_listener_free(pp_direct_listener *l) {
    if (!l) return;
    close(l->fd);
    free(l);
}

/* Reads exactly n bytes from a non-blocking socket within ms. */
static int read_all(int fd, void *buf, size_t n, int ms) {
    size_t got = 0;
    int64_t until = now_ms() + ms;
    while (got < n) {
        ssize_t k = recv(fd, (char *)buf + got, n - got, MSG_DONTWAIT);
        if (k > 0) {
            got += (size_t)k;
            continue;
        }
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 0;
        int64_t left = until - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {fd, POLLIN, 0};
        poll(&p, 1, (int)left);
    }
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

pp_status pp_direct_accept(pp_direct_listener *l, int timeout_ms, int *fd) {
    *fd = -1;
    int64_t until = now_ms() + timeout_ms;
    for (;;) {
        int c = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                return pp_error(PP_ERR_IO, "direct link: accept: %s", strerror(errno));
            int64_t left = until - now_ms();
            if (left <= 0) return PP_OK;
            struct pollfd p = {l->fd, POLLIN, 0};
            poll(&p, 1, (int)(left > 1000 ? 1000 : left));
            continue;
        }
        hello h;
        const char *what = "";
        if (!set_flags(c)) what = "cannot be set up";
        else if (!read_all(c, &h, sizeof h, HELLO_MS)) what = "sent no hello";
        else what = pp_direct_hello_check(&h, sizeof h, l->nonce, l->run_id, l->purpose, l->peer);
        if (!*what) {
            *fd = c;
            return PP_OK;
        }
        pp_warn("direct link: closed a connection that %s (expected sender %d)", what, (int)l->peer);
        close(c);
    }
}

int pp_direct_offer_valid(const char *text) {
    char host[64], nonce[2 * NONCE_BYTES + 2];
    int port;
    if (sscanf(text, "tcp %63s %d %33s", host, &port, nonce) != 3) return 0;
    if (port <= 0 || port > 65535 || strlen(nonce) != 2 * NONCE_BYTES) return 0;
    for (const char *p = nonce; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    return 1;
}

pp_status pp_direct_connect(pp_transport *t, const char *offer, uint32_t purpose, int32_t me, int timeout_ms,
                            int *fd) {
    *fd = -1;
    char host[64], port[8], nonce[2 * NONCE_BYTES + 2];
    int portn;
    if (!pp_direct_offer_valid(offer) || sscanf(offer, "tcp %63s %d %33s", host, &portn, nonce) != 3)
        return pp_error(PP_ERR_PEER, "direct link: malformed offer \"%.80s\"", offer);
    snprintf(port, sizeof port, "%d", portn);
    hello h = {{0}, {0}, pp_transport_run_id(t), purpose, me};
    memcpy(h.magic, HELLO_MAGIC, 8);
    for (int i = 0; i < NONCE_BYTES; i++) {
        unsigned v;
        sscanf(nonce + 2 * i, "%2x", &v);
        h.nonce[i] = (unsigned char)v;
    }
    struct addrinfo *ai;
    PP_TRY(resolve(host, port, &ai));
    int c = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const char *what = c < 0 || !set_flags(c) ? "socket" : NULL;
    if (!what && connect(c, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS) what = "connect";
        else {
            struct pollfd p = {c, POLLOUT, 0};
            int err = 0;
            socklen_t el = sizeof err;
            if (poll(&p, 1, timeout_ms < 0 ? -1 : timeout_ms) != 1) errno = ETIMEDOUT, what = "connect";
            else if (getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) errno = err, what = "connect";
        }
    }
    int e = errno;
    freeaddrinfo(ai);
    if (!what && !write_all(c, &h, sizeof h, timeout_ms < 0 ? 60000 : timeout_ms)) what = "hello", e = errno;
    if (what) {
        if (c >= 0) close(c);
        return pp_error(PP_ERR_IO, "direct link to %s port %s: %s: %s", host, port, what, strerror(e));
    }
    *fd = c;
    return PP_OK;
}
