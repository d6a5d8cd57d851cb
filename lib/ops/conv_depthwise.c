/* Direct depthwise convolution (one input channel per group: Cg == 1, any
 * channel multiplier Mg, kernel, stride, dilation and pad, pads negative
 * included), the three cores of conv_internal.h without im2col or BLAS.
 *
 * Each input channel is copied once into a "phase plane" buffer: for strides
 * sh x sw there are sh * sw planes, plane (a, b) holding the padded input's
 * rows a + sh*r and columns b + sw*c (zero outside the input), r < Hp,
 * c < R, with R = ow + ((kw-1)*dw)/sw and Hp = oh + ((kh-1)*dh)/sh. The
 * output is computed in a layout of row stride R: output (oy, ox) sits at
 * p = oy*R + ox, and kernel tap (i, j) reads plane ((i*dh)%sh, (j*dw)%sw) at
 * p + ((i*dh)/sh)*R + (j*dw)/sw. So every tap is one flat, unit-stride loop
 * of length span = (oh-1)*R + ow over the whole channel (vectorised in
 * PP_VFOR blocks), which stays long even for 4x4 or 2x2 images; the columns
 * ox >= ow of that layout are garbage and dropped (forward) or held at zero
 * (the adjoints). The largest index read is Hp*R - 1.
 *
 * Rounding: the forward accumulates the taps in the GEMM's order (i, j) with
 * fused multiply-adds, as the BLAS's AVX2 kernels do, so its outputs are the
 * im2col path's bit for bit there; the input gradient (multiplier 1) adds the
 * products in col2im's order. Deep BatchNorm stacks on tiny microbatches
 * (test/fixtures/tv_mobilenet_v2) turn a last-bit change in a depthwise
 * output into a visible change of the first layer's gradient. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conv_internal.h"
#include "vec.h"

#include "status_internal.h"

#define DW_MAX_MULT 16     /* beyond this channel multiplier a GEMM does better */
#define DW_TAPS_MAX 1024   /* kh * kw: the tap offsets live on the stack */

typedef struct dw_geo {
    int64_t Hp, R, PS, nbuf, span;
} dw_geo;

static int dw_geometry(const pp_conv_plan *p, dw_geo *g) {
    int64_t Hp, R, PS, nb;
    if (p->oh < 1 || p->ow < 1 || p->sh < 1 || p->sw < 1) return 0;
    if (__builtin_mul_overflow(p->kh - 1, p->dh, &Hp) || __builtin_add_overflow(p->oh, Hp / p->sh, &Hp))
        return 0;
    if (__builtin_mul_overflow(p->kw - 1, p->dw, &R) || __builtin_add_overflow(p->ow, R / p->sw, &R))
        return 0;
    if (__builtin_mul_overflow(Hp, R, &PS) || __builtin_mul_overflow(PS, p->sh, &nb) ||
        __builtin_mul_overflow(nb, p->sw, &nb))
        return 0;
    g->Hp = Hp;
    g->R = R;
    g->PS = PS;
    g->nbuf = nb;
    g->span = (p->oh - 1) * R + p->ow;
    return 1;
}

int pp_conv_dw_usable(const pp_conv_plan *p) {
    dw_geo g;
    if (p->Cg != 1 || p->Mg < 1 || p->Mg > DW_MAX_MULT || p->kh * p->kw > DW_TAPS_MAX) return 0;
    if (!dw_geometry(p, &g)) return 0;
    /* The planes hold the padded input (plus a stride's rounding): refuse
     * geometries where that dwarfs both the input and the output (huge pads
     * or strides), which im2col handles in O(output). */
    int64_t lim = 4 * (p->IL + p->L) + 4096;
    return g.nbuf <= lim;
}

/* Plane offset of every tap (i, j). */
static void tap_offsets(const pp_conv_plan *p, const dw_geo *g, int64_t *off) {
    for (int64_t i = 0; i < p->kh; i++)
        for (int64_t j = 0; j < p->kw; j++) {
            int64_t ri = i * p->dh, cj = j * p->dw;
            off[i * p->kw + j] = ((ri % p->sh) * p->sw + cj % p->sw) * g->PS + (ri / p->sh) * g->R +
                                 cj / p->sw;
        }
}

