/* Internal: the gate activations and elementwise steps of the LSTM/GRU
 * kernels, over arrays, in loops gcc vectorises (vec.h, pp_vexpf): sigmoid = 1 / (1 + exp(-x)), tanh = 1 - 2 / (exp(2x) + 1)
 * (an odd polynomial near 0, where that form would cancel). */
#ifndef PIPPIN_OPS_RNN_MATH_H
#define PIPPIN_OPS_RNN_MATH_H

#include "vec.h"

PP_VINLINE float pp_rnn_sigmoid(float x) { return 1.0f / (1.0f + pp_vexpf(-x)); }

PP_VINLINE float pp_rnn_tanh(float x) {
    float big = 1.0f - 2.0f / (pp_vexpf(2.0f * x) + 1.0f);
    float x2 = x * x;
    float small = x * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * -0.0539682540f)));
    return (x < 0.125f && x > -0.125f) ? small : big;
}

/* x[i] = sigmoid(x[i]) / tanh(x[i]), i < n. */
static PP_VEC_CLONES __attribute__((unused)) void pp_rnn_vsigmoid(float *restrict x, int64_t n) {
    PP_VFOR(i, n, x[i] = pp_rnn_sigmoid(x[i]););
}
static PP_VEC_CLONES __attribute__((unused)) void pp_rnn_vtanh(float *restrict x, int64_t n) {
    PP_VFOR(i, n, x[i] = pp_rnn_tanh(x[i]););
}

/* a[i] += b[i]; y[i] = a[i] * b[i]; the LSTM cell c[i] = f[i] * c[i] +
 * ig[i] * g[i], also into tc. (No FMA contraction in ISO C mode: the same
 * bits as the scalar loops.) */
static PP_VEC_CLONES __attribute__((unused)) void pp_rnn_vadd(float *restrict a,
                                                              const float *restrict b, int64_t n) {
    PP_VFOR(i, n, a[i] += b[i];);
}
static PP_VEC_CLONES __attribute__((unused)) void pp_rnn_vmul(float *restrict y,
                                                              const float *restrict a,
                                                              const float *restrict b, int64_t n) {
    PP_VFOR(i, n, y[i] = a[i] * b[i];);
}
static PP_VEC_CLONES __attribute__((unused)) void
pp_rnn_vcell(const float *restrict f, const float *restrict ig, const float *restrict g,
             float *restrict c, float *restrict tc, int64_t n) {
    PP_VFOR(i, n, float cn = f[i] * c[i] + ig[i] * g[i]; c[i] = cn; tc[i] = cn;);
}
/* The GRU state: h[i] = (1 - z[i]) * hh[i] + z[i] * h[i]. */
static PP_VEC_CLONES __attribute__((unused)) void pp_rnn_vgru_h(float *restrict h,
                                                                const float *restrict z,
                                                                const float *restrict hh, int64_t n) {
    PP_VFOR(i, n, h[i] = (1.0f - z[i]) * hh[i] + z[i] * h[i];);
}

#endif
