/* pippin-bench-transport: pippin's transport against raw libzmq, same run.
 *
 * Throughput: tensors sent by one rank and received (as tensors) by another,
 * against raw libzmq PUSH/PULL moving each message as one zero-copy frame,
 * for 4 KiB .. 256 MiB over tcp loopback and ipc; round-trip latency of a
 * small message; CURVE throughput; and pippin's socket path alone (shared
 * memory off, as between hosts), for information. Sender and receiver are threads with
 * their own ZeroMQ context each (one I/O thread each), as two processes
 * would have. Each figure is the median of a few repetitions; pippin and
 * raw run back to back in pairs, and the ratio is the median of the pairs'
 * ratios, so load from other processes mostly cancels out.
 *
 *   pippin-bench-transport [--json] [--reps N] [--quick] [--endpoint E] [--size BYTES]
 *                          [--frame-bytes N] [--recv-cache BYTES] [--hwm N] [--rcvhwm N] [--sockbuf BYTES] [--spin-us US]
 *                          [--only pippin|raw] [--no-batching] [--no-bulk] [--tune-allocator]
 *
 * --tune-allocator sets glibc's malloc as the CLI does for a rank
 * (pp_tune_allocator) before anything runs: what a deployed rank has. Raw
 * libzmq then runs in the same setting (one process): the same at 4 KiB,
 * slower at 16 MiB (its frames mmap'd), so compare large sizes without it.
 *
 * --json prints one object per line:
 *   {"endpoint": "tcp", "bytes": N, "pippin_gbps": x, "raw_gbps": y, "ratio": r, "cpu_ratio": c, "shm_share": s}
 * (cpu_ratio: raw's process CPU time over pippin's for the same bytes, median
 * of the pairs; > 1: pippin costs less. Under load it is steadier than the
 * wall-time ratio.)
 * (GB/s = 1e9 bytes per second; latency lines carry "test": "latency" and
 * microseconds instead). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "pippin/exec.h"
#include "pippin/log.h"
#include "pippin/tensor.h"
#include "pippin/transport.h"

#define MAX_REPS 31

static int json;
static int reps = 5;
static int quick;
static int tune_allocator; /* --tune-allocator: pp_tune_allocator first */
static const char *only_endpoint; /* --endpoint: run just this one (tcp, ipc, tcp+curve, tcp-noshm, latency) */
static size_t only_size;          /* --size: just this many bytes */
static size_t frame_bytes;        /* --frame-bytes: pippin's frame size (0: its default) */
static long long recv_cache = 0;  /* --recv-cache: pippin's reassembly cache (0: default, <0 off) */
static int hwm;                   /* --hwm: pippin's sndhwm and rcvhwm (0: default) */
static int rcvhwm;                /* --rcvhwm: pippin's rcvhwm alone (0: --hwm or default) */
static int spin_us;               /* --spin-us: pippin's receive busy-poll (0: default, <0 off) */
static int sockbuf;               /* --sockbuf: SNDBUF/RCVBUF for both pippin and raw (0: OS) */
static const char *only_side;     /* --only pippin|raw: time just one side (for profiling; no ratio) */
static int no_batching;           /* --no-batching: pippin sends every small message on its own */
static int no_bulk;               /* --no-bulk: pippin's large tensors in ZeroMQ frames, no bulk lane */
static char ipc_dir[200];

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double s[MAX_REPS];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

/* CPU seconds of the whole process (both ends' threads and I/O threads)
 * over the last timed repetition: under load, wall time is mostly other
 * processes', CPU time is what the code itself costs. */
static double last_cpu_s;

static void die(const char *what) {
    fprintf(stderr, "pippin-bench-transport: %s: %s\n", what, pp_last_error());
    exit(1);
}

static void die_zmq(const char *what) {
    fprintf(stderr, "pippin-bench-transport: %s: %s\n", what, zmq_strerror(zmq_errno()));
    exit(1);
}

/* Messages per repetition: about 256 MiB moved, at least 3 messages. */
static int count_for(size_t bytes) {
    size_t budget = quick ? (64u << 20) : (128u << 20);
    size_t n = budget / bytes;
    if (n < 3) n = 3;
    if (n > 20000) n = 20000;
    return (int)n;
}

