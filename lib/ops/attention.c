/* pippin::CausalAttention, what the optimizer makes of causal self-attention
 * (lib/opt_attention.c):
 *   Y = softmax(mask(scale(Q K^T))) V
 * per batch and head, keys j > i masked for query i, one row block at a
 * time: each block's scores are at most [rows, keys], never the T x T
 * matrix of all heads, and a block reads only the keys its rows see.
 *
 * Inputs: Q, K, V, and optionally mask_ref, read for its shape alone: it is
 * the causal mask as the graph sliced it ([..., a, b], every leading dim 1),
 * which the kernel applies as Where or Add would broadcast it: a query row i
 * sees key j when j <= i' (i' = i, or 0 when a is 1), every key when b is 1.
 * Without mask_ref, a = Tq and b = Tk.
 * Attributes:
 *   scale, scale_div  the scores are x * scale, or x / scale with
 *                     scale_div = 1 (what the graph's Mul or Div did)
 *   q_layout, v_layout, out_layout  "bhtd" ([..., T, D], leading dims the
 *                     batch and heads, the default) or "bthd" ([B, T, H, D],
 *                     what Transpose(perm 0,2,1,3) of it gave the graph)
 *   k_layout          "bhdt" (K^T [..., D, T], the default: MatMul's own
 *                     operand), "bhtd" or "bthd"
 * Q is read (and Y written) in place with its strides, K and V packed once
 * per head: the transposes around the pattern are gone.
 *
 * The GEMMs are the packed kernel's (lib/ops/gemm.h: K and V of a head
 * packed once, read by each block of queries), called from inside
 * pp_parallel_for pieces over (batch, head); a pp_parallel_for made inside
 * a piece runs inline (lib/thread_pool.h), so a GEMM parallel over the pool
 * stays on its piece's thread. Row blocks are pp_attn_block_rows (sized
 * for OpenBLAS, which the backward's other GEMMs still call).
 *
 * Within float rounding of the unfused graph: the scores are the same
 * products in another order and the same scaling; the softmax sums fewer
 * terms (the masked ones are exact zeros there) and the second GEMM skips
 * zero terms. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention_internal.h"
#include "gemm.h"
#include "op.h"
#include "thread_pool.h"
#include "vec.h"

#include "status_internal.h"


int pp_attn_layout_of(const pp_node *n, const char *name, const char *def, int allow_dt) {
    const char *s = pp_node_attr_string(n, name, def);
    if (strcmp(s, "bhtd") == 0) return L_BHTD;
    if (strcmp(s, "bthd") == 0) return L_BTHD;
    if (allow_dt && strcmp(s, "bhdt") == 0) return L_BHDT;
    return -1;
}

pp_status pp_attn_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    if (pp_attn_layout_of(n, "q_layout", "bhtd", 0) < 0 || pp_attn_layout_of(n, "v_layout", "bhtd", 0) < 0 ||
        pp_attn_layout_of(n, "out_layout", "bhtd", 0) < 0)
        return pp_node_error(n, PP_ERR_INVALID, "q_layout, v_layout and out_layout must be \"bhtd\" or \"bthd\"");
    if (pp_attn_layout_of(n, "k_layout", "bhdt", 1) < 0)
        return pp_node_error(n, PP_ERR_INVALID, "k_layout must be \"bhdt\", \"bhtd\" or \"bthd\"");
    return PP_OK;
}

pp_status pp_attn_view_of(const pp_kernel_ctx *ctx, const char *what, const pp_tensor *t, int l, pp_attn_view *v) {
    char s[128];
    memset(v, 0, sizeof *v);
    v->base = t->data;
    if (l == L_BTHD) {
        if (t->ndim != 4)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must be [B, T, H, D], got %s", what,
                                   pp_shape_str(t->ndim, t->shape, s, sizeof s));
        v->batch = t->shape[0], v->rows = t->shape[1], v->heads = t->shape[2], v->cols = t->shape[3];
        v->sd = 1, v->sh = v->cols, v->st = v->heads * v->cols, v->sb = v->rows * v->st;
        return PP_OK;
    }
    if (t->ndim < 2)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s must have at least 2 dims, got %s", what,
                               pp_shape_str(t->ndim, t->shape, s, sizeof s));
    int64_t r = t->shape[t->ndim - 2], c = t->shape[t->ndim - 1];
    v->heads = t->ndim > 2 ? t->shape[t->ndim - 3] : 1;
    v->batch = t->ndim > 3 ? pp_shape_numel(t->ndim - 3, t->shape) : 1;
    if (l == L_BHDT) v->rows = c, v->cols = r, v->st = 1, v->sd = c; /* K^T: [D, T] */
    else v->rows = r, v->cols = c, v->st = c, v->sd = 1;
    v->sh = r * c, v->sb = v->heads * r * c;
    return PP_OK;
}

