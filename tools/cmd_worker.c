/* pippin worker: one rank of a pipeline described by a YAML config
 * (`pippin run`, which starts one per rank, is tools/cmd_run.c). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "pippin/config.h"
#include "pippin/optimize.h"
#include "pippin/worker.h"

#include "status_internal.h"
/* The CLI's progress line per step: what pippin train prints, from the rank
 * whose stage computes the loss. */
static void print_progress(const pp_worker_progress *pr, void *user) {
    const pp_config *c = user;
    if (!pr->has_loss) return;
    printf("step %lld: loss %.6f  (%.1f ms, %.0f samples/s)\n", (long long)pr->step, pr->loss, pr->step_ms,
           pr->step_ms > 0 ? (double)c->batch_size * 1000.0 / pr->step_ms : 0.0);
    fflush(stdout);
}

static pp_worker *volatile running; /* for the signal handler */

static volatile sig_atomic_t signalled;
static struct timespec first_signal;

/* The first SIGINT/SIGTERM asks every rank to stop after the step in
 * progress; another one more than a second later ends the process at once
 * (e.g. while a receive waits for a peer that is gone). Within the second
 * it is the same request delivered twice: systemd, Slurm and `timeout`
 * signal every process of a job, and pippin run forwards it as well. */
static void on_signal(int sig) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!signalled) {
        signalled = 1;
        first_signal = now;
        pp_worker *w = running;
        if (w) pp_worker_stop(w);
        return;
    }
    long long ms = (now.tv_sec - first_signal.tv_sec) * 1000LL + (now.tv_nsec - first_signal.tv_nsec) / 1000000;
    if (ms < 1000) return;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void worker_usage(FILE *f) {
    fprintf(f, "usage: pippin worker CONFIG.yaml [--rank R] [--checkpoint DIR [--checkpoint-every N]\n"
               "                     [--checkpoint-keep K]] [--resume | --resume-if-any]\n"
               "                     [--rejoin-timeout-ms T] [--threads N] [--no-optimize]\n"
               "Runs one rank of the pipeline the config describes (docs/config.md): builds the\n"
               "stages the schedule puts on this rank, connects to the other ranks' endpoints,\n"
               "and trains (or infers) for the configured steps. The rank comes from --rank,\n"
               "else PIPPIN_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK.\n"
               "--checkpoint (or the config's checkpoint: block) saves this rank's stages to\n"
               "DIR/step_N/ every N steps and after the last; rank 0 commits a step once every\n"
               "rank's files are on disk, and the K newest committed steps are kept (default 2).\n"
               "--resume continues after the newest committed step (an error if there is none);\n"
               "--resume-if-any starts at step 0 when there is none. SIGINT/SIGTERM stop every\n"
               "rank after the step in progress (with a checkpoint when checkpoints are on).\n"
               "--rejoin-timeout-ms (or the config's rejoin_timeout_ms): when a peer dies or\n"
               "restarts, wait up to T ms for every rank to come back, then roll back together to\n"
               "the newest committed checkpoint (step 0 without one) and go on; a restarted rank\n"
               "rejoins when started with --resume-if-any (0: a failure ends the run).\n"
               "--threads N: compute threads (pippin's kernels and the BLAS); default\n"
               "PIPPIN_THREADS, else the config's threads:, else the CPUs this process may use\n"
               "divided among the ranks on this host (ipc:// or loopback endpoints).\n"
               "--no-optimize: inference and serving stages run their graphs as loaded, without\n"
               "the optimizer's passes (PIPPIN_OPTIMIZE=0 does the same; pippin/optimize.h).\n");
}

static int parse_count(const char *arg, const char *flag, long long max, long long *out) {
    char *end;
    long long v = strtoll(arg, &end, 10);
    if (*end || end == arg || v < 0 || v > max) {
        fprintf(stderr, "pippin worker: %s '%s': need a non-negative number\n", flag, arg);
        return 0;
    }
    *out = v;
    return 1;
}

