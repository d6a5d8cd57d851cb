/* The BLAS's thread count. OpenBLAS has openblas_set_num_threads; a generic
 * CBLAS has no such call, so it is referenced weakly and used when present.
 * pippin keeps OpenBLAS at one thread (its GEMMs run in panels on pippin's
 * pool, lib/ops/gemm.c): the first GEMM or the first explicit setting sets
 * that once, so the lazy default never undoes an explicit
 * pp_set_blas_threads; pp_set_threads does set 1 again (pippin/exec.h). */
#include <pthread.h>

#include "pippin/exec.h"

#include "blas_threads.h"

extern void openblas_set_num_threads(int n) __attribute__((weak));

static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void set_single(void) {
    if (openblas_set_num_threads) openblas_set_num_threads(1);
}

void pp_blas_default_once(void) { pthread_once(&default_once, set_single); }

int pp_set_blas_threads(int n) {
    pp_blas_default_once();
    if (!openblas_set_num_threads || n < 1) return 0;
    openblas_set_num_threads(n);
    return 1;
}