typedef struct {
    pp_attn_view q, k, v;
    float *y;
    int64_t y_sb, y_sh, y_st; /* Y's strides, as a view's */
    int64_t heads, tq, tk, d, dv, mask_a, mask_b, block;
    float scale;
    int scale_div, k_dt; /* k_dt: K given as K^T ([D, T]) */
    atomic_int failed;
} attn_job;

static int64_t keys_seen(const attn_job *j, int64_t i) { return pp_attn_keys_seen(j->mask_a, j->mask_b, j->tk, i); }

/* The masked softmax of one row (pp_attn_softmax_row). Rows are short
 * (a causal row sees i + 1 keys), so the loops run in whole vector
 * blocks: the max in lanes (a NaN still makes the row NaN, through its
 * exp), and the last partial block padded with -inf (exp 0) when the row
 * has room for it, instead of a scalar tail of exps. */
PP_VEC_CLONES static void softmax_row(float *restrict s, int64_t n, int64_t len, float scale, int scale_div) {
    if (scale_div) PP_VFOR(i, n, s[i] = s[i] / scale;);
    else PP_VFOR(i, n, s[i] = s[i] * scale;);
    int64_t whole = n / PP_VEC_BLOCK * PP_VEC_BLOCK;
    if (whole < n && whole + PP_VEC_BLOCK <= len) { /* pad the last block */
        for (int64_t i = n; i < whole + PP_VEC_BLOCK; i++) s[i] = -INFINITY;
        whole += PP_VEC_BLOCK;
    }
    int64_t end = whole > n ? whole : n; /* the scalar tail stops at n */
    float mx[PP_VEC_BLOCK];
    for (int l = 0; l < PP_VEC_BLOCK; l++) mx[l] = -INFINITY;
    int64_t i = 0;
    for (; i + PP_VEC_BLOCK <= whole; i += PP_VEC_BLOCK)
        for (int l = 0; l < PP_VEC_BLOCK; l++) mx[l] = s[i + l] > mx[l] ? s[i + l] : mx[l];
    float m = -INFINITY;
    for (int l = 0; l < PP_VEC_BLOCK; l++) m = mx[l] > m ? mx[l] : m;
    for (; i < end; i++) m = s[i] > m ? s[i] : m;
    float p[PP_VEC_BLOCK] = {0};
    for (i = 0; i + PP_VEC_BLOCK <= whole; i += PP_VEC_BLOCK)
        for (int l = 0; l < PP_VEC_BLOCK; l++) {
            float e = pp_vexpf(s[i + l] - m);
            s[i + l] = e;
            p[l] += e;
        }
    double total = 0;
    for (int l = 0; l < PP_VEC_BLOCK; l++) total += p[l];
    for (; i < end; i++) {
        s[i] = pp_vexpf(s[i] - m);
        total += s[i];
    }
    float k = (float)(1.0 / total);
    PP_VFOR(i2, n, s[i2] *= k;);
    if (len > n) memset(s + n, 0, sizeof(float) * (size_t)(len - n));
}

void pp_attn_softmax_row(float *s, int64_t n, int64_t len, float scale, int scale_div) {
    softmax_row(s, n, len, scale, scale_div);
}

