/* Balanced stages: the min-max partition equals brute force on small
 * random cost vectors (with cut costs and a memory cap); more stages than
 * items is refused with both counts; the same input gives the same cuts;
 * counted node costs are deterministic and put the uneven fixture's wide
 * layers in stages of their own; a plan's cuts split the model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/optimize.h"
#include "test_util.h"

#include "test_filter.h"

static double seg(const pp_balance_problem *pb, int a, int b) {
    double t = 0;
    for (int i = a; i < b; i++) t += pb->cost[i];
    if (pb->cut_cost && a > 0) t += pb->cut_cost[a];
    if (pb->cut_cost && b < pb->n) t += pb->cut_cost[b];
    return t;
}

static int fits(const pp_balance_problem *pb, int a, int b, int j, int parts) {
    if (pb->memory_cap <= 0) return 1;
    double p = 0, s = 0;
    for (int i = a; i < b; i++) p += pb->param_bytes[i], s += pb->stash_bytes[i];
    int m = pb->in_flight > 0 ? pb->in_flight : 1, held = parts - j < m ? parts - j : m;
    return p + s * held <= pb->memory_cap;
}

/* Every placement of parts-1 cuts among n-1 positions. */
static double brute(const pp_balance_problem *pb, int parts, int *cuts, int k, int from) {
    if (k == parts - 1) {
        double worst = 0;
        for (int j = 0; j < parts; j++) {
            int a = j ? cuts[j - 1] : 0, b = j + 1 < parts ? cuts[j] : pb->n;
            if (!fits(pb, a, b, j, parts)) return INFINITY;
            double c = seg(pb, a, b);
            if (c > worst) worst = c;
        }
        return worst;
    }
    double best = INFINITY;
    for (int c = from; c <= pb->n - (parts - 1 - k); c++) {
        cuts[k] = c;
        double v = brute(pb, parts, cuts, k + 1, c + 1);
        if (v < best) best = v;
    }
    return best;
}

static void test_partition_matches_brute_force(void **state) {
    (void)state;
    srand(12345);
    double cost[10], cut[11], par[10], st[10];
    int starts[10], cuts[10];
    for (int trial = 0; trial < 400; trial++) {
        int n = 1 + rand() % 10, parts = 1 + rand() % n;
        for (int i = 0; i < n; i++) {
            cost[i] = rand() % 20;
            par[i] = rand() % 5;
            st[i] = rand() % 3;
        }
        for (int i = 0; i <= n; i++) cut[i] = rand() % 4;
        pp_balance_problem pb = {n, cost, trial % 2 ? cut : NULL, par, st, 1 + rand() % 4, 0};
        if (trial % 3 == 0) pb.memory_cap = 4 + rand() % 20;
        double want = brute(&pb, parts, cuts, 0, 1), got = -1;
        pp_status s = pp_balance_partition(&pb, parts, starts, &got);
        if (isinf(want)) {
            assert_int_equal(s, PP_ERR_INVALID);
            assert_non_null(strstr(pp_last_error(), "memory cap"));
            continue;
        }
        assert_int_equal(s, PP_OK);
        assert_true(fabs(got - want) < 1e-9);
        /* the cuts it returns achieve that cost and fit */
        double worst = 0;
        for (int j = 0; j < parts; j++) {
            int a = j ? starts[j - 1] : 0, b = j + 1 < parts ? starts[j] : n;
            assert_true(a < b);
            assert_true(fits(&pb, a, b, j, parts));
            if (seg(&pb, a, b) > worst) worst = seg(&pb, a, b);
        }
        assert_true(fabs(worst - want) < 1e-9);
    }
}

static void test_partition_refuses(void **state) {
    (void)state;
    double cost[3] = {1, 2, 3};
    int starts[4];
    pp_balance_problem pb = {3, cost, NULL, NULL, NULL, 1, 0};
    assert_int_equal(pp_balance_partition(&pb, 4, starts, NULL), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "cannot cut 3 nodes into 4 stages"));
    assert_non_null(strstr(pp_last_error(), "2 possible cut points"));
    assert_int_equal(pp_balance_partition(&pb, 0, starts, NULL), PP_ERR_INVALID);
    cost[1] = NAN;
    assert_int_equal(pp_balance_partition(&pb, 2, starts, NULL), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "cost[1]"));
}

static void test_partition_deterministic(void **state) {
    (void)state;
    /* many equal optima: always the same (earliest) cuts */
    double cost[12];
    for (int i = 0; i < 12; i++) cost[i] = 1;
    cost[5] = 0;
    pp_balance_problem pb = {12, cost, NULL, NULL, NULL, 1, 0};
    int a[3], b[3];
    double ma, mb;
    assert_int_equal(pp_balance_partition(&pb, 4, a, &ma), PP_OK);
    for (int k = 0; k < 20; k++) {
        assert_int_equal(pp_balance_partition(&pb, 4, b, &mb), PP_OK);
        assert_memory_equal(a, b, sizeof a);
        assert_true(ma == mb);
    }
    assert_true(ma == 3);
}

