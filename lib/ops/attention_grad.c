/* pippin::CausalAttentionGrad, the gradient of pippin::CausalAttention
 * (lib/ops/attention.c) when training uses the fused attention:
 *
 *   (dQ, dK, dV) = CausalAttentionGrad(dY, Q, K, V[, mask_ref])
 *
 * with the forward node's attributes (scale, scale_div and the layouts);
 * each gradient has its operand's shape and layout. Per batch and head, one
 * block of query rows at a time, the probabilities P are recomputed from Q
 * and K exactly as the forward made them (the same GEMM, pp_attn_scores,
 * and the same softmax, pp_attn_softmax_row), so the backward keeps Q, K and V, never the
 * T x T matrix of every head:
 *
 *   dV += P^T dY        dP = dY V^T        dS = P (dP - rowsum(dP P))
 *   dQ  = dS K * c      dK += dS^T Q * c   (c: the scale, or 1 / scale)
 *
 * A head is one piece of the pool and its blocks are summed in order, so
 * the result is the same bits at any thread count. Against the unfused
 * graph's gradients it differs by float rounding only. No weights: the
 * whole rule is input gradient (region I of the I/W split). */
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "attention_internal.h"
#include "gemm.h"
#include "thread_pool.h"

#include "status_internal.h"

typedef struct {
    pp_attn_view q, k, v, dy;
    float *dq, *dk, *dv; /* NULL: not wanted */
    int64_t heads, tq, tk, d, dvw, mask_a, mask_b, block;
    int64_t dq_sb, dq_sh, dk_sb, dk_sh, dv_sb, dv_sh; /* the outputs' strides: their operands' */
    float scale, c;
    int scale_div, k_dt;
    atomic_int failed;
} grad_job;

static int64_t seen(const grad_job *j, int64_t i) { return pp_attn_keys_seen(j->mask_a, j->mask_b, j->tk, i); }

/* dS = P (dP - rowsum(dP P)) * c over the n keys row i sees (P is 0 past
 * them), in place of dP. */
PP_VEC_CLONES static void score_grad_row(const float *restrict p, float *restrict dp, int64_t n, int64_t len,
                                         float c) {
    double dot = 0;
    for (int64_t i = 0; i < n; i++) dot += (double)dp[i] * p[i];
    float t = (float)dot;
    PP_VFOR(i, n, dp[i] = p[i] * (dp[i] - t) * c;);
    if (len > n) memset(dp + n, 0, sizeof(float) * (size_t)(len - n));
}

static void one_head(grad_job *j, int64_t bh, float *p, float *dp, float *kp) {
    const float *q = pp_attn_head(&j->q, bh), *k = pp_attn_head(&j->k, bh), *v = pp_attn_head(&j->v, bh);
    const float *dy = pp_attn_head(&j->dy, bh);
    int64_t b = bh / j->heads, h = bh % j->heads;
    float *dq = j->dq ? j->dq + b * j->dq_sb + h * j->dq_sh : NULL;
    float *dk = j->dk ? j->dk + b * j->dk_sb + h * j->dk_sh : NULL;
    float *dv = j->dv ? j->dv + b * j->dv_sb + h * j->dv_sh : NULL;
    int k_rows = !j->k_dt; /* K stored as [T, D] rows (else K^T, [D, T]) */
    int64_t ldk = k_rows ? j->k.st : j->k.sd;
    const float *kpk = pp_attn_pack_k(k, j->k_dt, ldk, j->tk, j->d, kp); /* as the forward: NULL, the BLAS */
    for (int64_t r0 = 0; r0 < j->tq; r0 += j->block) {
        int64_t rows = j->tq - r0 < j->block ? j->tq - r0 : j->block, nk = 0;
        for (int64_t i = r0; i < r0 + rows; i++) nk = seen(j, i) > nk ? seen(j, i) : nk;
        const float *qb = q + r0 * j->q.st, *dyb = dy + r0 * j->dy.st;
        /* P, as the forward made it */
        pp_attn_scores(qb, j->q.st, kpk, k, j->k_dt, ldk, rows, nk, j->d, p);
        for (int64_t i = 0; i < rows; i++) pp_attn_softmax_row(p + i * nk, seen(j, r0 + i), nk, j->scale, j->scale_div);
        /* dV[:nk] += P^T dY */
        if (dv && j->dvw > 0)
            pp_gemm_f32(1, 0, (int)nk, (int)j->dvw, (int)rows, 1.0f, p, (int)nk, dyb, (int)j->dy.st, 1.0f, dv,
                        (int)j->v.st);
        if (!dq && !dk) continue;
        /* dP = dY V^T, then dS in its place */
        if (j->dvw > 0)
            pp_gemm_f32(0, 1, (int)rows, (int)nk, (int)j->dvw, 1.0f, dyb, (int)j->dy.st, v, (int)j->v.st, 0.0f, dp,
                        (int)nk);
        else
            memset(dp, 0, sizeof(float) * (size_t)(rows * nk));
        for (int64_t i = 0; i < rows; i++) score_grad_row(p + i * nk, dp + i * nk, seen(j, r0 + i), nk, j->c);
        if (j->d <= 0) continue;
        /* dQ[block] = dS K */
        if (dq)
            pp_gemm_f32(0, !k_rows, (int)rows, (int)j->d, (int)nk, 1.0f, dp, (int)nk, k, (int)ldk, 0.0f,
                        dq + r0 * j->q.st, (int)j->q.st);
        /* dK[:nk] += dS^T Q[block], or dK^T[:, :nk] += Q[block]^T dS */
        if (dk && k_rows)
            pp_gemm_f32(1, 0, (int)nk, (int)j->d, (int)rows, 1.0f, dp, (int)nk, qb, (int)j->q.st, 1.0f, dk, (int)ldk);
        else if (dk)
            pp_gemm_f32(1, 0, (int)j->d, (int)nk, (int)rows, 1.0f, qb, (int)j->q.st, dp, (int)nk, 1.0f, dk, (int)ldk);
    }
}

