/* The executor's memory plan (lib/mem_plan.c): buffers reused once a run
 * is planned, never a buffer that is still alive (a value with two
 * consumers, a stash kept past the run, a tensor held longer than when the
 * plan was recorded), and the same bits with the plan on and off on the
 * GPT fixture's training step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem_plan.h"
#include "test_util.h"

#include "test_filter.h"

static pp_tensor *filled(float v) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, 1, SHAPE(100), &t));
    for (int i = 0; i < 100; i++) ((float *)t->data)[i] = v;
    return t;
}

static void assert_all(const pp_tensor *t, float v) {
    for (int i = 0; i < 100; i++) assert_true(((const float *)t->data)[i] == v);
}

/* Recorded: a dies before b is born, so they share one slot. A later run
 * that keeps a alive gets b from the pool instead of a's bytes. */
static void test_slot_reused_only_when_free(void **state) {
    (void)state;
    pp_mem_plans *mp;
    TU_OK(pp_mem_plans_new(&mp));
    static const int nodes[2] = {0, 1};
    for (int rep = 0; rep < 3; rep++) {
        TU_OK(pp_mem_run_begin(mp, nodes, 2, 7));
        pp_mem_run_node(mp, 0);
        pp_tensor *a = filled(1.0f);
        void *a_data = a->data;
        pp_mem_run_node(mp, 1);
        int hold_a = rep == 1;
        if (!hold_a) pp_tensor_free(a);
        pp_tensor *b = filled(2.0f);
        if (rep == 2) assert_ptr_equal(b->data, a_data); /* planned: same slot */
        if (hold_a) {
            assert_ptr_not_equal(b->data, a_data);
            assert_all(a, 1.0f);
            pp_tensor_free(a);
        }
        assert_all(b, 2.0f);
        pp_tensor_free(b);
        TU_OK(pp_mem_run_end(mp, 1));
    }
    int64_t arena, total;
    pp_mem_plans_peak(mp, &arena, &total);
    assert_int_equal(arena, 448); /* 400 bytes in 64-byte steps */
    assert_int_equal(total, 896);
    pp_mem_plans_free(mp);
}

/* A buffer still alive at the end of the recorded run (an output, a
 * stash) is not planned: it stays the caller's after later runs. */
static void test_alive_at_end_not_planned(void **state) {
    (void)state;
    pp_mem_plans *mp;
    TU_OK(pp_mem_plans_new(&mp));
    static const int nodes[2] = {0, 1};
    pp_tensor *kept[3];
    for (int rep = 0; rep < 3; rep++) {
        TU_OK(pp_mem_run_begin(mp, nodes, 2, 1));
        pp_mem_run_node(mp, 0);
        kept[rep] = filled((float)rep);
        pp_mem_run_node(mp, 1);
        pp_tensor *tmp = filled(9.0f);
        pp_tensor_free(tmp);
        TU_OK(pp_mem_run_end(mp, 1));
    }
    for (int rep = 0; rep < 3; rep++) {
        assert_all(kept[rep], (float)rep);
        pp_tensor_free(kept[rep]);
    }
    int64_t arena, total;
    pp_mem_plans_peak(mp, &arena, &total);
    assert_int_equal(arena, 448); /* only tmp */
    pp_mem_plans_free(mp);
}

/* A planned run holds its arena: the thread letting its arena go in the
 * middle of the run (pp_tensor_cache_release from a value hook, or a
 * nested run needing a larger one) leaves the run's slots valid (ASan: no
 * use after free). */
static void test_run_holds_its_arena(void **state) {
    (void)state;
    pp_mem_plans *mp;
    TU_OK(pp_mem_plans_new(&mp));
    static const int nodes[2] = {0, 1};
    for (int rep = 0; rep < 3; rep++) {
        TU_OK(pp_mem_run_begin(mp, nodes, 2, 11));
        pp_mem_run_node(mp, 0);
        pp_tensor *a = filled(1.0f);
        pp_tensor_free(a);
        pp_mem_plan_release_thread(); /* as pp_tensor_cache_release does */
        pp_mem_run_node(mp, 1);
        pp_tensor *b = filled(2.0f);
        assert_all(b, 2.0f);
        pp_tensor_free(b);
        TU_OK(pp_mem_run_end(mp, 1));
    }
    pp_mem_plans_free(mp);
    pp_mem_plan_release_thread();
}