int cmd_worker(int argc, char **argv) {
    static const struct option opts[] = {{"rank", required_argument, NULL, 'r'},
                                         {"checkpoint", required_argument, NULL, 'c'},
                                         {"checkpoint-every", required_argument, NULL, 'e'},
                                         {"resume", no_argument, NULL, 'R'},
                                         {"resume-if-any", no_argument, NULL, 'A'},
                                         {"checkpoint-keep", required_argument, NULL, 'k'},
                                         {"rejoin-timeout-ms", required_argument, NULL, 'J'},
                                         {"threads", required_argument, NULL, 'T'},
                                         {"no-optimize", no_argument, NULL, 'O'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    pp_worker_options o;
    pp_worker_options_init(&o);
    int c;
    long long v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "r:h", opts, NULL)) != -1) {
        if (c == 'r') {
            if (!parse_count(optarg, "--rank", 1 << 20, &v)) return 2;
            o.rank = (int)v;
        } else if (c == 'c') {
            o.checkpoint_dir = optarg;
        } else if (c == 'e') {
            if (!parse_count(optarg, "--checkpoint-every", INT64_MAX, &v)) return 2;
            o.checkpoint_every = v;
        } else if (c == 'R') {
            o.resume = PP_WORKER_RESUME;
        } else if (c == 'A') {
            o.resume = PP_WORKER_RESUME_IF_ANY;
        } else if (c == 'k') {
            if (!parse_count(optarg, "--checkpoint-keep", 1 << 20, &v)) return 2;
            if (v < 1) {
                fprintf(stderr, "pippin worker: --checkpoint-keep '%s': need at least 1\n", optarg);
                return 2;
            }
            o.checkpoint_keep = (int)v;
        } else if (c == 'J') {
            if (!parse_count(optarg, "--rejoin-timeout-ms", INT_MAX, &v)) return 2;
            o.rejoin_timeout_ms = v ? (int)v : -1;
        } else if (c == 'T') {
            if (!parse_count(optarg, "--threads", 4096, &v)) return 2;
            if (v < 1) {
                fprintf(stderr, "pippin worker: --threads '%s': need at least 1\n", optarg);
                return 2;
            }
            o.threads = (int)v;
        } else if (c == 'O') {
            pp_optimize_set_default(0);
        } else if (c == 'h') {
            worker_usage(stdout);
            return 0;
        } else {
            worker_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || ((o.checkpoint_every || o.checkpoint_keep) && !o.checkpoint_dir)) {
        worker_usage(stderr);
        return 2;
    }
    pp_config *cfg = NULL;
    if (pp_config_load(argv[optind], &cfg) != PP_OK) return pp_cli_fail("worker");
    if (o.resume == PP_WORKER_RESUME && !o.checkpoint_dir && !cfg->checkpoint_dir) {
        fprintf(stderr, "pippin worker: --resume needs --checkpoint DIR or a checkpoint: block in %s\n", argv[optind]);
        pp_config_free(cfg);
        return 2;
    }
    o.progress = print_progress;
    o.progress_user = cfg;
    pp_worker *w = NULL;
    if (pp_worker_open_config(cfg, &o, &w) != PP_OK) {
        pp_config_free(cfg);
        return pp_cli_fail("worker");
    }
    char line[512], *p = line; /* one write, so workers' lines do not interleave */
    p += snprintf(p, 64, "pippin worker: rank %d of %d, stages", pp_worker_rank(w), cfg->n_ranks);
    for (int i = 0; i < pp_worker_n_stages(w) && p < line + 400; i++)
        p += snprintf(p, 16, " %d", pp_worker_stage_index(w, i));
    fprintf(stderr, "%s, endpoint %.80s\n", line, pp_worker_endpoint(w));
    running = w;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = pp_worker_run(w) == PP_OK ? 0 : pp_cli_fail("worker");
    if (rc == 0 && pp_worker_stopped(w)) {
        fprintf(stderr, "pippin worker: rank %d stopped after step %lld\n", pp_worker_rank(w),
                (long long)pp_worker_next_step(w) - 1);
        rc = 1;
    }
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old); /* no handler may run on a freed worker */
    running = NULL;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pp_worker_close(w);
    pp_config_free(cfg);
    return rc;
}
