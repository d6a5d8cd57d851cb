/* pippin worker: one rank of a pipeline described by a YAML config; and
 * pippin run: one worker process per rank of that config, on this machine. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "pippin/config.h"
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

/* The first SIGINT/SIGTERM asks every rank to stop after the step in
 * progress (SA_RESETHAND: a second one ends the process at once, e.g. while
 * a receive waits for a peer that is gone). */
static void on_signal(int sig) {
    (void)sig;
    pp_worker *w = running;
    if (w) pp_worker_stop(w);
}

static void worker_usage(FILE *f) {
    fprintf(f, "usage: pippin worker CONFIG.yaml [--rank R] [--checkpoint DIR [--checkpoint-every N] [--resume]]\n"
               "Runs one rank of the pipeline the config describes (docs/config.md): builds the\n"
               "stages the schedule puts on this rank, connects to the other ranks' endpoints,\n"
               "and trains (or infers) for the configured steps. The rank comes from --rank,\n"
               "else PIPPIN_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK or PMI_RANK.\n"
               "--checkpoint saves this rank's stages to DIR every N steps and after the last;\n"
               "--resume continues from DIR. SIGINT/SIGTERM stop after the step in progress\n"
               "(with a checkpoint when --checkpoint is given).\n");
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
            o.resume = 1;
        } else if (c == 'h') {
            worker_usage(stdout);
            return 0;
        } else {
            worker_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || ((o.resume || o.checkpoint_every) && !o.checkpoint_dir)) {
        worker_usage(stderr);
        return 2;
    }
    pp_config *cfg = NULL;
    if (pp_config_load(argv[optind], &cfg) != PP_OK) return pp_cli_fail("worker");
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
    sa.sa_flags = SA_RESETHAND;
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

/* ---- pippin run ---- */

static void run_usage(FILE *f) {
    fprintf(f, "usage: pippin run CONFIG.yaml\n"
               "Starts one `pippin worker CONFIG.yaml --rank R` process per rank of the config on\n"
               "this machine and waits for them. If a worker fails, the others are stopped and the\n"
               "failed ranks are named.\n");
}

int cmd_run(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        int help = argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0);
        run_usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    pp_config *cfg;
    if (pp_config_load(argv[1], &cfg) != PP_OK) return pp_cli_fail("run");
    int n = cfg->n_ranks, rc = 0;
    pp_config_free(cfg);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!pids) return 1;
    fflush(stdout);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            execl("/proc/self/exe", "pippin", "worker", argv[1], "--rank", rank, (char *)NULL);
            fprintf(stderr, "pippin run: cannot start rank %d: %s\n", r, strerror(errno));
            _exit(127);
        }
        if (pids[r] < 0) {
            fprintf(stderr, "pippin run: fork for rank %d: %s\n", r, strerror(errno));
            rc = 1;
            n = r;
            break;
        }
    }
    /* Wait for all; the first failure stops the rest (they would only time out). */
    for (int left = n; left > 0; left--) {
        int status;
        pid_t pid = wait(&status);
        if (pid < 0) break;
        int r = 0;
        while (r < n && pids[r] != pid) r++;
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (r < n) pids[r] = 0;
        if (!ok) {
            if (WIFSIGNALED(status)) fprintf(stderr, "pippin run: rank %d killed by signal %d\n", r, WTERMSIG(status));
            else fprintf(stderr, "pippin run: rank %d failed (exit %d)\n", r, WEXITSTATUS(status));
            if (!rc)
                for (int k = 0; k < n; k++)
                    if (pids[k] > 0) kill(pids[k], SIGTERM);
            rc = 1;
        }
    }
    free(pids);
    return rc;
}
