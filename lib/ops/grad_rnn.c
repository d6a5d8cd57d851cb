/* Backward through time of LSTM and GRU: pippin::LSTMGrad and
 * pippin::GRUGrad. Each takes the stash of its forward (the gate
 * activations and states of every step, from pippin::LSTMTrain / GRUTrain,
 * rnn.h) or, without one, reruns its direction's forward to make it; then
 * sweeps the steps backwards: per step the gate gradients of the whole
 * batch and one GEMM for the gradient of the previous state. The rest are
 * one GEMM each over all T*B rows: dX = dG W, and the weight gradients
 * dW = dG^T X, dR = dG^T H_prev (dB, dP: sums over the rows), which either
 * the same node computes or, for the I/W split, pippin::LSTMGradWeight /
 * GRUGradWeight from the gate gradients the sweep hands over (dG).
 *
 *   LSTMGrad(X W R B sequence_lens initial_h initial_c P dY dY_h dY_c [stash])
 *       -> dX dW dR dB dinitial_h dinitial_c dP dG
 *   GRUGrad(X W R B sequence_lens initial_h dY dY_h [stash])
 *       -> dX dW dR dB dinitial_h dG
 *   LSTMGradWeight(X W R B - - - P stash dG) -> dW dR dB dP
 *   GRUGradWeight(X W R B - - stash dG) -> dW dR dB
 * with the forward's attributes; any input but X W R (and the weight
 * helpers' stash and dG) may be absent (a missing output gradient is zero),
 * any output may be left out. dG: per direction the gate gradients [TB,G*H]
 * in X's row order, and for a GRU with linear_before_reset the gradient of
 * its q [TB,H] after them. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "rnn.h"
#include "rnn_math.h"

#include "status_internal.h"

typedef struct rnn_bufs {
    pp_rnn_stash st;
    float *dg, *dq, *dh, *dc, *tmp, *du; /* dg, dq: one direction's part of dG */
    pp_tensor *block; /* a tensor, so that the buffer comes from the pool */
} rnn_bufs;

/* Floats of one direction's part of dG. */
static int64_t dg_floats(const pp_rnn_plan *p) {
    return p->T * p->B * (p->G * p->H + (!p->lstm && p->lbr ? p->H : 0));
}

/* Points b->dg, b->dq at direction d's part of dG. */
static void dg_view(const pp_rnn_plan *p, float *base, int d, rnn_bufs *b) {
    b->dg = base + d * dg_floats(p);
    b->dq = b->dg + p->T * p->B * p->G * p->H;
}

/* The sweep's buffers; room for one direction's dG unless it goes out
 * (hand = 1); and, when no stash came in (kept = 0), room for one
 * direction's, which the forward rerun fills. */
static pp_status bufs_alloc(const pp_kernel_ctx *ctx, const pp_rnn_plan *p, int kept, int hand,
                            const int64_t *lens, rnn_bufs *b) {
    int64_t BH = p->B * p->H, ndg = hand ? 0 : dg_floats(p);
    int64_t ns = kept ? 0 : pp_rnn_stash_floats(p);
    /* floats: dh dc tmp du (B*H each), dG, the stash */
    int64_t nf = 4 * BH + ndg;
    if (ns < 0 || pp_rnn_mul3(nf + ns + 4, sizeof(float), 1) < 0)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "recurrence too large to stash");
    memset(b, 0, sizeof *b);
    /* a rerun leaves the rows of steps past a sequence's end unwritten:
     * zeros, as the weight gradients' GEMMs run over every row */
    int64_t n = nf + ns + 4;
    pp_status s = lens && ns ? pp_tensor_new(PP_F32, 1, &n, &b->block)
                             : pp_tensor_empty(PP_F32, 1, &n, &b->block);
    if (s != PP_OK) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory for the backward stash");
    float *f = b->block->data;
    b->dh = f, f += BH;
    b->dc = f, f += BH;
    b->tmp = f, f += BH;
    b->du = f, f += BH;
    if (!hand) dg_view(p, f, 0, b), f += ndg;
    if (!kept) pp_rnn_stash_view(p, f, 0, &b->st);
    return PP_OK;
}

static int active(const int64_t *lens, int64_t t, int64_t b) { return !lens || t < lens[b]; }

/* An active LSTM row without clip or peepholes: the arithmetic of
 * lstm_step's general loop, vectorised. The gates and their gradients come
 * as one pointer each (row + k*H), so that restrict rules out overlaps the
 * vectoriser could not exclude with an unknown H. */
