/* Helpers for the schedule tests (header-only). */
#ifndef PIPPIN_TEST_SCHED_UTIL_H
#define PIPPIN_TEST_SCHED_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "pippin/sched_sim.h"
#include "pippin/schedule.h"

/* Rank r's actions (compute only when compute_only) joined by spaces. */
static inline void rank_str(const pp_schedule *s, int r, int compute_only, char *out, size_t n) {
    size_t used = 0;
    out[0] = '\0';
    for (size_t k = 0; k < s->len[r]; k++) {
        const pp_action *a = &s->acts[r][k];
        if (a->kind == PP_ACT_IDLE) continue;
        if (compute_only && !pp_act_is_compute((pp_act_kind)a->kind)) continue;
        char b[PP_ACTION_STR_MAX];
        pp_action_format(s, a, b, sizeof b);
        int w = snprintf(out + used, n - used, "%s%s", used ? " " : "", b);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

static inline pp_schedule *gen(pp_sched_kind kind, int p, int m, int spr) {
    pp_sched_params pr = {0};
    pr.kind = kind;
    pr.nranks = p;
    pr.nmb = m;
    pr.stages_per_rank = spr;
    pp_schedule *s = NULL;
    pp_status st = pp_schedule_generate(&pr, &s);
    if (st != PP_OK) fail_msg("generate %s p=%d m=%d spr=%d: %s", pp_sched_kind_name(kind), p, m,
                              spr, pp_last_error());
    return s;
}

static inline pp_cost_model *uniform_costs(int nstages, double f, double i, double w,
                                           double c) {
    pp_cost_model *cm;
    assert_int_equal(pp_cost_model_new(nstages, &cm), PP_OK);
    for (int k = 0; k < nstages; k++) {
        cm->f[k] = f;
        cm->i[k] = i;
        cm->w[k] = w;
    }
    cm->latency = c;
    return cm;
}

static inline pp_sim_result *sim(const pp_schedule *s, const pp_cost_model *c) {
    pp_sim_result *r = NULL;
    if (pp_simulate(s, c, NULL, &r) != PP_OK) fail_msg("simulate: %s", pp_last_error());
    return r;
}

static inline pp_schedule *parse_csv(const char *text) {
    pp_schedule *s = NULL;
    if (pp_schedule_parse_csv(text, strlen(text), "test.csv", &s) != PP_OK)
        fail_msg("parse: %s", pp_last_error());
    return s;
}

#define assert_contains(hay, needle)                                             \
    do {                                                                         \
        const char *h_ = (hay), *n_ = (needle);                                  \
        if (!h_ || !strstr(h_, n_)) fail_msg("'%s' not found in '%s'", n_, h_ ? h_ : "(null)"); \
    } while (0)

#define assert_near(a, b)                                                        \
    do {                                                                         \
        double a_ = (a), b_ = (b);                                               \
        if (!(a_ - b_ < 1e-6 * (1 + (b_ < 0 ? -b_ : b_)) &&                      \
              b_ - a_ < 1e-6 * (1 + (b_ < 0 ? -b_ : b_))))                       \
            fail_msg("%s = %.9g, expected %.9g", #a, a_, b_);                   \
    } while (0)

#endif
