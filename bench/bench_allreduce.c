/* The replicas' gradient all-reduce (runtime/grad_ring.c) against Open MPI's
 * MPI_Allreduce on the same bytes, in the same processes, on the same host.
 * Run it under mpirun (bench/bench_allreduce.sh does):
 *
 *   mpirun -np 2 pippin-bench-allreduce [--json] [--noshm] [--iters N]
 *
 * Each size: float32 buffers summed in place, a few warm-up rounds, then N
 * timed rounds of each; the figure is the median round's algorithm
 * bandwidth (buffer bytes / time), as nccl-tests' "algbw". pippin's ring
 * runs over its transport (tcp on loopback; same-host peers use the
 * shared-memory rings unless --noshm), with the whole buffer as one bucket.
 * Both results are checked against the exact sum. Prints one line per size,
 * or with --json one JSON object per size: bytes, pippin_gbps, mpi_gbps,
 * ratio (pippin / MPI). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grad_ring.h"
#include "pippin/transport.h"

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
    MPI_Init(&argc, &argv);
    int rank, nranks, json = 0, noshm = 0, iters = 20;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--noshm")) noshm = 1;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else {
            if (!rank) fprintf(stderr, "usage: mpirun -np R %s [--json] [--noshm] [--iters N]\n", argv[0]);
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
        printf("all-reduce of float32, %d processes on this host, median of %d rounds; pippin over tcp%s\n"
               "%12s %14s %14s %8s\n", nranks, iters, noshm ? " (no shared memory)" : " + shared-memory rings",
               "bytes", "pippin GB/s", "MPI GB/s", "ratio");
    int64_t step = 0;
    int bad = 0;
    double *tp = calloc((size_t)iters, sizeof *tp), *tm = calloc((size_t)iters, sizeof *tm);
    for (int64_t bytes = 4096; bytes <= (64 << 20); bytes *= 4) {
        int64_t n = bytes / (int64_t)sizeof(float);
        float *x = malloc((size_t)bytes);
        /* pippin: one stage per rank, the whole buffer one bucket */
        pp_grad_ring_options ro = {t, nranks, rank, 1, bytes, bytes};
        pp_grad_ring *g;
        if (pp_grad_ring_new(&ro, &g) != PP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
        int64_t off0 = 0, numel = n;
        char xname[] = "x", *name = xname;
        pp_flat_params fp = {1, NULL, &name, &off0, &numel, NULL, NULL, n, NULL, x, NULL};
        for (int it = -3; it < iters && !bad; it++) {
            fill(x, n, rank);
            pp_transport_set_step(t, step);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now_s();
            pp_grad_ring_begin(g, step++);
            pp_status s = pp_grad_ring_add(g, 0, &fp, 0);
            if (s == PP_OK) s = pp_grad_ring_finish(g, -1);
            double dt = now_s() - t0;
            if (s != PP_OK) {
                fprintf(stderr, "rank %d: %s\n", rank, pp_last_error());
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            if (it == 0) bad |= check(x, n, nranks, "pippin", rank);
            if (it >= 0) tp[it] = dt;
        }
        for (int it = -3; it < iters && !bad; it++) {
            fill(x, n, rank);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now_s();
            MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = now_s() - t0;
            if (it == 0) bad |= check(x, n, nranks, "MPI", rank);
            if (it >= 0) tm[it] = dt;
        }
        pp_grad_ring_free(g);
        free(x);
        /* the slowest rank's round is the round */
        MPI_Allreduce(MPI_IN_PLACE, tp, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, tm, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (bad) break;
        double gp = (double)bytes / median(tp, iters) / 1e9, gm = (double)bytes / median(tm, iters) / 1e9;
        if (!rank && json)
            printf("{\"bytes\": %lld, \"processes\": %d, \"shm\": %s, \"pippin_gbps\": %.4f, \"mpi_gbps\": %.4f, "
                   "\"ratio\": %.3f}\n", (long long)bytes, nranks, noshm ? "false" : "true", gp, gm, gp / gm);
        else if (!rank)
            printf("%12lld %14.3f %14.3f %7.2fx\n", (long long)bytes, gp, gm, gp / gm);
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
