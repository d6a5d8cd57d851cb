/* In-place elementwise ops (lib/inplace.c): which inputs the planner
 * offers (made earlier in the run, dying at the node, not kept, watched,
 * an initializer, a graph input or read twice), what the executor gives at
 * run time (not a broadcast input, a view or a kept value), and the same
 * bits with it on and off, on small graphs and on the GPT fixture's
 * forward and training step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inplace.h"
#include "pippin/optimize.h"
#include "test_util.h"

#include "test_filter.h"

static int add(pp_graph *g, const char *op, int n_in, const int *in) {
    int node;
    TU_OK(pp_graph_add_node(g, op, "", NULL, n_in, in, 1, NULL, &node));
    return g->nodes[node].out[0];
}

/* The planner on a graph alone:
 *   0 a = Relu(x)      x is a graph input
 *   1 b = Neg(a)       a is read again at 4
 *   2 c = Exp(b)       b dies here: input 0
 *   3 d = Add(w, c)    w is an initializer; c dies here: input 1
 *   4 e = Mul(a, d)    both die here: inputs 0 and 1
 *   5 f = Add(e, e)    e read twice by the node
 *   6 h = Relu(f)      f dies here, unless kept or watched */
static void test_planner_rule(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int x, w;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(2, 4), &x));
    TU_OK(pp_graph_add_initializer(g, "w", PP_VALUE_PARAM, tu_f32(1, SHAPE(4), (float[]){1, 2, 3, 4}), &w));
    int a = add(g, "Relu", 1, &x);
    int b = add(g, "Neg", 1, &a);
    int c = add(g, "Exp", 1, &b);
    int d = add(g, "Add", 2, (int[]){w, c});
    int e = add(g, "Mul", 2, (int[]){a, d});
    int f = add(g, "Add", 2, (int[]){e, e});
    int h = add(g, "Relu", 1, &f);
    TU_OK(pp_graph_add_output(g, h));
    TU_OK(pp_graph_resolve(g));
    int nodes[7], last[64];
    for (int p = 0; p < 7; p++) nodes[p] = p;
    assert_true(g->n_values <= 64);
    for (int v = 0; v < g->n_values; v++) last[v] = -1;
    for (int p = 0; p < 7; p++)
        for (int k = 0; k < g->nodes[p].n_in; k++) last[g->nodes[p].in[k]] = p;
    uint8_t choice[7];
    pp_inplace_choose(g, nodes, 7, last, NULL, NULL, choice);
    static const uint8_t want[7] = {0, 0, 1, 2, 3, 0, 1};
    for (int p = 0; p < 7; p++) assert_int_equal(choice[p], want[p]);

    uint8_t keep[64] = {0}, watch[64] = {0};
    keep[f] = 1; /* a stash: kept past the run */
    watch[c] = 1; /* a value hook may take it */
    pp_inplace_choose(g, nodes, 7, last, keep, watch, choice);
    static const uint8_t want_kept[7] = {0, 0, 1, 0, 3, 0, 0};
    for (int p = 0; p < 7; p++) assert_int_equal(choice[p], want_kept[p]);

    /* a later run of nodes 4..6 alone: a and d come from an earlier run */
    for (int v = 0; v < g->n_values; v++) last[v] = -1;
    for (int p = 4; p < 7; p++)
        for (int k = 0; k < g->nodes[p].n_in; k++) last[g->nodes[p].in[k]] = p - 4;
    pp_inplace_choose(g, nodes + 4, 3, last, NULL, NULL, choice);
    assert_int_equal(choice[0], 0);
    assert_int_equal(choice[2], 1);
    pp_graph_free(g);
}

/* The hand-over: only an uninitialised allocation of the donor's dtype and
 * shape takes the buffer, once per offer; the donor lives until the taker
 * goes. */
