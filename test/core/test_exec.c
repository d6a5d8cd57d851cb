/* The executor: buffers freed after their last use, the shape sub-graph
 * cache per input signature, running node subsets, and the KV-cache decoder
 * fixture with an empty and a non-empty past. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"
/* y = Reshape(x, Concat(Shape(x)[0], [-1])) + 1: the shape path depends
 * only on x's shape. */
static pp_graph *reshape_graph(int *shape_node, int *concat_node) {
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int x, one, idx0, minus1, s, gth, cat, r, y;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 3, (int64_t[]){-1, 2, 3}, &x));
    pp_tensor *t;
    TU_OK(pp_tensor_scalar_f32(1.0f, &t));
    TU_OK(pp_graph_add_initializer(g, "one", PP_VALUE_CONST, t, &one));
    t = tu_i64(1, (int64_t[]){1}, (int64_t[]){0});
    TU_OK(pp_graph_add_initializer(g, "idx0", PP_VALUE_CONST, t, &idx0));
    t = tu_i64(1, (int64_t[]){1}, (int64_t[]){-1});
    TU_OK(pp_graph_add_initializer(g, "minus1", PP_VALUE_CONST, t, &minus1));
    TU_OK(pp_graph_add_node(g, "Shape", "", "shape", 1, &x, 1, NULL, &s));
    TU_OK(pp_graph_add_node(g, "Gather", "", "gather", 2, (int[]){g->nodes[s].out[0], idx0}, 1, NULL, &gth));
    TU_OK(pp_graph_add_node(g, "Concat", "", "concat", 2, (int[]){g->nodes[gth].out[0], minus1}, 1, NULL, &cat));
    TU_OK(pp_node_set_int(g, cat, "axis", 0));
    TU_OK(pp_graph_add_node(g, "Reshape", "", "reshape", 2, (int[]){x, g->nodes[cat].out[0]}, 1, NULL, &r));
    TU_OK(pp_graph_add_node(g, "Add", "", "add", 2, (int[]){g->nodes[r].out[0], one}, 1, NULL, &y));
    TU_OK(pp_graph_add_output(g, g->nodes[y].out[0]));
    *shape_node = s;
    *concat_node = cat;
    return g;
}

static void test_dynamic_batch_and_shape_cache(void **state) {
    (void)state;
    int s, cat;
    pp_graph *g = reshape_graph(&s, &cat);
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    for (int b = 1; b <= 3; b++) {
        pp_tensor *x, *y;
        TU_OK(pp_tensor_new(PP_F32, 3, (int64_t[]){b, 2, 3}, &x));
        for (int rep = 0; rep < 2; rep++) {
            int64_t run0, cached0, run1, cached1;
            pp_exec_stats(ex, &run0, &cached0);
            TU_OK(pp_exec_run(ex, &x, &y));
            pp_exec_stats(ex, &run1, &cached1);
            /* Shape, Gather, Concat run once per batch size, then come
             * from the cache; Reshape and Add always run. */
            assert_int_equal(run1 - run0, rep == 0 ? 5 : 2);
            assert_int_equal(cached1 - cached0, rep == 0 ? 0 : 3);
            assert_int_equal(y->ndim, 2);
            assert_int_equal(y->shape[0], b);
            assert_int_equal(y->shape[1], 6);
            assert_true(((float *)y->data)[0] == 1.0f);
            pp_tensor_free(y);
        }
        pp_tensor_free(x);
    }
    pp_exec_free(ex);
    pp_graph_free(g);
}

