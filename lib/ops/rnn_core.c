/* The LSTM/GRU recurrence (ONNX semantics), shared by the forward kernels
 * (rnn.c; the training variants fill a stash) and the backward helpers,
 * which rerun it with a stash when none was kept (grad_rnn.c). Per direction: X W^T plus the biases for all steps in one
 * GEMM, then per step one GEMM over the batch for the recurrent term
 * (two for a GRU without linear_before_reset) and the gate arithmetic. */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gemm.h"
#include "rnn.h"
#include "rnn_math.h"

#include "status_internal.h"

int64_t pp_rnn_mul3(int64_t a, int64_t b, int64_t c) {
    int64_t ab, abc;
    if (a < 0 || b < 0 || c < 0) return -1;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) return -1;
    return abc;
}

int64_t pp_rnn_stash_floats(const pp_rnn_plan *p) {
    int64_t TB = pp_rnn_mul3(p->T, p->B, 1);
    int64_t rows = pp_rnn_mul3(TB, (p->lstm ? 3 : 2) * p->H + p->G * p->H, 1);
    int64_t mask = p->clip > 0 ? pp_rnn_mul3(TB, p->G * p->H, 1) : 0;
    if (rows < 0 || mask < 0 || rows > INT64_MAX / 4 - mask / 4 - 1) return -1;
    return rows + (mask + 3) / 4;
}

void pp_rnn_stash_view(const pp_rnn_plan *p, float *base, int d, pp_rnn_stash *st) {
    const int64_t TB = p->T * p->B, H = p->H;
    float *f = base + d * pp_rnn_stash_floats(p);
    memset(st, 0, sizeof *st);
    st->hprev = f, f += TB * H;
    if (p->lstm) {
        st->cprev = f, f += TB * H;
        st->cnew = f, f += TB * H;
    } else {
        st->q = f, f += TB * H;
    }
    st->gates = f, f += TB * p->G * H;
    st->mask = p->clip > 0 ? (uint8_t *)f : NULL;
}

/* ---------------------------------------------------------- attributes */

static int direction_of(const char *s) {
    if (!s || !strcmp(s, "forward")) return 0;
    if (!strcmp(s, "reverse")) return 1;
    if (!strcmp(s, "bidirectional")) return 2;
    return -1;
}

pp_status pp_rnn_check_attrs(const pp_node *n, int lstm) {
    const pp_attr *a = pp_node_attr(n, "hidden_size");
    if (a && (a->type != PP_ATTR_INT || a->i < 1 || a->i > PP_RNN_HIDDEN_MAX))
        return pp_node_error(n, PP_ERR_INVALID, "hidden_size must be an int from 1 to %d",
                             PP_RNN_HIDDEN_MAX);
    a = pp_node_attr(n, "direction");
    if (a && (a->type != PP_ATTR_STRING || direction_of(a->s) < 0))
        return pp_node_error(n, PP_ERR_INVALID,
                             "direction must be forward, reverse or bidirectional");
    int nd = a && direction_of(a->s) == 2 ? 2 : 1;
    a = pp_node_attr(n, "layout");
    if (a && (a->type != PP_ATTR_INT || (a->i != 0 && a->i != 1)))
        return pp_node_error(n, PP_ERR_INVALID, "layout must be 0 or 1");
    a = pp_node_attr(n, "clip");
    if (a && (a->type != PP_ATTR_FLOAT || !(a->f > 0) || a->f != a->f))
        return pp_node_error(n, PP_ERR_INVALID, "clip must be a positive float");
    if (lstm) {
        a = pp_node_attr(n, "input_forget");
        if (a && (a->type != PP_ATTR_INT || a->i != 0))
            return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                 "input_forget=1 (coupled input and forget gates) is not supported");
    } else {
        a = pp_node_attr(n, "linear_before_reset");
        if (a && (a->type != PP_ATTR_INT || (a->i != 0 && a->i != 1)))
            return pp_node_error(n, PP_ERR_INVALID, "linear_before_reset must be 0 or 1");
    }
    a = pp_node_attr(n, "activations");
    if (a) {
        static const char *const lstm_acts[3] = {"Sigmoid", "Tanh", "Tanh"};
        static const char *const gru_acts[2] = {"Sigmoid", "Tanh"};
        const char *const *want = lstm ? lstm_acts : gru_acts;
        int per = lstm ? 3 : 2;
        if (a->type != PP_ATTR_STRINGS || a->n != per * nd)
            return pp_node_error(n, PP_ERR_INVALID,
                                 "activations must list %d names (%d per direction)", per * nd, per);
        for (int i = 0; i < a->n; i++)
            if (!a->strings[i] || strcasecmp(a->strings[i], want[i % per]) != 0)
                return pp_node_error(n, PP_ERR_UNSUPPORTED,
                                     "activation '%s' (entry %d) is not supported: only the "
                                     "default %s is",
                                     a->strings[i] ? a->strings[i] : "", i,
                                     lstm ? "Sigmoid, Tanh, Tanh" : "Sigmoid, Tanh");
    }
    return PP_OK;
}

