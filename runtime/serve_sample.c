/* Next-token choice (serve_sample.h). */
#include "serve_sample.h"

#include <math.h>
#include <stdlib.h>

#include "status_internal.h"

/* splitmix64: small, fast, and the same sequence everywhere */
static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct scored {
    float v;
    int64_t i;
} scored;

static int by_value_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->i < y->i ? -1 : x->i > y->i; /* ties: the lower id first, as greedy picks */
}

pp_status pp_sample_token(const float *logits, int64_t n, float temperature, uint32_t top_k, uint64_t *rng,
                          int64_t *token) {
    if (n < 1) return pp_error(PP_ERR_INVALID, "no logits to choose a token from");
    for (int64_t i = 0; i < n; i++)
        if (isnan(logits[i])) return pp_error(PP_ERR_INVALID, "the model's logits hold NaN (token %lld)", (long long)i);
    if (temperature == 0.0f || top_k == 1) {
        int64_t best = 0;
        for (int64_t i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        if (isinf(logits[best]) && logits[best] < 0)
            return pp_error(PP_ERR_INVALID, "the model's logits are all -inf: no token to choose");
        *token = best;
        return PP_OK;
    }
    scored *s = malloc(sizeof *s * (size_t)n);
    if (!s) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) s[i].v = logits[i], s[i].i = i;
    qsort(s, (size_t)n, sizeof *s, by_value_desc);
    int64_t k = top_k && (int64_t)top_k < n ? (int64_t)top_k : n;
    if (isinf(s[0].v)) { /* +inf: certain (the first such token); all -inf: nothing to draw from */
        int64_t best = s[0].i;
        free(s);
        if (logits[best] < 0) return pp_error(PP_ERR_INVALID, "the model's logits are all -inf: no token to choose");
        *token = best;
        return PP_OK;
    }
    double total = 0;
    for (int64_t i = 0; i < k; i++) total += exp(((double)s[i].v - (double)s[0].v) / (double)temperature);
    double u = (double)(next_u64(rng) >> 11) * (1.0 / 9007199254740992.0) * total; /* [0, total) */
    int64_t pick = k - 1;
    for (int64_t i = 0; i < k; i++) {
        u -= exp(((double)s[i].v - (double)s[0].v) / (double)temperature);
        if (u < 0) {
            pick = i;
            break;
        }
    }
    *token = s[pick].i;
    free(s);
    return PP_OK;
}
