/* pippin's thread pool: a fixed set of workers, one pool per process, and
 * pp_parallel_for over ranges (lib/thread_pool.h).
 *
 * A call publishes a job (fn, arg, n, pieces) under the pool's mutex, wakes
 * the workers and runs pieces itself. Pieces are claimed from one 64-bit
 * atomic word holding (job generation << 32 | next piece), so a worker that
 * wakes late can never claim a piece of a later job with an earlier job's
 * function. The caller returns when every piece has run; a worker that
 * finds nothing left goes back to sleep. The workers start on the first
 * call that needs them, and again in a child after fork. */
#include "thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "pippin/exec.h"

#include "core_share.h"
#include "log_internal.h"

#define MAX_WORKERS 255

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;

/* The job in flight, written under mu by the caller that holds `busy`. */
static pp_par_fn job_fn;
static void *job_arg;
static int64_t job_n;
static int job_pieces;
static uint32_t job_gen;
static _Atomic uint64_t claim; /* job_gen << 32 | next piece */
static atomic_int done;        /* pieces finished */

static _Atomic int64_t parallel_calls;
static atomic_int busy;     /* 1 while a call uses the workers */
static atomic_int size = 0; /* threads, caller included; 0: not set yet */
static int n_workers;       /* started (under busy) */
static int quit;            /* under mu */
static pthread_t workers[MAX_WORKERS];
static _Thread_local int in_piece;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void piece_range(int64_t n, int pieces, int k, int64_t *lo, int64_t *hi) {
    *lo = n * k / pieces;
    *hi = n * (k + 1) / pieces;
}

/* Claims and runs pieces of job gen until none is left. */
static void run_pieces(uint32_t gen, pp_par_fn fn, void *arg, int64_t n, int pieces) {
    for (;;) {
        uint64_t c = atomic_load(&claim);
        if ((uint32_t)(c >> 32) != gen || (int)(uint32_t)c >= pieces) return;
        if (!atomic_compare_exchange_weak(&claim, &c, c + 1)) continue;
        int64_t lo, hi;
        piece_range(n, pieces, (int)(uint32_t)c, &lo, &hi);
        in_piece = 1;
        fn(arg, lo, hi);
        in_piece = 0;
        if (atomic_fetch_add(&done, 1) + 1 == pieces) {
            pthread_mutex_lock(&mu);
            pthread_cond_broadcast(&done_cv);
            pthread_mutex_unlock(&mu);
        }
    }
}

