/* A rank's compute threads (pippin's pool and the BLAS): a --threads flag,
 * else PIPPIN_THREADS, else the config's `threads`, else the CPUs this
 * process may use divided among the ranks on its host, so that ranks
 * sharing a machine do not oversubscribe it (pp_worker_threads). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/exec.h"
#include "pippin/worker.h"

#include "log_internal.h"
#include "rank_threads.h"
#include "thread_pool.h"

/* An endpoint that can only be on this host: ipc, inproc, loopback tcp. */
static int local_endpoint(const char *e) {
    if (!strncmp(e, "ipc://", 6) || !strncmp(e, "inproc://", 9)) return 1;
    if (strncmp(e, "tcp://", 6) != 0) return 0;
    const char *h = e + 6;
    return !strncmp(h, "127.", 4) || !strncmp(h, "localhost:", 10) || !strncmp(h, "[::1]:", 6);
}

int pp_worker_threads(const pp_config *c, int given, int ranks_on_host) {
    if (given > 0) return given;
    int env = pp_env_threads();
    if (env > 0) return env;
    if (c && c->threads > 0) return c->threads;
    if (ranks_on_host < 1 && c) {
        ranks_on_host = 0;
        for (int r = 0; r < c->n_ranks; r++) ranks_on_host += local_endpoint(c->ranks[r]);
    }
    return pp_default_threads(ranks_on_host < 1 ? 1 : ranks_on_host);
}

/* Serving at one request in flight, each rank waits for the other ranks
 * between its computes; a core that sleeps through those waits comes back
 * slower (bench_serve: the example GPT's kernels took 1.0 ms a request in
 * a 2-rank service against 0.65-0.85 ms back to back; 2 ms of spinning
 * brought them to 0.8 and the p50 from 1.37-1.46 ms to 0.99-1.06). It pays
 * only when every rank's threads have cores of their own: 4 ranks on 2
 * cores spinning took 5.5 ms instead of 1.6. */
#define SERVE_SPIN_US 2000

int pp_worker_spin_us(const pp_config *c, int threads) {
    if (c->spin_us >= 0) return c->spin_us;
    if (!c->serving) return 0;
    int local = 0;
    for (int r = 0; r < c->n_ranks; r++) local += local_endpoint(c->ranks[r]);
    if (local < 1) local = 1;
    return (int64_t)local * (threads > 0 ? threads : 1) <= pp_affinity_cpus() ? SERVE_SPIN_US : 0;
}

/* Workers open in this process, and whether two ever were: their waits
 * would lend the threads another computes on, so such a process stops
 * sharing for good. */
static atomic_int workers_open;
static atomic_int several;

void pp_rank_share_cores(const pp_config *c, int rank, int *joined) {
    *joined = 0;
    if (atomic_fetch_add(&workers_open, 1) > 0) {
        if (!atomic_exchange(&several, 1)) pp_debug("rank %d: several workers in this process; core sharing stops", rank);
        pp_share_cores_leave();
        return;
    }
    if (atomic_load(&several) || !c->share_cores || rank < 0 || rank >= c->n_ranks) return;
    /* inproc:// ranks are threads of one process: nothing to lend across */
    const char *mine = c->ranks[rank];
    if (!local_endpoint(mine) || !strncmp(mine, "inproc://", 9)) return;
    int local = 0;
    for (int r = 0; r < c->n_ranks; r++) local += local_endpoint(c->ranks[r]);
    int own = pp_get_threads(), cap = pp_affinity_cpus();
    if (local < 2 || cap <= own) return;
    /* the ranks of one config meet under their endpoints, which no other
     * run on this host can use at the same time */
    size_t n = 1;
    for (int r = 0; r < c->n_ranks; r++) n += strlen(c->ranks[r]) + 1;
    char *key = malloc(n);
    if (!key) return;
    key[0] = 0;
    for (int r = 0; r < c->n_ranks; r++) strcat(strcat(key, c->ranks[r]), "\n");
    if (pp_share_cores_join(key, rank, c->n_ranks, own, cap) == PP_OK) *joined = 1;
    else pp_warn("rank %d computes on its own %d threads: %s", rank, own, pp_last_error());
    free(key);
}

void pp_rank_share_cores_done(int joined) {
    if (joined) pp_share_cores_leave();
    atomic_fetch_sub(&workers_open, 1);
}
