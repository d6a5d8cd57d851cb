/* Growing heap arrays (grow.h). */
#include "grow.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

/* Allocations left before the injected failure; -1: none planned. */
static _Thread_local int fail_countdown = -1;

int pp_grow_fail_after(int n) {
    int left = fail_countdown;
    fail_countdown = n < 0 ? -1 : n;
    return left;
}

pp_status pp_grow(void *arrp, int *cap, int n, size_t elem) {
    if (n < 0 || n == INT_MAX || elem == 0)
        return pp_error(PP_ERR_INTERNAL, "cannot grow an array to index %d", n);
    if (cap && n < *cap) return PP_OK;
    int ncap = n + 1;
    if (cap) {
        ncap = *cap > 0 ? *cap : 16;
        while (ncap <= n) ncap = ncap > INT_MAX / 2 ? n + 1 : ncap * 2;
    }
    int injected = fail_countdown >= 0 && fail_countdown-- == 0;
    void *old, *p = NULL;
    memcpy(&old, arrp, sizeof old);
    if (!injected && (size_t)ncap <= SIZE_MAX / elem) p = realloc(old, (size_t)ncap * elem);
    if (!p) return pp_error(PP_ERR_NOMEM, "out of memory growing an array to %d elements", ncap);
    memcpy(arrp, &p, sizeof p);
    if (cap) *cap = ncap;
    return PP_OK;
}
