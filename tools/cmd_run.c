/* pippin run: one `pippin worker CONFIG --rank R` process per rank of a
 * config, on this machine. The first failure stops the rest; SIGINT and
 * SIGTERM are forwarded to every worker (which stop together after the step
 * in progress), a second one kills them; no worker outlives the launcher
 * (each has PR_SET_PDEATHSIG). With --restart N, the workers rejoin: a
 * failed worker is started again alone (up to N times in all) while the
 * others wait for it, and every rank rolls back to the newest committed
 * checkpoint together (pippin/worker.h).
 *
 * The launcher blocks SIGINT, SIGTERM and SIGCHLD and takes them with
 * sigwaitinfo, so no signal is lost between checking and waiting. The
 * workers run in a process group of their own: a Ctrl-C on the terminal
 * reaches the launcher only, and each worker gets the signal once, from it
 * (a worker dies at once on its second signal). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "pippin/checkpoint.h"
#include "pippin/config.h"
#include "pippin/worker.h"

typedef struct job {
    const char *config;
    int n;           /* ranks */
    pid_t *pids;     /* per rank; 0 once reaped */
    int live;        /* workers not yet reaped */
    int failed;      /* a worker failed (this attempt) */
    int stop_sig;    /* the user's signal (forwarded), 0 if none */
    int signals;     /* SIGINT/SIGTERM received, over all attempts */
    pid_t first_pid; /* the first one's sender (SI_USER) or -1 */
    double first_at; /* and when it came */
    double kill_at;  /* monotonic seconds: SIGKILL what is left then (0: never) */
    double grace_s;  /* after a failure, how long the others get to stop */
    int rejoin_ms;   /* > 0: workers rejoin (--restart) */
    int finished;    /* a worker exited 0: the run is over, nothing to rejoin */
    int restarts_left;
    int resume_any;  /* restarted workers take --resume-if-any (the config has checkpoint:) */
    int64_t *mark;   /* per rank: the newest committed step when it was last restarted (-2: never) */
    const char *ckpt_dir;
    pid_t pgid, launcher;
    const sigset_t *child_mask;
    int threads;     /* each worker's --threads */
} job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void signal_all(job *j, int sig) {
    for (int r = 0; r < j->n; r++)
        if (j->pids[r] > 0) kill(j->pids[r], sig);
}

/* Forks rank r's worker. The child joins process group pgid (0: a new one,
 * led by itself), asks to be sent SIGTERM when the launcher dies and checks
 * that the launcher is still there (it may have died before the prctl).
 * resume: 0, or the worker flag to continue from a checkpoint. */
static pid_t spawn(const job *j, int r, const char *resume) {
    pid_t pid = fork();
    if (pid != 0) {
        if (pid > 0) setpgid(pid, j->pgid ? j->pgid : pid); /* also here: whichever runs first */
        return pid;
    }
    setpgid(0, j->pgid);
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != j->launcher) _exit(1);
    signal(SIGINT, SIG_DFL); /* not an ignore inherited by the launcher: the worker must hear a stop */
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_SETMASK, j->child_mask, NULL);
    char rank[16], rejoin[16], threads[16];
    snprintf(rank, sizeof rank, "%d", r);
    snprintf(rejoin, sizeof rejoin, "%d", j->rejoin_ms);
    snprintf(threads, sizeof threads, "%d", j->threads);
    char *argv[11] = {"pippin", "worker", (char *)j->config, "--rank", rank, "--threads", threads};
    int n = 7;
    if (j->rejoin_ms > 0) argv[n++] = "--rejoin-timeout-ms", argv[n++] = rejoin;
    if (resume) argv[n++] = (char *)resume;
    argv[n] = NULL;
    execv("/proc/self/exe", argv);
    fprintf(stderr, "pippin run: cannot start rank %d: %s\n", r, strerror(errno));
    _exit(127);
}