static PP_VEC_CLONES void lstm_row(int64_t H, const float *restrict gi, const float *restrict go,
                                   const float *restrict gf, const float *restrict gc,
                                   const float *restrict cn, const float *restrict cp,
                                   const float *restrict dyr, const float *restrict dh,
                                   float *restrict dc, float *restrict di, float *restrict dO,
                                   float *restrict df, float *restrict dcg, float *restrict tmp) {
#define PP_LSTM_ELEM(DHT)                                                                  \
    float dht = (DHT), ig = gi[j], og = go[j], fg = gf[j], cg = gc[j];                     \
    float tc = pp_rnn_tanh(cn[j]);                                                         \
    float dpo = dht * tc * og * (1.0f - og);                                               \
    float dC = dc[j] + dht * og * (1.0f - tc * tc);                                        \
    di[j] = dC * cg * ig * (1.0f - ig);                                                    \
    dO[j] = dpo;                                                                           \
    df[j] = dC * cp[j] * fg * (1.0f - fg);                                                 \
    dcg[j] = dC * ig * (1.0f - cg * cg);                                                   \
    dc[j] = dC * fg;                                                                       \
    tmp[j] = 0;
    if (dyr) PP_VFOR(j, H, PP_LSTM_ELEM(dh[j] + dyr[j]));
    else PP_VFOR(j, H, PP_LSTM_ELEM(dh[j] + 0.0f));
#undef PP_LSTM_ELEM
}

/* One LSTM step t of the backward sweep: gate gradients into dg (zeros on
 * inactive rows), dc updated, tmp = the part of dh_prev that is not dG R
 * (inactive rows: dh). */
static void lstm_step(const pp_rnn_plan *p, int d, int64_t t, const int64_t *lens, const float *dy,
                      const float *P, rnn_bufs *bf) {
    const int64_t H = p->H, GH = 4 * H;
    for (int64_t b = 0; b < p->B; b++) {
        float *restrict dh = bf->dh + b * H, *restrict dc = bf->dc + b * H, *restrict tmp = bf->tmp + b * H;
        const int64_t row = t * p->st + b * p->sb;
        if (!active(lens, t, b)) {
            memcpy(tmp, dh, sizeof(float) * (size_t)H);
            memset(bf->dg + row * GH, 0, sizeof(float) * (size_t)GH);
            continue;
        }
        const float *gt = bf->st.gates + row * GH, *cn = bf->st.cnew + row * H,
                    *cp = bf->st.cprev + row * H;
        const uint8_t *m = bf->st.mask ? bf->st.mask + row * GH : NULL;
        const float *dyr = dy ? dy + t * p->yt + b * p->yb + d * p->yd : NULL;
        float *dg = bf->dg + row * GH, *restrict tcs = bf->du + b * H;
        if (!m && !P) {
            lstm_row(H, gt, gt + H, gt + 2 * H, gt + 3 * H, cn, cp, dyr, dh, dc, dg, dg + H, dg + 2 * H,
                     dg + 3 * H, tmp);
            continue;
        }
        memcpy(tcs, cn, sizeof(float) * (size_t)H);
        pp_rnn_vtanh(tcs, H);
        for (int64_t j = 0; j < H; j++) {
            float dht = dh[j] + (dyr ? dyr[j] : 0.0f);
            float ig = gt[j], og = gt[H + j], fg = gt[2 * H + j], cg = gt[3 * H + j];
            float tc = tcs[j];
            float dpo = dht * tc * og * (1.0f - og);
            if (m && m[H + j]) dpo = 0;
            float dC = dc[j] + dht * og * (1.0f - tc * tc);
            if (P) dC += P[H + j] * dpo;
            float dpi = dC * cg * ig * (1.0f - ig), dpf = dC * cp[j] * fg * (1.0f - fg);
            float dpc = dC * ig * (1.0f - cg * cg);
            if (m) {
                if (m[j]) dpi = 0;
                if (m[2 * H + j]) dpf = 0;
                if (m[3 * H + j]) dpc = 0;
            }
            float dcp = dC * fg;
            if (P) dcp += P[j] * dpi + P[2 * H + j] * dpf;
            dg[j] = dpi, dg[H + j] = dpo, dg[2 * H + j] = dpf, dg[3 * H + j] = dpc;
            dc[j] = dcp;
            tmp[j] = 0;
        }
    }
}

