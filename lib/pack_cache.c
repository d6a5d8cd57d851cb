/* Training weights packed once per parameter version (pack_cache.h).
 *
 * Why: OpenBLAS packs op(B) on every sgemm call (and again in every row
 * panel of the pool's cut), with transB (torch's Linear weights) by its
 * slower path, so with M microbatches a step packed each weight M times
 * in the forward; at 8 microbatches OpenBLAS's packing was 6-11% of the
 * medium GPT's step. Here each parameter is copied at its first use after
 * the parameters last changed, into the layout pp_pack_choice picks for
 * the row count (panels for pp_gemm_packed_f32, or W^T for OpenBLAS), and
 * the copy is read until they change again.
 *
 * Entries are keyed by (value, layout) and validated on every use by the
 * epoch, the source pointer and the shape: a parameter whose tensor was
 * replaced, or whose data moved, is packed again even without a bump. The
 * memory is plain malloc (not the tensor pool, which the memory plan
 * records) and is reused across epochs. */
#include "pack_cache.h"

#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "pippin/device.h"

#include "status_internal.h"

typedef struct pack_entry {
    float *panels;      /* NULL until first packed */
    int64_t cap;        /* floats allocated */
    int64_t floats;     /* floats of the current copy */
    const float *src;   /* the weight's data when packed */
    int64_t rows, cols; /* its shape then */
    uint64_t epoch;     /* the cache's epoch then */
} pack_entry;

struct pp_pack_cache {
    int n_values;
    pack_entry *e; /* [n_values * PP_PACK_LAYOUTS] */
    uint64_t epoch; /* starts at 1: a zeroed entry is never current */
    int check;      /* PIPPIN_PACK_CHECK=1 */
    int64_t packed, reused;
};

pp_status pp_pack_cache_new(int n_values, pp_pack_cache **out) {
    *out = NULL;
    pp_pack_cache *c = calloc(1, sizeof *c);
    if (c) c->e = calloc((size_t)(n_values > 0 ? n_values : 1) * PP_PACK_LAYOUTS, sizeof *c->e);
    if (!c || !c->e) {
        free(c);
        return pp_error(PP_ERR_NOMEM, "out of memory for the packed-weight cache");
    }
    c->n_values = n_values;
    c->epoch = 1;
    const char *env = getenv("PIPPIN_PACK_CHECK");
    c->check = env && strcmp(env, "1") == 0;
    *out = c;
    return PP_OK;
}

void pp_pack_cache_free(pp_pack_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n_values * PP_PACK_LAYOUTS; i++) free(c->e[i].panels);
    free(c->e);
    free(c);
}

void pp_pack_cache_invalidate(pp_pack_cache *c) {
    if (c) c->epoch++;
}

void pp_pack_cache_stats(const pp_pack_cache *c, int64_t *packed, int64_t *reused) {
    if (packed) *packed = c ? c->packed : 0;
    if (reused) *reused = c ? c->reused : 0;
}

/* Measured on the medium GPT's weights (bench/bench_gemm_packed.c
 * --train, one thread, thread CPU time; docs/architecture.md): against
 * OpenBLAS with transB as training called it, the packed kernel is
 * 1.1-1.4x at 128 rows and 1.0-1.4x at 256, but OpenBLAS on W^T (no
 * transB) is as fast there and ahead from 512 rows (1.1-1.2x, where the
 * packed kernel's 1.0-1.15x lacks cache blocking); at 1024 rows (a whole
 * batch) W^T gains about 5%, less than its copy's memory is worth. Those
 * limits were measured against the AVX2 kernel; with AVX-512 panels win
 * at any row count (the medium GPT's train step at 8 x 128 rows: 0.93x
 * the time of per-call packing). */
#define PANELS_MAX_ROWS 256
#define TRANSPOSED_MAX_ROWS 512

int pp_pack_choice(int64_t M, int64_t K, int64_t N, int trans_b) {
    if (M < 1 || K < 16 || N < 16) return -1;
    /* panels only where the packed GEMM has a vector kernel (else the BLAS) */
    /* with AVX-512 every GEMM runs the packed kernel (pp_gemm_packed_any),
     * which would pack W^T per call: the held panels at any row count */
    if ((M <= PANELS_MAX_ROWS && pp_gemm_packed_fast()) || pp_gemm_packed_wide())
        return trans_b ? PP_PACK_PANELS_T : PP_PACK_PANELS;
    return trans_b && M <= TRANSPOSED_MAX_ROWS ? PP_PACK_TRANSPOSED : -1;
}