/* Stops the job: the others get SIGTERM (they would only wait for the
 * failed one until their timeout), then grace_s, then SIGKILL. */
static void stop_job(job *j) {
    if (!j->failed && !j->stop_sig && j->live > 0) {
        signal_all(j, SIGTERM);
        j->kill_at = now_s() + j->grace_s;
    }
    j->failed = 1;
}

/* With rejoin: starts rank r again while the others wait for it, when it
 * died of a signal (killed, crashed) -- a worker that exits with an error
 * failed for a reason a restart repeats -- unless the run is over, the
 * restarts are used up, or r died before without a step committed since.
 * 1 if restarted. */
static int restart_rank(job *j, int r, int status) {
    if (j->rejoin_ms <= 0 || j->stop_sig || j->failed || j->finished) return 0;
    if (!WIFSIGNALED(status)) return 0;
    int64_t step = -1;
    if (!j->ckpt_dir || pp_checkpoint_latest(j->ckpt_dir, &step) != PP_OK) step = -1;
    if (j->restarts_left <= 0) {
        fprintf(stderr, "pippin run: rank %d failed and the restarts (--restart) are used up\n", r);
        return 0;
    }
    if (j->mark[r] == step) {
        fprintf(stderr, "pippin run: giving up: rank %d failed again and no new step was committed since its last "
                "restart\n", r);
        return 0;
    }
    j->mark[r] = step;
    j->restarts_left--;
    pid_t pid = spawn(j, r, j->resume_any ? "--resume-if-any" : NULL);
    if (pid < 0) {
        fprintf(stderr, "pippin run: fork for rank %d: %s\n", r, strerror(errno));
        return 0;
    }
    j->pids[r] = pid;
    j->live++;
    if (step >= 0)
        fprintf(stderr, "pippin run: restarted rank %d (%d restart%s left); every rank rolls back to step %lld "
                "(committed in %s)\n", r, j->restarts_left, j->restarts_left == 1 ? "" : "s", (long long)step,
                j->ckpt_dir);
    else
        fprintf(stderr, "pippin run: restarted rank %d (%d restart%s left); every rank starts again from step 0 (no "
                "committed checkpoint)\n", r, j->restarts_left, j->restarts_left == 1 ? "" : "s");
    return 1;
}

/* A worker ended: rank r (or -1: not ours). A failure restarts it (with
 * rejoin) or stops the others. */
static void reaped(job *j, pid_t pid, int status) {
    int r = 0;
    while (r < j->n && j->pids[r] != pid) r++;
    if (r == j->n) return;
    j->pids[r] = 0;
    j->live--;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        j->finished = 1;
        return;
    }
    /* After the user's stop, workers end with "stopped" (exit 1): no news. */
    if (!j->stop_sig) {
        if (WIFSIGNALED(status)) fprintf(stderr, "pippin run: rank %d killed by signal %d\n", r, WTERMSIG(status));
        else fprintf(stderr, "pippin run: rank %d failed (exit %d)\n", r, WEXITSTATUS(status));
    }
    if (!restart_rank(j, r, status)) stop_job(j);
}

/* A SIGINT/SIGTERM for the launcher: the first is forwarded, a second one
 * kills every worker. The same signal from the same process within a
 * second is one request delivered twice: `timeout` and others signal the
 * child and then its whole process group. */
