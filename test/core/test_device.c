/* Devices on the CPU: the fake device (separate host memory, counted
 * copies, a chosen op subset) checks placement, CPU fallback, boundary
 * copies, constants kept on the device, staging buffers and the pool;
 * results must equal the CPU run bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_backend.h"
#include "test_util.h"

#include "test_filter.h"

/* y = Mul(Tanh(Relu(Add(MatMul(x, W), b))), c): with the fake device
 * claiming MatMul, Add, Relu and Mul, Tanh falls back to the CPU. */
static pp_graph *mlp_graph(void) {
    pp_graph *g;
    TU_OK(pp_graph_new("g", &g));
    uint64_t rng = 7;
    float wv[12], bv[4], cv[4];
    for (int i = 0; i < 12; i++) wv[i] = (float)tu_urand(&rng);
    for (int i = 0; i < 4; i++) bv[i] = (float)tu_urand(&rng), cv[i] = (float)tu_urand(&rng);
    int x, w, b, c, mm, add, relu, tanh_, mul;
    TU_OK(pp_graph_add_input(g, "x", PP_F32, 2, SHAPE(-1, 3), &x));
    TU_OK(pp_graph_add_initializer(g, "W", PP_VALUE_CONST, tu_f32(2, SHAPE(3, 4), wv), &w));
    TU_OK(pp_graph_add_initializer(g, "b", PP_VALUE_CONST, tu_f32(1, SHAPE(4), bv), &b));
    TU_OK(pp_graph_add_initializer(g, "c", PP_VALUE_CONST, tu_f32(1, SHAPE(4), cv), &c));
    TU_OK(pp_graph_add_node(g, "MatMul", "", "mm", 2, (int[]){x, w}, 1, NULL, &mm));
    TU_OK(pp_graph_add_node(g, "Add", "", "add", 2, (int[]){g->nodes[mm].out[0], b}, 1, NULL, &add));
    TU_OK(pp_graph_add_node(g, "Relu", "", "relu", 1, &g->nodes[add].out[0], 1, NULL, &relu));
    TU_OK(pp_graph_add_node(g, "Tanh", "", "tanh", 1, &g->nodes[relu].out[0], 1, NULL, &tanh_));
    TU_OK(pp_graph_add_node(g, "Mul", "", "mul", 2, (int[]){g->nodes[tanh_].out[0], c}, 1, NULL, &mul));
    TU_OK(pp_graph_add_output(g, g->nodes[mul].out[0]));
    TU_OK(pp_graph_add_output(g, g->nodes[relu].out[0])); /* also read by Tanh on the CPU */
    return g;
}

static pp_tensor *random_x(int64_t rows, uint64_t seed) {
    pp_tensor *x;
    TU_OK(pp_tensor_new(PP_F32, 2, SHAPE(rows, 3), &x));
    for (int64_t i = 0; i < rows * 3; i++) ((float *)x->data)[i] = (float)tu_urand(&seed);
    return x;
}

static void assert_same_bits(const pp_tensor *a, const pp_tensor *b) {
    assert_int_equal(a->dtype, b->dtype);
    assert_true(pp_shape_equal(a->ndim, a->shape, b->ndim, b->shape));
    assert_memory_equal(a->data, b->data, a->nbytes);
}

static void test_placement_fallback_and_copies(void **state) {
    (void)state;
    pp_graph *g = mlp_graph();
    pp_device *dev;
    TU_OK(pp_device_open("fake:MatMul,Add,Relu,Mul", &dev));
    assert_string_equal(pp_device_name(dev), "fake");
    pp_exec *cpu, *ex;
    TU_OK(pp_exec_new(g, &cpu));
    TU_OK(pp_exec_new(g, &ex));
    TU_OK(pp_exec_set_device(ex, dev));
    const char *want[] = {"fake", "fake", "fake", "cpu", "fake"};
    for (int i = 0; i < g->n_nodes; i++) {
        assert_string_equal(pp_exec_node_device(ex, i), want[i]);
        assert_string_equal(pp_exec_node_device(cpu, i), "cpu");
    }
    for (int run = 0; run < 2; run++) {
        pp_tensor *x = random_x(5, 11 + (uint64_t)run), *y_cpu[2], *y_dev[2];
        pp_device_reset_stats(dev);
        TU_OK(pp_exec_run(cpu, &x, y_cpu));
        TU_OK(pp_exec_run(ex, &x, y_dev));
        for (int o = 0; o < 2; o++) {
            assert_null(pp_tensor_device(y_dev[o])); /* results come back to the host */
            assert_same_bits(y_dev[o], y_cpu[o]);
        }
        pp_device_stats st;
        pp_device_get_stats(dev, &st);
        /* Up: x, and Tanh's output to Mul; W, b and c on the first run only
         * (constants stay on the device). Down: Relu's output to Tanh (the
         * same copy is the output), y. */
        assert_int_equal(st.uploads, run == 0 ? 5 : 2);
        assert_int_equal(st.downloads, 2);
        assert_int_equal(st.kernels, 4);
        assert_int_equal(st.download_bytes, 2 * 5 * 4 * 4);
        if (run == 1) assert_true(st.pool_hits > 0); /* the second run reuses buffers */
        pp_tensor_free(x);
        for (int o = 0; o < 2; o++) {
            pp_tensor_free(y_cpu[o]);
            pp_tensor_free(y_dev[o]);
        }
    }
    pp_exec_free(ex);
    pp_exec_free(cpu);
    pp_device_stats st;
    pp_device_get_stats(dev, &st);
    assert_int_equal(st.bytes_in_use, 0); /* every device buffer went back to the pool */
    pp_device_close(dev);
    pp_graph_free(g);
}