int64_t pp_attn_kpack_floats(int64_t tk, int64_t d) { return (tk + PP_PACK_NR - 1) / PP_PACK_NR * PP_PACK_NR * d; }

const float *pp_attn_pack_k(const float *k, int k_dt, int64_t ldk, int64_t tk, int64_t d, float *kp) {
    if (!pp_gemm_packed_fast()) return NULL;
    pp_pack_b_f32(!k_dt, (int)d, (int)tk, k, (int)ldk, kp);
    return kp;
}

void pp_attn_scores(const float *qb, int64_t q_st, const float *kp, const float *k, int k_dt, int64_t ldk,
                    int64_t rows, int64_t nk, int64_t d, float *s) {
    if (d <= 0) memset(s, 0, sizeof(float) * (size_t)(rows * nk));
    else if (kp) pp_gemm_packed_f32((int)rows, (int)nk, (int)d, qb, (int)q_st, kp, NULL, s, (int)nk);
    else pp_gemm_f32(0, !k_dt, (int)rows, (int)nk, (int)d, 1.0f, qb, (int)q_st, k, (int)ldk, 0.0f, s, (int)nk);
}

/* One head: K and V packed once, then row blocks of scores, softmax,
 * times V, by the packed GEMM (lib/ops/gemm_packed.c). Why not the BLAS:
 * OpenBLAS packs both operands again for every block, and on a CPU with
 * AVX-512 it may run AVX2 kernels (0.3.21 on Zen 5); the medium GPT's
 * forward took 0.955x the time with this (paired rounds). */
static void one_head(attn_job *j, int64_t bh, float *scores, float *kp, float *vp) {
    const float *q = pp_attn_head(&j->q, bh), *k = pp_attn_head(&j->k, bh), *v = pp_attn_head(&j->v, bh);
    float *y = j->y + (bh / j->heads) * j->y_sb + (bh % j->heads) * j->y_sh;
    int64_t ldk = j->k_dt ? j->k.sd : j->k.st;
    const float *kpk = pp_attn_pack_k(k, j->k_dt, ldk, j->tk, j->d, kp); /* NULL: the BLAS instead */
    if (kpk && j->dv > 0) pp_pack_b_f32(0, (int)j->tk, (int)j->dv, v, (int)j->v.st, vp); /* [ceil(dv/16), tk, 16] */
    for (int64_t r0 = 0; r0 < j->tq; r0 += j->block) {
        int64_t rows = j->tq - r0 < j->block ? j->tq - r0 : j->block;
        int64_t nk = 0; /* keys any row of the block sees */
        for (int64_t i = r0; i < r0 + rows; i++) nk = keys_seen(j, i) > nk ? keys_seen(j, i) : nk;
        pp_attn_scores(q + r0 * j->q.st, j->q.st, kpk, k, j->k_dt, ldk, rows, nk, j->d, scores);
        for (int64_t i = 0; i < rows; i++)
            softmax_row(scores + i * nk, keys_seen(j, r0 + i), nk, j->scale, j->scale_div);
        if (j->dv > 0 && kpk)
            pp_gemm_packed_strided((int)rows, (int)j->dv, (int)nk, scores, (int)nk, vp, j->tk * PP_PACK_NR,
                                   y + r0 * j->y_st, (int)j->y_st);
        else if (j->dv > 0)
            pp_gemm_f32(0, 0, (int)rows, (int)j->dv, (int)nk, 1.0f, scores, (int)nk, v, (int)j->v.st, 0.0f,
                        y + r0 * j->y_st, (int)j->y_st);
    }
}

static void heads_piece(void *arg, int64_t lo, int64_t hi) {
    attn_job *j = arg;
    int64_t nv = (j->dv + PP_PACK_NR - 1) / PP_PACK_NR * PP_PACK_NR * j->tk, nkp = pp_attn_kpack_floats(j->tk, j->d);
    float *scores = malloc(sizeof(float) * (size_t)(j->block * j->tk + nkp + nv));
    if (!scores) {
        atomic_store(&j->failed, 1);
        return;
    }
    float *kp = scores + j->block * j->tk, *vp = kp + nkp;
    for (int64_t bh = lo; bh < hi; bh++) one_head(j, bh, scores, kp, vp);
    free(scores);
}