static void user_signal(job *j, int sig, const siginfo_t *info) {
    pid_t from = info && info->si_code == SI_USER ? info->si_pid : -1;
    double t = now_s();
    if (j->signals == 1 && sig == j->stop_sig && from >= 0 && from == j->first_pid && t - j->first_at < 1.0) return;
    j->signals++;
    if (j->signals == 1) {
        j->stop_sig = sig;
        j->first_pid = from;
        j->first_at = t;
        fprintf(stderr, "pippin run: %s: stopping the workers after the step in progress (again: kill them)\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM");
        signal_all(j, sig);
    } else {
        if (!j->stop_sig) j->stop_sig = sig;
        fprintf(stderr, "pippin run: %s again: killing the workers\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        signal_all(j, SIGKILL);
    }
}

/* Waits until every worker of this attempt is reaped. */
static void wait_all(job *j, const sigset_t *set) {
    for (;;) {
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) reaped(j, pid, status);
        if (j->live == 0) return;
        if (pid < 0 && errno == ECHILD) { /* cannot happen: every worker is our child */
            for (int r = 0; r < j->n; r++) j->pids[r] = 0;
            j->live = 0;
            j->failed = 1;
            return;
        }
        siginfo_t info;
        int sig;
        if (j->kill_at > 0) {
            double left = j->kill_at - now_s();
            if (left <= 0) {
                fprintf(stderr, "pippin run: %d worker%s still running after %.0f s: killing\n", j->live,
                        j->live == 1 ? "" : "s", j->grace_s);
                signal_all(j, SIGKILL);
                j->kill_at = 0;
                continue;
            }
            struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
            sig = sigtimedwait(set, &info, &ts);
        } else {
            sig = sigwaitinfo(set, &info);
        }
        if (sig == SIGINT || sig == SIGTERM) user_signal(j, sig, &info);
    }
}

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: pippin run CONFIG.yaml [--resume] [--restart N] [--threads T]\n"
            "Starts one `pippin worker CONFIG.yaml --rank R` process per rank of the config on\n"
            "this machine and waits for them. If a worker fails, the others are stopped and the\n"
            "failed ranks are named. SIGINT/SIGTERM are passed to every worker, which stop\n"
            "together after the step in progress (with a checkpoint when the config has\n"
            "checkpoint:); a second signal kills them. A worker whose launcher dies stops too.\n"
            "  --resume     every worker continues from the newest committed checkpoint in the\n"
            "               config's checkpoint.dir\n"
            "  --restart N  a worker that dies of a signal (killed, crashed) is started again\n"
            "               (N times in all, default 0) while the others wait for it\n"
            "               (rejoin_timeout_ms, default 60000); then every rank rolls back to the\n"
            "               newest committed checkpoint in checkpoint.dir (step 0 when there is\n"
            "               none) and goes on. A worker that exits with an error stops the job\n"
            "  --threads T  compute threads per worker (pippin's kernels and the BLAS); default\n"
            "               PIPPIN_THREADS, else the config's threads:, else the CPUs this\n"
            "               process may use divided by the number of ranks\n"
            "Exit status: 0 when every worker succeeded, 1 otherwise, 2 for a usage error.\n");
}