/* run_nodes frees what no later listed node reads, unless kept. */
static void test_run_nodes_frees_and_keeps(void **state) {
    (void)state;
    int s, cat;
    pp_graph *g = reshape_graph(&s, &cat);
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    pp_tensor **env = calloc((size_t)g->n_values, sizeof *env);
    uint8_t *keep = calloc((size_t)g->n_values, 1);
    int x = pp_graph_find_value(g, "x");
    TU_OK(pp_tensor_new(PP_F32, 3, (int64_t[]){2, 2, 3}, &env[x]));
    int shape_out = g->nodes[s].out[0];
    keep[g->outputs[0]] = 1;
    keep[shape_out] = 1;
    int all[] = {0, 1, 2, 3, 4};
    TU_OK(pp_exec_run_nodes(ex, all, 5, env, keep));
    assert_non_null(env[g->outputs[0]]);
    assert_non_null(env[shape_out]); /* kept */
    assert_null(env[g->nodes[cat].out[0]]); /* read by reshape, then freed */
    assert_null(env[x]); /* its last reader ran */
    for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]);
    /* a node whose input is missing names it */
    memset(env, 0, sizeof(pp_tensor *) * (size_t)g->n_values);
    assert_int_equal(pp_exec_run_nodes(ex, all, 5, env, NULL), PP_ERR_STATE);
    assert_non_null(strstr(pp_last_error(), "'x'"));
    for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]); /* cached shape values */
    free(env);
    free(keep);
    pp_exec_free(ex);
    pp_graph_free(g);
}

/* The value hook gets each watched value right after its node, may take
 * it out of env, and its error stops the run. */
typedef struct taken {
    int calls, value, fail;
    float first;
} taken;

static pp_status take_value(void *user, int value, pp_tensor **slot) {
    taken *t = user;
    t->calls++;
    t->value = value;
    t->first = ((const float *)(*slot)->data)[0];
    pp_tensor_free(*slot);
    *slot = NULL;
    return t->fail ? PP_ERR_INVALID : PP_OK;
}

static void test_value_hook(void **state) {
    (void)state;
    int s, cat;
    pp_graph *g = reshape_graph(&s, &cat);
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    uint8_t *watch = calloc((size_t)g->n_values, 1);
    pp_tensor **env = calloc((size_t)g->n_values, sizeof *env);
    int x = pp_graph_find_value(g, "x"), y = g->outputs[0], all[] = {0, 1, 2, 3, 4};
    watch[y] = 1;
    for (int fail = 0; fail < 2; fail++) {
        taken t = {0, -1, fail, 0};
        pp_exec_set_value_hook(ex, watch, take_value, &t);
        TU_OK(pp_tensor_new(PP_F32, 3, (int64_t[]){2, 2, 3}, &env[x]));
        pp_status st = pp_exec_run_nodes(ex, all, 5, env, NULL);
        assert_int_equal(st, fail ? PP_ERR_INVALID : PP_OK);
        assert_int_equal(t.calls, 1);
        assert_int_equal(t.value, y);
        assert_true(t.first == 1.0f); /* 0 + 1 */
        assert_null(env[y]);
        for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]), env[v] = NULL;
    }
    pp_exec_set_value_hook(ex, NULL, NULL, NULL);
    TU_OK(pp_tensor_new(PP_F32, 3, (int64_t[]){2, 2, 3}, &env[x]));
    TU_OK(pp_exec_run_nodes(ex, all, 5, env, NULL));
    assert_non_null(env[y]); /* no hook: left in env */
    for (int v = 0; v < g->n_values; v++) pp_tensor_free(env[v]);
    free(env);
    free(watch);
    pp_exec_free(ex);
    pp_graph_free(g);
}

/* The target hook: a weight's gradient as one tall product (MatMulGradB,
 * weight_t) adds straight into the place the hook offers (beta 1), the
 * value hook is not called for it and no tensor is made; the place holds
 * what it held plus the gradient, bit for bit what adding the gradient
 * made alone gives (one block of k). Without a place, the value hook
 * gets the tensor as before. */
static int hook_calls;
static float place[4 * 5];

static pp_status count_value(void *user, int value, pp_tensor **slot) {
    (void)user, (void)value;
    hook_calls++;
    pp_tensor_free(*slot);
    *slot = NULL;
    return PP_OK;
}

