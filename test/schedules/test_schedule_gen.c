/* Schedule generators: torch's orders, 1F1B on every rank, the paper's
 * hand schedules, constraints, and the auto scheduler. */
#include "sched_test_util.h"
#include "torch_ref.h"

#include "test_filter.h"
static void test_torch_orders(void **state) {
    (void)state;
    char buf[8192];
    for (size_t c = 0; c < sizeof ref_cases / sizeof ref_cases[0]; c++) {
        const ref_case *rc = &ref_cases[c];
        pp_sched_kind k;
        assert_int_equal(pp_sched_kind_parse(rc->kind, &k), PP_OK);
        pp_schedule *s = gen(k, rc->p, rc->m, rc->spr);
        assert_int_equal(s->nranks, rc->p);
        for (int r = 0; r < rc->p; r++) {
            rank_str(s, r, 1, buf, sizeof buf);
            if (strcmp(buf, rc->ranks[r]) != 0)
                fail_msg("%s p=%d m=%d spr=%d rank %d:\n got  %s\n want %s", rc->kind, rc->p,
                         rc->m, rc->spr, r, buf, rc->ranks[r]);
        }
        assert_int_equal(pp_schedule_validate(s, NULL), PP_OK);
        pp_schedule_free(s);
    }
}

/* 1F1B by hand for p=4, m=6, and by rule for many sizes. */
static void test_1f1b_every_rank(void **state) {
    (void)state;
    static const char *want[4] = {
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5",
    };
    char buf[4096];
    pp_schedule *s = gen(PP_SCHED_1F1B, 4, 6, 0);
    for (int r = 0; r < 4; r++) {
        rank_str(s, r, 1, buf, sizeof buf);
        assert_string_equal(buf, want[r]);
    }
    pp_schedule_free(s);
    for (int p = 1; p <= 7; p++)
        for (int m = 1; m <= 10; m++) {
            s = gen(PP_SCHED_1F1B, p, m, 0);
            for (int r = 0; r < p; r++) {
                int warm = p - r - 1 < m ? p - r - 1 : m, f = 0, b = 0;
                const pp_action *a = s->acts[r];
                assert_int_equal(s->len[r], 2 * (size_t)m);
                size_t k = 0;
                for (; k < (size_t)warm; k++) assert_true(a[k].kind == PP_ACT_F && a[k].mb == f++);
                while (f < m) {
                    assert_true(a[k].kind == PP_ACT_F && a[k].mb == f++);
                    k++;
                    assert_true(a[k].kind == PP_ACT_B && a[k].mb == b++);
                    k++;
                }
                for (; k < s->len[r]; k++) assert_true(a[k].kind == PP_ACT_B && a[k].mb == b++);
                assert_int_equal(b, m);
            }
            assert_int_equal(pp_schedule_validate(s, NULL), PP_OK);
            pp_schedule_free(s);
        }
}

/* ZB-H1 is torch's InterleavedZeroBubble with one stage per rank; the
 * last rank defers its first p-1 W. */
static void test_zb_h1(void **state) {
    (void)state;
    char a[4096], b[4096];
    pp_schedule *h1 = gen(PP_SCHED_ZB_H1, 4, 8, 0);
    pp_schedule *iz = gen(PP_SCHED_INTERLEAVED_ZB, 4, 8, 1);
    for (int r = 0; r < 4; r++) {
        rank_str(h1, r, 1, a, sizeof a);
        rank_str(iz, r, 1, b, sizeof b);
        assert_string_equal(a, b);
    }
    rank_str(h1, 3, 1, a, sizeof a);
    assert_string_equal(a, "3F0 3I0 3F1 3I1 3F2 3I2 3F3 3I3 3W0 3F4 3I4 3W1 3F5 3I5 3W2 3F6 3I6 "
                           "3W3 3F7 3I7 3W4 3W5 3W6 3W7");
    rank_str(h1, 0, 1, a, sizeof a);
    assert_string_equal(a, "0F0 0F1 0F2 0F3 0I0 0W0 0F4 0I1 0W1 0F5 0I2 0W2 0F6 0I3 0W3 0F7 "
                           "0I4 0W4 0I5 0W5 0I6 0W6 0I7 0W7");
    pp_schedule_free(h1);
    pp_schedule_free(iz);
}