static const char *bind_endpoint(const char *kind, char *buf, size_t cap) {
    static atomic_int counter;
    if (!strcmp(kind, "ipc"))
        snprintf(buf, cap, "ipc://%s/e%d", ipc_dir, atomic_fetch_add(&counter, 1));
    else
        snprintf(buf, cap, "tcp://127.0.0.1:*");
    return buf;
}

/* ---- pippin ---- */

typedef struct pip_pair {
    void *ctx[2];
    pp_transport *t[2];
    char keys[2][2][PP_CURVE_KEY_CHARS + 1]; /* [rank][0 public, 1 secret] */
} pip_pair;

static int sockets_only; /* pippin without its same-host shared-memory paths */

static void pip_open(pip_pair *p, const char *kind, int curve) {
    memset(p, 0, sizeof *p);
    char ep[2][256];
    const char *pubs[2];
    for (int r = 0; r < 2; r++) {
        p->ctx[r] = zmq_ctx_new();
        /* as pippin sets its own context (transport/context.c): small
         * frames copied out of libzmq's read buffer, not pinning it */
        zmq_ctx_set(p->ctx[r], 10 /* ZMQ_ZERO_COPY_RECV, draft */, 0);
        bind_endpoint(kind, ep[r], sizeof ep[r]);
        if (curve && pp_curve_keypair(p->keys[r][0], p->keys[r][1]) != PP_OK) die("keypair");
        pubs[r] = p->keys[r][0];
    }
    for (int r = 0; r < 2; r++) {
        pp_transport_options o;
        pp_transport_options_init(&o);
        const char *eps[2] = {NULL, NULL};
        eps[r] = ep[r];
        o.rank = r;
        o.nranks = 2;
        o.endpoints = eps;
        o.zmq_context = p->ctx[r];
        o.timeout_ms = 30000;
        o.frame_bytes = frame_bytes;
        o.recv_cache_bytes = recv_cache;
        o.sndhwm = o.rcvhwm = hwm;
        if (rcvhwm) o.rcvhwm = rcvhwm;
        o.sndbuf = o.rcvbuf = sockbuf;
        o.spin_us = spin_us;
        if (sockets_only) o.shm_bytes = -1;
        if (no_bulk) o.bulk_lanes = -1;
        if (curve) {
            o.curve_secret_key = p->keys[r][1];
            o.curve_rank_keys = pubs;
        }
        if (pp_transport_create(&o, &p->t[r]) != PP_OK) die("pp_transport_create");
        /* a streaming sender: small messages merge while the receiver is
         * behind (the sender flushes after its loop) */
        pp_transport_set_batching(p->t[r], !no_batching);
    }
    for (int r = 0; r < 2; r++)
        if (pp_transport_connect_peer(p->t[r], 1 - r, pp_transport_endpoint(p->t[1 - r])) != PP_OK)
            die("connect");
    for (int r = 0; r < 2; r++)
        if (pp_transport_wait_peers(p->t[r], 10000) != PP_OK) die("wait_peers");
}

static void pip_close(pip_pair *p) {
    for (int r = 0; r < 2; r++) {
        pp_transport_close(p->t[r]);
        zmq_ctx_term(p->ctx[r]);
    }
}

typedef struct pip_job {
    pp_transport *t;
    pp_tensor *x;
    int n;
    int64_t step;
    pthread_barrier_t *go;
} pip_job;

static void *pip_sender(void *arg) {
    pip_job *j = arg;
    pthread_barrier_wait(j->go);
    for (int i = 0; i < j->n; i++) {
        pp_transport_key k = {PP_MSG_ACTIVATION, j->step, i, 0, 1, "x"};
        if (pp_transport_send(j->t, &k, j->x) != PP_OK) die("send");
    }
    if (pp_transport_flush(j->t, -1) != PP_OK) die("flush"); /* what batching held back */
    return NULL;
}

static int64_t pip_step;