/* A device claiming nothing the graph has: no copies, the CPU's results. */
/* The executor's value hook (a stage's W adding each gradient into its
 * flat buffer) reads host memory: a watched value on the device is never
 * handed to it; it comes back to the host with the run's results instead.
 * (On a GPU the hook read device memory and crashed.) */
static int hook_calls, hook_saw_device;

static pp_status watch_hook(void *user, int v, pp_tensor **slot) {
    (void)user, (void)v;
    hook_calls++;
    if (pp_tensor_device(*slot)) hook_saw_device++;
    return PP_OK;
}

static void test_value_hook_sees_host_values_only(void **state) {
    (void)state;
    pp_graph *g = mlp_graph();
    pp_device *dev;
    TU_OK(pp_device_open("fake:MatMul,Add,Relu,Mul", &dev));
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    TU_OK(pp_exec_set_device(ex, dev));
    uint8_t *watch = calloc((size_t)g->n_values, 1);
    for (int i = 0; i < g->n_nodes; i++) watch[g->nodes[i].out[0]] = 1; /* every node's output */
    pp_exec_set_value_hook(ex, watch, watch_hook, NULL);
    hook_calls = hook_saw_device = 0;
    pp_tensor *x = random_x(5, 3), *y[2];
    TU_OK(pp_exec_run(ex, &x, y));
    assert_int_equal(hook_saw_device, 0);
    assert_int_equal(hook_calls, 1); /* Tanh's, the one node on the CPU */
    for (int o = 0; o < 2; o++) {
        assert_null(pp_tensor_device(y[o]));
        pp_tensor_free(y[o]);
    }
    pp_exec_set_value_hook(ex, NULL, NULL, NULL);
    pp_tensor_free(x);
    free(watch);
    pp_exec_free(ex);
    pp_device_close(dev);
    pp_graph_free(g);
}

static void test_nothing_claimed_no_copies(void **state) {
    (void)state;
    pp_graph *g = mlp_graph();
    pp_device *dev;
    TU_OK(pp_device_open("fake:Conv", &dev));
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    TU_OK(pp_exec_set_device(ex, dev));
    pp_tensor *x = random_x(3, 5), *y[2];
    TU_OK(pp_exec_run(ex, &x, y));
    pp_device_stats st;
    pp_device_get_stats(dev, &st);
    assert_int_equal(st.uploads + st.downloads + st.kernels, 0);
    pp_tensor_free(y[0]);
    pp_tensor_free(y[1]);
    pp_tensor_free(x);
    pp_exec_free(ex);
    pp_device_close(dev);
    pp_graph_free(g);
}

/* The example GPT's forward (loss and logits) with the default fake ops
 * and with the CPU: the same bits; back on the CPU device: no copies. */
static void test_gpt_forward_equal(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model_nosplit.onnx");
    pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
    assert_int_equal(g->n_inputs, 2);
    pp_tensor *want[4] = {0}, *got[4] = {0};
    assert_true(g->n_outputs <= 4);
    TU_OK(pp_graph_run(g, ins, want));
    pp_device *dev;
    TU_OK(pp_device_open("fake", &dev));
    pp_exec *ex;
    TU_OK(pp_exec_new(g, &ex));
    TU_OK(pp_exec_set_device(ex, dev));
    int placed = 0;
    for (int i = 0; i < g->n_nodes; i++) placed += strcmp(pp_exec_node_device(ex, i), "fake") == 0;
    assert_true(placed > 0 && placed < g->n_nodes);
    TU_OK(pp_exec_run(ex, ins, got));
    for (int k = 0; k < g->n_outputs; k++) {
        assert_same_bits(got[k], want[k]);
        pp_tensor_free(got[k]);
    }
    pp_device_stats st;
    pp_device_get_stats(dev, &st);
    assert_int_equal(st.kernels, placed);
    assert_true(st.uploads > 0 && st.downloads > 0);
    TU_OK(pp_exec_set_device(ex, NULL)); /* back to the CPU */
    pp_device_reset_stats(dev);
    TU_OK(pp_exec_run(ex, ins, got));
    for (int k = 0; k < g->n_outputs; k++) {
        assert_same_bits(got[k], want[k]);
        pp_tensor_free(got[k]);
        pp_tensor_free(want[k]);
    }
    pp_device_get_stats(dev, &st);
    assert_int_equal(st.uploads + st.downloads + st.kernels, 0);
    pp_exec_free(ex);
    pp_device_close(dev);
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    pp_graph_free(g);
}

