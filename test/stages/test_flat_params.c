/* Flat parameter and gradient buffers: layout, views, lifetime, bad lists,
 * accumulation; data batches; microbatch accumulation equals the full-batch
 * gradient; a step's microbatches summed in place equal their gradients
 * made alone and summed (both in place), at any thread count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/microbatch.h"
#include "test_util.h"

#include "test_filter.h"
/* A graph y = (x * a + b) @ c with three parameters of odd sizes. */
static pp_graph *small_graph(int *ids) {
    pp_graph *g;
    TU_OK(pp_graph_new("t", &g));
    int64_t sa[1] = {3}, sc[2] = {3, 5};
    float va[3] = {1, 2, 3}, vb[1] = {-1}, vc[15];
    for (int i = 0; i < 15; i++) vc[i] = (float)i * 0.5f;
    int x;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, (int64_t[]){-1, 3}, &x));
    TU_OK(pp_graph_add_initializer(g, "a", PP_VALUE_PARAM, tu_f32(1, sa, va), &ids[0]));
    TU_OK(pp_graph_add_initializer(g, "b", PP_VALUE_PARAM, tu_f32(0, NULL, vb), &ids[1]));
    TU_OK(pp_graph_add_initializer(g, "c", PP_VALUE_PARAM, tu_f32(2, sc, vc), &ids[2]));
    int n1, n2, n3;
    TU_OK(pp_graph_add_node(g, "Mul", "", "mul", 2, (int[]){x, ids[0]}, 1, NULL, &n1));
    TU_OK(pp_graph_add_node(g, "Add", "", "add", 2, (int[]){g->nodes[n1].out[0], ids[1]}, 1, NULL, &n2));
    TU_OK(pp_graph_add_node(g, "MatMul", "", "mm", 2, (int[]){g->nodes[n2].out[0], ids[2]}, 1, NULL, &n3));
    TU_OK(pp_graph_add_output(g, g->nodes[n3].out[0]));
    return g;
}

static void test_layout_and_views(void **state) {
    (void)state;
    int ids[3];
    pp_graph *g = small_graph(ids);
    pp_flat_params *fp;
    TU_OK(pp_flat_params_new(g, 3, ids, &fp));
    assert_int_equal(fp->n, 3);
    assert_int_equal(fp->offset[0], 0);
    assert_int_equal(fp->offset[1], 16);
    assert_int_equal(fp->offset[2], 32);
    assert_int_equal(fp->total, 48);
    assert_int_equal((uintptr_t)fp->data % 64, 0);
    /* The graph's parameters are views into the flat buffer. */
    for (int i = 0; i < 3; i++) assert_ptr_equal(g->values[ids[i]].data->data, fp->data + fp->offset[i]);
    assert_true(fp->data[2] == 3.0f && fp->data[16] == -1.0f && fp->data[33] == 0.5f);
    assert_int_equal(g->values[ids[2]].data->ndim, 2);
    assert_int_equal(pp_flat_params_find(fp, "c"), 2);
    assert_int_equal(pp_flat_params_find(fp, "zz"), -1);
    /* Padding is zero. */
    for (int64_t k = 3; k < 16; k++) assert_true(fp->data[k] == 0.0f && fp->grad[k] == 0.0f);
    /* An update through the buffer is what the graph computes with. */
    fp->data[fp->offset[1]] = 10.0f;
    pp_tensor *x = tu_f32(2, (int64_t[]){1, 3}, (float[]){1, 1, 1}), *y = NULL;
    TU_OK(pp_graph_run(g, &x, &y));
    /* (1*[1,2,3] + 10) @ c, column 0 = 11*0 + 12*2.5 + 13*5 */
    assert_float_equal(((float *)y->data)[0], 12 * 2.5f + 13 * 5.0f, 1e-4);
    pp_tensor_free(x);
    pp_tensor_free(y);
    /* The graph outlives the flat buffers: views keep the memory. */
    pp_tensor *gv;
    TU_OK(pp_flat_params_grad_view(fp, 2, &gv));
    assert_int_equal(gv->ndim, 2);
    assert_int_equal(gv->shape[1], 5);
    pp_flat_params_free(fp);
    assert_true(((float *)g->values[ids[1]].data->data)[0] == 10.0f);
    ((float *)gv->data)[0] = 1.0f;
    pp_tensor_free(gv);
    pp_graph_free(g);
}