/* Column range [lo, hi) of plane column phase b whose input column
 * b + sw*c - pw lies in [0, iw). */
static void col_range(const pp_conv_plan *p, const dw_geo *g, int64_t b, int64_t *lo, int64_t *hi) {
    int64_t first = p->pw - b; /* c*sw >= first */
    int64_t l = first <= 0 ? 0 : (first + p->sw - 1) / p->sw;
    int64_t last = p->iw + p->pw - b; /* c*sw < last */
    int64_t h = last <= 0 ? 0 : (last + p->sw - 1) / p->sw;
    if (h > g->R) h = g->R;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* Row r of the planes (a, b) for every b: tmp (sw*R floats) gets the padded
 * input row a + sh*r, whose column b + sw*c then goes to plane b's column c.
 * Stride 1 copies straight into the plane; stride 2 splits even and odd
 * columns in one vectorisable pass. */
PP_VEC_CLONES static void fill_row(const pp_conv_plan *p, const dw_geo *g, const float *restrict xr,
                                   float *restrict row0, float *restrict tmp) {
    int64_t R = g->R, sw = p->sw, W = sw * R;
    float *restrict t = sw == 1 ? row0 : tmp;
    int64_t lo = p->pw < 0 ? 0 : (p->pw < W ? p->pw : W); /* t[q] = x[q - pw] for q in [lo, hi) */
    int64_t hi = p->iw + p->pw < W ? p->iw + p->pw : W;
    if (hi < lo) hi = lo;
    for (int64_t q = 0; q < lo; q++) t[q] = 0;
    if (hi > lo) memcpy(t + lo, xr + lo - p->pw, (size_t)(hi - lo) * sizeof(float));
    for (int64_t q = hi; q < W; q++) t[q] = 0;
    if (sw == 1) return;
    if (sw == 2) {
        float *restrict r1 = row0 + g->PS;
        PP_VFOR(c, R, row0[c] = t[2 * c]; r1[c] = t[2 * c + 1];);
        return;
    }
    for (int64_t b = 0; b < sw; b++) {
        float *restrict rb = row0 + b * g->PS;
        for (int64_t c = 0; c < R; c++) rb[c] = t[c * sw + b];
    }
}

/* planes <- the padded input channel x [ih, iw]. */
static void fill_planes(const pp_conv_plan *p, const dw_geo *g, const float *restrict x,
                        float *restrict pl, float *restrict tmp) {
    for (int64_t a = 0; a < p->sh; a++)
        for (int64_t r = 0; r < g->Hp; r++) {
            float *row0 = pl + a * p->sw * g->PS + r * g->R;
            int64_t iy = a + p->sh * r - p->ph;
            if (iy < 0 || iy >= p->ih) {
                for (int64_t b = 0; b < p->sw; b++)
                    memset(row0 + b * g->PS, 0, (size_t)g->R * sizeof(float));
                continue;
            }
            fill_row(p, g, x + iy * p->iw, row0, tmp);
        }
}

/* dx [ih, iw] <- the planes' entries at input positions (the adjoint of
 * fill_planes, which maps planes one-to-one onto padded positions); dx's
 * positions no plane covers were zeroed by the caller. */
static void unfill_planes(const pp_conv_plan *p, const dw_geo *g, const float *restrict pl,
                          float *restrict dx) {
    for (int64_t a = 0; a < p->sh; a++)
        for (int64_t b = 0; b < p->sw; b++) {
            const float *base = pl + (a * p->sw + b) * g->PS;
            int64_t lo, hi;
            col_range(p, g, b, &lo, &hi);
            if (lo >= hi) continue;
            for (int64_t r = 0; r < g->Hp; r++) {
                int64_t iy = a + p->sh * r - p->ph;
                if (iy < 0 || iy >= p->ih) continue;
                const float *row = base + r * g->R;
                float *xr = dx + iy * p->iw + b - p->pw;
                if (p->sw == 1) memcpy(xr + lo, row + lo, (size_t)(hi - lo) * sizeof(float));
                else
                    for (int64_t c = lo; c < hi; c++) xr[c * p->sw] = row[c];
            }
        }
}

PP_VINLINE void v_scale(float *restrict y, const float *restrict x, float a, int64_t n) {
    PP_VFOR(i, n, y[i] = a * x[i];);
}

PP_VINLINE void v_axpy(float *restrict y, const float *restrict x, float a, int64_t n) {
    PP_VFOR(i, n, y[i] += a * x[i];);
}

PP_VINLINE void v_fma(float *restrict y, const float *restrict x, float a, int64_t n) {
    PP_VFOR(i, n, y[i] = fmaf(a, x[i], y[i]););
}

/* acc[0, span) = sum over taps t of w[t] * pl[off[t] + p]. */
PP_VEC_CLONES static void dw_taps_forward(const float *restrict pl, const int64_t *off,
                                          const float *restrict w, int64_t ntaps, int64_t span,
                                          float *restrict acc) {
    v_scale(acc, pl + off[0], w[0], span);
    for (int64_t t = 1; t < ntaps; t++) v_fma(acc, pl + off[t], w[t], span);
}

/* pl[off[t] + p] += w[t] * dy[p] for every tap t. */
PP_VEC_CLONES static void dw_taps_adjoint(float *restrict pl, const int64_t *off,
                                          const float *restrict w, int64_t ntaps, int64_t span,
                                          const float *restrict dy) {
    for (int64_t t = 0; t < ntaps; t++) v_axpy(pl + off[t], dy, w[t], span);
}

/* For every tap t, lanes[t][k] += the products pl[off[t] + p] * dy[p] of the
 * blocks p = 16*b + k, and lanes[t][16] += those of the tail: the sums stay
 * split over the whole batch and are reduced once (dw_lanes_reduce). */
PP_VEC_CLONES static void dw_taps_filter(const float *restrict pl, const int64_t *off,
                                         const float *restrict dy, int64_t ntaps, int64_t span,
                                         float *restrict lanes) {
    for (int64_t t = 0; t < ntaps; t++) {
        const float *restrict a = pl + off[t];
        float *restrict acc = lanes + t * (PP_VEC_BLOCK + 1);
        int64_t i = 0;
        for (; i + PP_VEC_BLOCK <= span; i += PP_VEC_BLOCK)
            for (int j = 0; j < PP_VEC_BLOCK; j++) acc[j] += a[i + j] * dy[i + j];
        float s = 0;
        for (; i < span; i++) s += a[i] * dy[i];
        acc[PP_VEC_BLOCK] += s;
    }
}

static void dw_lanes_reduce(const float *lanes, int64_t ntaps, float *dw) {
    for (int64_t t = 0; t < ntaps; t++) {
        const float *acc = lanes + t * (PP_VEC_BLOCK + 1);
        float s = 0;
        for (int j = 0; j < PP_VEC_BLOCK; j++) s += acc[j];
        dw[t] = s + acc[PP_VEC_BLOCK];
    }
}

/* buf (row stride R, zero in the columns ox >= ow) <- dy [oh, ow]. */
static void spread_rows(const pp_conv_plan *p, const dw_geo *g, const float *restrict dy,
                        float *restrict buf) {
    for (int64_t oy = 0; oy < p->oh; oy++) {
        memcpy(buf + oy * g->R, dy + oy * p->ow, (size_t)p->ow * sizeof(float));
        if (oy + 1 < p->oh) memset(buf + oy * g->R + p->ow, 0, (size_t)(g->R - p->ow) * sizeof(float));
    }
}

/* Scratch: the planes, one padded input row (sw*R) and, when R != ow, one
 * channel of row stride R. */
static pp_status dw_scratch(const pp_kernel_ctx *ctx, const pp_conv_plan *p, const dw_geo *g,
                            float **pl, float **tmp, float **rowbuf) {
    size_t extra = g->R != p->ow ? (size_t)g->span : 0, row = (size_t)(p->sw * g->R);
    *pl = malloc(((size_t)g->nbuf + row + extra) * sizeof(float) + 1);
    if (!*pl) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory for the depthwise planes");
    *tmp = *pl + g->nbuf;
    *rowbuf = extra ? *tmp + row : NULL;
    return PP_OK;
}

pp_status pp_conv_dw_forward(const pp_kernel_ctx *ctx, const pp_conv_plan *p, const float *xd,
                             const float *wd, float *yd) {
    dw_geo g;
    int64_t off[DW_TAPS_MAX], nt = p->kh * p->kw;
    if (!dw_geometry(p, &g)) return pp_kernel_error(ctx, PP_ERR_INTERNAL, "depthwise geometry");
    tap_offsets(p, &g, off);
    float *pl, *tmp, *acc;
    PP_TRY(dw_scratch(ctx, p, &g, &pl, &tmp, &acc));
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t c = 0; c < p->C; c++) {
            fill_planes(p, &g, xd + (n * p->C + c) * p->IL, pl, tmp);
            for (int64_t j = 0; j < p->Mg; j++) {
                int64_t m = c * p->Mg + j;
                float *y = yd + (n * p->M + m) * p->L;
                dw_taps_forward(pl, off, wd + m * nt, nt, g.span, acc ? acc : y);
                if (acc)
                    for (int64_t oy = 0; oy < p->oh; oy++)
                        memcpy(y + oy * p->ow, acc + oy * g.R, (size_t)p->ow * sizeof(float));
            }
        }
    free(pl);
    return PP_OK;
}