static void test_take_rules(void **state) {
    (void)state;
    pp_tensor *d = tu_f32(2, SHAPE(2, 3), (float[]){1, 2, 3, 4, 5, 6}), *z, *other, *f64, *t, *again;
    assert_true(pp_inplace_can_donate(d));
    pp_tensor *view;
    TU_OK(pp_tensor_view(d, 1, SHAPE(6), &view));
    assert_false(pp_inplace_can_donate(d));    /* the view holds a reference */
    assert_false(pp_inplace_can_donate(view)); /* not its own buffer */
    pp_tensor_free(view);
    pp_inplace_offer(&d, 1);
    TU_OK(pp_tensor_new(PP_F32, 2, SHAPE(2, 3), &z)); /* zeroed: would clear the donor */
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(3, 2), &other));
    TU_OK(pp_tensor_empty(PP_F64, 2, SHAPE(2, 3), &f64));
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(2, 3), &t));
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(2, 3), &again));
    assert_int_equal(pp_inplace_withdraw(), 6 * sizeof(float));
    assert_ptr_not_equal(z->data, d->data);
    assert_ptr_not_equal(other->data, d->data);
    assert_ptr_not_equal(f64->data, d->data);
    assert_ptr_equal(t->data, d->data);
    assert_ptr_not_equal(again->data, d->data);
    assert_true(((float *)d->data)[5] == 6.0f);
    assert_true(pp_inplace_can_donate(t) == 0); /* d still in hand: two references to d */
    pp_tensor_free(d);
    assert_true(pp_inplace_can_donate(t)); /* t alone holds the buffer now */
    assert_true(((float *)t->data)[0] == 1.0f);
    pp_tensor_free(t); /* ASan: the buffer goes back once, here */
    pp_tensor_free(z);
    pp_tensor_free(other);
    pp_tensor_free(f64);
    pp_tensor_free(again);
    /* no offer: nothing taken */
    TU_OK(pp_tensor_empty(PP_F32, 1, SHAPE(4), &t));
    assert_int_equal(pp_inplace_withdraw(), 0);
    pp_tensor_free(t);
}

/* The executor at run time, x [rows, 8], w [8] a parameter:
 *   h = Add(x, w)      x a graph input: a new buffer
 *   r = Relu(h)        in place (h dies)
 *   p = Neg(w)         an initializer: a new buffer
 *   q = Add(p, r)      p dies but is broadcast; r is read again
 *   v = Reshape(q)     a view of q
 *   z = Sigmoid(v)     v dies, but is a view: a new buffer
 *   u = Reshape(z)     a view of z
 *   y = Mul(u, r)      u is a view; r dies: in place (input 1) */
static pp_graph *runtime_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int x, w, flat, back;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(-1, 8), &x));
    TU_OK(pp_graph_add_initializer(g, "w", PP_VALUE_PARAM,
                                   tu_f32(1, SHAPE(8), (float[]){-1, 2, -3, 4, -5, 6, -7, 8}), &w));
    TU_OK(pp_graph_add_initializer(g, "flat", PP_VALUE_CONST, tu_i64_vec(1, (int64_t[]){-1}), &flat));
    TU_OK(pp_graph_add_initializer(g, "back", PP_VALUE_CONST, tu_i64_vec(2, (int64_t[]){-1, 8}), &back));
    int h = add(g, "Add", 2, (int[]){x, w});
    int r = add(g, "Relu", 1, &h);
    int p = add(g, "Neg", 1, &w);
    int q = add(g, "Add", 2, (int[]){p, r});
    int v = add(g, "Reshape", 2, (int[]){q, flat});
    int z = add(g, "Sigmoid", 1, &v);
    int u = add(g, "Reshape", 2, (int[]){z, back});
    int y = add(g, "Mul", 2, (int[]){u, r});
    TU_OK(pp_graph_add_output(g, y));
    return g;
}

static pp_tensor *random_x(int64_t rows, uint64_t seed) {
    pp_tensor *x;
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(rows, 8), &x));
    for (int64_t i = 0; i < rows * 8; i++) ((float *)x->data)[i] = (float)(tu_urand(&seed) * 8.0 - 4.0);
    return x;
}