/* ZB-H2: 2(p-r)-1 forwards before the first I, 2r W deferred. */
static void test_zb_h2(void **state) {
    (void)state;
    char a[4096];
    pp_schedule *s = gen(PP_SCHED_ZB_H2, 3, 6, 0);
    rank_str(s, 0, 1, a, sizeof a);
    assert_string_equal(a, "0F0 0F1 0F2 0F3 0F4 0I0 0W0 0F5 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4 "
                           "0I5 0W5");
    rank_str(s, 2, 1, a, sizeof a);
    assert_string_equal(a, "2F0 2I0 2F1 2I1 2F2 2I2 2F3 2I3 2F4 2I4 2W0 2F5 2I5 2W1 2W2 2W3 "
                           "2W4 2W5");
    assert_int_equal(pp_schedule_validate(s, NULL), PP_OK);
    pp_schedule_free(s);
}

static void expect_gen_error(pp_sched_kind k, int p, int m, int spr, const char *msg) {
    pp_sched_params pr = {0};
    pr.kind = k;
    pr.nranks = p;
    pr.nmb = m;
    pr.stages_per_rank = spr;
    pp_schedule *s = (pp_schedule *)1;
    assert_int_equal(pp_schedule_generate(&pr, &s), PP_ERR_INVALID);
    assert_null(s);
    assert_contains(pp_last_error(), msg);
}

static void test_constraints(void **state) {
    (void)state;
    expect_gen_error(PP_SCHED_ZBV, 4, 8, 3, "zbv requires exactly 2 stages per rank, but got 3");
    expect_gen_error(PP_SCHED_DUALPIPEV, 4, 8, 1,
                     "dualpipev requires exactly 2 stages per rank, but got 1");
    expect_gen_error(PP_SCHED_DUALPIPEV, 4, 7, 2, "at least as many microbatches as stages");
    expect_gen_error(PP_SCHED_INTERLEAVED_1F1B, 4, 10 + 1, 2, "multiple of the number of rounds");
    expect_gen_error(PP_SCHED_INTERLEAVED_ZB, 4, 9, 2, "multiple of the number of rounds");
    expect_gen_error(PP_SCHED_GPIPE, 4, 8, 2, "gpipe runs one stage per rank");
    expect_gen_error(PP_SCHED_1F1B, 0, 8, 1, "0 ranks");
    expect_gen_error(PP_SCHED_1F1B, 2, 0, 1, "0 microbatches");
    pp_sched_kind k;
    assert_int_equal(pp_sched_kind_parse("nope", &k), PP_ERR_INVALID);
    assert_contains(pp_last_error(), "unknown schedule kind 'nope'");
    static const struct {
        const char *name;
        pp_sched_kind kind;
    } names[] = {{"GPipe", PP_SCHED_GPIPE},
                 {"ScheduleInterleaved1F1B", PP_SCHED_INTERLEAVED_1F1B},
                 {"InterleavedZeroBubble", PP_SCHED_INTERLEAVED_ZB},
                 {"ZBVZeroBubble", PP_SCHED_ZBV},
                 {"dualpipev", PP_SCHED_DUALPIPEV},
                 {"zb_h2", PP_SCHED_ZB_H2},
                 {"looped-bfs", PP_SCHED_LOOPED_BFS}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        assert_int_equal(pp_sched_kind_parse(names[i].name, &k), PP_OK);
        assert_int_equal(k, names[i].kind);
    }
    for (int i = 0; i < PP_SCHED_KIND_COUNT; i++) {
        assert_int_equal(pp_sched_kind_parse(pp_sched_kind_name((pp_sched_kind)i), &k), PP_OK);
        assert_int_equal(k, i);
    }
}

