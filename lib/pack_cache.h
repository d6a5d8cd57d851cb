/* Internal: weights packed once per parameter version for training GEMMs
 * (lib/pack_cache.c). Not installed.
 *
 * An executor with packing on (pp_exec_set_pack_weights) gives its kernels
 * a cache: a kernel asks for input k (a 2-D float32 parameter on the host)
 * in a layout, and gets a copy made at the first ask since the parameters
 * last changed, so every microbatch of a step reads one prepared copy
 * instead of OpenBLAS packing the weight on each call.
 *
 * The invariant: an entry is used only while the cache's epoch equals the
 * one it was packed at, and its source pointer and shape still match.
 * Whoever may have written a parameter bumps the epoch
 * (pp_pack_cache_invalidate, via pp_exec_params_changed) before the next
 * run; stages and the trainer do it at every place that hands out or
 * changes their parameters (docs/architecture.md, "Training weights are
 * packed once per step"). PIPPIN_PACK_CHECK=1 re-packs on every hit and
 * fails the node when the cached copy differs: a missed bump is caught. */
#ifndef PIPPIN_PACK_CACHE_H
#define PIPPIN_PACK_CACHE_H

#include <stdint.h>

#include "op.h"

/* What a kernel asks for. */
enum {
    PP_PACK_PANELS_T = 0,   /* W [N, K] as panels of op(B) = W^T (a Linear's forward, transB) */
    PP_PACK_PANELS = 1,     /* W [K, N] as panels of op(B) = W */
    PP_PACK_TRANSPOSED = 2, /* W [N, K] as a plain W^T [K, N], for OpenBLAS without transB */
    PP_PACK_LAYOUTS = 3
};

typedef struct pp_pack_cache pp_pack_cache;

pp_status pp_pack_cache_new(int n_values, pp_pack_cache **out);
void pp_pack_cache_free(pp_pack_cache *c);
/* The parameters may have changed: every entry is stale from now on (its
 * memory is kept for the next pack). */
void pp_pack_cache_invalidate(pp_pack_cache *c);
/* Packs made and packs reused since creation. */
void pp_pack_cache_stats(const pp_pack_cache *c, int64_t *packed, int64_t *reused);

/* Which copy of a K x N weight (trans_b: stored [N, K]) a product of M
 * rows should read, as measured on the training shapes
 * (bench/bench_gemm_packed.c --train): PP_PACK_PANELS(_T) for pippin's
 * packed GEMM, PP_PACK_TRANSPOSED for OpenBLAS on W^T (its cheaper
 * packing path), or -1: OpenBLAS on W as stored, no copy made. */
int pp_pack_choice(int64_t M, int64_t K, int64_t N, int trans_b);

/* Input k's panels in layout, current for this epoch; *panels NULL (and
 * PP_OK) when the executor has no cache or input k is not a 2-D float32
 * host parameter: the kernel then reads it as usual. Errors only for a
 * stale entry under PIPPIN_PACK_CHECK=1 (naming the parameter). Out of
 * memory is not an error: the kernel goes without. */
pp_status pp_kernel_packed_weight(pp_kernel_ctx *ctx, int k, int layout, const float **panels);

#endif