static pp_status offer_place(void *user, int value, pp_tensor **target) {
    (void)value;
    if (!*(int *)user) return PP_OK;
    return pp_tensor_wrap(PP_F32, 2, (int64_t[]){4, 5}, place, NULL, NULL, target);
}

static void test_target_hook(void **state) {
    (void)state;
    pp_tensor *dy, *a, *shape, *alone;
    TU_OK(pp_tensor_new(PP_F32, 3, (int64_t[]){2, 3, 4}, &dy));
    TU_OK(pp_tensor_new(PP_F32, 3, (int64_t[]){2, 3, 5}, &a));
    TU_OK(pp_tensor_new(PP_I64, 1, (int64_t[]){2}, &shape));
    for (int i = 0; i < 24; i++) ((float *)dy->data)[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int i = 0; i < 30; i++) ((float *)a->data)[i] = 0.05f * (float)(i % 11) - 0.2f;
    ((int64_t *)shape->data)[0] = 4, ((int64_t *)shape->data)[1] = 5;
    tu_node t;
    tu_node_init_dom(&t, "MatMulGradB", "pippin", 3, (pp_tensor *[]){dy, a, shape}, 1, NULL);
    TU_OK(pp_node_set_int(t.g, t.node, "weight_t", 1));
    alone = tu_node_run_one(&t); /* dW [4, 5] = dy^T a, made as a tensor */
    TU_OK(pp_graph_resolve(t.g));
    pp_exec *ex;
    TU_OK(pp_exec_new(t.g, &ex));
    uint8_t watch[16] = {0};
    int y = t.g->outputs[0], offer = 1;
    watch[y] = 1;
    pp_exec_set_value_hook(ex, watch, count_value, &offer);
    pp_exec_set_target_hook(ex, offer_place);
    for (int i = 0; i < 20; i++) place[i] = 0.25f * (float)i;
    pp_tensor *outs[1] = {NULL};
    hook_calls = 0;
    TU_OK(pp_exec_run(ex, (pp_tensor *[]){dy, a, shape}, outs));
    assert_null(outs[0]);        /* taken: it went into its place */
    assert_int_equal(hook_calls, 0);
    for (int i = 0; i < 20; i++) {
        float want = 0.25f * (float)i + ((const float *)alone->data)[i];
        if (memcmp(&place[i], &want, sizeof want)) fail_msg("place[%d] = %a, want %a", i, (double)place[i], (double)want);
    }
    offer = 0; /* no place: the value hook takes the tensor */
    TU_OK(pp_exec_run(ex, (pp_tensor *[]){dy, a, shape}, outs));
    assert_null(outs[0]);
    assert_int_equal(hook_calls, 1);
    pp_exec_set_target_hook(ex, NULL);
    pp_exec_set_value_hook(ex, NULL, NULL, NULL);
    TU_OK(pp_exec_run(ex, (pp_tensor *[]){dy, a, shape}, outs));
    assert_non_null(outs[0]);
    assert_memory_equal(outs[0]->data, alone->data, alone->nbytes);
    pp_tensor_free(outs[0]);
    pp_exec_free(ex);
    pp_tensor_free(alone);
    tu_node_free(&t); /* it owns dy, a and shape (tu_node_init) */
}

/* Bias sums (SumToShape), LayerNorm's weight and bias gradients
 * (LayerNormGradWeight) and an embedding's (GatherGrad) add into the
 * places offered too: the value hook is not called for them, no tensor
 * comes out, and each place holds what it held plus the gradient made
 * alone, bit for bit. For GatherGrad that needs a picked row's dy rows
 * summed before they reach the place: row 1 is picked three times with
 * 1e8, 1, -1e8, whose sum is 0 alone but not added one by one to 0.25. */
static const pp_graph *sum_graph;
static float sum_place[2][8];

