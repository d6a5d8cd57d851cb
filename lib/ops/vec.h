/* Internal: helpers for CPU kernels that gcc -O2 vectorises.
 *
 * At -O2 gcc 12 uses the "very cheap" vectoriser cost model, which only
 * vectorises a loop whose trip count is a known multiple of the vector width.
 * PP_VFOR therefore runs the body in fixed blocks of PP_VEC_BLOCK and then a
 * scalar tail. Pointers inside the body must be restrict-qualified, since the
 * cheap model adds no runtime alias checks either.
 *
 * Including this header also turns off -ftrapping-math and -fmath-errno for
 * the rest of the including file: with the first, gcc refuses to if-convert
 * float selects (x < 0 ? 0 : x); with the second, sqrtf stays a call that may
 * set errno; either leaves a loop scalar. No kernel reads the floating-point
 * exception flags or errno, so nothing observable changes. */
#ifndef PIPPIN_OPS_VEC_H
#define PIPPIN_OPS_VEC_H

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#define PP_VEC_BLOCK 16

/* Hot loops are compiled three times, for x86-64-v4 (AVX-512), x86-64-v3
 * (AVX2) and the baseline, and the loader picks one (ifunc) on the machine
 * at hand (v4: twice the lanes per instruction where the FMA and ALU units
 * are 512 bits wide, as on AMD Zen 5). gcc does not inline a baseline
 * function into a clone, so every helper such a loop calls must be
 * PP_VINLINE. No FMA contraction happens in ISO C mode, and the blocked
 * reductions fix their order in the source, so every version gives
 * bit-identical results. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define PP_VEC_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PP_VEC_CLONES
#endif
#define PP_VINLINE static inline __attribute__((always_inline))

/* for (int64_t i = 0; i < n; i++) BODY, in vectorisable blocks. */
#define PP_VFOR(i, n, ...)                                              \
    do {                                                                \
        int64_t pp_vn_ = (n), pp_vb_ = 0;                               \
        for (; pp_vb_ + PP_VEC_BLOCK <= pp_vn_; pp_vb_ += PP_VEC_BLOCK) \
            for (int pp_vj_ = 0; pp_vj_ < PP_VEC_BLOCK; pp_vj_++) {     \
                const int64_t i = pp_vb_ + pp_vj_;                      \
                __VA_ARGS__                                             \
            }                                                           \
        for (int64_t i = pp_vb_; i < pp_vn_; i++) { __VA_ARGS__ }       \
    } while (0)

/* expf with a relative error below 1e-7 over the whole range (denormal
 * results, +-inf and NaN included), written without calls or branches so a
 * loop over it vectorises. Cephes polynomial. The clamp to [-104, 88.8]
 * leaves 2^n in [2^-150, 2^128], applied in two halves so that each is a
 * normal float: past 88.72 the product overflows to inf and below -103.97 it
 * rounds to 0 on its own. */
PP_VINLINE float pp_vexpf(float x) {
    float xc = x > -104.0f ? x : -104.0f; /* NaN goes to -104 here ... */
    xc = xc < 88.8f ? xc : 88.8f;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (xc * 1.44269504088896341f + magic) - magic;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    uint32_t e1 = (uint32_t)(n1 + 127) << 23, e2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &e1, sizeof s1);
    memcpy(&s2, &e2, sizeof s2);
    float y = (p * s1) * s2;
    return x != x ? x : y; /* ... and comes back here */
}

/* tanhf to about 4e-7 absolute / relative error: Eigen's rational
 * approximation (generic_fast_tanh_float), which saturates at |x| ~ 8. */
PP_VINLINE float pp_vtanhf(float x) {
    const float clamp = 7.99881172180175781f;
    float xc = x < -clamp ? -clamp : (x > clamp ? clamp : x);
    float x2 = xc * xc;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    p = p * xc;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    float y = p / q;
    /* Tiny inputs return themselves (keeps -0 and denormals exact); beyond
     * 9, tanhf rounds to exactly +-1. */
    y = (x < 0.0004f && x > -0.0004f) ? x : y;
    y = x > 9.0f ? 1.0f : (x < -9.0f ? -1.0f : y);
    return x != x ? x : y;
}

/* erff to about 5e-7 error: Eigen's rational approximation
 * (generic_fast_erf_float), which saturates at |x| = 4. */
PP_VINLINE float pp_verff(float x) {
    float xc = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
    float x2 = xc * xc;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    p = p * xc;
    float q = -1.45660718464996e-05f;
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    float y = p / q;
    return x != x ? x : y;
}

#endif