/* op(B)'s K and N for a weight of rows x cols in a panel layout. */
static void dims_of(int layout, int64_t rows, int64_t cols, int *K, int *N) {
    *K = (int)(layout == PP_PACK_PANELS_T ? cols : rows);
    *N = (int)(layout == PP_PACK_PANELS_T ? rows : cols);
}

/* out [cols, rows] = w^T, in tiles that stay in L1 both ways. */
static void transpose_into(const pp_tensor *w, float *out) {
    int64_t R = w->shape[0], C = w->shape[1];
    const float *in = w->data;
    for (int64_t r0 = 0; r0 < R; r0 += 32)
        for (int64_t c0 = 0; c0 < C; c0 += 32)
            for (int64_t c = c0; c < c0 + 32 && c < C; c++)
                for (int64_t r = r0; r < r0 + 32 && r < R; r++) out[c * R + r] = in[r * C + c];
}

static int64_t floats_of(int layout, const pp_tensor *w) {
    if (layout == PP_PACK_TRANSPOSED) return w->shape[0] * w->shape[1];
    int K, N;
    dims_of(layout, w->shape[0], w->shape[1], &K, &N);
    return pp_packed_b_floats(K, N);
}

static void pack_into(int layout, const pp_tensor *w, float *out) {
    if (layout == PP_PACK_TRANSPOSED) {
        transpose_into(w, out);
        return;
    }
    int K, N;
    dims_of(layout, w->shape[0], w->shape[1], &K, &N);
    pp_pack_b_f32(layout == PP_PACK_PANELS_T, K, N, w->data, (int)w->shape[1], out);
}

/* Under PIPPIN_PACK_CHECK: the cached panels must equal a fresh pack. */
static pp_status check_entry(const pp_kernel_ctx *ctx, int k, int layout, const pack_entry *e) {
    float *fresh = malloc(sizeof(float) * (size_t)e->floats);
    if (!fresh) return PP_OK; /* the check is a debugging aid: no memory, no check */
    pack_into(layout, ctx->in[k], fresh);
    int same = memcmp(fresh, e->panels, sizeof(float) * (size_t)e->floats) == 0;
    free(fresh);
    if (same) return PP_OK;
    return pp_kernel_error(ctx, PP_ERR_STATE,
                           "parameter '%s' changed after it was packed without the packed copy being dropped "
                           "(pp_exec_params_changed)",
                           ctx->graph->values[ctx->node->in[k]].name);
}

pp_status pp_kernel_packed_weight(pp_kernel_ctx *ctx, int k, int layout, const float **panels) {
    *panels = NULL;
    pp_pack_cache *c = ctx->packs;
    if (!c || k >= ctx->n_in || layout < 0 || layout >= PP_PACK_LAYOUTS) return PP_OK;
    int v = ctx->node->in[k];
    const pp_tensor *w = ctx->in[k];
    if (v < 0 || v >= c->n_values || !w || ctx->graph->values[v].kind != PP_VALUE_PARAM) return PP_OK;
    if (w->dtype != PP_F32 || w->ndim != 2 || pp_tensor_device(w) || w->shape[0] > INT32_MAX ||
        w->shape[1] > INT32_MAX)
        return PP_OK;
    pack_entry *e = &c->e[(size_t)v * PP_PACK_LAYOUTS + (size_t)layout];
    if (e->panels && e->epoch == c->epoch && e->src == w->data && e->rows == w->shape[0] &&
        e->cols == w->shape[1]) {
        if (c->check) PP_TRY(check_entry(ctx, k, layout, e));
        c->reused++;
        *panels = e->panels;
        return PP_OK;
    }
    int64_t floats = floats_of(layout, w);
    if (floats > e->cap) {
        free(e->panels);
        e->panels = aligned_alloc(64, (sizeof(float) * (size_t)floats + 63) / 64 * 64);
        e->cap = e->panels ? floats : 0;
        e->epoch = 0; /* not current, whatever happens next */
        if (!e->panels) return PP_OK; /* an optimisation only: OpenBLAS reads W as before */
    }
    e->floats = floats;
    pack_into(layout, w, e->panels);
    e->src = w->data;
    e->rows = w->shape[0];
    e->cols = w->shape[1];
    e->epoch = c->epoch;
    c->packed++;
    *panels = e->panels;
    return PP_OK;
}