static pp_status offer_sum_place(void *user, int value, pp_tensor **target) {
    (void)user;
    for (int k = 0; k < sum_graph->n_outputs && k < 2; k++)
        if (sum_graph->outputs[k] == value)
            return pp_tensor_wrap(PP_F32, 1, (int64_t[]){8}, sum_place[k], NULL, NULL, target);
    return PP_OK;
}

static void check_sums_in_place(tu_node *t) {
    pp_tensor *alone[2] = {NULL, NULL};
    TU_OK(tu_node_run(t, alone));
    pp_exec *ex;
    TU_OK(pp_exec_new(t->g, &ex));
    uint8_t *watch = calloc((size_t)t->g->n_values + 1, 1);
    assert_non_null(watch);
    for (int k = 0; k < t->n_out; k++) watch[t->g->outputs[k]] = 1;
    sum_graph = t->g;
    pp_exec_set_value_hook(ex, watch, count_value, NULL);
    pp_exec_set_target_hook(ex, offer_sum_place);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 8; i++) sum_place[k][i] = 0.25f * (float)i - 1.0f + (float)k;
    pp_tensor *outs[2] = {NULL, NULL}, *ins[TU_MAX_IN];
    int n = 0;
    for (int i = 0; i < t->n_in; i++)
        if (t->in[i]) ins[n++] = t->in[i];
    hook_calls = 0;
    TU_OK(pp_exec_run(ex, ins, outs));
    assert_int_equal(hook_calls, 0);
    for (int k = 0; k < t->n_out; k++) {
        assert_null(outs[k]);
        for (int i = 0; i < 8; i++) {
            float want = (0.25f * (float)i - 1.0f + (float)k) + ((const float *)alone[k]->data)[i];
            if (memcmp(&sum_place[k][i], &want, sizeof want))
                fail_msg("output %d [%d] = %a, want %a", k, i, (double)sum_place[k][i], (double)want);
        }
        pp_tensor_free(alone[k]);
    }
    pp_exec_free(ex);
    free(watch);
}

static void test_target_hook_sums(void **state) {
    (void)state;
    pp_tensor *g, *shape, *dy, *x;
    TU_OK(pp_tensor_new(PP_F32, 3, (int64_t[]){3, 5, 8}, &g));
    for (int i = 0; i < 120; i++) ((float *)g->data)[i] = 0.37f * (float)(i % 13) - 1.1f;
    TU_OK(pp_tensor_new(PP_I64, 1, (int64_t[]){1}, &shape));
    ((int64_t *)shape->data)[0] = 8;
    tu_node t;
    tu_node_init_dom(&t, "SumToShape", "pippin", 2, (pp_tensor *[]){g, shape}, 1, NULL); /* a bias's gradient */
    check_sums_in_place(&t);
    tu_node_free(&t);
    TU_OK(pp_tensor_new(PP_F32, 2, (int64_t[]){6, 8}, &dy));
    TU_OK(pp_tensor_new(PP_F32, 2, (int64_t[]){6, 8}, &x));
    for (int i = 0; i < 48; i++) {
        ((float *)dy->data)[i] = 0.13f * (float)(i % 7) - 0.4f;
        ((float *)x->data)[i] = 0.21f * (float)(i % 11) - 0.9f;
    }
    tu_node_init_dom(&t, "LayerNormGradWeight", "pippin", 2, (pp_tensor *[]){dy, x}, 2, NULL);
    check_sums_in_place(&t);
    tu_node_free(&t);
    pp_tensor *rows, *ids, *data_shape; /* an embedding [4, 2]; rows 1, 3, 1 (as -3), 1, 0 */
    TU_OK(pp_tensor_new(PP_F32, 2, (int64_t[]){5, 2}, &rows));
    static const float rv[10] = {1e8f, 0.5f, 0.1f, -0.0f, 1.0f, 0.25f, -1e8f, 0.3f, -0.0f, 0.7f};
    memcpy(rows->data, rv, sizeof rv);
    TU_OK(pp_tensor_new(PP_I64, 1, (int64_t[]){5}, &ids));
    static const int64_t iv[5] = {1, 3, -3, 1, 0};
    memcpy(ids->data, iv, sizeof iv);
    TU_OK(pp_tensor_new(PP_I64, 1, (int64_t[]){2}, &data_shape));
    ((int64_t *)data_shape->data)[0] = 4, ((int64_t *)data_shape->data)[1] = 2;
    tu_node_init_dom(&t, "GatherGrad", "pippin", 3, (pp_tensor *[]){rows, ids, data_shape}, 1, NULL);
    check_sums_in_place(&t);
    tu_node_free(&t);
}