static void test_runtime_checks_and_same_bits(void **state) {
    (void)state;
    pp_graph *g = runtime_graph();
    pp_exec *on, *off;
    TU_OK(pp_exec_new(g, &on));
    TU_OK(pp_exec_new(g, &off));
    pp_exec_set_inplace(on, 1);
    pp_exec_set_inplace(off, 0);
    for (int rep = 0; rep < 4; rep++) { /* recorded, then planned; two sizes */
        int64_t rows = rep % 2 ? 3000 : 1000;
        pp_tensor *x = random_x(rows, 7 + (uint64_t)rep), *a, *b;
        TU_OK(pp_exec_run(on, &x, &a));
        TU_OK(pp_exec_run(off, &x, &b));
        assert_int_equal(a->nbytes, b->nbytes);
        assert_memory_equal(a->data, b->data, a->nbytes);
        /* the value itself: (sigmoid(relu(x + w) - w)) * relu(x + w) */
        static const float wv[8] = {-1, 2, -3, 4, -5, 6, -7, 8};
        for (int64_t i = 0; i < rows * 8; i += 997) {
            float rl = ((float *)x->data)[i] + wv[i % 8];
            rl = rl < 0 ? 0.0f : rl;
            float want = rl / (1.0f + expf(-(rl - wv[i % 8])));
            assert_float_equal(((float *)a->data)[i], want, 1e-5f * (1.0f + fabsf(want)));
        }
        pp_tensor_free(x);
        pp_tensor_free(a);
        pp_tensor_free(b);
    }
    int64_t nodes, bytes, off_nodes;
    pp_exec_inplace_stats(on, &nodes, &bytes);
    assert_int_equal(nodes, 2 * 4); /* Relu and Mul, every run */
    assert_int_equal(bytes, 2 * 2 * (1000 + 3000) * 8 * 4);
    pp_exec_inplace_stats(off, &off_nodes, NULL);
    assert_int_equal(off_nodes, 0);

    /* h kept (as a stash would be): Relu gets a new buffer */
    pp_tensor **env = calloc((size_t)g->n_values, sizeof *env);
    uint8_t *keep = calloc((size_t)g->n_values, 1);
    assert_true(env && keep);
    int h = g->nodes[0].out[0], y = g->outputs[0];
    keep[h] = keep[y] = keep[g->inputs[0]] = 1;
    env[g->inputs[0]] = random_x(1000, 3);
    int all[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    TU_OK(pp_exec_run_nodes(on, all, 8, env, keep));
    int64_t after;
    pp_exec_inplace_stats(on, &after, NULL);
    assert_int_equal(after, nodes + 1); /* the Mul alone */
    assert_non_null(env[h]); /* still x + w */
    for (int64_t i = 0; i < 1000 * 8; i += 37)
        assert_true(((float *)env[h]->data)[i] ==
                    ((float *)env[g->inputs[0]]->data)[i] + ((float *)g->values[1].data->data)[i % 8]);
    for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]);
    free(env);
    free(keep);
    pp_exec_free(on);
    pp_exec_free(off);
    pp_graph_free(g);
}

/* A binary op's in-place loops for both operands and both row forms
 * (contiguous and one-element other operand), against the plain loops:
 * y = ((e - s) * c) / e2 + k, each step in place, with s [1], c [rows, 1]
 * broadcast and e2 [rows, 64] dying on the other side. */
static void test_binary_forms_same_bits(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int x, s, c, k;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(-1, 64), &x));
    TU_OK(pp_graph_add_input(g, "s", PP_F32, 1, SHAPE(1), &s));
    TU_OK(pp_graph_add_input(g, "c", PP_F32, 2, SHAPE(-1, 1), &c));
    TU_OK(pp_graph_add_initializer(g, "k", PP_VALUE_CONST, tu_f32(0, NULL, (float[]){0.25f}), &k));
    int e = add(g, "Exp", 1, &x);
    int e2 = add(g, "Sigmoid", 1, &x);
    int d1 = add(g, "Sub", 2, (int[]){e, s});   /* a in place, b one element */
    int d2 = add(g, "Mul", 2, (int[]){d1, c});  /* a in place, b broadcast per row */
    int d3 = add(g, "Div", 2, (int[]){d2, e2}); /* a in place (first), b contiguous */
    int d4 = add(g, "Neg", 1, &x);
    int d5 = add(g, "Sub", 2, (int[]){k, d4});  /* b in place, a one element */
    int d6 = add(g, "Sub", 2, (int[]){x, d5});  /* b in place, a contiguous */
    int y = add(g, "Add", 2, (int[]){d3, d6});
    TU_OK(pp_graph_add_output(g, y));
    pp_exec *on, *off;
    TU_OK(pp_exec_new(g, &on));
    TU_OK(pp_exec_new(g, &off));
    pp_exec_set_inplace(on, 1);
    pp_exec_set_inplace(off, 0);
    uint64_t seed = 11;
    pp_tensor *in[3];
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(300, 64), &in[0]));
    TU_OK(pp_tensor_empty(PP_F32, 1, SHAPE(1), &in[1]));
    TU_OK(pp_tensor_empty(PP_F32, 2, SHAPE(300, 1), &in[2]));
    for (int i = 0; i < 3; i++)
        for (int64_t j = 0; j < pp_tensor_numel(in[i]); j++)
            ((float *)in[i]->data)[j] = (float)(tu_urand(&seed) * 4.0 - 2.0);
    pp_tensor *a, *b;
    TU_OK(pp_exec_run(on, in, &a));
    TU_OK(pp_exec_run(off, in, &b));
    assert_memory_equal(a->data, b->data, a->nbytes);
    int64_t n_in_place;
    pp_exec_inplace_stats(on, &n_in_place, NULL);
    assert_int_equal(n_in_place, 6); /* Sub, Mul, Div, Sub, Sub, Add */
    for (int i = 0; i < 3; i++) pp_tensor_free(in[i]);
    pp_tensor_free(a);
    pp_tensor_free(b);
    pp_exec_free(on);
    pp_exec_free(off);
    pp_graph_free(g);
}

