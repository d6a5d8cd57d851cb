/* Embedding pippin's worker API: every rank of a pipeline config, each in a
 * process of its own, as a service would start them (one per host, or one
 * per GPU). Each process opens its rank's worker, runs the configured steps
 * with a progress callback, and closes it.
 *
 *   worker_pipeline CONFIG.yaml        e.g. examples/gpt/pipeline.yaml
 *
 * Builds with `pkg-config --cflags --libs pippin` after `meson install`
 * (or as build/examples/worker_pipeline in the source tree). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pippin/pippin.h"

static void on_step(const pp_worker_progress *p, void *user) {
    (void)user;
    if (p->has_loss) /* only the rank whose stage computes the loss has it */
        printf("rank %d step %lld/%lld: loss %.6f (%.1f ms)\n", p->rank, (long long)p->step + 1,
               (long long)p->steps, p->loss, p->step_ms);
    fflush(stdout);
}

/* One rank, start to end; the process's exit code. */
static int run_rank(const char *config, int rank) {
    pp_worker_options o;
    pp_worker_options_init(&o);
    o.rank = rank;
    o.progress = on_step;
    o.blas_threads = 1; /* the ranks share this machine's cores */
    pp_worker *w;
    if (pp_worker_open(config, &o, &w) != PP_OK) { /* the message names the rank */
        fprintf(stderr, "%s\n", pp_last_error());
        return 1;
    }
    pp_status s = pp_worker_run(w);
    if (s != PP_OK) fprintf(stderr, "%s\n", pp_last_error());
    pp_worker_close(w);
    return s == PP_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CONFIG.yaml\n", argv[0]);
        return 2;
    }
    pp_config *c;
    if (pp_config_load(argv[1], &c) != PP_OK) {
        fprintf(stderr, "%s\n", pp_last_error());
        return 1;
    }
    int n = c->n_ranks;
    pp_config_free(c);
    printf("pippin %s: %d ranks, a process each\n", pp_version(), n);
    fflush(stdout);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!pids) return 1;
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(run_rank(argv[1], r));
        if (pids[r] < 0) { /* the ranks already started would wait for this one */
            for (int k = 0; k < r; k++) kill(pids[k], SIGTERM);
            return 1;
        }
    }
    int rc = 0;
    for (int r = 0; r < n; r++) {
        int status;
        if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
    }
    free(pids);
    printf(rc ? "a rank failed\n" : "all ranks done\n");
    return rc;
}
