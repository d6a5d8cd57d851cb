/* Internal: growing a heap array one element at a time, the one place that
 * reallocs for graph, autodiff and export lists. */
#ifndef PIPPIN_LIB_GROW_H
#define PIPPIN_LIB_GROW_H

#include <stddef.h>

#include "pippin/status.h"

/* Makes room for element n (index n valid afterwards) in the array whose
 * pointer lies at arrp (the address of a T *, elements of elem bytes). With
 * cap, *cap is the capacity in elements and doubles (from 16) until it
 * exceeds n; with cap NULL the array holds exactly n elements and becomes
 * n + 1 long. On failure the array and *cap are unchanged and PP_ERR_NOMEM
 * comes back with the message set, so the caller still owns (and frees) what
 * it had. */
pp_status pp_grow(void *arrp, int *cap, int n, size_t elem);

/* The usual calls: PP_GROW(g->nodes, g->cap_nodes, g->n_nodes) before
 * g->nodes[g->n_nodes++] = ...; PP_GROW_EXACT(n->attrs, n->n_attr) for an
 * array kept exactly as long as its count. */
#define PP_GROW(arr, cap, n) pp_grow(&(arr), &(cap), (n), sizeof *(arr))
#define PP_GROW_EXACT(arr, n) pp_grow(&(arr), NULL, (n), sizeof *(arr))

/* Test hook (fault injection): on the calling thread, the pp_grow call that
 * must allocate after the next n that do fails as if out of memory (n = 0:
 * the very next one); that happens once, then growing works again. n < 0
 * turns it off. Returns how many allocations were still left of the previous
 * setting (-1: none planned), so a test can count the allocations of a call. */
int pp_grow_fail_after(int n);

#endif
