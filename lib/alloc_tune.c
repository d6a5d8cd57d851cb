/* pp_tune_allocator (pippin/exec.h): glibc's malloc set for a pipeline
 * rank, process-wide, so only where the program asks (the CLI does). */
#include "pippin/exec.h"

#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

void pp_tune_allocator(void) {
#ifdef __GLIBC__
    /* glibc raises its mmap threshold to the size of each large block freed
     * (up to 32 MiB), so later blocks below it come from the heap and stay
     * in RSS when freed: the loaded model's and the split's measuring run
     * left 9 MiB there on the medium GPT's pipelined training. Fixed at
     * glibc's starting value. */
    if (!getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    /* glibc gives the top of a heap back to the kernel once 128 KiB of it
     * is free. libzmq's I/O thread allocates each received frame over 8 KiB
     * (a batch of small tensors: 48 KiB) and the receiving rank frees it, so
     * that heap grew and shrank with every few frames and each frame landed
     * on fresh pages: 4 KiB tensors over tcp page-faulted 8x as often as
     * raw libzmq and ran at 0.9-1.1x its speed; kept up to 4 MiB, 1.4-1.5x
     * (pippin-bench-transport, same process for both). Peak RSS of the
     * medium GPT's 2-stage training unchanged (167 MiB). */
    if (!getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 4 * 1024 * 1024);
#endif
}
