/* The simulator's cost model and its "F=1,I=1,W=1,c=0" text form. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pippin/sched_sim.h"

#include "status_internal.h"
pp_status pp_cost_model_new(int nstages, pp_cost_model **out) {
    *out = NULL;
    if (nstages < 1 || nstages > PP_SCHED_MAX_STAGES)
        return pp_error(PP_ERR_INVALID, "cost model: %d stages", nstages);
    pp_cost_model *c = calloc(1, sizeof *c);
    if (!c) return pp_error(PP_ERR_NOMEM, "cost model: out of memory");
    size_t n = (size_t)nstages;
    c->nstages = nstages;
    c->f = malloc(n * sizeof(double));
    c->i = malloc(n * sizeof(double));
    c->w = malloc(n * sizeof(double));
    c->edge_bytes = calloc(n, sizeof(double));
    c->stash_bytes = calloc(n, sizeof(double));
    c->wstash_bytes = calloc(n, sizeof(double));
    c->recompute = calloc(n, 1);
    c->input_bytes = malloc(n * sizeof(double));
    if (!c->f || !c->i || !c->w || !c->edge_bytes || !c->stash_bytes || !c->wstash_bytes ||
        !c->recompute || !c->input_bytes) {
        pp_cost_model_free(c);
        return pp_error(PP_ERR_NOMEM, "cost model: out of memory");
    }
    for (size_t k = 0; k < n; k++) {
        c->f[k] = c->i[k] = c->w[k] = 1.0;
        c->input_bytes[k] = -1.0; /* the edge before it */
    }
    *out = c;
    return PP_OK;
}

void pp_cost_model_free(pp_cost_model *c) {
    if (!c) return;
    free(c->f);
    free(c->i);
    free(c->w);
    free(c->edge_bytes);
    free(c->stash_bytes);
    free(c->wstash_bytes);
    free(c->recompute);
    free(c->input_bytes);
    free(c);
}

double pp_cost_model_xfer(const pp_cost_model *c, int s) {
    double t = c->latency;
    if (c->bandwidth > 0 && c->edge_bytes && s >= 0 && s < c->nstages)
        t += c->edge_bytes[s] / c->bandwidth;
    return t;
}

static int recomputes(const pp_cost_model *c, int s) {
    return c->recompute && s >= 0 && s < c->nstages && c->recompute[s];
}

double pp_cost_model_backward_input(const pp_cost_model *c, int s) {
    if (s < 0 || s >= c->nstages) return 0.0;
    return c->i[s] + (recomputes(c, s) ? c->f[s] : 0.0);
}

static double input_bytes(const pp_cost_model *c, int s) {
    if (c->input_bytes && c->input_bytes[s] >= 0) return c->input_bytes[s];
    return s > 0 && c->edge_bytes ? c->edge_bytes[s - 1] : 0.0;
}

double pp_cost_model_stash(const pp_cost_model *c, int s) {
    if (s < 0 || s >= c->nstages) return 0.0;
    if (recomputes(c, s)) return input_bytes(c, s);
    return c->stash_bytes ? c->stash_bytes[s] : 0.0;
}

double pp_cost_model_recompute_extra(const pp_cost_model *c, int s) {
    if (!recomputes(c, s)) return 0.0;
    double full = c->stash_bytes ? c->stash_bytes[s] : 0.0, in = input_bytes(c, s);
    return full > in ? full - in : 0.0;
}

/* Parses "v" or "v1:v2:...:vS" into dst[nstages]. */
static pp_status parse_values(const char *key, const char *v, size_t len, int nstages,
                              double *dst, int scalar) {
    double vals[1];
    int count = 0;
    const char *p = v, *end = v + len;
    /* Count first so a wrong length is reported before anything is written. */
    for (const char *q = p; q < end; q++) count += *q == ':';
    count++;
    if (scalar && count != 1)
        return pp_error(PP_ERR_INVALID, "cost '%s': takes one value, not a per-stage list", key);
    if (count != 1 && count != nstages)
        return pp_error(PP_ERR_INVALID, "cost '%s': %d values for %d stages (give 1 or %d)", key,
                        count, nstages, nstages);
    for (int k = 0; k < count; k++) {
        const char *colon = memchr(p, ':', (size_t)(end - p));
        const char *stop = colon ? colon : end;
        char num[64];
        size_t n = (size_t)(stop - p);
        if (n == 0 || n >= sizeof num)
            return pp_error(PP_ERR_INVALID, "cost '%s': value %d is %s", key, k + 1,
                            n ? "too long" : "empty");
        memcpy(num, p, n);
        num[n] = '\0';
        char *e;
        errno = 0;
        double x = strtod(num, &e);
        if (*e || errno || !isfinite(x) || x < 0)
            return pp_error(PP_ERR_INVALID, "cost '%s': '%s' is not a non-negative number", key,
                            num);
        if (count == 1) {
            vals[0] = x;
            for (int st = 0; st < nstages; st++) dst[st] = vals[0];
        } else {
            dst[k] = x;
        }
        p = stop + 1;
    }
    return PP_OK;
}