pp_status pp_attn_mask_dims(const pp_kernel_ctx *ctx, const pp_tensor *m, int64_t tq, int64_t tk, int64_t *a,
                            int64_t *b, int *rank) {
    char s[128];
    if (!m) {
        *a = tq, *b = tk;
        *rank = 0;
        return PP_OK;
    }
    *rank = m->ndim;
    int ok = m->ndim >= 2;
    for (int d = 0; ok && d < m->ndim - 2; d++) ok = m->shape[d] == 1;
    if (ok) {
        *a = m->shape[m->ndim - 2], *b = m->shape[m->ndim - 1];
        ok = (*a == 1 || *a == tq) && (*b == 1 || *b == tk);
    }
    if (!ok)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "causal mask %s does not broadcast to %" PRId64 " queries by %" PRId64
                               " keys", pp_shape_str(m->ndim, m->shape, s, sizeof s), tq, tk);
    return PP_OK;
}

pp_status pp_attn_operands_of(const pp_kernel_ctx *ctx, const pp_tensor *Q, const pp_tensor *K, const pp_tensor *V,
                              const pp_tensor *M, pp_attn_operands *o) {
    const pp_node *n = ctx->node;
    if (Q->dtype != PP_F32 || K->dtype != PP_F32 || V->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "float32 only, got %s, %s and %s", pp_dtype_name(Q->dtype),
                               pp_dtype_name(K->dtype), pp_dtype_name(V->dtype));
    o->ql = pp_attn_layout_of(n, "q_layout", "bhtd", 0), o->kl = pp_attn_layout_of(n, "k_layout", "bhdt", 1);
    o->vl = pp_attn_layout_of(n, "v_layout", "bhtd", 0), o->ol = pp_attn_layout_of(n, "out_layout", "bhtd", 0);
    PP_TRY(pp_attn_view_of(ctx, "Q", Q, o->ql, &o->q));
    PP_TRY(pp_attn_view_of(ctx, "K", K, o->kl, &o->k));
    PP_TRY(pp_attn_view_of(ctx, "V", V, o->vl, &o->v));
    char sq[128], sk[128], sv[128];
    if (o->q.batch != o->k.batch || o->k.batch != o->v.batch || o->q.heads != o->k.heads ||
        o->k.heads != o->v.heads || o->q.cols != o->k.cols || o->k.rows != o->v.rows)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "Q %s, K %s and V %s (layouts %s, %s, %s) are not one attention's",
                               pp_shape_str(Q->ndim, Q->shape, sq, sizeof sq), pp_shape_str(K->ndim, K->shape, sk, sizeof sk),
                               pp_shape_str(V->ndim, V->shape, sv, sizeof sv), pp_node_attr_string(n, "q_layout", "bhtd"),
                               pp_node_attr_string(n, "k_layout", "bhdt"), pp_node_attr_string(n, "v_layout", "bhtd"));
    if (o->ol == L_BTHD && o->ql != L_BTHD && Q->ndim != 4)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "out_layout \"bthd\" needs a 4-D Q, got %s",
                               pp_shape_str(Q->ndim, Q->shape, sq, sizeof sq));
    PP_TRY(pp_attn_mask_dims(ctx, M, o->q.rows, o->k.rows, &o->mask_a, &o->mask_b, &o->mask_rank));
    if (o->q.rows > INT_MAX || o->k.rows > INT_MAX || o->q.cols > INT_MAX || o->v.cols > INT_MAX ||
        o->q.st > INT_MAX || o->k.st > INT_MAX || o->k.sd > INT_MAX || o->v.st > INT_MAX)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "attention dims exceed BLAS int range");
    return PP_OK;
}