static void test_accumulate_and_zero(void **state) {
    (void)state;
    int ids[3];
    pp_graph *g = small_graph(ids);
    pp_flat_params *fp;
    TU_OK(pp_flat_params_new(g, 3, ids, &fp));
    pp_graph_free(g); /* the other order: graph first */
    pp_tensor *d = tu_f32(1, (int64_t[]){3}, (float[]){1, 2, 3});
    TU_OK(pp_flat_params_accumulate(fp, 0, d));
    TU_OK(pp_flat_params_accumulate(fp, 0, d));
    assert_true(fp->grad[0] == 2.0f && fp->grad[2] == 6.0f);
    pp_tensor *v;
    TU_OK(pp_flat_params_grad_view(fp, 0, &v));
    assert_true(((float *)v->data)[1] == 4.0f);
    pp_flat_params_zero_grad(fp);
    assert_true(((float *)v->data)[1] == 0.0f);
    pp_tensor_free(v);
    /* Wrong size and wrong index are errors naming the parameter. */
    assert_int_equal(pp_flat_params_accumulate(fp, 2, d), PP_ERR_SHAPE);
    assert_non_null(strstr(pp_last_error(), "'c'"));
    assert_int_equal(pp_flat_params_accumulate(fp, 5, d), PP_ERR_INVALID);
    TU_OK(pp_flat_params_set(fp, 0, d));
    assert_true(fp->data[1] == 2.0f);
    TU_OK(pp_flat_params_data_view(fp, 0, &v));
    assert_true(((float *)v->data)[2] == 3.0f);
    pp_tensor_free(v);
    pp_tensor_free(d);
    pp_flat_params_free(fp);
}

static void test_not_a_parameter(void **state) {
    (void)state;
    int ids[3];
    pp_graph *g = small_graph(ids);
    int x = pp_graph_find_value(g, "x");
    pp_flat_params *fp = NULL;
    assert_int_equal(pp_flat_params_new(g, 1, &x, &fp), PP_ERR_INVALID);
    assert_null(fp);
    assert_non_null(strstr(pp_last_error(), "'x'"));
    /* One parameter listed twice would get two slots of which the graph
     * reads only the last: refused, and the graph is left alone. */
    int twice[2] = {ids[0], ids[0]};
    pp_tensor *before = g->values[ids[0]].data;
    assert_int_equal(pp_flat_params_new(g, 2, twice, &fp), PP_ERR_INVALID);
    assert_null(fp);
    assert_non_null(strstr(pp_last_error(), "'a'"));
    assert_ptr_equal(g->values[ids[0]].data, before);
    assert_int_equal(pp_flat_params_new(g, -1, ids, &fp), PP_ERR_INVALID);
    assert_int_equal(pp_flat_params_new(g, 1, NULL, &fp), PP_ERR_INVALID);
    pp_graph_free(g);
}

/* Batches of rows read in order, wrapping around; a negative step is an
 * error, not a read before the data. */
static void test_data_batch(void **state) {
    (void)state;
    pp_tensor *d = tu_f32(2, (int64_t[]){3, 2}, (float[]){0, 1, 10, 11, 20, 21}), *b;
    TU_OK(pp_data_batch(d, 1, 2, &b)); /* rows 2, 0 */
    assert_int_equal(b->shape[0], 2);
    assert_true(((float *)b->data)[0] == 20.0f && ((float *)b->data)[3] == 1.0f);
    pp_tensor_free(b);
    b = NULL;
    assert_int_equal(pp_data_batch(d, -1, 2, &b), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "-1"));
    assert_null(b);
    pp_tensor_free(d);
}

/* Gradients of two half batches seeded with 1/2 add up to the gradient of
 * the whole batch (MLP fixture, batch 4). */
static void test_microbatch_accumulation(void **state) {
    (void)state;
    pp_graph *g;
    TU_OK(pp_onnx_load(tu_src_path("test/fixtures/mlp/model.onnx"), &g));
    pp_trainer *t;
    TU_OK(pp_trainer_new(g, NULL, &t));
    pp_flat_params *fp = pp_trainer_params(t);
    pp_tensor *x, *y;
    TU_OK(pp_npy_load(tu_src_path("test/fixtures/mlp/x.npy"), &x));
    TU_OK(pp_npy_load(tu_src_path("test/fixtures/mlp/y.npy"), &y));
    float loss;
    TU_OK(pp_trainer_backward(t, (pp_tensor *[]){x, y}, 1.0f, &loss));
    float *whole = malloc(sizeof(float) * (size_t)fp->total);
    memcpy(whole, fp->grad, sizeof(float) * (size_t)fp->total);
    pp_flat_params_zero_grad(fp);
    pp_tensor *xc[2], *yc[2];
    TU_OK(pp_microbatch_split(x, 2, "x", xc));
    TU_OK(pp_microbatch_split(y, 2, "y", yc));
    float l0, l1;
    TU_OK(pp_trainer_backward(t, (pp_tensor *[]){xc[0], yc[0]}, 0.5f, &l0));
    TU_OK(pp_trainer_backward(t, (pp_tensor *[]){xc[1], yc[1]}, 0.5f, &l1));
    assert_float_equal((l0 + l1) / 2, loss, 1e-6);
    for (int64_t k = 0; k < fp->total; k++) assert_float_equal(fp->grad[k], whole[k], 1e-6);
    for (int i = 0; i < 2; i++) {
        pp_tensor_free(xc[i]);
        pp_tensor_free(yc[i]);
    }
    free(whole);
    pp_tensor_free(x);
    pp_tensor_free(y);
    pp_trainer_free(t);
    pp_graph_free(g);
}