/* ------------------------------------------------------------------ plan */

static pp_status f32_shape(const pp_kernel_ctx *ctx, const pp_tensor *t, const char *what, int nd,
                           const int64_t *want) {
    char a[128], b[128];
    if (!t) return PP_OK;
    if (t->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "%s must be float32, not %s", what,
                               pp_dtype_name(t->dtype));
    if (!pp_shape_equal(t->ndim, t->shape, nd, want))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%s is %s, expected %s", what,
                               pp_shape_str(t->ndim, t->shape, a, sizeof a),
                               pp_shape_str(nd, want, b, sizeof b));
    return PP_OK;
}

pp_status pp_rnn_plan_make(const pp_kernel_ctx *ctx, int lstm, const pp_rnn_inputs *in,
                           pp_rnn_plan *p, int64_t **lens) {
    const pp_node *n = ctx->node;
    char a[128];
    *lens = NULL;
    memset(p, 0, sizeof *p);
    PP_TRY(pp_rnn_check_attrs(n, lstm));
    p->lstm = lstm;
    p->G = lstm ? 4 : 3;
    p->direction = direction_of(pp_node_attr_string(n, "direction", "forward"));
    p->nd = p->direction == 2 ? 2 : 1;
    p->layout = (int)pp_node_attr_int(n, "layout", 0);
    p->lbr = !lstm && pp_node_attr_int(n, "linear_before_reset", 0);
    p->clip = pp_node_attr(n, "clip") ? pp_node_attr_float(n, "clip", 0) : 0;
    const pp_tensor *x = in->x, *w = in->w, *r = in->r;
    if (!x || !w || !r) return pp_kernel_error(ctx, PP_ERR_INVALID, "X, W and R are required");
    if (x->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "X must be float32, not %s",
                               pp_dtype_name(x->dtype));
    if (x->ndim != 3)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "X must be 3-D, not %s",
                               pp_shape_str(x->ndim, x->shape, a, sizeof a));
    if (r->ndim != 3)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "R must be 3-D, not %s",
                               pp_shape_str(r->ndim, r->shape, a, sizeof a));
    p->T = x->shape[p->layout ? 1 : 0];
    p->B = x->shape[p->layout ? 0 : 1];
    p->In = x->shape[2];
    p->H = r->shape[2];
    int64_t hs = pp_node_attr_int(n, "hidden_size", p->H);
    if (hs != p->H || p->H < 1 || p->H > PP_RNN_HIDDEN_MAX)
        return pp_kernel_error(ctx, PP_ERR_SHAPE,
                               "R %s does not match hidden_size %" PRId64 " (1 to %d)",
                               pp_shape_str(r->ndim, r->shape, a, sizeof a), hs, PP_RNN_HIDDEN_MAX);
    int64_t GH = p->G * p->H, nd = p->nd, B = p->B, H = p->H;
    /* Every buffer is at most T*B*G*H floats (or I*G*H, T*B*I); BLAS takes
     * int dimensions. */
    int64_t tb = pp_rnn_mul3(p->T, p->B, 1);
    if (tb < 0 || tb > INT_MAX || p->In > INT_MAX || pp_rnn_mul3(tb, GH, 16) < 0 ||
        pp_rnn_mul3(tb, p->In, 16) < 0 || pp_rnn_mul3(GH, p->In, 16) < 0 ||
        pp_rnn_mul3(GH, H, 16) < 0)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "recurrence too large (X %s, hidden %" PRId64 ")",
                               pp_shape_str(x->ndim, x->shape, a, sizeof a), H);
    PP_TRY(f32_shape(ctx, w, "W", 3, (int64_t[]){nd, GH, p->In}));
    PP_TRY(f32_shape(ctx, r, "R", 3, (int64_t[]){nd, GH, H}));
    PP_TRY(f32_shape(ctx, in->b, "B", 2, (int64_t[]){nd, 2 * GH}));
    int64_t hshape[3] = {nd, B, H};
    if (p->layout) hshape[0] = B, hshape[1] = nd;
    PP_TRY(f32_shape(ctx, in->h0, "initial_h", 3, hshape));
    PP_TRY(f32_shape(ctx, in->c0, "initial_c", 3, hshape));
    PP_TRY(f32_shape(ctx, in->p, "P", 2, (int64_t[]){nd, 3 * H}));
    if (p->layout == 0) {
        p->st = B, p->sb = 1;
        p->yt = nd * B * H, p->yb = H, p->yd = B * H;
        p->hd = B * H, p->hb = H;
    } else {
        p->st = 1, p->sb = p->T;
        p->yt = nd * H, p->yb = p->T * nd * H, p->yd = H;
        p->hd = H, p->hb = nd * H;
    }
    const pp_tensor *s = in->seq;
    if (s) {
        if ((s->dtype != PP_I32 && s->dtype != PP_I64) || s->ndim != 1 || s->shape[0] != B)
            return pp_kernel_error(ctx, PP_ERR_SHAPE,
                                   "sequence_lens must be a 1-D int32 tensor of %" PRId64 " entries",
                                   B);
        int64_t *l = malloc(sizeof(int64_t) * (size_t)(B ? B : 1));
        if (!l) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory");
        for (int64_t b = 0; b < B; b++) {
            l[b] = s->dtype == PP_I32 ? ((const int32_t *)s->data)[b] : ((const int64_t *)s->data)[b];
            if (l[b] < 0 || l[b] > p->T) {
                int64_t bad = l[b];
                free(l);
                return pp_kernel_error(ctx, PP_ERR_INVALID,
                                       "sequence_lens[%" PRId64 "] = %" PRId64
                                       " is outside 0..%" PRId64,
                                       b, bad, p->T);
            }
        }
        *lens = l;
    }
    return PP_OK;
}