/* Staging: an async download lands in pinned memory, readable after the
 * wait; freed staging buffers return to the pool. */
static void test_staging_download(void **state) {
    (void)state;
    pp_device *dev;
    TU_OK(pp_device_open("fake", &dev));
    pp_tensor *h = F32(1, SHAPE(4), 1, 2, 3, 4), *d, *staged;
    TU_OK(pp_device_upload(dev, h, &d));
    assert_ptr_equal(pp_tensor_device(d), dev);
    assert_null(pp_tensor_device(h));
    TU_OK(pp_device_download_async(dev, d, &staged));
    assert_null(pp_tensor_device(staged)); /* pinned host memory, not device memory */
    TU_OK(pp_device_staging_wait(dev, staged));
    assert_same_bits(staged, h);
    pp_tensor *again;
    assert_int_equal(pp_device_upload(dev, d, &again), PP_ERR_INVALID); /* already on the device */
    assert_null(again);
    assert_non_null(strstr(pp_last_error(), "already on a device"));
    assert_int_equal(pp_device_staging_wait(dev, h), PP_ERR_INVALID); /* not a staging buffer */
    pp_tensor_free(staged);
    pp_tensor_free(d);
    pp_tensor_free(h);
    pp_device_stats st;
    pp_device_get_stats(dev, &st);
    assert_int_equal(st.uploads, 1);
    assert_int_equal(st.downloads, 1);
    assert_int_equal(st.bytes_in_use, 0);
    assert_int_equal(st.bytes_pooled, 2 * 256); /* one device block, one pinned block */
    pp_device_close(dev);
}

/* The fake device is as strict as a real one may be: a fresh buffer holds
 * NaN bytes (cudaMalloc does not zero), and a download lands only when it
 * is waited for, so code that reads either too early fails on the CPU. */
static void test_fake_device_is_strict(void **state) {
    (void)state;
    pp_device *dev;
    TU_OK(pp_device_open("fake", &dev));
    pp_tensor *fresh;
    TU_OK(pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, 1, SHAPE(3), &fresh));
    for (int i = 0; i < 3; i++) assert_true(isnan(((float *)fresh->data)[i]));
    pp_tensor *h = F32(1, SHAPE(3), 1, 2, 3), *d, *staged;
    TU_OK(pp_device_upload(dev, h, &d)); /* the compute stream waits: it is there */
    assert_memory_equal(d->data, h->data, h->nbytes);
    TU_OK(pp_device_download_async(dev, d, &staged));
    for (int i = 0; i < 3; i++) assert_true(isnan(((float *)staged->data)[i])); /* not yet */
    TU_OK(pp_device_staging_wait(dev, staged));
    assert_same_bits(staged, h);
    pp_tensor_free(staged);
    pp_tensor_free(fresh); /* back to the pool: handed out again, poisoned again */
    TU_OK(pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, 1, SHAPE(3), &fresh));
    assert_true(isnan(((float *)fresh->data)[0]));
    pp_tensor_free(fresh);
    pp_tensor_free(d);
    pp_tensor_free(h);
    pp_device_close(dev);
}

/* An async download's source may be freed by its owner at once (a run
 * ends, its values go back to the pool) while the compute stream goes on:
 * the next buffer handed out must not be that memory before the copy is
 * waited for. Before, the pool gave it out again and the copy read the
 * new tensor's bytes (a microbatch's output sent with the next one's). */
static void test_download_source_kept_until_waited(void **state) {
    (void)state;
    pp_device *dev;
    TU_OK(pp_device_open("fake", &dev));
    pp_tensor *h = F32(1, SHAPE(4), 1, 2, 3, 4), *d, *staged, *next;
    TU_OK(pp_device_upload(dev, h, &d));
    TU_OK(pp_device_download_async(dev, d, &staged));
    assert_true(pp_tensor_pending(staged));
    void *src = d->data;
    pp_tensor_free(d); /* the owner is done with it */
    TU_OK(pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, 1, SHAPE(4), &next)); /* the next compute's buffer */
    assert_ptr_not_equal(next->data, src);
    memset(next->data, 0, next->nbytes); /* a kernel writes it */
    TU_OK(pp_tensor_wait(staged));
    assert_false(pp_tensor_pending(staged));
    assert_same_bits(staged, h);
    assert_false(pp_tensor_pending(h));
    TU_OK(pp_tensor_wait(h)); /* any tensor: at once */
    pp_tensor_free(next);
    pp_tensor_free(staged);
    pp_tensor_free(h);
    pp_device_stats st;
    pp_device_get_stats(dev, &st);
    assert_int_equal(st.bytes_in_use, 0);
    pp_device_close(dev);
}