/* PIPPIN_OPTIMIZE without "inplace" (the optimizer's debug switch) makes
 * executors that never go in place. */
static void test_optimizer_switch(void **state) {
    (void)state;
    pp_graph *g = runtime_graph();
    unsigned before = pp_optimize_default();
    pp_optimize_set_default(PP_OPT_ALL & ~PP_OPT_INPLACE);
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    pp_tensor *x = random_x(100, 5), *y;
    TU_OK(pp_exec_run(ex, &x, &y));
    int64_t nodes;
    pp_exec_inplace_stats(ex, &nodes, NULL);
    assert_int_equal(nodes, 0);
    pp_exec_free(ex);
    pp_tensor_free(y);
    pp_optimize_set_default(PP_OPT_ALL);
    TU_OK(pp_exec_new(g, &ex));
    TU_OK(pp_exec_run(ex, &x, &y));
    pp_exec_inplace_stats(ex, &nodes, NULL);
    assert_int_equal(nodes, 2);
    pp_optimize_set_default(before);
    pp_exec_free(ex);
    pp_tensor_free(x);
    pp_tensor_free(y);
    pp_graph_free(g);
}

/* ------------------------------------------------------------------------ */
/* The GPT fixture: forward (optimized for inference) and a training step
 * as a pipeline runs it (F of two microbatches, then I and W of each),
 * in place and not: the same bits. */

static void gpt_inputs(const pp_graph *g, int n, pp_tensor **ins) {
    for (int i = 0; i < n; i++) {
        char file[300];
        snprintf(file, sizeof file, "%s.npy", g->values[g->inputs[i]].name);
        ins[i] = tu_fixture_npy("gpt", file);
    }
}

static void test_gpt_forward_same_bits(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model_nosplit.onnx");
    TU_OK(pp_graph_optimize(g, PP_OPT_ALL, NULL));
    pp_tensor *ins[8], *a[8], *b[8];
    assert_true(g->n_inputs <= 8 && g->n_outputs <= 8);
    gpt_inputs(g, g->n_inputs, ins);
    pp_exec *on, *off;
    TU_OK(pp_exec_new(g, &on));
    TU_OK(pp_exec_new(g, &off));
    pp_exec_set_inplace(on, 1);
    pp_exec_set_inplace(off, 0);
    for (int rep = 0; rep < 2; rep++) {
        TU_OK(pp_exec_run(on, ins, a));
        TU_OK(pp_exec_run(off, ins, b));
        for (int i = 0; i < g->n_outputs; i++) {
            assert_int_equal(a[i]->nbytes, b[i]->nbytes);
            assert_memory_equal(a[i]->data, b[i]->data, a[i]->nbytes);
            pp_tensor_free(a[i]);
            pp_tensor_free(b[i]);
        }
    }
    int64_t nodes, bytes;
    pp_exec_inplace_stats(on, &nodes, &bytes);
    print_message("# gpt fixture forward: %lld nodes in place per run, %lld bytes not allocated\n",
                  (long long)nodes / 2, (long long)bytes / 2);
    assert_true(nodes > 0);
    for (int i = 0; i < g->n_inputs; i++) pp_tensor_free(ins[i]);
    pp_exec_free(on);
    pp_exec_free(off);
    pp_graph_free(g);
}