static void *worker_main(void *unused) {
    (void)unused;
    uint32_t seen = 0;
    pthread_mutex_lock(&mu);
    seen = job_gen;
    for (;;) {
        while (!quit && job_gen == seen) pthread_cond_wait(&wake, &mu);
        if (quit) break;
        seen = job_gen;
        pp_par_fn fn = job_fn;
        void *arg = job_arg;
        int64_t n = job_n;
        int pieces = job_pieces;
        pthread_mutex_unlock(&mu);
        run_pieces(seen, fn, arg, n, pieces);
        pthread_mutex_lock(&mu);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* In a child after fork only the forking thread exists: forget the
 * workers (and a call another thread had in flight) and start afresh. */
static void after_fork_child(void) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t c = PTHREAD_COND_INITIALIZER;
    mu = m;
    wake = c;
    done_cv = c;
    n_workers = 0;
    quit = 0;
    atomic_store(&busy, 0);
}

static void install_atfork(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* Takes `busy`, waiting for a call in flight to end. */
static void acquire_busy(void) {
    while (atomic_exchange(&busy, 1)) sched_yield();
}

/* Stops every worker (busy held). */
static void stop_workers(void) {
    if (n_workers == 0) return;
    pthread_mutex_lock(&mu);
    quit = 1;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < n_workers; i++) pthread_join(workers[i], NULL);
    n_workers = 0;
    pthread_mutex_lock(&mu);
    quit = 0;
    pthread_mutex_unlock(&mu);
}

/* Starts workers up to want (busy held). Fewer start when the system
 * refuses threads; the pool then works with what it has. */
static void start_workers(int want) {
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    pthread_once(&atfork_once, install_atfork);
    /* workers take no signals (as libzmq's threads): a program's handler
     * runs on its own threads, never inside a kernel's piece */
    sigset_t all, was;
    sigfillset(&all);
    for (int sig = 0; sig < 5; sig++) /* faults stay with the thread that makes them */
        sigdelset(&all, (int[]){SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}[sig]);
    pthread_sigmask(SIG_SETMASK, &all, &was);
    while (n_workers < want) {
        if (pthread_create(&workers[n_workers], NULL, worker_main, NULL) != 0) {
            pp_warn("thread pool: could not start worker %d of %d; going on with %d", n_workers + 1, want,
                    n_workers);
            break;
        }
        n_workers++;
    }
    pthread_sigmask(SIG_SETMASK, &was, NULL);
}

static int current_size(void) {
    int s = atomic_load(&size);
    if (s > 0) return s;
    int d = pp_default_threads(1);
    int expected = 0;
    if (!atomic_compare_exchange_strong(&size, &expected, d)) return expected;
    return d;
}

void pp_pool_set_size(int n) {
    if (n < 1) n = pp_default_threads(1);
    if (n > MAX_WORKERS + 1) n = MAX_WORKERS + 1;
    acquire_busy();
    atomic_store(&size, n);
    if (n_workers > n - 1) stop_workers(); /* the rest start on the next call */
    atomic_store(&busy, 0);
}

int pp_get_threads(void) { return current_size(); }

int64_t pp_pool_parallel_calls(void) { return atomic_load(&parallel_calls); }

/* Inside a piece, or while another thread's call holds the workers, the
 * call runs on its own thread: nothing to borrow. */
int pp_pool_threads_claim(void) {
    if (in_piece || atomic_load(&busy)) return 1;
    return pp_share_cores_claim(current_size());
}

void pp_pool_reset_size(int n) { atomic_store(&size, n < 1 ? 1 : n > MAX_WORKERS + 1 ? MAX_WORKERS + 1 : n); }

void pp_pool_threads_release(int threads) { pp_share_cores_release(threads); }

void pp_parallel_for(int64_t n, int64_t grain, pp_par_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (n < 2 * grain || in_piece) { /* one piece: nothing to claim */
        fn(arg, 0, n);
        return;
    }
    int threads = pp_pool_threads_claim();
    pp_parallel_for_threads(n, grain, fn, arg, threads);
    pp_pool_threads_release(threads);
}

void pp_parallel_for_threads(int64_t n, int64_t grain, pp_par_fn fn, void *arg, int threads) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int64_t most = n / grain;
    int pieces = (int)(most < 2 * (int64_t)threads ? most : 2 * (int64_t)threads);
    if (threads < 2 || pieces < 2 || in_piece || atomic_exchange(&busy, 1)) {
        fn(arg, 0, n);
        return;
    }
    if (n_workers < threads - 1) start_workers(threads - 1);
    if (n_workers == 0) {
        atomic_store(&busy, 0);
        fn(arg, 0, n);
        return;
    }
    atomic_fetch_add(&parallel_calls, 1);
    pthread_mutex_lock(&mu);
    uint32_t gen = ++job_gen;
    job_fn = fn;
    job_arg = arg;
    job_n = n;
    job_pieces = pieces;
    atomic_store(&done, 0);
    atomic_store(&claim, (uint64_t)gen << 32);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&mu);
    run_pieces(gen, fn, arg, n, pieces);
    if (atomic_load(&done) < pieces) {
        pthread_mutex_lock(&mu);
        while (atomic_load(&done) < pieces) pthread_cond_wait(&done_cv, &mu);
        pthread_mutex_unlock(&mu);
    }
    atomic_store(&busy, 0);
}

typedef struct elems_job {
    pp_par_fn fn;
    void *arg;
    int64_t n;
} elems_job;

static void elems_piece(void *arg, int64_t lo, int64_t hi) {
    const elems_job *j = arg;
    lo *= PP_PAR_ALIGN;
    hi = hi * PP_PAR_ALIGN < j->n ? hi * PP_PAR_ALIGN : j->n;
    j->fn(j->arg, lo, hi);
}

void pp_parallel_elems(int64_t n, int64_t grain, pp_par_fn fn, void *arg) {
    if (n <= 0) return;
    elems_job j = {fn, arg, n};
    pp_parallel_for((n + PP_PAR_ALIGN - 1) / PP_PAR_ALIGN, grain / PP_PAR_ALIGN, elems_piece, &j);
}