/* Every kind over a grid of sizes validates, compute-only and lowered. */
static void test_all_valid(void **state) {
    (void)state;
    int n = 0;
    for (int k = 0; k < PP_SCHED_KIND_COUNT; k++)
        for (int p = 1; p <= 5; p++)
            for (int m = 1; m <= 11; m++)
                for (int spr = 1; spr <= 3; spr++) {
                    if (k == PP_SCHED_AUTO && (p > 4 || m > 6)) continue;
                    pp_sched_params pr = {0};
                    pr.kind = (pp_sched_kind)k;
                    pr.nranks = p;
                    pr.nmb = m;
                    pr.stages_per_rank = spr;
                    pp_schedule *s, *l;
                    if (pp_schedule_generate(&pr, &s) != PP_OK) continue;
                    n++;
                    if (pp_schedule_validate(s, NULL) != PP_OK)
                        fail_msg("%s p=%d m=%d spr=%d: %s", pp_sched_kind_name((pp_sched_kind)k), p,
                                 m, spr, pp_last_error());
                    assert_int_equal(pp_schedule_lower(s, PP_LOWER_COMMS | PP_LOWER_REDUCE_GRAD, &l),
                                     PP_OK);
                    if (pp_schedule_validate(l, NULL) != PP_OK)
                        fail_msg("lowered %s p=%d m=%d spr=%d: %s",
                                 pp_sched_kind_name((pp_sched_kind)k), p, m, spr, pp_last_error());
                    pp_schedule_free(l);
                    pp_schedule_free(s);
                }
    assert_true(n > 600);
}

static pp_schedule *gen_auto(int p, int m, pp_cost_model *cm, double cap, double wf,
                             pp_sched_objective obj, unsigned search) {
    pp_sched_params pr = {0};
    pr.kind = PP_SCHED_AUTO;
    pr.nranks = p;
    pr.nmb = m;
    pr.costs = cm;
    pr.mem_cap = cap;
    pr.w_frac = wf;
    pr.objective = obj;
    pr.auto_search = search;
    pp_schedule *s = NULL;
    if (pp_schedule_generate(&pr, &s) != PP_OK) fail_msg("auto: %s", pp_last_error());
    return s;
}

/* Peak of activations + w_frac * pending W, from a simulation with those
 * as bytes. */
static double peak_units(const pp_schedule *s, const pp_cost_model *cm, double wf) {
    pp_cost_model *c2;
    assert_int_equal(pp_cost_model_new(s->nstages, &c2), PP_OK);
    for (int k = 0; k < s->nstages; k++) {
        c2->f[k] = cm->f[k];
        c2->i[k] = cm->i[k];
        c2->w[k] = cm->w[k];
        c2->stash_bytes[k] = 1;
        c2->wstash_bytes[k] = wf;
    }
    c2->latency = cm->latency;
    pp_sim_result *r = sim(s, c2);
    double peak = 0;
    for (int j = 0; j < r->nranks; j++)
        if (r->peak_bytes[j] > peak) peak = r->peak_bytes[j];
    pp_sim_result_free(r);
    pp_cost_model_free(c2);
    return peak;
}

static double makespan_of(const pp_schedule *s, const pp_cost_model *cm) {
    pp_sim_result *r = sim(s, cm);
    double t = r->makespan;
    pp_sim_result_free(r);
    return t;
}

