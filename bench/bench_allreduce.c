/* The replicas' gradient all-reduce (runtime/grad_ring.c) against Open MPI's
 * MPI_Allreduce on the same bytes, in the same processes, on the same host.
 * Run it under mpirun (bench/bench_allreduce.sh does):
 *
 *   mpirun -np 2 pippin-bench-allreduce [--json] [--noshm] [--ring] [--no-links] [--iters N]
 *                                       [--size BYTES] [--only pippin|mpi]
 *                                       [--slot BYTES] [--piece BYTES] [--shard] [--spin-us US]
 *
 * Each size: float32 buffers summed in place, a few warm-up rounds, then N
 * timed rounds of each, pippin's and MPI's taken in turn (so a change in
 * the machine's load hits both alike); the figure is the median round's
 * algorithm bandwidth (buffer bytes / time), as nccl-tests' "algbw", and
 * the best round's. --size: that size only; --only: run one of the two
 * (for perf stat on the processes: system calls, context switches).
 * Buckets this small are summed directly rather than round the ring
 * (runtime/grad_ring.h). pippin's ring
 * sums through shared memory when every process is on this host
 * (runtime/grad_shm.h), else over direct TCP links beside its transport
 * (runtime/grad_tcp.h; tcp on loopback); --no-links keeps it off those
 * (through the transport); --ring keeps it off shared memory (same-host
 * peers then use the transport's shared-memory rings unless --noshm, and
 * direct links with it); --slot: the shared-memory slot size;
 * --piece: the ring's pieces over the transport (0: whole chunks);
 * --shard: ZeRO-1's pair instead of the sum, the reduce-scatter of the
 * gradients then the all-gather of the parameters (each process's shard
 * of the sums taken as its updated parameters), against the same
 * MPI_Allreduce (the same bytes each way); --spin-us: the transport's
 * busy-poll before a receive sleeps (pp_transport_options.spin_us).
 * The whole buffer is one bucket.
 * Both results are checked against the exact sum. Prints one line per size,
 * or with --json one JSON object per size: bytes, pippin_gbps, mpi_gbps,
 * ratio (pippin / MPI), and per round and process what the machine's load
 * does not change: system calls, context switches (on a loaded machine
 * also preemptions), CPU milliseconds (MPI's include its busy-polling),
 * counted in the timed part only, over every thread (perf events; absent
 * where perf_event_open is not allowed). */
#include <linux/perf_event.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "grad_ring.h"
#include "pippin/transport.h"

/* System calls, context switches and CPU time of this process's threads
 * (those started after counters_open too: libzmq's and MPI's), counted
 * only while enabled. */
enum { N_COUNTERS = 3 };
static int counter_fd[N_COUNTERS] = {-1, -1, -1};

static int open_counter(uint32_t type, uint64_t config) {
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.type = type;
    a.config = config;
    a.disabled = 1;
    a.inherit = 1;
    return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
}

static void counters_open(void) {
    FILE *f = fopen("/sys/kernel/tracing/events/raw_syscalls/sys_enter/id", "r");
    if (!f) f = fopen("/sys/kernel/debug/tracing/events/raw_syscalls/sys_enter/id", "r");
    unsigned long long id = 0;
    if (f && fscanf(f, "%llu", &id) == 1) counter_fd[0] = open_counter(PERF_TYPE_TRACEPOINT, id);
    if (f) fclose(f);
    counter_fd[1] = open_counter(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES);
    counter_fd[2] = open_counter(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK);
}

static void counters_enable(int on) {
    for (int i = 0; i < N_COUNTERS; i++)
        if (counter_fd[i] >= 0) ioctl(counter_fd[i], on ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_DISABLE, 0);
}

static void counters_read(double *v) {
    for (int i = 0; i < N_COUNTERS; i++) {
        uint64_t x = 0;
        v[i] = counter_fd[i] >= 0 && read(counter_fd[i], &x, sizeof x) == (ssize_t)sizeof x ? (double)x : -1;
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Rank r's value at i: small integers, so every order of the sum is exact. */
static void fill(float *x, int64_t n, int rank) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 7 + rank * 13) % 64);
}