/* A recorded run that failed makes no plan: the next run records again
 * (a plan cut short at the failing node would serve every later run). */
static void test_failed_recording_makes_no_plan(void **state) {
    (void)state;
    pp_mem_plans *mp;
    TU_OK(pp_mem_plans_new(&mp));
    static const int nodes[2] = {0, 1};
    TU_OK(pp_mem_run_begin(mp, nodes, 2, 5));
    pp_mem_run_node(mp, 0);
    pp_tensor *a = filled(1.0f), *kept = filled(3.0f);
    pp_tensor_free(a);
    TU_OK(pp_mem_run_end(mp, 0)); /* the run failed after node 0 */
    int64_t arena, total;
    pp_mem_plans_peak(mp, &arena, &total);
    assert_int_equal(arena, 0);
    assert_all(kept, 3.0f);
    pp_tensor_free(kept); /* its own free function again */
    for (int rep = 0; rep < 2; rep++) { /* recorded now, then planned */
        TU_OK(pp_mem_run_begin(mp, nodes, 2, 5));
        pp_mem_run_node(mp, 0);
        a = filled(1.0f);
        pp_tensor_free(a);
        pp_mem_run_node(mp, 1);
        pp_tensor *b = filled(2.0f);
        pp_tensor_free(b);
        TU_OK(pp_mem_run_end(mp, 1));
    }
    pp_mem_plans_peak(mp, &arena, &total);
    assert_int_equal(arena, 448);
    pp_mem_plans_free(mp);
}

/* x -> a = Relu(x); a chain of unary ops of a's size; y = a + chain. a is
 * read first and last, so no buffer of the chain may take its slot. */
static pp_graph *two_consumer_graph(int chain) {
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int x, node;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(-1, 64), &x));
    TU_OK(pp_graph_add_node(g, "Relu", "", "relu", 1, &x, 1, NULL, &node));
    int a = g->nodes[node].out[0], v = a;
    static const char *ops[] = {"Neg", "Exp", "Sigmoid", "Tanh"};
    for (int k = 0; k < chain; k++) {
        char name[32];
        snprintf(name, sizeof name, "op%d", k);
        TU_OK(pp_graph_add_node(g, ops[k % 4], "", name, 1, &v, 1, NULL, &node));
        v = g->nodes[node].out[0];
    }
    TU_OK(pp_graph_add_node(g, "Add", "", "add", 2, (int[]){a, v}, 1, NULL, &node));
    TU_OK(pp_graph_add_output(g, g->nodes[node].out[0]));
    return g;
}

static pp_tensor *run_graph(pp_exec *ex, int64_t rows, uint64_t seed) {
    pp_tensor *x, *y;
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(rows, 64), &x));
    for (int64_t i = 0; i < rows * 64; i++) ((float *)x->data)[i] = (float)tu_urand(&seed);
    TU_OK(pp_exec_run(ex, &x, &y));
    pp_tensor_free(x);
    return y;
}