/* One repetition: GB/s from the sender's start to the last tensor received. */
static double pip_throughput(pip_pair *p, size_t bytes, int n) {
    int64_t shape[1] = {(int64_t)bytes};
    pp_tensor *x;
    if (pp_tensor_new(PP_U8, 1, shape, &x) != PP_OK) die("tensor");
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    pip_job j = {p->t[0], x, n, ++pip_step, &go};
    pthread_t th;
    pthread_create(&th, NULL, pip_sender, &j);
    pthread_barrier_wait(&go);
    double t0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < n; i++) {
        pp_transport_key k = {PP_MSG_ACTIVATION, j.step, i, 0, 1, "x"};
        pp_tensor *got;
        if (pp_transport_recv(p->t[1], &k, -1, &got) != PP_OK) die("recv");
        pp_tensor_free(got);
    }
    double dt = now_s() - t0;
    last_cpu_s = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    pthread_join(th, NULL);
    pthread_barrier_destroy(&go);
    pp_tensor_free(x);
    return (double)bytes * n / dt / 1e9;
}

/* ---- raw libzmq ---- */

typedef struct raw_pair {
    void *ctx[2];
    void *push, *pull;
} raw_pair;

static void raw_open(raw_pair *p, const char *kind, int curve) {
    char ep[256], last[256];
    size_t len = sizeof last;
    int zero = 0;
    p->ctx[0] = zmq_ctx_new();
    p->ctx[1] = zmq_ctx_new();
    p->pull = zmq_socket(p->ctx[1], ZMQ_PULL);
    p->push = zmq_socket(p->ctx[0], ZMQ_PUSH);
    zmq_setsockopt(p->pull, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(p->push, ZMQ_LINGER, &zero, sizeof zero);
    if (sockbuf) {
        zmq_setsockopt(p->pull, ZMQ_RCVBUF, &sockbuf, sizeof sockbuf);
        zmq_setsockopt(p->push, ZMQ_SNDBUF, &sockbuf, sizeof sockbuf);
    }
    if (curve) {
        char spub[41], ssec[41], cpub[41], csec[41];
        int one = 1;
        zmq_curve_keypair(spub, ssec);
        zmq_curve_keypair(cpub, csec);
        zmq_setsockopt(p->pull, ZMQ_CURVE_SERVER, &one, sizeof one);
        zmq_setsockopt(p->pull, ZMQ_CURVE_SECRETKEY, ssec, 40);
        zmq_setsockopt(p->push, ZMQ_CURVE_SERVERKEY, spub, 40);
        zmq_setsockopt(p->push, ZMQ_CURVE_PUBLICKEY, cpub, 40);
        zmq_setsockopt(p->push, ZMQ_CURVE_SECRETKEY, csec, 40);
    }
    if (zmq_bind(p->pull, bind_endpoint(kind, ep, sizeof ep)) != 0) die_zmq("raw bind");
    zmq_getsockopt(p->pull, ZMQ_LAST_ENDPOINT, last, &len);
    if (zmq_connect(p->push, last) != 0) die_zmq("raw connect");
    /* one message through, so the connection is up */
    zmq_send(p->push, "", 0, 0);
    char b[1];
    zmq_recv(p->pull, b, 1, 0);
}

static void raw_close(raw_pair *p) {
    zmq_close(p->push);
    zmq_close(p->pull);
    zmq_ctx_term(p->ctx[0]);
    zmq_ctx_term(p->ctx[1]);
}

static atomic_int raw_frees;

static void raw_free(void *data, void *hint) {
    (void)data;
    (void)hint;
    atomic_fetch_add(&raw_frees, 1);
}

typedef struct raw_job {
    void *push;
    void *buf;
    size_t bytes;
    int n;
    pthread_barrier_t *go;
} raw_job;

static void *raw_sender(void *arg) {
    raw_job *j = arg;
    pthread_barrier_wait(j->go);
    for (int i = 0; i < j->n; i++) {
        zmq_msg_t m;
        /* one zero-copy frame; the buffer never changes while in flight */
        zmq_msg_init_data(&m, j->buf, j->bytes, raw_free, NULL);
        if (zmq_msg_send(&m, j->push, 0) < 0) die_zmq("raw send");
    }
    return NULL;
}

static double raw_throughput(raw_pair *p, size_t bytes, int n) {
    void *buf = calloc(1, bytes);
    if (!buf) die("out of memory");
    atomic_store(&raw_frees, 0);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    raw_job j = {p->push, buf, bytes, n, &go};
    pthread_t th;
    pthread_create(&th, NULL, raw_sender, &j);
    pthread_barrier_wait(&go);
    double t0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < n; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->pull, 0) < 0) die_zmq("raw recv");
        zmq_msg_close(&m);
    }
    double dt = now_s() - t0;
    last_cpu_s = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    pthread_join(th, NULL);
    pthread_barrier_destroy(&go);
    while (atomic_load(&raw_frees) < n) usleep(100);
    free(buf);
    return (double)bytes * n / dt / 1e9;
}

