/* The budget of incoming tcp connections: strangers first.
 *
 * Every accepted connection costs a descriptor, and libzmq offers no way to
 * close one it accepted (a monitor on the receive socket would tell us the
 * descriptors, but an unread monitor stalls libzmq's I/O thread). So once
 * a second this looks at the process's own sockets instead: those whose
 * local port is the bound one and that are not the listener are the
 * incoming connections. A connection is a known rank's when its address
 * (IP and port) is the one that rank's hello handshake pinned. When there
 * are more incoming connections than the budget, or the process is near its
 * file limit, the others that were already there at the previous look (so
 * a peer gets at least a second to complete its handshake) are shut down:
 * shutdown(2), not close(2), so libzmq sees the connection end and closes
 * its descriptor itself. A peer whose connection is shed reconnects.
 * (Connections that never complete libzmq's own handshake are closed by
 * libzmq after ZMQ_HANDSHAKE_IVL; this is for those that do -- any ZeroMQ
 * socket -- and then never say hello.) */
#include "transport_internal.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "log_internal.h"

#define SWEEP_MS 1000
#define DEFAULT_BUDGET_SPARE 32 /* incoming connections beyond 4 per rank */
#define FILES_HEADROOM 16       /* shed when fewer descriptors than this are left */

/* "IP:PORT" of a socket address, as pp_tp_peer_addr writes it. */
static int addr_str(const struct sockaddr_storage *sa, char *buf, size_t cap, int *port) {
    char ip[INET6_ADDRSTRLEN];
    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        if (!inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip)) return 0;
        *port = ntohs(a->sin_port);
        snprintf(buf, cap, "%s:%d", ip, *port);
        return 1;
    }
    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        if (!inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip)) return 0;
        *port = ntohs(a->sin6_port);
        snprintf(buf, cap, "[%s]:%d", ip, *port);
        return 1;
    }
    return 0;
}

static int pinned(const pp_transport *t, const char *addr) {
    for (int r = 0; r < t->nranks; r++)
        if (r != t->rank && t->peers[r].verified && t->peers[r].addr && strcmp(t->peers[r].addr, addr) == 0)
            return 1;
    return 0;
}

/* Whether (fd, addr) was an unpinned incoming connection at the last look. */
static int seen_before(const pp_transport *t, int fd, const char *addr) {
    for (size_t i = 0; i < t->n_strangers; i++)
        if (t->strangers[i].fd == fd && strcmp(t->strangers[i].addr, addr) == 0) return 1;
    return 0;
}

void pp_tp_conn_budget(pp_transport *t, int64_t now) {
    if (!t->bound_port || now - t->conns_swept_at < SWEEP_MS) return;
    t->conns_swept_at = now;
    DIR *d = t->fd_dir; /* opened at the start: at the file limit no directory opens */
    if (!d) return;
    rewinddir(d);
    struct rlimit rl;
    long limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long)rl.rlim_cur : -1;
    long files = 0;
    size_t n = 0, incoming = 0;
    pp_tp_stranger *now_seen = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        files++;
        int fd = atoi(e->d_name);
        if (fd == dirfd(d)) continue;
        struct sockaddr_storage local, remote;
        socklen_t ll = sizeof local, rl2 = sizeof remote;
        char laddr[80], raddr[80];
        int lport, rport, listening = 0;
        socklen_t ol = sizeof listening;
        if (getsockname(fd, (struct sockaddr *)&local, &ll) != 0 || !addr_str(&local, laddr, sizeof laddr, &lport) ||
            lport != t->bound_port)
            continue;
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) != 0 || listening) continue;
        if (getpeername(fd, (struct sockaddr *)&remote, &rl2) != 0 || !addr_str(&remote, raddr, sizeof raddr, &rport))
            continue;
        incoming++;
        if (pinned(t, raddr)) continue;
        if (n == cap) {
            size_t c = cap ? 2 * cap : 16;
            pp_tp_stranger *grown = realloc(now_seen, c * sizeof *grown);
            if (!grown) break;
            now_seen = grown, cap = c;
        }
        now_seen[n].fd = fd;
        snprintf(now_seen[n].addr, sizeof now_seen[n].addr, "%s", raddr);
        n++;
    }
    int over = incoming > t->conn_budget || (limit > 0 && files >= limit - FILES_HEADROOM);
    size_t shed = 0;
    for (size_t i = 0; over && i < n; i++) {
        if (!seen_before(t, now_seen[i].fd, now_seen[i].addr)) continue;
        /* the descriptor may have been closed and reused since the look:
         * only the same connection is shut down */
        struct sockaddr_storage remote;
        socklen_t rl2 = sizeof remote;
        char raddr[80];
        int rport;
        if (getpeername(now_seen[i].fd, (struct sockaddr *)&remote, &rl2) != 0 ||
            !addr_str(&remote, raddr, sizeof raddr, &rport) || strcmp(raddr, now_seen[i].addr) != 0)
            continue;
        shutdown(now_seen[i].fd, SHUT_RDWR);
        now_seen[i].fd = -1; /* gone: not "seen" next time */
        shed++;
    }
    if (shed) {
        stat_add(&t->st.shed_connections, shed);
        pp_warn("transport rank %d (%s): %zu incoming connections (budget %zu), %ld of %ld file descriptors open: "
                "shut down %zu that completed no handshake (a flood of connections?)", t->rank, t->endpoint, incoming,
                t->conn_budget, files, limit, shed);
    }
    free(t->strangers);
    t->strangers = now_seen;
    t->n_strangers = n;
}

void pp_tp_conn_budget_init(pp_transport *t, size_t budget) {
    t->conn_budget = budget ? budget : (size_t)4 * (size_t)t->nranks + DEFAULT_BUDGET_SPARE;
    t->bound_port = 0;
    const char *ep = t->endpoint;
    if (strncmp(ep, "tcp://", 6) != 0) return; /* ipc: local users; inproc: this process */
    const char *colon = strrchr(ep, ':');
    int port = colon ? atoi(colon + 1) : 0;
    if (port > 0 && port < 65536) t->bound_port = port;
    if (t->bound_port) t->fd_dir = opendir("/proc/self/fd");
}

void pp_tp_conn_budget_close(pp_transport *t) {
    if (t->fd_dir) closedir(t->fd_dir);
    t->fd_dir = NULL;
    free(t->strangers);
    t->strangers = NULL;
}