/* A constant the host rewrites in place (weights replaced on a running
 * service): its device copy, kept across runs by the tensor it copies,
 * is made again after pp_exec_constants_written, so the run equals the
 * CPU's with the new values. Without it the device used the old ones. */
static void test_constants_written_reach_the_device(void **state) {
    (void)state;
    pp_graph *g = mlp_graph();
    pp_device *dev;
    TU_OK(pp_device_open("fake:MatMul,Add,Relu,Mul", &dev));
    pp_exec *cpu, *ex;
    TU_OK(pp_exec_new(g, &cpu));
    TU_OK(pp_exec_new(g, &ex));
    TU_OK(pp_exec_set_device(ex, dev));
    pp_tensor *x = random_x(5, 21), *y_cpu[2], *y_dev[2];
    for (int run = 0; run < 2; run++) {
        if (run == 1) { /* W and b rewritten in place */
            for (int v = 0; v < g->n_values; v++)
                if (g->values[v].kind == PP_VALUE_CONST && g->values[v].data)
                    for (int64_t i = 0; i < pp_tensor_numel(g->values[v].data); i++)
                        ((float *)g->values[v].data->data)[i] += 0.5f;
            pp_exec_constants_written(ex);
            pp_exec_constants_written(cpu);
        }
        pp_device_reset_stats(dev);
        TU_OK(pp_exec_run(cpu, &x, y_cpu));
        TU_OK(pp_exec_run(ex, &x, y_dev));
        pp_device_stats st;
        pp_device_get_stats(dev, &st);
        assert_int_equal(st.uploads, 5); /* x, Tanh's output, and W, b, c again */
        for (int o = 0; o < 2; o++) {
            assert_same_bits(y_dev[o], y_cpu[o]);
            pp_tensor_free(y_cpu[o]);
            pp_tensor_free(y_dev[o]);
        }
    }
    pp_tensor_free(x);
    pp_exec_free(ex);
    pp_exec_free(cpu);
    pp_device_close(dev);
    pp_graph_free(g);
}

/* A device tensor may outlive pp_device_close (a stage's output after the
 * stage is gone): the device goes with its last buffer (ASan: no leak, no
 * use after free). */
static void test_tensor_outlives_close(void **state) {
    (void)state;
    pp_device *dev;
    TU_OK(pp_device_open("fake", &dev));
    pp_tensor *h = F32(1, SHAPE(3), 1, 2, 3), *d, *staged;
    TU_OK(pp_device_upload(dev, h, &d));
    TU_OK(pp_device_download_async(dev, d, &staged));
    pp_device_close(dev);
    TU_OK(pp_device_staging_wait(NULL, staged));
    assert_same_bits(staged, h);
    pp_tensor_free(d);
    pp_tensor_free(staged);
    pp_tensor_free(h);
}

static void test_specs_and_errors(void **state) {
    (void)state;
    pp_device *dev = NULL;
    TU_OK(pp_device_open("cpu", &dev));
    assert_true(pp_device_is_cpu(dev));
    pp_device_close(dev);
    assert_int_equal(pp_device_spec_check("cuda:1"), PP_OK);
    assert_int_equal(pp_device_spec_check("gpu"), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "device 'gpu'"));
    assert_int_equal(pp_device_spec_check("cuda:x"), PP_ERR_INVALID);
    assert_int_equal(pp_device_open("fake:Add,", &dev), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "empty"));
    assert_null(dev);
    /* No GPU here (or no CUDA build): a clear error, never an abort. */
    pp_status s = pp_device_open("cuda:0", &dev);
    if (s == PP_OK) { /* a machine with a GPU */
        pp_device_close(dev);
        return;
    }
    assert_int_equal(s, PP_ERR_UNSUPPORTED);
    assert_non_null(strstr(pp_last_error(), "no CUDA device"));
    assert_non_null(strstr(pp_last_error(), "cuda:0"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement_fallback_and_copies),
        cmocka_unit_test(test_value_hook_sees_host_values_only),
        cmocka_unit_test(test_nothing_claimed_no_copies),
        cmocka_unit_test(test_gpt_forward_equal),
        cmocka_unit_test(test_staging_download),
        cmocka_unit_test(test_fake_device_is_strict),
        cmocka_unit_test(test_download_source_kept_until_waited),
        cmocka_unit_test(test_constants_written_reach_the_device),
        cmocka_unit_test(test_tensor_outlives_close),
        cmocka_unit_test(test_specs_and_errors),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