/* --------------------------------------------------------------- forward */

/* xw[row] = X[row] W_d^T + the biases that add to every step. */
static void input_projection(const pp_rnn_plan *p, int d, const pp_rnn_inputs *in, float *xw) {
    int64_t GH = p->G * p->H, TB = p->T * p->B, H = p->H;
    if (p->In > 0)
        pp_gemm_f32(0, 1, (int)TB, (int)GH, (int)p->In, 1.0f,
                    in->x->data, (int)p->In, (const float *)in->w->data + d * GH * p->In, (int)p->In,
                    0.0f, xw, (int)GH);
    else
        memset(xw, 0, sizeof(float) * (size_t)(TB * GH));
    if (!in->b) return;
    const float *wb = (const float *)in->b->data + d * 2 * GH, *rb = wb + GH;
    for (int64_t row = 0; row < TB; row++) {
        float *restrict xr = xw + row * GH;
        for (int64_t j = 0; j < GH; j++) {
            /* GRU with linear_before_reset: Rb_h sits inside r * (...) */
            float rbj = (p->lbr && j >= 2 * H) ? 0.0f : rb[j];
            xr[j] += wb[j] + rbj;
        }
    }
}

/* Clips x[0..n) to [-clip, clip] (clip > 0), marking cut entries in m. */
static void clip_range(float *x, int64_t n, float clip, uint8_t *m) {
    if (!(clip > 0)) return;
    for (int64_t j = 0; j < n; j++) {
        uint8_t cut = x[j] > clip || x[j] < -clip;
        x[j] = x[j] > clip ? clip : x[j] < -clip ? -clip : x[j];
        if (m) m[j] = cut;
    }
}

