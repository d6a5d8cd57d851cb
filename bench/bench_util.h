/* Helpers the C benchmarks share: clocks, a median, random GPT tokens.
 * Header-only (static inline): each bench is one program of its own. */
#ifndef PIPPIN_BENCH_UTIL_H
#define PIPPIN_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "pippin/pippin.h"

/* Milliseconds on clock id (CLOCK_MONOTONIC: wall; CLOCK_PROCESS_CPUTIME_ID:
 * this process's CPU time). */
static inline double bench_clock_ms(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v). */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

/* [batch, seq] int64 token ids in [0, vocab) from an LCG seed; NULL when
 * out of memory. */
static inline pp_tensor *bench_tokens(int64_t batch, int64_t seq, int64_t vocab, unsigned *seed) {
    pp_tensor *t;
    if (pp_tensor_empty(PP_I64, 2, (int64_t[]){batch, seq}, &t) != PP_OK) return NULL;
    int64_t *d = t->data;
    for (int64_t i = 0; i < batch * seq; i++) {
        *seed = *seed * 1103515245u + 12345u;
        d[i] = (int64_t)((*seed >> 8) % (unsigned)vocab);
    }
    return t;
}

#endif