/* One GRU step t: pass 0 all gates but (without linear_before_reset) r,
 * whose gradient needs du = dph R_h (pass 1). */
static void gru_step(const pp_rnn_plan *p, int d, int pass, int64_t t, const int64_t *lens,
                     const float *dy, rnn_bufs *bf) {
    const int64_t H = p->H, GH = 3 * H;
    for (int64_t b = 0; b < p->B; b++) {
        float *restrict dh = bf->dh + b * H, *restrict tmp = bf->tmp + b * H;
        const int64_t row = t * p->st + b * p->sb;
        if (!active(lens, t, b)) {
            if (pass == 0) {
                memcpy(tmp, dh, sizeof(float) * (size_t)H);
                memset(bf->dg + row * GH, 0, sizeof(float) * (size_t)GH);
                if (p->lbr) memset(bf->dq + row * H, 0, sizeof(float) * (size_t)H);
            }
            continue;
        }
        const float *gt = bf->st.gates + row * GH, *hp = bf->st.hprev + row * H, *q = bf->st.q + row * H;
        const uint8_t *m = bf->st.mask ? bf->st.mask + row * GH : NULL;
        float *dg = bf->dg + row * GH, *dq = bf->dq + row * H;
        if (pass == 1) {
            const float *du = bf->du + b * H;
            for (int64_t j = 0; j < H; j++) {
                float rg = gt[H + j];
                float dpr = du[j] * hp[j] * rg * (1.0f - rg);
                if (m && m[H + j]) dpr = 0;
                dg[H + j] = dpr;
                tmp[j] += du[j] * rg;
            }
            continue;
        }
        const float *dyr = dy ? dy + t * p->yt + b * p->yb + d * p->yd : NULL;
        for (int64_t j = 0; j < H; j++) {
            float dht = dh[j] + (dyr ? dyr[j] : 0.0f);
            float zg = gt[j], rg = gt[H + j], hh = gt[2 * H + j];
            float dpz = dht * (hp[j] - hh) * zg * (1.0f - zg);
            float dph = dht * (1.0f - zg) * (1.0f - hh * hh);
            if (m) {
                if (m[j]) dpz = 0;
                if (m[2 * H + j]) dph = 0;
            }
            dg[j] = dpz;
            dg[2 * H + j] = dph;
            tmp[j] = dht * zg;
            if (p->lbr) {
                float dpr = dph * q[j] * rg * (1.0f - rg);
                if (m && m[H + j]) dpr = 0;
                dg[H + j] = dpr;
                dq[j] = dph * rg;
            }
        }
    }
}

/* Sums the n rows (row length w, pitch ld) of a into acc. */
static PP_VEC_CLONES void col_sums(const float *restrict a, int64_t n, int64_t w, int64_t ld,
                                   float *restrict acc) {
    for (int64_t r = 0; r < n; r++) {
        const float *restrict row = a + r * ld;
        PP_VFOR(j, w, acc[j] += row[j];);
    }
}

static void sgemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (beta == 0.0f)
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
        return;
    }
    pp_gemm_f32(ta == CblasTrans, tb == CblasTrans, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb,
                beta, C, (int)ldc);
}

static int want(const pp_kernel_ctx *ctx, int k) { return k < ctx->n_out && ctx->node->out[k] >= 0; }