pp_status pp_rnn_forward_dir(const pp_kernel_ctx *ctx, const pp_rnn_plan *p, int d,
                             const pp_rnn_inputs *in, const int64_t *lens, float *y, float *yh,
                             float *yc, const pp_rnn_stash *stash) {
    const int64_t T = p->T, B = p->B, H = p->H, G = p->G, GH = G * H, TB = T * B;
    const int reverse = p->direction == 1 || d == 1;
    /* a tensor, so that the buffer comes from the pool (no fresh pages
     * every step) */
    pp_tensor *xwt = NULL;
    int64_t nxw = TB * GH + 1;
    float *buf = malloc(sizeof(float) * (size_t)(B * (GH + 3 * H) + 1));
    if (!buf || pp_tensor_empty(PP_F32, 1, &nxw, &xwt) != PP_OK) {
        pp_tensor_free(xwt);
        free(buf);
        return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory for the recurrence");
    }
    float *xw = xwt->data;
    float *g = buf, *h = g + B * GH, *c = h + B * H, *u = c + B * H;
    input_projection(p, d, in, xw);
    const float *R = (const float *)in->r->data + d * GH * H;
    const float *P = in->p ? (const float *)in->p->data + d * 3 * H : NULL;
    const float *rbh = in->b && p->lbr ? (const float *)in->b->data + d * 2 * GH + GH + 2 * H : NULL;
    for (int64_t b = 0; b < B; b++) {
        const float *h0 = in->h0 ? (const float *)in->h0->data + d * p->hd + b * p->hb : NULL;
        const float *c0 = in->c0 ? (const float *)in->c0->data + d * p->hd + b * p->hb : NULL;
        for (int64_t j = 0; j < H; j++) {
            h[b * H + j] = h0 ? h0[j] : 0.0f;
            c[b * H + j] = c0 ? c0[j] : 0.0f;
        }
    }
    memset(u, 0, sizeof(float) * (size_t)(B * H));
    const float clip = p->clip;
    for (int64_t s = 0; s < T && B > 0; s++) {
        const int64_t t = reverse ? T - 1 - s : s;
        /* recurrent term for the whole batch: g = h R^T (GRU without
         * linear_before_reset: z and r only, h after the reset) */
        int64_t n_rec = (!p->lstm && !p->lbr) ? 2 * H : GH;
        /* the gates of the step's rows: in place in the stash when there is
         * one (row b at gs + b * gld), so they need no copy */
        float *gs = stash ? stash->gates + t * p->st * GH : g;
        const int64_t gld = stash ? p->sb * GH : GH;
        pp_gemm_f32(0, 1, (int)B, (int)n_rec, (int)H, 1.0f, h,
                    (int)H, R, (int)H, 0.0f, gs, (int)gld);
        for (int pass = 0; pass < ((!p->lstm && !p->lbr) ? 2 : 1); pass++) {
            if (pass == 1) /* GRU, reset before the linear map: g_h = (r * h) R_h^T */
                pp_gemm_f32(0, 1, (int)B, (int)H, (int)H, 1.0f,
                            u, (int)H, R + 2 * H * H, (int)H, 0.0f, gs + 2 * H, (int)gld);
            for (int64_t b = 0; b < B; b++) {
                int active = !lens || t < lens[b];
                float *yr = y ? y + t * p->yt + b * p->yb + d * p->yd : NULL;
                if (!active) {
                    if (yr && pass == 0) memset(yr, 0, sizeof(float) * (size_t)H);
                    continue;
                }
                const int64_t row = t * p->st + b * p->sb;
                const float *xr = xw + row * GH;
                float *gb = gs + b * gld, *hb = h + b * H, *cb = c + b * H;
                uint8_t *m = stash && stash->mask ? stash->mask + row * GH : NULL;
                if (stash && pass == 0) memcpy(stash->hprev + row * H, hb, sizeof(float) * (size_t)H);
                if (p->lstm) {
                    float *restrict tc = u + b * H;
                    if (stash) memcpy(stash->cprev + row * H, cb, sizeof(float) * (size_t)H);
                    pp_rnn_vadd(gb, xr, GH);
                    if (P)
                        for (int64_t j = 0; j < H; j++) gb[j] += P[j] * cb[j], gb[2 * H + j] += P[2 * H + j] * cb[j];
                    clip_range(gb, H, clip, m);
                    clip_range(gb + 2 * H, 2 * H, clip, m ? m + 2 * H : NULL);
                    pp_rnn_vsigmoid(gb, H);
                    pp_rnn_vsigmoid(gb + 2 * H, H);
                    pp_rnn_vtanh(gb + 3 * H, H);
                    pp_rnn_vcell(gb + 2 * H, gb, gb + 3 * H, cb, tc, H);
                    if (P)
                        for (int64_t j = 0; j < H; j++) gb[H + j] += P[H + j] * cb[j];
                    clip_range(gb + H, H, clip, m ? m + H : NULL);
                    pp_rnn_vsigmoid(gb + H, H);
                    pp_rnn_vtanh(tc, H);
                    pp_rnn_vmul(hb, gb + H, tc, H);
                    if (stash) memcpy(stash->cnew + row * H, cb, sizeof(float) * (size_t)H);
                    if (yr) memcpy(yr, hb, sizeof(float) * (size_t)H);
                } else if (pass == 0 && !p->lbr) {
                    /* z and r; u = r * h for the second GEMM */
                    float *ub = u + b * H;
                    pp_rnn_vadd(gb, xr, 2 * H);
                    clip_range(gb, 2 * H, clip, m);
                    pp_rnn_vsigmoid(gb, 2 * H);
                    pp_rnn_vmul(ub, gb + H, hb, H);
                } else {
                    float *qs = stash ? stash->q + row * H : NULL;
                    float *restrict qb = stash ? qs : u + b * H;
                    if (p->lbr) {
                        pp_rnn_vadd(gb, xr, 2 * H);
                        clip_range(gb, 2 * H, clip, m);
                        pp_rnn_vsigmoid(gb, 2 * H);
                        for (int64_t j = 0; j < H; j++) {
                            float q = gb[2 * H + j] + (rbh ? rbh[j] : 0.0f);
                            qb[j] = q;
                            gb[2 * H + j] = xr[2 * H + j] + gb[H + j] * q;
                        }
                    } else {
                        if (qs) memcpy(qs, u + b * H, sizeof(float) * (size_t)H);
                        pp_rnn_vadd(gb + 2 * H, xr + 2 * H, H);
                    }
                    clip_range(gb + 2 * H, H, clip, m ? m + 2 * H : NULL);
                    pp_rnn_vtanh(gb + 2 * H, H);
                    pp_rnn_vgru_h(hb, gb, gb + 2 * H, H);
                    if (yr) memcpy(yr, hb, sizeof(float) * (size_t)H);
                }
            }
        }
    }
    for (int64_t b = 0; b < B; b++) {
        if (yh) memcpy(yh + d * p->hd + b * p->hb, h + b * H, sizeof(float) * (size_t)H);
        if (yc) memcpy(yc + d * p->hd + b * p->hb, c + b * H, sizeof(float) * (size_t)H);
    }
    pp_tensor_free(xwt);
    free(buf);
    return PP_OK;
}