static void run_step(pp_graph *g, const pp_backward *b, pp_exec *ex, const uint8_t *kf, const uint8_t *ki,
                     pp_tensor *const *mb_in, pp_tensor ***outs) {
    pp_tensor **env[2];
    for (int m = 0; m < 2; m++) {
        env[m] = calloc((size_t)g->n_values, sizeof *env[m]);
        assert_non_null(env[m]);
        for (int i = 0; i < b->n_inputs_before; i++)
            env[m][g->inputs[i]] = pp_tensor_retain(mb_in[m * b->n_inputs_before + i]);
        for (int i = b->n_inputs_before; i < g->n_inputs; i++)
            TU_OK(pp_tensor_scalar_f32(0.5f, &env[m][g->inputs[i]]));
        TU_OK(pp_exec_run_nodes(ex, b->forward_nodes, b->n_forward, env[m], kf));
    }
    for (int m = 0; m < 2; m++) {
        TU_OK(pp_exec_run_nodes(ex, b->i_nodes, b->n_i, env[m], ki));
        TU_OK(pp_exec_run_nodes(ex, b->w_nodes, b->n_w, env[m], kf));
        outs[m] = calloc((size_t)g->n_outputs, sizeof(pp_tensor *));
        for (int i = 0; i < g->n_outputs; i++) {
            int v = g->outputs[i];
            if (!env[m][v] && g->values[v].data) env[m][v] = pp_tensor_retain(g->values[v].data);
            assert_non_null(env[m][v]);
            outs[m][i] = pp_tensor_retain(env[m][v]);
        }
        for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[m][v]);
        free(env[m]);
    }
}

static void test_gpt_training_same_bits(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model_nosplit.onnx");
    pp_backward *b = NULL;
    TU_OK(pp_autodiff_model(g, NULL, 0, &b));
    uint8_t *kf, *ki;
    TU_OK(pp_backward_keep_masks(g, b, &kf, &ki));
    pp_tensor *whole[8], *mb_in[16];
    assert_true(b->n_inputs_before <= 8);
    gpt_inputs(g, b->n_inputs_before, whole);
    for (int i = 0; i < b->n_inputs_before; i++) { /* two microbatches: row 0 and the rest */
        TU_OK(pp_tensor_slice0(whole[i], 0, 1, &mb_in[i]));
        TU_OK(pp_tensor_slice0(whole[i], 1, whole[i]->shape[0] - 1, &mb_in[b->n_inputs_before + i]));
        pp_tensor_free(whole[i]);
    }
    pp_exec *on, *off;
    TU_OK(pp_exec_new(g, &on));
    TU_OK(pp_exec_new(g, &off));
    pp_exec_set_inplace(on, 1);
    pp_exec_set_inplace(off, 0);
    for (int step = 0; step < 2; step++) { /* recorded, then planned */
        pp_tensor **a[2], **c[2];
        run_step(g, b, on, kf, ki, mb_in, a);
        run_step(g, b, off, kf, ki, mb_in, c);
        for (int m = 0; m < 2; m++) {
            for (int i = 0; i < g->n_outputs; i++) {
                assert_int_equal(a[m][i]->nbytes, c[m][i]->nbytes);
                assert_memory_equal(a[m][i]->data, c[m][i]->data, a[m][i]->nbytes);
                pp_tensor_free(a[m][i]);
                pp_tensor_free(c[m][i]);
            }
            free(a[m]);
            free(c[m]);
        }
    }
    int64_t nodes, bytes;
    pp_exec_inplace_stats(on, &nodes, &bytes);
    print_message("# gpt fixture training step: %lld nodes in place, %lld bytes not allocated\n",
                  (long long)nodes / 2, (long long)bytes / 2);
    assert_true(nodes > 0);
    pp_exec_free(on);
    pp_exec_free(off);
    for (int i = 0; i < 2 * b->n_inputs_before; i++) pp_tensor_free(mb_in[i]);
    free(kf);
    free(ki);
    pp_backward_free(b);
    pp_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_planner_rule),
        cmocka_unit_test(test_take_rules),
        cmocka_unit_test(test_runtime_checks_and_same_bits),
        cmocka_unit_test(test_binary_forms_same_bits),
        cmocka_unit_test(test_optimizer_switch),
        cmocka_unit_test(test_gpt_forward_same_bits),
        cmocka_unit_test(test_gpt_training_same_bits),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