pp_status pp_cost_model_parse(const char *spec, int nstages, pp_cost_model **out) {
    *out = NULL;
    pp_cost_model *c;
    PP_TRY(pp_cost_model_new(nstages, &c));
    size_t n = (size_t)nstages;
    double *b = malloc(n * sizeof *b);
    if (!b) {
        pp_cost_model_free(c);
        return pp_error(PP_ERR_NOMEM, "cost model: out of memory");
    }
    int have_i = 0, have_w = 0, have_b = 0;
    pp_status st = PP_OK;
    const char *p = spec, *end = spec + strlen(spec);
    while (p < end && st == PP_OK) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        char key[16];
        size_t kl = eq ? (size_t)(eq - p) : 0;
        if (!eq || kl == 0 || kl >= sizeof key) {
            st = pp_error(PP_ERR_INVALID, "cost: expected key=value, got '%.*s'",
                          (int)(stop - p), p);
            break;
        }
        memcpy(key, p, kl);
        key[kl] = '\0';
        const char *v = eq + 1;
        size_t vl = (size_t)(stop - v);
        double lat = 0;
        if (!strcmp(key, "F") || !strcmp(key, "f")) {
            st = parse_values(key, v, vl, nstages, c->f, 0);
        } else if (!strcmp(key, "I") || !strcmp(key, "i")) {
            st = parse_values(key, v, vl, nstages, c->i, 0);
            have_i = 1;
        } else if (!strcmp(key, "W") || !strcmp(key, "w")) {
            st = parse_values(key, v, vl, nstages, c->w, 0);
            have_w = 1;
        } else if (!strcmp(key, "B") || !strcmp(key, "b")) {
            st = parse_values(key, v, vl, nstages, b, 0);
            have_b = 1;
        } else if (!strcmp(key, "c") || !strcasecmp(key, "latency")) {
            st = parse_values(key, v, vl, 1, &lat, 1);
            c->latency = lat;
        } else if (!strcmp(key, "bw") || !strcasecmp(key, "bandwidth")) {
            st = parse_values(key, v, vl, 1, &lat, 1);
            c->bandwidth = lat;
        } else if (!strcmp(key, "bytes")) {
            st = parse_values(key, v, vl, nstages, c->edge_bytes, 0);
        } else if (!strcmp(key, "mem")) {
            st = parse_values(key, v, vl, nstages, c->stash_bytes, 0);
        } else if (!strcmp(key, "wmem")) {
            st = parse_values(key, v, vl, nstages, c->wstash_bytes, 0);
        } else if (!strcmp(key, "in")) {
            st = parse_values(key, v, vl, nstages, c->input_bytes, 0);
        } else if (!strcmp(key, "rc") || !strcmp(key, "recompute")) {
            double *flags = malloc(n * sizeof *flags); /* b may hold B's values */
            st = flags ? parse_values(key, v, vl, nstages, flags, 0)
                       : pp_error(PP_ERR_NOMEM, "cost model: out of memory");
            for (size_t k = 0; k < n && st == PP_OK; k++) {
                if (flags[k] != 0 && flags[k] != 1)
                    st = pp_error(PP_ERR_INVALID, "cost '%s': stage %zu: %g is not 0 or 1", key,
                                  k, flags[k]);
                else
                    c->recompute[k] = flags[k] == 1;
            }
            free(flags);
        } else {
            st = pp_error(PP_ERR_INVALID,
                          "cost: unknown key '%s' (F, I, W, B, c, bw, bytes, mem, wmem, rc, in)",
                          key);
        }
        p = stop + 1;
    }
    if (st == PP_OK && have_b) {
        if (have_i && have_w) {
            st = pp_error(PP_ERR_INVALID, "cost: give B or I and W, not all three");
        } else {
            for (size_t k = 0; k < n && st == PP_OK; k++) {
                if (have_w)
                    c->i[k] = b[k] - c->w[k];
                else if (have_i)
                    c->w[k] = b[k] - c->i[k];
                else
                    c->i[k] = c->w[k] = b[k] / 2;
                if (c->i[k] < 0 || c->w[k] < 0)
                    st = pp_error(PP_ERR_INVALID, "cost: stage %zu: B is smaller than %s", k,
                                  have_w ? "W" : "I");
            }
        }
    }
    free(b);
    if (st != PP_OK) {
        pp_cost_model_free(c);
        return st;
    }
    *out = c;
    return PP_OK;
}