static void test_two_consumers_same_bits(void **state) {
    (void)state;
    pp_graph *g = two_consumer_graph(12);
    pp_exec *on, *off;
    TU_OK(pp_exec_new(g, &on));
    TU_OK(pp_exec_new(g, &off));
    pp_exec_set_memory_plan(on, 1);
    pp_exec_set_memory_plan(off, 0);
    /* the plan's own placement: in place, the chain would hold one buffer
     * (test_inplace) */
    pp_exec_set_inplace(on, 0);
    pp_exec_set_inplace(off, 0);
    /* two signatures, each recorded then planned twice */
    for (int rep = 0; rep < 6; rep++) {
        int64_t rows = rep % 2 ? 300 : 200;
        pp_tensor *a = run_graph(on, rows, 100 + (uint64_t)rep), *b = run_graph(off, rows, 100 + (uint64_t)rep);
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
        pp_tensor_free(a);
        pp_tensor_free(b);
    }
    int64_t plan, buffers, off_plan;
    pp_exec_memory_plan(on, &plan, &buffers);
    /* a and two links of the chain at a time: 3 buffers of 300 x 64 floats */
    assert_int_equal(plan, 3 * 300 * 64 * 4);
    assert_int_equal(buffers, 13 * 300 * 64 * 4);
    pp_exec_memory_plan(off, &off_plan, NULL);
    assert_int_equal(off_plan, 0);
    pp_exec_free(on);
    pp_exec_free(off);
    pp_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* The GPT fixture's training step as a pipeline runs it: F of two
 * microbatches (each keeps its stash), then I and W of each. */

typedef struct step_result {
    pp_tensor **outs[2]; /* per microbatch: every graph output */
} step_result;

static void run_mb_step(pp_graph *g, const pp_backward *b, pp_exec *ex, const uint8_t *kf,
                        const uint8_t *ki, pp_tensor *const *mb_inputs, step_result *r) {
    pp_tensor **env[2];
    for (int m = 0; m < 2; m++) {
        env[m] = calloc((size_t)g->n_values, sizeof *env[m]);
        assert_non_null(env[m]);
        for (int i = 0; i < b->n_inputs_before; i++)
            env[m][g->inputs[i]] = pp_tensor_retain(mb_inputs[m * b->n_inputs_before + i]);
        for (int i = b->n_inputs_before; i < g->n_inputs; i++)
            TU_OK(pp_tensor_scalar_f32(0.5f, &env[m][g->inputs[i]]));
        TU_OK(pp_exec_run_nodes(ex, b->forward_nodes, b->n_forward, env[m], kf));
    }
    for (int m = 0; m < 2; m++) {
        TU_OK(pp_exec_run_nodes(ex, b->i_nodes, b->n_i, env[m], ki));
        TU_OK(pp_exec_run_nodes(ex, b->w_nodes, b->n_w, env[m], kf));
        r->outs[m] = calloc((size_t)g->n_outputs, sizeof(pp_tensor *));
        for (int i = 0; i < g->n_outputs; i++) {
            int v = g->outputs[i];
            if (!env[m][v] && g->values[v].data) env[m][v] = pp_tensor_retain(g->values[v].data);
            assert_non_null(env[m][v]);
            r->outs[m][i] = pp_tensor_retain(env[m][v]);
        }
        for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[m][v]);
        free(env[m]);
    }
}

static void free_result(const pp_graph *g, step_result *r) {
    for (int m = 0; m < 2; m++) {
        for (int i = 0; i < g->n_outputs; i++) pp_tensor_free(r->outs[m][i]);
        free(r->outs[m]);
    }
}

static void test_gpt_training_same_bits_and_reuse(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model_nosplit.onnx");
    pp_backward *b = NULL;
    TU_OK(pp_autodiff_model(g, NULL, 0, &b));
    uint8_t *kf, *ki;
    TU_OK(pp_backward_keep_masks(g, b, &kf, &ki));
    /* two microbatches: row 0 and the rest of each input */
    pp_tensor *mb_in[16];
    assert_true(b->n_inputs_before <= 8);
    for (int i = 0; i < b->n_inputs_before; i++) {
        char file[300];
        snprintf(file, sizeof file, "%s.npy", g->values[g->inputs[i]].name);
        pp_tensor *whole = tu_fixture_npy("gpt", file);
        assert_true(whole->shape[0] >= 2);
        TU_OK(pp_tensor_slice0(whole, 0, 1, &mb_in[i]));
        TU_OK(pp_tensor_slice0(whole, 1, whole->shape[0] - 1, &mb_in[b->n_inputs_before + i]));
        pp_tensor_free(whole);
    }
    pp_exec *on, *off;
    TU_OK(pp_exec_new(g, &on));
    TU_OK(pp_exec_new(g, &off));
    pp_exec_set_memory_plan(on, 1);
    pp_exec_set_memory_plan(off, 0);
    for (int step = 0; step < 3; step++) { /* step 0 records, then planned */
        step_result a, c;
        run_mb_step(g, b, on, kf, ki, mb_in, &a);
        run_mb_step(g, b, off, kf, ki, mb_in, &c);
        for (int m = 0; m < 2; m++)
            for (int i = 0; i < g->n_outputs; i++) {
                assert_int_equal(a.outs[m][i]->nbytes, c.outs[m][i]->nbytes);
                assert_memory_equal(a.outs[m][i]->data, c.outs[m][i]->data, a.outs[m][i]->nbytes);
            }
        free_result(g, &a);
        free_result(g, &c);
    }
    int64_t plan, buffers;
    pp_exec_memory_plan(on, &plan, &buffers);
    print_message("# gpt fixture: largest plan %lld bytes for %lld bytes of buffers\n", (long long)plan,
                  (long long)buffers);
    assert_true(plan > 0);
    assert_true(plan * 2 < buffers); /* reuse, not one buffer each */
    pp_exec_free(on);
    pp_exec_free(off);
    for (int i = 0; i < 2 * b->n_inputs_before; i++) pp_tensor_free(mb_in[i]);
    free(kf);
    free(ki);
    pp_backward_free(b);
    pp_graph_free(g);
}

