/* Internal: pippin's own thread pool, one per process, for the kernels'
 * row-parallel loops (lib/thread_pool.c). Not installed.
 *
 * pp_parallel_for cuts [0, n) into pieces of at least `grain` items and runs
 * fn on them: on the calling thread and on the pool's workers, which sleep on
 * a condition variable between calls (they never spin while the BLAS or
 * another rank works). Which thread runs a piece never changes what a piece
 * computes, so a kernel that gives every output element the same arithmetic
 * in the same order whatever the cut (never one reduction split across
 * pieces) gives the same bits at any thread count.
 *
 * Thread safety: any thread may call pp_parallel_for at any time. One call
 * uses the workers at a time; a call made while another thread's call holds
 * them (two rank threads of one process), or from inside a piece, runs all
 * of its range on its own thread. No allocation per call. */
#ifndef PIPPIN_THREAD_POOL_H
#define PIPPIN_THREAD_POOL_H

#include <stdint.h>

/* Runs fn(arg, lo, hi) over disjoint ranges covering [0, n). A range is at
 * least `grain` items unless n < 2 * grain, when fn(arg, 0, n) runs on the
 * caller. Returns once every range has run. */
typedef void (*pp_par_fn)(void *arg, int64_t lo, int64_t hi);
void pp_parallel_for(int64_t n, int64_t grain, pp_par_fn fn, void *arg);

/* The same with the thread count given: a caller that sizes its pieces
 * by the threads (the GEMM's panels) claims them first, runs, and releases
 * them. pp_pool_threads_claim: the pool's size, or, while the process
 * shares cores with the host's other ranks (pp_share_cores_join), its own
 * threads plus those lent to it now; each claim is released with the
 * count it returned. */
void pp_parallel_for_threads(int64_t n, int64_t grain, pp_par_fn fn, void *arg, int threads);
int pp_pool_threads_claim(void);
void pp_pool_threads_release(int threads);

/* The pool's size set without waiting for a call in flight: for a fork
 * handler, where only the forking thread exists. */
void pp_pool_reset_size(int n);

/* The same over elements, with every cut at a multiple of PP_PAR_ALIGN
 * (the vector block of lib/ops/vec.h): a vectorised loop then splits at
 * its block boundaries. */
#define PP_PAR_ALIGN 16
void pp_parallel_elems(int64_t n, int64_t grain, pp_par_fn fn, void *arg);

/* Calls since the process started that ran in pieces on the workers (for
 * tests: a kernel meant to be parallel at a size did go parallel). */
int64_t pp_pool_parallel_calls(void);

/* The pool's size alone (the calling thread counts as one), without
 * touching the BLAS: pp_set_threads (pippin/exec.h) sets both. n < 1: the
 * default (pp_default_threads(1)). Waits for a call in flight to end. */
void pp_pool_set_size(int n);

/* Grains: items per piece below which splitting does not pay (each piece
 * should be some tens of microseconds of work). PP_GRAIN_ELEMS counts
 * elements of a cheap elementwise loop; PP_GRAIN_ROW_ELEMS counts elements
 * of a row kernel (softmax, layernorm: a few passes, an exp each). */
/* The CPUs this process may run on (sched_getaffinity); PIPPIN_THREADS as
 * a count, 0 when unset or not a count from 1 to 4096. */
int pp_affinity_cpus(void);
int pp_env_threads(void);

#define PP_GRAIN_ELEMS 32768
#define PP_GRAIN_ROW_ELEMS 16384

/* Multiply-adds (GEMM-like work) a piece must hold to pay for the thread
 * it runs on: waking a sleeping worker, or one another rank lends
 * (lib/core_share.c), and moving its operands' cache lines costs tens of
 * microseconds, about what 2^20 multiply-adds take on one core. Below
 * that, a second thread made the example GPT's 64-token request slower
 * (bench/bench_par_min.c measures where splitting starts to pay). */
#define PP_PAR_MIN_MACS (INT64_C(1) << 20)

/* The grain, in items of `macs_per_item` multiply-adds each, that gives
 * every piece at least PP_PAR_MIN_MACS. */
static inline int64_t pp_grain_macs(int64_t macs_per_item) {
    return macs_per_item > 0 && macs_per_item < PP_PAR_MIN_MACS ? (PP_PAR_MIN_MACS + macs_per_item - 1) / macs_per_item : 1;
}

/* The grain in rows for rows of `len` elements (at least 1 row). */
static inline int64_t pp_grain_rows(int64_t len, int64_t grain_elems) {
    return len > 0 && len < grain_elems ? grain_elems / len : 1;
}

#endif