/* ---- latency ---- */

typedef struct echo_job {
    pp_transport *pt;
    void *pull, *push;
    int n;
} echo_job;

static void *pip_echo(void *arg) {
    echo_job *j = arg;
    for (int i = 0; i < j->n; i++) {
        pp_transport_key k = {PP_MSG_ACTIVATION, 0, i, 0, 1, "ping"};
        pp_tensor *got;
        if (pp_transport_recv(j->pt, &k, -1, &got) != PP_OK) die("echo recv");
        pp_transport_key b = {PP_MSG_GRADIENT, 0, i, 1, 0, "pong"};
        if (pp_transport_send(j->pt, &b, got) != PP_OK) die("echo send");
        pp_tensor_free(got);
    }
    return NULL;
}

static double pip_latency_us(const char *kind, int n) {
    pip_pair p;
    pip_open(&p, kind, 0);
    int64_t shape[1] = {16};
    pp_tensor *x;
    pp_tensor_new(PP_F32, 1, shape, &x);
    echo_job j = {p.t[1], NULL, NULL, n};
    pthread_t th;
    pthread_create(&th, NULL, pip_echo, &j);
    double t0 = 0;
    for (int i = 0; i < n; i++) {
        if (i == n / 10) t0 = now_s(); /* the first tenth warms up */
        pp_transport_key k = {PP_MSG_ACTIVATION, 0, i, 0, 1, "ping"};
        if (pp_transport_send(p.t[0], &k, x) != PP_OK) die("ping send");
        pp_transport_key b = {PP_MSG_GRADIENT, 0, i, 1, 0, "pong"};
        pp_tensor *got;
        if (pp_transport_recv(p.t[0], &b, -1, &got) != PP_OK) die("pong recv");
        pp_tensor_free(got);
    }
    double dt = now_s() - t0;
    pthread_join(th, NULL);
    pp_tensor_free(x);
    pip_close(&p);
    return dt / (n - n / 10) * 1e6;
}

static void *raw_echo(void *arg) {
    echo_job *j = arg;
    char buf[256];
    for (int i = 0; i < j->n; i++) {
        int len = zmq_recv(j->pull, buf, sizeof buf, 0);
        if (len < 0) die_zmq("raw echo recv");
        zmq_send(j->push, buf, (size_t)len, 0);
    }
    return NULL;
}

static double raw_latency_us(const char *kind, int n) {
    raw_pair there, back;
    raw_open(&there, kind, 0);
    raw_open(&back, kind, 0);
    echo_job j = {NULL, there.pull, back.push, n};
    pthread_t th;
    pthread_create(&th, NULL, raw_echo, &j);
    char msg[64] = {0}, buf[256];
    double t0 = 0;
    for (int i = 0; i < n; i++) {
        if (i == n / 10) t0 = now_s();
        zmq_send(there.push, msg, sizeof msg, 0);
        if (zmq_recv(back.pull, buf, sizeof buf, 0) < 0) die_zmq("raw pong");
    }
    double dt = now_s() - t0;
    pthread_join(th, NULL);
    raw_close(&there);
    raw_close(&back);
    return dt / (n - n / 10) * 1e6;
}

/* ---- report ---- */

static int misses;

/* shm: the share of pippin's payload bytes that went through a
 * shared-memory ring (same-host peers) instead of the socket. */
