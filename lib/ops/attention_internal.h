/* Internal: what pippin::CausalAttention (lib/ops/attention.c) and its
 * gradient (lib/ops/attention_grad.c) share: the operands' layouts, the
 * views that read them in place, the causal mask's dims, the row blocks
 * and the masked softmax of one row, so the backward recomputes exactly
 * the probabilities the forward used. */
#ifndef PIPPIN_OPS_ATTENTION_INTERNAL_H
#define PIPPIN_OPS_ATTENTION_INTERNAL_H

#include "op.h"
#include "vec.h"

enum { L_BHTD, L_BTHD, L_BHDT };

/* Node attribute `name` as a layout (default def); bhdt only when
 * allow_dt; -1 when it is none of them. */
int pp_attn_layout_of(const pp_node *n, const char *name, const char *def, int allow_dt);

/* The load-time check of both ops' layout attributes. */
pp_status pp_attn_check(const pp_graph *g, const pp_node *n);

/* One operand as (batch-head) matrices: the head of batch-head index bh
 * starts at base + (bh / heads) * sb + (bh % heads) * sh; inside it, row t
 * (time) and column d step by st and sd. */
typedef struct {
    const float *base;
    int64_t batch, heads, rows, cols; /* rows: time; cols: features */
    int64_t sb, sh, st, sd;
} pp_attn_view;

/* Describes t in layout l. bhtd and bhdt: the dim before the last two is
 * the heads, the ones before it the batch (1 and 1 for a matrix). */
pp_status pp_attn_view_of(const pp_kernel_ctx *ctx, const char *what, const pp_tensor *t, int l, pp_attn_view *v);

static inline const float *pp_attn_head(const pp_attn_view *v, int64_t bh) {
    return v->base + (bh / v->heads) * v->sb + (bh % v->heads) * v->sh;
}

/* a and b of mask_ref (its last two dims; tq and tk without one), checked
 * as Where would broadcast them; *rank: its rank (0 without one). */
pp_status pp_attn_mask_dims(const pp_kernel_ctx *ctx, const pp_tensor *m, int64_t tq, int64_t tk, int64_t *a,
                            int64_t *b, int *rank);

/* Q, K, V (and the optional mask_ref) of one attention node, read and
 * checked as both kernels need them: float32, the node's layouts, views
 * of one attention (same batch and heads, Q's width K's, K's keys V's),
 * the mask's dims, and dims the BLAS's int can hold. */
typedef struct {
    pp_attn_view q, k, v;
    int ql, kl, vl, ol;
    int64_t mask_a, mask_b;
    int mask_rank;
} pp_attn_operands;

pp_status pp_attn_operands_of(const pp_kernel_ctx *ctx, const pp_tensor *Q, const pp_tensor *K, const pp_tensor *V,
                              const pp_tensor *M, pp_attn_operands *o);

/* Y's shape (*nd dims) and strides (ystride: batch, head, time; features
 * step by 1) for Q and the operands o: Q's leading dims or [B, T, H, Dv]
 * by out_layout, after the 1s a wider mask adds. The CPU kernel's and
 * the CUDA backend's. */
pp_status pp_attn_out_shape(const pp_kernel_ctx *ctx, const pp_tensor *Q, const pp_attn_operands *o,
                            int64_t *shape, int *nd, int64_t *ystride);

/* Keys query i sees under a mask of dims a x b over tk keys. */
static inline int64_t pp_attn_keys_seen(int64_t a, int64_t b, int64_t tk, int64_t i) {
    if (b == 1) return tk;
    int64_t ip = a == 1 ? 0 : i;
    return ip + 1 < tk ? ip + 1 : tk;
}

/* Query rows per block: each block's GEMMs stay at most GEMM_SERIAL_MNK
 * multiply-adds, the size below which OpenBLAS 0.3 runs a GEMM on the
 * calling thread (so its own threads are not woken). */
#define PP_ATTN_GEMM_SERIAL_MNK 262144 /* OpenBLAS: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD */
static inline int64_t pp_attn_block_rows(int64_t tk, int64_t width) {
    int64_t per_row = tk * width, block = per_row > 0 ? PP_ATTN_GEMM_SERIAL_MNK / per_row : 64;
    return block < 8 ? 8 : block > 64 ? 64 : block;
}

/* The scores of a block of queries, the same bits in the forward and the
 * backward: K of one head packed once (pp_attn_kpack_floats floats; k_dt:
 * K given as K^T [D, T], ldk its row stride), then S [rows, nk] = Q[block]
 * K[:nk]^T by the packed GEMM, Q's rows q_st apart. Where the packed GEMM
 * has no vector kernel (pp_gemm_packed_fast 0) pp_attn_pack_k returns NULL
 * and the scores come from the BLAS on K as given. */
int64_t pp_attn_kpack_floats(int64_t tk, int64_t d);
const float *pp_attn_pack_k(const float *k, int k_dt, int64_t ldk, int64_t tk, int64_t d, float *kp);
void pp_attn_scores(const float *qb, int64_t q_st, const float *kp, const float *k, int k_dt, int64_t ldk,
                    int64_t rows, int64_t nk, int64_t d, float *s);

/* The masked softmax of one row of scores in place: the first n of len
 * scaled (x * scale, or x / scale with scale_div) and normalised, the rest
 * 0. (A plain function: a target_clones one cannot be called across
 * files of a library built with hidden visibility.) */
void pp_attn_softmax_row(float *s, int64_t n, int64_t len, float scale, int scale_div);

#endif