/* Regression: pp_autodiff fuses torch's Linear layers (MatMul by a
 * transposed weight, and its bias Add) before building the backward, which
 * renumbers the forward; the costs must still fall on the model's own
 * nodes, the same as with the fusions off: the MatMuls carry the work. */
static void test_gpt_costs_on_model_nodes(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_node_costs_options o;
    pp_node_costs_options_init(&o);
    o.source = PP_COST_FLOPS;
    pp_node_costs *fused, *plain;
    TU_OK(pp_node_costs_measure(g, &o, &fused));
    pp_optimize_set_default(0);
    TU_OK(pp_node_costs_measure(g, &o, &plain));
    pp_optimize_set_default(PP_OPT_ALL);
    assert_int_equal(fused->n_nodes, g->n_nodes);
    assert_memory_equal(fused->fwd_ms, plain->fwd_ms, sizeof(double) * (size_t)g->n_nodes);
    assert_memory_equal(fused->bwd_ms, plain->bwd_ms, sizeof(double) * (size_t)g->n_nodes);
    int c_attn = -1;
    for (int i = 0; i < g->n_nodes; i++)
        if (!strcmp(g->nodes[i].name, "/blocks.0/attn/c_attn/MatMul")) c_attn = i;
    assert_true(c_attn >= 0);
    assert_true(fused->fwd_ms[c_attn] > 0);
    pp_node_costs_free(fused);
    pp_node_costs_free(plain);
    pp_graph_free(g);
}

static void test_uneven_fixture(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("uneven", "model.onnx");
    pp_node_costs_options o;
    pp_node_costs_options_init(&o);
    o.source = PP_COST_FLOPS;
    o.batch = 16;
    pp_node_costs *c1, *c2;
    TU_OK(pp_node_costs_measure(g, &o, &c1));
    TU_OK(pp_node_costs_measure(g, &o, &c2));
    assert_int_equal(c1->n_nodes, g->n_nodes);
    assert_memory_equal(c1->fwd_ms, c2->fwd_ms, sizeof(double) * (size_t)g->n_nodes);
    assert_memory_equal(c1->bwd_ms, c2->bwd_ms, sizeof(double) * (size_t)g->n_nodes);
    int64_t params = 0;
    for (int i = 0; i < g->n_nodes; i++) params += c1->param_bytes[i];
    int64_t want_params;
    pp_graph_param_stats(g, NULL, &want_params);
    assert_true(params == want_params);
    pp_balance_options bo;
    pp_balance_options_init(&bo, 4);
    pp_balance_plan *bal, *even;
    TU_OK(pp_balance_plan_auto(c1, &bo, &bal));
    TU_OK(pp_balance_plan_even(c1, &bo, &even));
    assert_true(bal->max_ms < even->max_ms * 0.8);
    /* the three 128-wide layers (1, 2: 128x128, 0 and 3: 32x128) never
     * share a stage two at a time */
    const char *wide[2] = {"/layers.1/", "/layers.2/"};
    int stage_of[2];
    for (int w = 0; w < 2; w++) {
        int node = -1;
        for (int i = 0; i < g->n_nodes && node < 0; i++)
            if (strncmp(g->nodes[i].name, wide[w], strlen(wide[w])) == 0) node = i;
        assert_true(node >= 0);
        stage_of[w] = 0;
        while (stage_of[w] < 3 && node >= bal->cut_at[stage_of[w]]) stage_of[w]++;
    }
    assert_int_not_equal(stage_of[0], stage_of[1]);
    /* the cuts split the model into that many stages */
    pp_split_spec spec;
    pp_split_spec_init(&spec);
    spec.n_cut_at = 3;
    spec.cut_at = bal->cut_at;
    spec.ignore_markers = 1;
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, &spec, &p));
    assert_int_equal(p->n_stages, 4);
    pp_pipe_free(p);
    /* too many stages: named */
    pp_balance_options_init(&bo, 1000);
    pp_balance_plan *none = NULL;
    assert_int_equal(pp_balance_plan_auto(c1, &bo, &none), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "1000 stages asked"));
    assert_null(none);
    /* a cap no split meets */
    pp_balance_options_init(&bo, 4);
    bo.memory_cap = 1000;
    assert_int_equal(pp_balance_plan_auto(c1, &bo, &none), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "memory cap"));
    /* a cut outside the graph */
    int bad = g->n_nodes;
    spec.n_cut_at = 1;
    spec.cut_at = &bad;
    assert_int_equal(pp_pipe_split(g, &spec, &p), PP_ERR_INVALID);
    pp_balance_plan_free(bal);
    pp_balance_plan_free(even);
    pp_node_costs_free(c1);
    pp_node_costs_free(c2);
    pp_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partition_matches_brute_force),
        cmocka_unit_test(test_partition_refuses),
        cmocka_unit_test(test_partition_deterministic),
        cmocka_unit_test(test_gpt_costs_on_model_nodes),
        cmocka_unit_test(test_uneven_fixture),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