static void report(const char *endpoint, size_t bytes, double pip, double raw, double ratio,
                   double cpu_ratio, double target, double shm) {
    int miss = target > 0 && ratio < target;
    misses += miss;
    if (json) {
        printf("{\"endpoint\": \"%s\", \"bytes\": %zu, \"pippin_gbps\": %.3f, \"raw_gbps\": %.3f, "
               "\"ratio\": %.3f, \"cpu_ratio\": %.3f, \"shm_share\": %.2f}\n", endpoint, bytes, pip, raw, ratio,
               cpu_ratio, shm);
    } else {
        char size[32];
        if (bytes >= (1u << 20)) snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
        else snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
        printf("%-10s %8s %10.3f %10.3f %8.2fx %8.2fx %6.0f%%", endpoint, size, pip, raw, ratio, cpu_ratio,
               shm * 100);
        if (target > 0) printf("   >= %.2fx %s", target, miss ? "MISSED" : "ok");
        printf("\n");
    }
    fflush(stdout);
}

static void throughput_suite(const char *endpoint, const char *kind, int curve, const size_t *sizes,
                             int nsizes) {
    if (only_endpoint && strcmp(only_endpoint, endpoint) != 0) return;
    pip_pair pp;
    raw_pair rp;
    pip_open(&pp, kind, curve);
    raw_open(&rp, kind, curve);
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s];
        if (only_size && bytes != only_size) continue;
        int n = count_for(bytes);
        pip_throughput(&pp, bytes, n < 20 ? 1 : n / 20); /* warm up */
        raw_throughput(&rp, bytes, n < 20 ? 1 : n / 20);
        /* Pairs run back to back (alternating which goes first) see the same
         * machine; the median pair ratio shrugs off the rest of the noise. */
        double pip[MAX_REPS], raw[MAX_REPS], ratio[MAX_REPS], cpu_ratio[MAX_REPS];
        pp_transport_stats before, after;
        pp_transport_stats_get(pp.t[0], &before);
        for (int r = 0; r < reps; r++) {
            double pip_cpu = 1, raw_cpu = 1;
            if (only_side) { /* profiling one side: the other reads as 1 */
                int pip_side = !strcmp(only_side, "pippin");
                pip[r] = pip_side ? pip_throughput(&pp, bytes, n) : 1;
                raw[r] = pip_side ? 1 : raw_throughput(&rp, bytes, n);
            } else if (r % 2) {
                raw[r] = raw_throughput(&rp, bytes, n);
                raw_cpu = last_cpu_s;
                pip[r] = pip_throughput(&pp, bytes, n);
                pip_cpu = last_cpu_s;
            } else {
                pip[r] = pip_throughput(&pp, bytes, n);
                pip_cpu = last_cpu_s;
                raw[r] = raw_throughput(&rp, bytes, n);
                raw_cpu = last_cpu_s;
            }
            ratio[r] = pip[r] / raw[r];
            cpu_ratio[r] = pip_cpu > 0 ? raw_cpu / pip_cpu : 1;
        }
        double best_pip = median(pip, reps), best_raw = median(raw, reps);
        double target = curve || sockets_only ? 0 : (bytes <= (1u << 20) ? 0.95 : (bytes >= (16u << 20) ? 1.5 : 0));
        pp_transport_stats_get(pp.t[0], &after);
        double sent = (double)(after.bytes_sent - before.bytes_sent);
        double shm = sent > 0 ? (double)(after.shm_bytes_sent - before.shm_bytes_sent) / sent : 0;
        report(endpoint, bytes, best_pip, best_raw, median(ratio, reps), median(cpu_ratio, reps), target, shm);
    }
    pip_close(&pp);
    raw_close(&rp);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--quick")) quick = 1, reps = 3;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--endpoint") && i + 1 < argc) only_endpoint = argv[++i];
        else if (!strcmp(argv[i], "--size") && i + 1 < argc) only_size = (size_t)atoll(argv[++i]);
        else if (!strcmp(argv[i], "--frame-bytes") && i + 1 < argc) frame_bytes = (size_t)atoll(argv[++i]);
        else if (!strcmp(argv[i], "--recv-cache") && i + 1 < argc) recv_cache = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--hwm") && i + 1 < argc) hwm = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rcvhwm") && i + 1 < argc) rcvhwm = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sockbuf") && i + 1 < argc) sockbuf = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc) spin_us = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only_side = argv[++i];
        else if (!strcmp(argv[i], "--no-batching")) no_batching = 1;
        else if (!strcmp(argv[i], "--no-bulk")) no_bulk = 1;
        else if (!strcmp(argv[i], "--tune-allocator")) tune_allocator = 1;
        else {
            fprintf(stderr, "usage: pippin-bench-transport [--json] [--reps N] [--quick] "
                            "[--endpoint tcp|ipc|tcp+curve|tcp-noshm|latency] [--size BYTES] [--frame-bytes N] "
                            "[--recv-cache BYTES] [--hwm N] [--rcvhwm N] [--sockbuf BYTES] [--spin-us US] [--only pippin|raw] [--no-batching] [--no-bulk] [--tune-allocator]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    if (reps > MAX_REPS) reps = MAX_REPS;
    /* --tune-allocator: glibc's malloc as the CLI sets it for a rank
     * (pp_tune_allocator), for pippin and raw alike (one process). Off by
     * default: it fixes glibc's mmap threshold, which makes raw's 16 MiB
     * frames mmap'd (slower; pippin's lanes do not care), so raw at its
     * best runs with glibc's defaults; at 4 KiB raw runs the same either
     * way and pippin's batch frames stop page-faulting. */
    if (tune_allocator) pp_tune_allocator();
    if (!getenv("PIPPIN_LOG")) pp_log_set_level(PP_LOG_ERROR); /* PIPPIN_LOG=warn shows drops */
    snprintf(ipc_dir, sizeof ipc_dir, "/tmp/pippin-bench-XXXXXX");
    if (!mkdtemp(ipc_dir)) die("mkdtemp");
    double t_start = now_s();

    static const size_t sizes[] = {4u << 10, 1u << 20, 16u << 20, 64u << 20, 256u << 20};
    if (!json)
        printf("throughput, GB/s (median of %d; ratio: median of back-to-back pairs): pippin "
               "tensors vs raw libzmq PUSH/PULL, one zero-copy frame; shm: pippin's bytes that took "
               "its same-host shared-memory path; cpu: raw's process CPU time over pippin's for the same bytes "
               "(> 1: pippin costs less)\n%-10s %8s %10s %10s %9s %9s %7s\n",
               reps, "endpoint", "size", "pippin", "raw", "ratio", "cpu", "shm");
    throughput_suite("tcp", "tcp", 0, sizes, 5);
    throughput_suite("ipc", "ipc", 0, sizes, 5);
    static const size_t curve_sizes[] = {1u << 20, 16u << 20};
    throughput_suite("tcp+curve", "tcp", 1, curve_sizes, 2);
    /* the socket path alone, as between hosts (no target: informational) */
    sockets_only = 1;
    static const size_t socket_sizes[] = {4u << 10, 1u << 20, 16u << 20, 64u << 20};
    throughput_suite("tcp-noshm", "tcp", 0, socket_sizes, 4);
    sockets_only = 0;

    const char *kinds[2] = {"tcp", "ipc"};
    int n = quick ? 2000 : 5000;
    for (int k = 0; k < 2 && (!only_endpoint || !strcmp(only_endpoint, "latency")); k++) {
        double pip[MAX_REPS], raw[MAX_REPS], ratios[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            pip[r] = pip_latency_us(kinds[k], n);
            raw[r] = raw_latency_us(kinds[k], n);
            ratios[r] = pip[r] / raw[r];
        }
        double best_pip = median(pip, reps), best_raw = median(raw, reps);
        double ratio = median(ratios, reps);
        int miss = ratio > 1.2;
        misses += miss;
        if (json)
            printf("{\"endpoint\": \"%s\", \"test\": \"latency\", \"bytes\": 64, \"pippin_us\": %.2f, "
                   "\"raw_us\": %.2f, \"ratio\": %.3f}\n", kinds[k], best_pip, best_raw, ratio);
        else
            printf("latency %-4s 64 B round trip: pippin %.1f us, raw %.1f us, %.2fx   <= 1.20x %s\n",
                   kinds[k], best_pip, best_raw, ratio, miss ? "MISSED" : "ok");
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ipc_dir); /* the raw sockets' files */
    if (system(cmd) != 0) fprintf(stderr, "pippin-bench-transport: could not remove %s\n", ipc_dir);
    if (!json)
        printf("%d target(s) missed; %.1f s\n", misses, now_s() - t_start);
    return 0;
}