static void test_auto(void **state) {
    (void)state;
    static const struct {
        int p, m;
        double f, i, w, c, cap, wf;
    } cases[] = {
        {4, 8, 1, 1, 1, 0, 8, 0},         {4, 8, 1, 1, 1, 0, 4, 0},
        {4, 12, 2, 2, 1, 0.3, 6, 0.5},    {6, 12, 18522, 18086, 9337, 601, 12, 0.366},
        {3, 3, 1, 2, 1, 0, 2, 0},         {5, 10, 1, 1.5, 0.5, 0.2, 10, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        pp_cost_model *cm = uniform_costs(cases[k].p, cases[k].f, cases[k].i, cases[k].w,
                                          cases[k].c);
        pp_schedule *a = gen_auto(cases[k].p, cases[k].m, cm, cases[k].cap, cases[k].wf,
                                  PP_OBJ_MAKESPAN, 0);
        assert_int_equal(pp_schedule_validate(a, NULL), PP_OK);
        assert_true(peak_units(a, cm, cases[k].wf) <= cases[k].cap + 1e-9);
        double ta = makespan_of(a, cm);
        /* Never worse than the paper's heuristic alone, nor than 1F1B. */
        pp_schedule *h = gen_auto(cases[k].p, cases[k].m, cm, cases[k].cap, cases[k].wf,
                                  PP_OBJ_MAKESPAN, PP_AUTO_PAPER);
        pp_schedule *f = gen(PP_SCHED_1F1B, cases[k].p, cases[k].m, 0);
        assert_true(ta <= makespan_of(h, cm) + 1e-9);
        assert_true(ta <= makespan_of(f, cm) + 1e-9);
        if (cases[k].cap >= cases[k].p) {
            pp_schedule *z = gen(PP_SCHED_ZB_H1, cases[k].p, cases[k].m, 0);
            assert_true(ta <= makespan_of(z, cm) + 1e-9);
            pp_schedule_free(z);
        }
        pp_schedule_free(a);
        pp_schedule_free(h);
        pp_schedule_free(f);
        pp_cost_model_free(cm);
    }
}

/* At one of the paper's settings the search beats the paper's heuristic
 * (by its own measure, the longest per-rank span) and reaches the lower
 * bound on the makespan at the headline setting. */
static void test_auto_beats_heuristic(void **state) {
    (void)state;
    pp_cost_model *cm = uniform_costs(8, 29718, 29444, 19927, 527);
    double wf = 32.0 * 4096 / (34.0 * 4096 + 5.0 * 32 * 1024);
    pp_schedule *h = gen_auto(8, 24, cm, 16, wf, PP_OBJ_SPAN, PP_AUTO_PAPER);
    pp_schedule *a = gen_auto(8, 24, cm, 16, wf, PP_OBJ_SPAN, 0);
    pp_sim_result *rh = sim(h, cm), *ra = sim(a, cm);
    double sh = pp_sim_result_span(rh), sa = pp_sim_result_span(ra);
    double work = 24 * (29718.0 + 29444 + 19927);
    /* The paper publishes a ZB-2p bubble of 0.0029 here; its heuristic,
     * ported, gives the same. */
    assert_true(fabs((sh - work) / sh - 0.0029) < 0.00005);
    assert_true(sa < sh);
    pp_sim_result_free(rh);
    pp_sim_result_free(ra);
    pp_schedule_free(h);
    pp_schedule_free(a);
    pp_cost_model_free(cm);

    cm = uniform_costs(8, 18522, 18086, 9337, 601);
    wf = 32.0 * 2304 / (34.0 * 2304 + 5.0 * 24 * 1024);
    a = gen_auto(8, 24, cm, 16, wf, PP_OBJ_MAKESPAN, 0);
    /* (p-1)(F+c) + m(F+I+W): the last rank busy from its first input on. */
    assert_near(makespan_of(a, cm), 7 * (18522.0 + 601) + 24 * (18522.0 + 18086 + 9337));
    pp_schedule_free(a);
    pp_cost_model_free(cm);
}

static void test_auto_errors(void **state) {
    (void)state;
    pp_sched_params pr = {0};
    pr.kind = PP_SCHED_AUTO;
    pr.nranks = 4;
    pr.nmb = 8;
    pr.mem_cap = 0.5;
    pp_schedule *s;
    assert_int_equal(pp_schedule_generate(&pr, &s), PP_ERR_INVALID);
    assert_contains(pp_last_error(), "memory cap");
    pr.mem_cap = 4;
    pr.w_frac = 2;
    assert_int_equal(pp_schedule_generate(&pr, &s), PP_ERR_INVALID);
    assert_contains(pp_last_error(), "w_frac");
    pr.w_frac = 0;
    pp_cost_model *cm = uniform_costs(3, 1, 1, 1, 0);
    pr.costs = cm;
    assert_int_equal(pp_schedule_generate(&pr, &s), PP_ERR_INVALID);
    assert_contains(pp_last_error(), "cost model has 3 stages");
    pp_cost_model_free(cm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch_orders),    cmocka_unit_test(test_1f1b_every_rank),
        cmocka_unit_test(test_zb_h1),           cmocka_unit_test(test_zb_h2),
        cmocka_unit_test(test_constraints),     cmocka_unit_test(test_all_valid),
        cmocka_unit_test(test_auto),            cmocka_unit_test(test_auto_beats_heuristic),
        cmocka_unit_test(test_auto_errors),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