/* Regression (review): a target hook that gave a place for a node's first
 * watched output and failed for its second had the first place freed twice
 * (once by the executor's cleanup of the failed offers, once more after the
 * node), dropping a reference the hook's owner still held. The place here
 * holds a reference of the test's own, which must survive the failed run. */
static pp_tensor *kept_place;

static pp_status place_then_fail(void *user, int value, pp_tensor **target) {
    int *calls = user;
    (void)value;
    if ((*calls)++ == 0) return *target = pp_tensor_retain(kept_place), PP_OK;
    return PP_ERR_NOMEM; /* no place for the second output */
}

static void test_target_hook_fails_on_second_output(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("split", &g));
    int x, id;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 1, (int64_t[]){4}, &x));
    TU_OK(pp_graph_add_node(g, "Split", "", "split", 1, &x, 2, NULL, &id));
    int y0 = g->nodes[id].out[0], y1 = g->nodes[id].out[1];
    TU_OK(pp_graph_add_output(g, y0));
    TU_OK(pp_graph_add_output(g, y1));
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    uint8_t *watch = calloc((size_t)g->n_values + 1, 1);
    assert_non_null(watch);
    watch[y0] = watch[y1] = 1;
    int calls = 0;
    TU_OK(pp_tensor_new(PP_F32, 1, (int64_t[]){2}, &kept_place));
    pp_exec_set_value_hook(ex, watch, count_value, &calls);
    pp_exec_set_target_hook(ex, place_then_fail);
    pp_tensor *in, *outs[2] = {NULL, NULL};
    TU_OK(pp_tensor_new(PP_F32, 1, (int64_t[]){4}, &in));
    assert_int_equal(pp_exec_run(ex, &in, outs), PP_ERR_NOMEM);
    assert_int_equal(calls, 2);
    assert_int_equal(kept_place->refcount, 1); /* the executor let go of its reference once */
    pp_tensor_free(kept_place);
    pp_tensor_free(in);
    pp_exec_free(ex);
    free(watch);
    pp_graph_free(g);
}

/* Identity-like ops hand out views: no copy of a large input. */
static void test_views_not_copies(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    int x, n;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, (int64_t[]){4, 8}, &x));
    TU_OK(pp_graph_add_node(g, "Flatten", "", "f", 1, &x, 1, NULL, &n));
    TU_OK(pp_graph_add_output(g, g->nodes[n].out[0]));
    pp_tensor *in, *out;
    TU_OK(pp_tensor_new(PP_F32, 2, (int64_t[]){4, 8}, &in));
    TU_OK(pp_graph_run(g, &in, &out));
    assert_ptr_equal(out->data, in->data);
    pp_tensor_free(in);
    pp_tensor_free(out);
    pp_graph_free(g);
}

/* The KV-cache decoder fixture (test/fixtures/decoder) on one executor, as
 * a generation loop uses it: a step with an EMPTY past (past_key_values.*
 * [1,4,0,8]: Shape/Gather give P = 0, Concat with a 0-sized input, Range
 * from 0, the mask sliced [0:T, :T]), then one with P = 6, then the empty
 * one again (the shape cache must key on the past length). Outputs
 * (logits, present.*) within 1e-4 of torch's. */
