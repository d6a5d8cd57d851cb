/* The BLAS's thread count. OpenBLAS has openblas_set_num_threads; a generic
 * CBLAS has no such call, so it is referenced weakly and used when present. */
#include "pippin/exec.h"

extern void openblas_set_num_threads(int n) __attribute__((weak));

int pp_set_blas_threads(int n) {
    if (!openblas_set_num_threads || n < 1) return 0;
    openblas_set_num_threads(n);
    return 1;
}