static void heads_piece(void *arg, int64_t lo, int64_t hi) {
    grad_job *j = arg;
    int64_t n = 2 * j->block * j->tk;
    float *p = malloc(sizeof(float) * (size_t)(n + pp_attn_kpack_floats(j->tk, j->d)));
    if (!p) {
        atomic_store(&j->failed, 1);
        return;
    }
    for (int64_t bh = lo; bh < hi; bh++) one_head(j, bh, p, p + j->block * j->tk, p + n);
    free(p);
}

/* A gradient shaped as its operand, zeroed (the blocks add into it). */
static pp_status grad_like(const pp_tensor *t, pp_tensor **out) {
    PP_TRY(pp_tensor_empty(PP_F32, t->ndim, t->shape, out));
    if ((*out)->nbytes) memset((*out)->data, 0, (*out)->nbytes);
    return PP_OK;
}

static pp_status attention_grad_run(pp_kernel_ctx *ctx) {
    const pp_node *n = ctx->node;
    const pp_tensor *dY = ctx->in[0], *Q = ctx->in[1], *K = ctx->in[2], *V = ctx->in[3];
    const pp_tensor *M = ctx->n_in > 4 ? ctx->in[4] : NULL;
    if (dY->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "float32 only, got dY %s", pp_dtype_name(dY->dtype));
    pp_attn_operands op;
    PP_TRY(pp_attn_operands_of(ctx, Q, K, V, M, &op));
    grad_job *j = calloc(1, sizeof *j);
    if (!j) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory");
    j->q = op.q, j->k = op.k, j->v = op.v, j->mask_a = op.mask_a, j->mask_b = op.mask_b;
    int kl = op.kl, ol = op.ol;
    pp_status st = pp_attn_view_of(ctx, "dY", dY, ol, &j->dy);
    char sq[128], sy[128];
    if (st == PP_OK && (j->dy.batch * j->dy.heads != j->q.batch * j->q.heads || j->dy.rows != j->q.rows ||
                        j->dy.cols != j->v.cols))
        st = pp_kernel_error(ctx, PP_ERR_SHAPE, "dY %s is not the output of this attention's Q %s",
                             pp_shape_str(dY->ndim, dY->shape, sy, sizeof sy), pp_shape_str(Q->ndim, Q->shape, sq, sizeof sq));
    /* dY read with Y's strides: the same heads in the same order as Q's */
    if (st == PP_OK) {
        j->dy.heads = j->q.heads, j->dy.batch = j->q.batch;
        if (ol == L_BTHD) j->dy.sh = j->v.cols, j->dy.st = j->q.heads * j->v.cols, j->dy.sb = j->q.rows * j->dy.st;
        else j->dy.st = j->v.cols, j->dy.sh = j->q.rows * j->v.cols, j->dy.sb = j->q.heads * j->dy.sh;
        if (j->dy.st > INT_MAX) st = pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "attention dims exceed BLAS int range");
    }
    pp_tensor *dq = NULL, *dk = NULL, *dv = NULL;
    if (st == PP_OK && n->out[0] >= 0) st = grad_like(Q, &dq);
    if (st == PP_OK && n->n_out > 1 && n->out[1] >= 0) st = grad_like(K, &dk);
    if (st == PP_OK && n->n_out > 2 && n->out[2] >= 0) st = grad_like(V, &dv);
    if (st != PP_OK) {
        pp_tensor_free(dq);
        pp_tensor_free(dk);
        pp_tensor_free(dv);
        free(j);
        return st;
    }
    j->dq = dq ? dq->data : NULL, j->dk = dk ? dk->data : NULL, j->dv = dv ? dv->data : NULL;
    j->dq_sb = j->q.sb, j->dq_sh = j->q.sh, j->dk_sb = j->k.sb, j->dk_sh = j->k.sh, j->dv_sb = j->v.sb,
    j->dv_sh = j->v.sh;
    j->heads = j->q.heads, j->tq = j->q.rows, j->tk = j->k.rows, j->d = j->q.cols, j->dvw = j->v.cols;
    j->k_dt = kl == L_BHDT;
    j->scale = pp_node_attr_float(n, "scale", 1.0f);
    j->scale_div = pp_node_attr_int(n, "scale_div", 0) != 0;
    j->c = j->scale_div ? 1.0f / j->scale : j->scale;
    j->block = pp_attn_block_rows(j->tk, j->d > j->dvw ? j->d : j->dvw);
    /* the backward: about twice the forward's products per head */
    if (j->tq > 0 && j->tk > 0)
        pp_parallel_for(j->q.batch * j->q.heads, pp_grain_macs(2 * j->tq * j->tk * (j->d + j->dvw)), heads_piece, j);
    int failed = atomic_load(&j->failed);
    free(j);
    if (failed) {
        pp_tensor_free(dq);
        pp_tensor_free(dk);
        pp_tensor_free(dv);
        return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory for attention scores");
    }
    ctx->out[0] = dq;
    if (ctx->n_out > 1) ctx->out[1] = dk;
    if (ctx->n_out > 2) ctx->out[2] = dv;
    return PP_OK;
}

const pp_op pp_ops_attention_grad[] = {
    {"CausalAttentionGrad", "pippin", 4, 5, 1, 3, pp_attn_check, attention_grad_run},
    {NULL},
};