pp_status pp_attn_out_shape(const pp_kernel_ctx *ctx, const pp_tensor *Q, const pp_attn_operands *o,
                            int64_t *oshape, int *nd, int64_t *ystride) {
    int64_t tq = o->q.rows, dv = o->v.cols, heads = o->q.heads;
    int ond;
    /* Y: Q's leading dims (or [B, T, H, Dv]), after the 1s a wider mask adds. */
    if (o->ol == L_BTHD) {
        int64_t s4[4] = {o->q.batch, tq, heads, dv};
        ond = 4;
        memcpy(oshape, s4, sizeof s4);
    } else {
        int qnd = o->ql == L_BTHD ? 4 : Q->ndim;
        ond = o->mask_rank > qnd ? o->mask_rank : qnd;
        if (ond > PP_MAX_DIMS)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "attention output has more than %d dims", PP_MAX_DIMS);
        int pad = ond - qnd;
        for (int d = 0; d < pad; d++) oshape[d] = 1;
        if (o->ql == L_BTHD) {
            int64_t s4[4] = {o->q.batch, heads, tq, dv};
            memcpy(oshape + pad, s4, sizeof s4);
        } else {
            for (int d = 0; d < Q->ndim - 1; d++) oshape[pad + d] = Q->shape[d];
            oshape[ond - 1] = dv;
        }
    }
    *nd = ond;
    if (o->ol == L_BTHD) ystride[1] = dv, ystride[2] = heads * dv, ystride[0] = tq * ystride[2];
    else ystride[2] = dv, ystride[1] = tq * dv, ystride[0] = heads * tq * dv;
    return PP_OK;
}

static pp_status attention_run(pp_kernel_ctx *ctx) {
    const pp_node *n = ctx->node;
    const pp_tensor *Q = ctx->in[0], *K = ctx->in[1], *V = ctx->in[2];
    const pp_tensor *M = ctx->n_in > 3 ? ctx->in[3] : NULL;
    pp_attn_operands op;
    PP_TRY(pp_attn_operands_of(ctx, Q, K, V, M, &op));
    attn_job *j = calloc(1, sizeof *j);
    if (!j) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory");
    j->q = op.q, j->k = op.k, j->v = op.v, j->mask_a = op.mask_a, j->mask_b = op.mask_b;
    int kl = op.kl;
    int64_t tq = j->q.rows, tk = j->k.rows, dv = j->v.cols, nbh = j->q.batch * j->q.heads;
    pp_status st;
    int64_t oshape[PP_MAX_DIMS], ystride[3];
    int ond;
    st = pp_attn_out_shape(ctx, Q, &op, oshape, &ond, ystride);
    if (st != PP_OK) {
        free(j);
        return st;
    }
    pp_tensor *y;
    st = pp_tensor_empty(PP_F32, ond, oshape, &y);
    if (st != PP_OK) {
        free(j);
        return st;
    }
    ctx->out[0] = y;
    j->y = y->data;
    j->heads = j->q.heads;
    j->y_sb = ystride[0], j->y_sh = ystride[1], j->y_st = ystride[2];
    j->tq = tq, j->tk = tk, j->d = j->q.cols, j->dv = dv, j->k_dt = kl == L_BHDT;
    j->scale = pp_node_attr_float(n, "scale", 1.0f);
    j->scale_div = pp_node_attr_int(n, "scale_div", 0) != 0;
    j->block = pp_attn_block_rows(tk, j->d > dv ? j->d : dv);
    if (y->nbytes && tk > 0) pp_parallel_for(nbh, pp_grain_macs(tq * tk * (j->d + dv)), heads_piece, j);
    else if (y->nbytes) memset(y->data, 0, y->nbytes); /* no keys: softmax of nothing times nothing */
    int failed = atomic_load(&j->failed);
    free(j);
    if (failed) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory for attention scores");
    return PP_OK;
}

const pp_op pp_ops_attention[] = {
    {"CausalAttention", "pippin", 3, 4, 1, 1, pp_attn_check, attention_run},
    {NULL},
};