pp_status pp_conv_dw_backward_data(const pp_kernel_ctx *ctx, const pp_conv_plan *p,
                                   const float *dyd, const float *wd, float *dxd) {
    dw_geo g;
    int64_t off[DW_TAPS_MAX], nt = p->kh * p->kw;
    if (!dw_geometry(p, &g)) return pp_kernel_error(ctx, PP_ERR_INTERNAL, "depthwise geometry");
    tap_offsets(p, &g, off);
    float *pl, *tmp, *buf;
    PP_TRY(dw_scratch(ctx, p, &g, &pl, &tmp, &buf));
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t c = 0; c < p->C; c++) {
            memset(pl, 0, (size_t)g.nbuf * sizeof(float));
            for (int64_t j = 0; j < p->Mg; j++) {
                int64_t m = c * p->Mg + j;
                const float *dy = dyd + (n * p->M + m) * p->L;
                if (buf) {
                    spread_rows(p, &g, dy, buf);
                    dy = buf;
                }
                dw_taps_adjoint(pl, off, wd + m * nt, nt, g.span, dy);
            }
            unfill_planes(p, &g, pl, dxd + (n * p->C + c) * p->IL);
        }
    free(pl);
    return PP_OK;
}

pp_status pp_conv_dw_backward_filter(const pp_kernel_ctx *ctx, const pp_conv_plan *p,
                                     const float *dyd, const float *xd, float *dwd) {
    dw_geo g;
    int64_t off[DW_TAPS_MAX], nt = p->kh * p->kw;
    if (!dw_geometry(p, &g)) return pp_kernel_error(ctx, PP_ERR_INTERNAL, "depthwise geometry");
    tap_offsets(p, &g, off);
    float *pl, *tmp, *buf;
    PP_TRY(dw_scratch(ctx, p, &g, &pl, &tmp, &buf));
    /* Mg * nt <= 16 * 1024 sets of 17 lanes */
    size_t nl = (size_t)(p->Mg * nt * (PP_VEC_BLOCK + 1));
    float *lanes = malloc(nl * sizeof(float));
    if (!lanes) {
        free(pl);
        return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory for the depthwise sums");
    }
    for (int64_t c = 0; c < p->C; c++) {
        memset(lanes, 0, nl * sizeof(float));
        for (int64_t n = 0; n < p->N; n++) {
            fill_planes(p, &g, xd + (n * p->C + c) * p->IL, pl, tmp);
            for (int64_t j = 0; j < p->Mg; j++) {
                const float *dy = dyd + (n * p->M + c * p->Mg + j) * p->L;
                if (buf) {
                    spread_rows(p, &g, dy, buf);
                    dy = buf;
                }
                dw_taps_filter(pl, off, dy, nt, g.span, lanes + j * nt * (PP_VEC_BLOCK + 1));
            }
        }
        for (int64_t j = 0; j < p->Mg; j++)
            dw_lanes_reduce(lanes + j * nt * (PP_VEC_BLOCK + 1), nt, dwd + (c * p->Mg + j) * nt);
    }
    free(lanes);
    free(pl);
    return PP_OK;
}