int cmd_run(int argc, char **argv) {
    static const struct option opts[] = {{"resume", no_argument, NULL, 'R'},
                                         {"restart", required_argument, NULL, 'n'},
                                         {"threads", required_argument, NULL, 'T'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int resume = 0, restarts = 0, threads = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'R') {
            resume = 1;
        } else if (c == 'n') {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 0 || v > 1000000) {
                fprintf(stderr, "pippin run: --restart '%s': need a number from 0 to 1000000\n", optarg);
                return 2;
            }
            restarts = (int)v;
        } else if (c == 'T') {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || end == optarg || v < 1 || v > 4096) {
                fprintf(stderr, "pippin run: --threads '%s': need a number from 1 to 4096\n", optarg);
                return 2;
            }
            threads = (int)v;
        } else if (c == 'h') {
            run_usage(stdout);
            return 0;
        } else {
            run_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1) {
        run_usage(stderr);
        return 2;
    }
    const char *path = argv[optind];
    pp_config *cfg;
    if (pp_config_load(path, &cfg) != PP_OK) return pp_cli_fail("run");
    if (resume && !cfg->checkpoint_dir) {
        fprintf(stderr, "pippin run: --resume: %s has no checkpoint: {dir: ...}\n", path);
        pp_config_free(cfg);
        return 2;
    }
    int64_t mark = -1;
    if (cfg->checkpoint_dir && pp_checkpoint_latest(cfg->checkpoint_dir, &mark) != PP_OK) mark = -1;
    if (!resume && mark >= 0) { /* the workers would refuse it */
        fprintf(stderr, "pippin run: %s holds committed checkpoints up to step %lld of an earlier run: resume it "
                "(--resume) or use another directory\n", cfg->checkpoint_dir, (long long)mark);
        pp_config_free(cfg);
        return 1;
    }
    job j = {.config = path, .n = cfg->n_ranks, .restarts_left = restarts, .ckpt_dir = cfg->checkpoint_dir};
    /* Every rank runs on this machine: the CPUs are shared among all. */
    j.threads = pp_worker_threads(cfg, threads, cfg->n_ranks);
    if (restarts > 0) {
        j.rejoin_ms = cfg->rejoin_timeout_ms > 0 ? cfg->rejoin_timeout_ms : 60000;
        long long at_least = 3LL * cfg->timeout_ms;
        if (j.rejoin_ms < at_least) j.rejoin_ms = at_least > INT_MAX ? INT_MAX : (int)at_least;
        j.resume_any = cfg->training && cfg->checkpoint_dir;
    }
    /* A failed peer is noticed within timeout_ms; then give the step's
     * end and a checkpoint some time before killing. */
    j.grace_s = 2.0 * cfg->timeout_ms / 1000.0 + 10.0;
    j.pids = calloc((size_t)j.n, sizeof *j.pids);
    j.mark = calloc((size_t)j.n, sizeof *j.mark);
    if (!j.pids || !j.mark) {
        free(j.pids);
        free(j.mark);
        pp_config_free(cfg);
        fprintf(stderr, "pippin run: out of memory\n");
        return 1;
    }
    for (int r = 0; r < j.n; r++) j.mark[r] = -2;

    sigset_t set, old, child_mask;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGCHLD);
    signal(SIGCHLD, SIG_DFL); /* an inherited SIG_IGN would reap the workers for us */
    sigprocmask(SIG_BLOCK, &set, &old);
    child_mask = old;
    sigdelset(&child_mask, SIGINT);
    sigdelset(&child_mask, SIGTERM);
    sigdelset(&child_mask, SIGCHLD);
    j.launcher = getpid();
    j.child_mask = &child_mask;

    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < j.n && !j.signals; r++) {
        pid_t pid = spawn(&j, r, resume ? "--resume" : NULL);
        if (pid < 0) {
            fprintf(stderr, "pippin run: fork for rank %d: %s\n", r, strerror(errno));
            stop_job(&j);
            break;
        }
        if (!j.pgid) j.pgid = pid;
        j.pids[r] = pid;
        j.live++;
        /* A signal while starting: the ones started hear it at once. */
        siginfo_t info;
        struct timespec zero = {0, 0};
        sigset_t stop;
        sigemptyset(&stop);
        sigaddset(&stop, SIGINT);
        sigaddset(&stop, SIGTERM);
        int sig = sigtimedwait(&stop, &info, &zero);
        if (sig == SIGINT || sig == SIGTERM) user_signal(&j, sig, &info);
    }
    wait_all(&j, &set);
    /* a service ends by a signal: that is its normal end when every worker drained cleanly */
    int rc = !j.failed && (!j.signals || cfg->serving) ? 0 : 1;
    if (j.signals) fprintf(stderr, "pippin run: stopped by %s\n", j.stop_sig == SIGINT ? "SIGINT" : "SIGTERM");

    /* Signals that came after the last worker ended must not kill us when
     * the mask is restored. */
    struct timespec zero = {0, 0};
    siginfo_t info;
    while (sigtimedwait(&set, &info, &zero) > 0) {
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    free(j.pids);
    free(j.mark);
    pp_config_free(cfg);
    return rc;
}