static void run_decoder_step(pp_exec *ex, const pp_graph *g, const char *prefix) {
    pp_tensor *ins[16] = {0}, *outs[16] = {0};
    char file[128];
    assert_true(g->n_inputs <= 16 && g->n_outputs <= 16);
    for (int i = 0; i < g->n_inputs; i++) {
        snprintf(file, sizeof file, "%s%s.npy", prefix, g->values[g->inputs[i]].name);
        ins[i] = tu_fixture_npy("decoder", file);
    }
    if (strcmp(prefix, "step0_") == 0) {
        assert_int_equal(ins[1]->ndim, 4);
        assert_int_equal(ins[1]->shape[2], 0);
        assert_int_equal(ins[1]->nbytes, 0);
    }
    TU_OK(pp_exec_run(ex, ins, outs));
    for (int o = 0; o < g->n_outputs; o++) {
        snprintf(file, sizeof file, "%s%s.npy", prefix, g->values[g->outputs[o]].name);
        pp_tensor *want = tu_fixture_npy("decoder", file);
        tu_assert_close(outs[o], want, 0, 1e-4, file);
        pp_tensor_free(want);
        pp_tensor_free(outs[o]);
    }
    for (int i = 0; i < g->n_inputs; i++) pp_tensor_free(ins[i]);
}

static void test_decoder_empty_past(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("decoder", "decoder.onnx");
    assert_int_equal(g->n_inputs, 7);  /* idx, past_key_values.{0,1,2}.{key,value} */
    assert_int_equal(g->n_outputs, 7); /* logits, present.{0,1,2}.{key,value} */
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    run_decoder_step(ex, g, "step0_");
    run_decoder_step(ex, g, "step_");
    run_decoder_step(ex, g, "step0_");
    pp_exec_free(ex);
    pp_graph_free(g);
}

/* With constant parameters, what depends on weights alone (each linear
 * layer's Transpose of its weight) runs once, not at every step of a
 * generation whose shapes change; the results stay the same. */
static void test_constant_params_fold_weights(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("decoder", "decoder.onnx");
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    run_decoder_step(ex, g, "step0_");
    int64_t plain0, plain1, cached0, cached1;
    pp_exec_stats(ex, &plain0, NULL);
    run_decoder_step(ex, g, "step_"); /* another signature: the per-shape cache starts again */
    pp_exec_stats(ex, &plain1, NULL);
    pp_exec_set_constant_params(ex, 1);
    run_decoder_step(ex, g, "step0_");
    pp_exec_stats(ex, &cached0, NULL);
    run_decoder_step(ex, g, "step_"); /* checked against PyTorch inside */
    run_decoder_step(ex, g, "step0_");
    pp_exec_stats(ex, &cached1, NULL);
    int64_t per_step_plain = plain1 - plain0, per_step_cached = (cached1 - cached0) / 2;
    assert_true(per_step_cached < per_step_plain); /* the weight-only nodes ran once */
    pp_exec_set_constant_params(ex, 0); /* and off again: the weight-only nodes run again */
    int64_t off0, off1;
    pp_exec_stats(ex, &off0, NULL);
    run_decoder_step(ex, g, "step_");
    pp_exec_stats(ex, &off1, NULL);
    assert_true(off1 - off0 >= per_step_plain);
    pp_exec_free(ex);
    pp_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dynamic_batch_and_shape_cache),
        cmocka_unit_test(test_run_nodes_frees_and_keeps),
        cmocka_unit_test(test_value_hook),
        cmocka_unit_test(test_target_hook),
        cmocka_unit_test(test_target_hook_sums),
        cmocka_unit_test(test_target_hook_fails_on_second_output),
        cmocka_unit_test(test_views_not_copies),
        cmocka_unit_test(test_decoder_empty_past),
        cmocka_unit_test(test_constant_params_fold_weights),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