static int check(const float *x, int64_t n, int nranks, const char *who, int rank) {
    for (int64_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < nranks; r++) want += (float)((i * 7 + r * 13) % 64);
        if (x[i] != want) {
            fprintf(stderr, "rank %d: %s sum wrong at %lld: %g, expected %g\n", rank, who, (long long)i, x[i], want);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    counters_open(); /* before MPI and libzmq start their threads */
    MPI_Init(&argc, &argv);
    int rank, nranks, json = 0, noshm = 0, ring = 0, nolinks = 0, iters = 20, run_pippin = 1, run_mpi = 1, shard = 0;
    int64_t only_size = 0, slot = 0, piece = 0;
    int spin_us = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--noshm")) noshm = 1;
        else if (!strcmp(argv[i], "--ring")) ring = 1;
        else if (!strcmp(argv[i], "--no-links")) nolinks = 1;
        else if (!strcmp(argv[i], "--slot") && i + 1 < argc) slot = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--piece") && i + 1 < argc) piece = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--shard")) shard = 1;
        else if (!strcmp(argv[i], "--spin-us") && i + 1 < argc) spin_us = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--size") && i + 1 < argc) only_size = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "pippin")) run_mpi = 0, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "mpi")) run_pippin = 0, i++;
        else {
            if (!rank)
                fprintf(stderr, "usage: mpirun -np R %s [--json] [--noshm] [--ring] [--no-links] [--iters N] [--size BYTES] "
                        "[--only pippin|mpi] [--slot BYTES] [--piece BYTES] [--shard] [--spin-us US]\n", argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    if (nranks < 2 || iters < 1) {
        if (!rank) fprintf(stderr, "pippin-bench-allreduce: run it under mpirun with 2 or more processes\n");
        MPI_Finalize();
        return 2;
    }
    /* every rank binds a free tcp port, then they swap endpoints over MPI */
    pp_transport_options o;
    pp_transport_options_init(&o);
    char mine[64] = "tcp://127.0.0.1:*";
    char *eps = calloc((size_t)nranks, 64);
    const char **ep = calloc((size_t)nranks, sizeof *ep);
    for (int r = 0; r < nranks; r++) ep[r] = r == rank ? mine : "";
    o.rank = rank;
    o.nranks = nranks;
    o.endpoints = ep;
    o.timeout_ms = 60000;
    o.step_window = -1;
    if (noshm) o.shm_bytes = -1;
    o.spin_us = spin_us;
    int *stage_rank = calloc((size_t)nranks, sizeof *stage_rank);
    for (int r = 0; r < nranks; r++) stage_rank[r] = r;
    o.nstages = nranks;
    o.stage_ranks = stage_rank;
    pp_transport *t;
    if (pp_transport_create(&o, &t) != PP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, pp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    snprintf(mine, sizeof mine, "%s", pp_transport_endpoint(t));
    MPI_Allgather(mine, 64, MPI_CHAR, eps, 64, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < nranks; r++)
        if (r != rank && pp_transport_connect_peer(t, r, eps + 64 * r) != PP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
    if (pp_transport_wait_peers(t, 30000) != PP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, pp_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (!rank && !json)
        printf("all-reduce of float32, %d processes on this host, %d rounds each, taken in turn; pippin over "
               "%s (counters: pippin / MPI)\n%12s %14s %14s %8s %10s\n", nranks, iters,
               noshm ? "tcp (no shared memory)" : ring ? "tcp + the transport's shared-memory rings"
                                                 : "shared memory (grad_shm) if every process is on this host",
               "bytes", "pippin GB/s", "MPI GB/s", "ratio", "best/best");
    int64_t step = 0;
    int bad = 0;
    double *tp = calloc((size_t)iters, sizeof *tp), *tm = calloc((size_t)iters, sizeof *tm);
    for (int64_t bytes = only_size ? only_size : 4096; bytes <= (only_size ? only_size : 64 << 20); bytes *= 4) {
        int64_t n = bytes / (int64_t)sizeof(float);
        float *x = malloc((size_t)bytes), *y = shard ? malloc((size_t)bytes) : NULL;
        /* pippin: one stage per rank, the whole buffer one bucket */
        pp_grad_ring_options ro = {t, nranks, rank, 1, bytes, bytes, shard, 0, ring ? -1 : 0, slot, piece,
                                   nolinks ? -1 : 0};
        const char *via = "transport";
        pp_grad_ring *g;
        if (pp_grad_ring_new(&ro, &g) != PP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
        int64_t off0 = 0, numel = n;
        char xname[] = "x", *name = xname;
        pp_flat_params fp = {1, NULL, &name, &off0, &numel, NULL, NULL, n, y, x, NULL};
        pp_ring_ranges mine = {0};
        if (shard && pp_grad_ring_shard(&ro, rank, &fp, &mine) != PP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
        double cp[N_COUNTERS] = {0}, cm[N_COUNTERS] = {0};
        for (int it = -3; it < iters && !bad; it++) {
            if (run_pippin) {
                fill(x, n, rank);
                pp_transport_set_step(t, step);
                MPI_Barrier(MPI_COMM_WORLD);
                double c0[N_COUNTERS], c1[N_COUNTERS];
                counters_read(c0);
                counters_enable(it >= 0);
                double t0 = now_s();
                pp_grad_ring_begin(g, step++);
                pp_status s = pp_grad_ring_add(g, 0, &fp, 0);
                if (s == PP_OK) s = pp_grad_ring_finish(g, -1);
                for (int q = 0; shard && s == PP_OK && q < mine.n; q++) /* the "update": the shard's sums */
                    memcpy(y + mine.lo[q], x + mine.lo[q], sizeof(float) * (size_t)mine.len[q]);
                if (shard && s == PP_OK) s = pp_grad_ring_gather(g, -1);
                double dt = now_s() - t0;
                counters_enable(0);
                counters_read(c1);
                for (int i = 0; i < N_COUNTERS; i++) cp[i] += c1[i] - c0[i];
                if (s != PP_OK) {
                    fprintf(stderr, "rank %d: %s\n", rank, pp_last_error());
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
                if (it == 0) bad |= check(shard ? y : x, n, nranks, "pippin", rank);
                via = pp_grad_ring_shm_buckets(g) > 0 ? "grad_shm" : pp_grad_ring_tcp_buckets(g) > 0 ? "links" : "transport";
                if (it >= 0) tp[it] = dt;
            }
            if (run_mpi) {
                fill(x, n, rank);
                MPI_Barrier(MPI_COMM_WORLD);
                double c0[N_COUNTERS], c1[N_COUNTERS];
                counters_read(c0);
                counters_enable(it >= 0);
                double t0 = now_s();
                MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                double dt = now_s() - t0;
                counters_enable(0);
                counters_read(c1);
                for (int i = 0; i < N_COUNTERS; i++) cm[i] += c1[i] - c0[i];
                if (it == 0) bad |= check(x, n, nranks, "MPI", rank);
                if (it >= 0) tm[it] = dt;
            }
        }
        pp_grad_ring_free(g);
        pp_ring_ranges_free(&mine);
        free(x);
        free(y);
        /* the slowest rank's round is the round */
        MPI_Allreduce(MPI_IN_PLACE, tp, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, tm, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (bad) break;
        double gp = (double)bytes / median(tp, iters) / 1e9, gm = (double)bytes / median(tm, iters) / 1e9;
        double bp = (double)bytes / tp[0] / 1e9, bm = (double)bytes / tm[0] / 1e9; /* sorted by median() */
        /* per round and process, summed over the processes */
        MPI_Allreduce(MPI_IN_PLACE, cp, N_COUNTERS, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, cm, N_COUNTERS, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double per = (double)iters * nranks;
        if (!rank && json)
            printf("{\"bytes\": %lld, \"processes\": %d, \"shm\": %s, \"sharded\": %s, \"via\": \"%s\", \"pippin_gbps\": %.4f, \"mpi_gbps\": %.4f, "
                   "\"ratio\": %.3f, \"ratio_best\": %.3f, \"pippin_syscalls\": %.1f, \"mpi_syscalls\": %.1f, "
                   "\"pippin_cswitches\": %.1f, \"mpi_cswitches\": %.1f, \"pippin_cpu_ms\": %.3f, "
                   "\"mpi_cpu_ms\": %.3f}\n", (long long)bytes, nranks, noshm ? "false" : "true",
                   shard ? "true" : "false", via, gp, gm, gp / gm,
                   bp / bm, cp[0] / per, cm[0] / per, cp[1] / per, cm[1] / per, cp[2] / per / 1e6, cm[2] / per / 1e6);
        else if (!rank)
            printf("%12lld %14.3f %14.3f %7.2fx %9.2fx   %s%s; per round and process: syscalls %.1f / %.1f, context "
                   "switches %.1f / %.1f, CPU ms %.3f / %.3f\n", (long long)bytes, gp, gm, gp / gm, bp / bm,
                   via, shard ? " (ZeRO-1)" : "", cp[0] / per,
                   cm[0] / per, cp[1] / per, cm[1] / per, cp[2] / per / 1e6, cm[2] / per / 1e6);
        fflush(stdout);
    }
    free(tp);
    free(tm);
    pp_transport_close(t);
    free(eps);
    free(ep);
    free(stage_rank);
    MPI_Finalize();
    return bad;
}