static pp_status check_dy(const pp_kernel_ctx *ctx, const pp_tensor *t, const char *what, int nd,
                          const int64_t *shape) {
    char a[128], b[128];
    if (!t) return PP_OK;
    if (t->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "%s must be float32", what);
    if (!pp_shape_equal(t->ndim, t->shape, nd, shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s is %s, the output is %s", what,
                               pp_shape_str(t->ndim, t->shape, a, sizeof a),
                               pp_shape_str(nd, shape, b, sizeof b));
    return PP_OK;
}

/* dP of direction d, from the gate gradients (zero on rows past a
 * sequence's end) and the cell states: sums over all rows. */
static void peephole_grads(const pp_rnn_plan *p, const rnn_bufs *bf, float *restrict dP) {
    const int64_t TB = p->T * p->B, H = p->H, GH = 4 * H;
    for (int64_t r = 0; r < TB; r++) {
        const float *restrict dg = bf->dg + r * GH, *restrict cp = bf->st.cprev + r * H,
                              *restrict cn = bf->st.cnew + r * H;
        for (int64_t j = 0; j < H; j++) {
            dP[j] += dg[j] * cp[j];
            dP[H + j] += dg[H + j] * cn[j];
            dP[2 * H + j] += dg[2 * H + j] * cp[j];
        }
    }
}

/* After the sweep of direction d: dW, dR, dB and dP (out[0..3], NULL: not
 * wanted) from the gate gradients. */
static void weight_grads(const pp_rnn_plan *p, int d, const pp_tensor *x, const rnn_bufs *bf,
                         pp_tensor *const *out) {
    const int64_t TB = p->T * p->B, H = p->H, GH = p->G * H, In = p->In;
    const float *hp = bf->st.hprev;
    if (out[0]) /* dW = dG^T X */
        sgemm(CblasTrans, CblasNoTrans, GH, In, TB, bf->dg, GH, x->data, In, 0.0f,
              (float *)out[0]->data + d * GH * In, In);
    if (out[1]) {
        float *dr = (float *)out[1]->data + d * GH * H;
        if (p->lstm) {
            sgemm(CblasTrans, CblasNoTrans, GH, H, TB, bf->dg, GH, hp, H, 0.0f, dr, H);
        } else { /* z, r: dG^T H_prev; h: dq^T H_prev, or dph^T (r * H_prev) */
            sgemm(CblasTrans, CblasNoTrans, 2 * H, H, TB, bf->dg, GH, hp, H, 0.0f, dr, H);
            if (p->lbr)
                sgemm(CblasTrans, CblasNoTrans, H, H, TB, bf->dq, H, hp, H, 0.0f, dr + 2 * H * H, H);
            else
                sgemm(CblasTrans, CblasNoTrans, H, H, TB, bf->dg + 2 * H, GH, bf->st.q, H, 0.0f,
                      dr + 2 * H * H, H);
        }
    }
    if (out[2]) {
        float *db = (float *)out[2]->data + d * 2 * GH;
        col_sums(bf->dg, TB, GH, GH, db);
        if (p->lstm || !p->lbr) {
            memcpy(db + GH, db, sizeof(float) * (size_t)GH);
        } else {
            memcpy(db + GH, db, sizeof(float) * (size_t)(2 * H));
            col_sums(bf->dq, TB, H, H, db + GH + 2 * H);
        }
    }
    if (out[3] && p->lstm) peephole_grads(p, bf, (float *)out[3]->data + d * 3 * H);
}

/* Checks a stash or dG input: float32, 1-D, nd * per floats. */
static pp_status check_flat(const pp_kernel_ctx *ctx, const pp_rnn_plan *p, const pp_tensor *t,
                            int64_t per, const char *what) {
    int64_t want = pp_rnn_mul3(per, p->nd, 1);
    if (t->dtype != PP_F32 || t->ndim != 1 || per < 0 || t->shape[0] != want)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s does not match the inputs", what);
    return PP_OK;
}

/* Output k: a new zero tensor shaped like `like` (an input), or an error if
 * that input is absent. */
static pp_status new_like(const pp_kernel_ctx *ctx, int k, const pp_tensor *like, pp_tensor **out) {
    if (!like) return pp_kernel_error(ctx, PP_ERR_INVALID, "output %d asked for an absent input", k);
    return pp_tensor_new(PP_F32, like->ndim, like->shape, out);
}

static pp_status rnn_grad_run(pp_kernel_ctx *ctx, int lstm) {
    pp_rnn_inputs in;
    pp_rnn_read_inputs(ctx, lstm, &in);
    int k0 = lstm ? 8 : 6;
    const pp_tensor *dy = ctx->n_in > k0 ? ctx->in[k0] : NULL;
    const pp_tensor *dyh = ctx->n_in > k0 + 1 ? ctx->in[k0 + 1] : NULL;
    const pp_tensor *dyc = lstm && ctx->n_in > k0 + 2 ? ctx->in[k0 + 2] : NULL;
    const int ks = k0 + (lstm ? 3 : 2);
    const pp_tensor *kept = ctx->n_in > ks ? ctx->in[ks] : NULL;
    pp_rnn_plan p;
    int64_t *lens = NULL;
    PP_TRY(pp_rnn_plan_make(ctx, lstm, &in, &p, &lens));
    const int64_t H = p.H, GH = p.G * H, B = p.B;
    int64_t ys[4] = {p.T, p.nd, B, H}, hs[3] = {p.nd, B, H};
    if (p.layout) ys[0] = B, ys[1] = p.T, ys[2] = p.nd, hs[0] = B, hs[1] = p.nd;
    pp_status s = check_dy(ctx, dy, "dY", 4, ys);
    if (s == PP_OK) s = check_dy(ctx, dyh, "dY_h", 3, hs);
    if (s == PP_OK) s = check_dy(ctx, dyc, "dY_c", 3, hs);
    if (s == PP_OK && kept)
        s = check_flat(ctx, &p, kept, pp_rnn_stash_floats(&p),
                       lstm ? "the stash from pippin::LSTMTrain" : "the stash from pippin::GRUTrain");
    /* outputs: dX dW dR dB dh0 [dc0 dP] dG */
    pp_tensor *out[8] = {0};
    const pp_tensor *like[7] = {in.x, in.w, in.r, in.b, NULL, NULL, in.p};
    int n_out = lstm ? 8 : 6, kg = n_out - 1;
    for (int k = 0; k < n_out && s == PP_OK; k++) {
        if (!want(ctx, k)) continue;
        if (k == kg) {
            int64_t n = pp_rnn_mul3(dg_floats(&p), p.nd, 1);
            s = pp_tensor_empty(PP_F32, 1, &n, &out[k]);
        } else if (k == 4 || k == 5) {
            s = pp_tensor_new(PP_F32, 3, hs, &out[k]);
        } else {
            s = new_like(ctx, k, like[k], &out[k]);
        }
    }
    rnn_bufs bf = {0};
    if (s == PP_OK) s = bufs_alloc(ctx, &p, kept != NULL, out[kg] != NULL, lens, &bf);
    const int64_t TB = p.T * B;
    for (int d = 0; d < p.nd && s == PP_OK; d++) {
        const int reverse = p.direction == 1 || d == 1;
        if (kept)
            pp_rnn_stash_view(&p, kept->data, d, &bf.st);
        else if ((s = pp_rnn_forward_dir(ctx, &p, d, &in, lens, NULL, NULL, NULL, &bf.st)) != PP_OK)
            break;
        if (out[kg]) dg_view(&p, out[kg]->data, d, &bf);
        /* the steps write every row of dG (zeros where inactive) */
        for (int64_t b = 0; b < B; b++) {
            int64_t o = d * p.hd + b * p.hb;
            for (int64_t j = 0; j < H; j++) {
                bf.dh[b * H + j] = dyh ? ((const float *)dyh->data)[o + j] : 0.0f;
                bf.dc[b * H + j] = dyc ? ((const float *)dyc->data)[o + j] : 0.0f;
            }
        }
        const float *R = (const float *)in.r->data + d * GH * H;
        const float *P = in.p ? (const float *)in.p->data + d * 3 * H : NULL;
        const float *dyd = dy ? dy->data : NULL;
        const int64_t ld = p.sb * GH; /* pitch of one step's rows in dg */
        for (int64_t s2 = p.T - 1; s2 >= 0 && B > 0; s2--) {
            const int64_t t = reverse ? p.T - 1 - s2 : s2;
            float *dgt = bf.dg + t * p.st * GH;
            if (lstm) {
                lstm_step(&p, d, t, lens, dyd, P, &bf);
                sgemm(CblasNoTrans, CblasNoTrans, B, H, GH, dgt, ld, R, H, 1.0f, bf.tmp, H);
            } else {
                gru_step(&p, d, 0, t, lens, dyd, &bf);
                if (!p.lbr) {
                    sgemm(CblasNoTrans, CblasNoTrans, B, H, H, dgt + 2 * H, ld, R + 2 * H * H, H,
                          0.0f, bf.du, H);
                    gru_step(&p, d, 1, t, lens, dyd, &bf);
                } else {
                    sgemm(CblasNoTrans, CblasNoTrans, B, H, H, bf.dq + t * p.st * H, p.sb * H,
                          R + 2 * H * H, H, 1.0f, bf.tmp, H);
                }
                sgemm(CblasNoTrans, CblasNoTrans, B, H, 2 * H, dgt, ld, R, H, 1.0f, bf.tmp, H);
            }
            float *sw = bf.dh;
            bf.dh = bf.tmp;
            bf.tmp = sw;
        }
        for (int64_t b = 0; b < B; b++) {
            int64_t o = d * p.hd + b * p.hb;
            if (out[4]) memcpy((float *)out[4]->data + o, bf.dh + b * H, sizeof(float) * (size_t)H);
            if (lstm && out[5])
                memcpy((float *)out[5]->data + o, bf.dc + b * H, sizeof(float) * (size_t)H);
        }
        if (out[0]) /* dX += dG W */
            sgemm(CblasNoTrans, CblasNoTrans, TB, p.In, GH, bf.dg, GH,
                  (const float *)in.w->data + d * GH * p.In, p.In, 1.0f, out[0]->data, p.In);
        weight_grads(&p, d, in.x, &bf, (pp_tensor *const[]){out[1], out[2], out[3], lstm ? out[6] : NULL});
    }
    pp_tensor_free(bf.block);
    free(lens);
    for (int k = 0; k < n_out; k++) {
        if (s == PP_OK) ctx->out[k] = out[k];
        else pp_tensor_free(out[k]);
    }
    return s;
}

/* pippin::LSTMGradWeight / GRUGradWeight: the weight gradients from the
 * stash and the dG that LSTMGrad / GRUGrad handed over. */
static pp_status rnn_grad_weight_run(pp_kernel_ctx *ctx, int lstm) {
    pp_rnn_inputs in;
    pp_rnn_read_inputs(ctx, lstm, &in);
    in.seq = in.h0 = in.c0 = NULL; /* not needed: dG is zero past a sequence's end */
    int ks = lstm ? 8 : 6;
    const pp_tensor *kept = ctx->n_in > ks ? ctx->in[ks] : NULL;
    const pp_tensor *dg = ctx->n_in > ks + 1 ? ctx->in[ks + 1] : NULL;
    pp_rnn_plan p;
    int64_t *lens = NULL;
    if (!kept || !dg) return pp_kernel_error(ctx, PP_ERR_INVALID, "the stash and dG are required");
    PP_TRY(pp_rnn_plan_make(ctx, lstm, &in, &p, &lens));
    free(lens);
    PP_TRY(check_flat(ctx, &p, kept, pp_rnn_stash_floats(&p), "the stash"));
    PP_TRY(check_flat(ctx, &p, dg, dg_floats(&p), "dG"));
    /* outputs: dW dR dB [dP] */
    pp_tensor *out[4] = {0};
    const pp_tensor *like[4] = {in.w, in.r, in.b, in.p};
    int n_out = lstm ? 4 : 3;
    pp_status s = PP_OK;
    for (int k = 0; k < n_out && s == PP_OK; k++)
        if (want(ctx, k)) s = new_like(ctx, k, like[k], &out[k]);
    for (int d = 0; d < p.nd && s == PP_OK; d++) {
        rnn_bufs bf = {0};
        pp_rnn_stash_view(&p, kept->data, d, &bf.st);
        dg_view(&p, dg->data, d, &bf);
        weight_grads(&p, d, in.x, &bf, out);
    }
    for (int k = 0; k < n_out; k++) {
        if (s == PP_OK) ctx->out[k] = out[k];
        else pp_tensor_free(out[k]);
    }
    return s;
}

static pp_status lstm_grad_run(pp_kernel_ctx *ctx) { return rnn_grad_run(ctx, 1); }
static pp_status gru_grad_run(pp_kernel_ctx *ctx) { return rnn_grad_run(ctx, 0); }
static pp_status lstm_grad_weight_run(pp_kernel_ctx *ctx) { return rnn_grad_weight_run(ctx, 1); }
static pp_status gru_grad_weight_run(pp_kernel_ctx *ctx) { return rnn_grad_weight_run(ctx, 0); }

static pp_status lstm_grad_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    return pp_rnn_check_attrs(n, 1);
}

static pp_status gru_grad_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    return pp_rnn_check_attrs(n, 0);
}

const pp_op pp_ops_grad_rnn[] = {
    {"LSTMGrad", "pippin", 3, 12, 1, 8, lstm_grad_check, lstm_grad_run},
    {"GRUGrad", "pippin", 3, 9, 1, 6, gru_grad_check, gru_grad_run},
    {"LSTMGradWeight", "pippin", 3, 10, 1, 4, lstm_grad_check, lstm_grad_weight_run},
    {"GRUGradWeight", "pippin", 3, 8, 1, 3, gru_grad_check, gru_grad_weight_run},
    {NULL},
};
