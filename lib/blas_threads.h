/* Internal: OpenBLAS kept at one thread unless the caller said otherwise
 * (lib/blas_threads.c). Not installed. */
#ifndef PIPPIN_BLAS_THREADS_H
#define PIPPIN_BLAS_THREADS_H

/* Sets OpenBLAS to one thread the first time it is called in the process,
 * unless pp_set_blas_threads ran before; no effect after that. */
void pp_blas_default_once(void);

#endif