/* M microbatches' gradients go into the flat buffer as they are made (the
 * GEMM of a weight's gradient with beta 1; a bias's, a LayerNorm's and the
 * position embedding's sums added in place; the tied head and token
 * embedding through the value hook). The step's sum must equal each
 * microbatch's gradient made alone, into a zeroed buffer, then summed in
 * microbatch order (bit for bit for the 1-D parameters, within float
 * rounding for the 2-D weights: OpenBLAS adds a GEMM's k blocks into C one
 * after another), and be the same bits at 1, 2 and 4 threads (GPT fixture,
 * batch 8 as 4 microbatches). Both sides take the in-place path, so this
 * proves the sums deterministic and ordered, not that they are the old
 * path's bits: test_exec's test_target_hook_sums compares each kernel's
 * in-place sum with its tensor added alone. */
#define SUM_MBS 4

static void accumulate_step(pp_trainer *t, pp_tensor *const *mb0, pp_tensor *const *mb1, int only, float *grad) {
    pp_flat_params *fp = pp_trainer_params(t);
    pp_flat_params_zero_grad(fp);
    pp_trainer_hold_params(t, 1);
    for (int k = 0; k < SUM_MBS; k++) {
        if (only >= 0 && k != only) continue;
        float l;
        pp_trainer_set_step(t, 0, k);
        TU_OK(pp_trainer_backward(t, (pp_tensor *[]){mb0[k], mb1[k]}, 1.0f / SUM_MBS, &l));
    }
    pp_trainer_hold_params(t, 0);
    assert_int_equal(fp->grads_incomplete, 0);
    memcpy(grad, fp->grad, sizeof(float) * (size_t)fp->total);
}

static void test_microbatch_sum_in_place(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model_nosplit.onnx");
    pp_trainer *t;
    TU_OK(pp_trainer_new(g, "loss", &t));
    pp_flat_params *fp = pp_trainer_params(t);
    size_t bytes = sizeof(float) * (size_t)fp->total;
    pp_tensor *data[2] = {tu_fixture_npy("gpt", "train_idx.npy"), tu_fixture_npy("gpt", "train_targets.npy")};
    pp_tensor *b[2], *mb[2][SUM_MBS];
    for (int i = 0; i < 2; i++) {
        TU_OK(pp_data_batch(data[i], 0, 8, &b[i]));
        TU_OK(pp_microbatch_split(b[i], SUM_MBS, "batch", mb[i]));
    }
    float *sum = calloc((size_t)fp->total, sizeof(float)), *one = malloc(bytes), *acc[3];
    assert_true(sum && one);
    for (int k = 0; k < SUM_MBS; k++) { /* each alone, summed in microbatch order */
        accumulate_step(t, mb[0], mb[1], k, one);
        for (int64_t e = 0; e < fp->total; e++) sum[e] += one[e];
    }
    static const int threads[3] = {1, 2, 4};
    for (int r = 0; r < 3; r++) {
        acc[r] = malloc(bytes);
        assert_non_null(acc[r]);
        pp_set_threads(threads[r]);
        accumulate_step(t, mb[0], mb[1], -1, acc[r]);
    }
    pp_set_threads(1);
    int exact = 0;
    for (int i = 0; i < fp->n; i++) {
        const float *a = acc[0] + fp->offset[i], *w = sum + fp->offset[i];
        if (fp->ndims[i] == 1) {
            exact++;
            for (int64_t e = 0; e < fp->numel[i]; e++)
                if (memcmp(&a[e], &w[e], sizeof(float)))
                    fail_msg("%s[%lld]: %a in place, %a summed", fp->names[i], (long long)e, (double)a[e], (double)w[e]);
            continue;
        }
        float big = 0;
        for (int64_t e = 0; e < fp->numel[i]; e++) big = fmaxf(big, fabsf(w[e]));
        for (int64_t e = 0; e < fp->numel[i]; e++)
            if (fabsf(a[e] - w[e]) > 1e-6f * big)
                fail_msg("%s[%lld]: %g in place, %g summed", fp->names[i], (long long)e, (double)a[e], (double)w[e]);
    }
    assert_true(exact > 0);
    assert_memory_equal(acc[0], acc[1], bytes); /* the thread count changes no bit */
    assert_memory_equal(acc[0], acc[2], bytes);
    for (int r = 0; r < 3; r++) free(acc[r]);
    free(sum);
    free(one);
    for (int i = 0; i < 2; i++) {
        pp_tensor_free(b[i]);
        pp_tensor_free(data[i]);
        for (int k = 0; k < SUM_MBS; k++) pp_tensor_free(mb[i][k]);
    }
    pp_trainer_free(t);
    pp_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_views),
        cmocka_unit_test(test_accumulate_and_zero),
        cmocka_unit_test(test_not_a_parameter),
        cmocka_unit_test(test_data_batch),
        cmocka_unit_test(test_microbatch_accumulation),
        cmocka_unit_test(test_microbatch_sum_in_place),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
