/* How many threads the process computes with: the default (the CPUs this
 * process may use, divided among the ranks on the host, or PIPPIN_THREADS)
 * and pp_set_threads, which sizes pippin's pool (lib/thread_pool.c). The
 * GEMMs run on that pool too (lib/ops/gemm.c cuts them into panels), so the
 * BLAS's own threads stay at one: they would spin beside the pool. */
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "pippin/exec.h"

#include "thread_pool.h"

int pp_affinity_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int pp_env_threads(void) {
    const char *e = getenv("PIPPIN_THREADS");
    if (!e || !*e) return 0;
    char *end;
    long v = strtol(e, &end, 10);
    return *end || v < 1 || v > 4096 ? 0 : (int)v;
}

int pp_default_threads(int ranks_on_host) {
    int env = pp_env_threads();
    if (env > 0) return env;
    int cpus = pp_affinity_cpus();
    if (ranks_on_host < 1) ranks_on_host = 1;
    return cpus / ranks_on_host > 0 ? cpus / ranks_on_host : 1;
}

int pp_set_threads(int n) {
    if (n < 1) n = pp_default_threads(1);
    pp_pool_set_size(n);
    pp_set_blas_threads(1);
    return pp_get_threads();
}