/* W's plan holds the parameter gradients: a stage hands each over as soon
 * as W makes it (adding it into its flat buffer), so it is a buffer living
 * and dying inside W's run. Measured without that hand-over, the gradients
 * stayed alive to the run's end and W's plan left them out (issue 14: W's
 * fixed part was 0 here). The figures are computed from the model alone:
 * the largest parameter's bytes and all of them, gradients that no batch
 * size changes. */
static void test_plan_covers_parameter_gradients(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("mlp", "model_nosplit.onnx");
    pp_backward *b = NULL;
    TU_OK(pp_autodiff_model(g, NULL, 0, &b)); /* I empty: W holds 11 nodes, enough to be planned */
    int64_t largest = 0, all = 0; /* all: every gradient at once, in the plan's 64-byte steps */
    for (int i = 0; i < b->n_params; i++) {
        const pp_tensor *p = g->values[b->params[i]].data;
        if (b->param_grads[i] < 0) continue;
        if ((int64_t)p->nbytes > largest) largest = (int64_t)p->nbytes;
        all += ((int64_t)p->nbytes + 63) / 64 * 64;
    }
    assert_true(largest >= 1024); /* a gradient worth planning */
    int64_t per[PP_PHASES], fixed[PP_PHASES];
    TU_OK(pp_backward_plan_phases_per_sample_dims(g, b, NULL, 0, NULL, per, fixed));
    print_message("# mlp fixture: F %lld/sample + %lld, I %lld + %lld, W %lld + %lld; largest parameter %lld bytes\n",
                  (long long)per[0], (long long)fixed[0], (long long)per[1], (long long)fixed[1], (long long)per[2],
                  (long long)fixed[2], (long long)largest);
    /* the gradients, whatever the batch: the largest at least (0 when W
     * kept them all to its end), never more than all of them */
    assert_true(fixed[PP_PHASE_W] >= largest);
    assert_true(fixed[PP_PHASE_W] <= all);
    int64_t bound_per, bound_fixed;
    TU_OK(pp_backward_plan_per_sample_dims(g, b, NULL, 0, NULL, &bound_per, &bound_fixed));
    for (int p = 0; p < PP_PHASES; p++) { /* the reported bound covers each phase at batch 1 and 2 */
        assert_true(bound_per + bound_fixed >= per[p] + fixed[p]);
        assert_true(2 * bound_per + bound_fixed >= 2 * per[p] + fixed[p]);
    }
    assert_true(bound_fixed >= largest);
    pp_backward_free(b);
    pp_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slot_reused_only_when_free),
        cmocka_unit_test(test_alive_at_end_not_planned),
        cmocka_unit_test(test_run_holds_its_arena),
        cmocka_unit_test(test_failed_recording_makes_no_plan),
        cmocka_unit_test(test_two_consumers_same_bits),
        cmocka_unit_test(test_gpt_training_same_bits_and_reuse),
        cmocka_unit_test(test_plan_covers_parameter_gradients),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
