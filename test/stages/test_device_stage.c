/* Stages on a device: the example GPT's training step (forward, I and W,
 * then an AdamW step) with its stages on the fake device equals the CPU
 * run bit for bit (the fake runs the CPU kernels, so any difference is a
 * lost or misplaced copy), and a missing CUDA device is a clear error
 * naming the stage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"

static const char *const input_names[2] = {"idx", "targets"};

/* One training step of the GPT pipe with every stage on `spec` (NULL: the
 * CPU): outs[] the outputs, then an AdamW step. */
static pp_runner *gpt_step(const char *spec, pp_pipe **p_out, pp_tensor **outs) {
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    pp_runner *r;
    TU_OK(pp_runner_new(p, 1, &r));
    for (int s = 0; spec && s < pp_runner_n_stages(r); s++) TU_OK(pp_stage_use_device(pp_runner_stage(r, s), spec));
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    TU_OK(pp_runner_set_optimizer(r, &oc));
    pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
    TU_OK(pp_runner_step(r, 2, NULL, 2, input_names, ins, outs));
    TU_OK(pp_runner_optimizer_step(r));
    pp_tensor_free(ins[0]);
    pp_tensor_free(ins[1]);
    *p_out = p;
    return r;
}

static void assert_same(const pp_tensor *a, const pp_tensor *b, const char *what) {
    if (!pp_shape_equal(a->ndim, a->shape, b->ndim, b->shape) || memcmp(a->data, b->data, a->nbytes) != 0)
        fail_msg("%s differs between the fake device and the CPU", what);
}

static void test_gpt_training_step_on_fake_device(void **state) {
    (void)state;
    pp_pipe *pc, *pd;
    pp_tensor *oc[4] = {0}, *od[4] = {0};
    pp_runner *cpu = gpt_step(NULL, &pc, oc);
    /* the ops the CUDA backend claims (lib/cuda/cuda_ops.c) */
    pp_runner *dev = gpt_step("fake:Add,Sub,Mul,Div,Relu,Tanh,Gelu,Neg,Exp,Sqrt,Sigmoid,ReluGrad,TanhGrad,GeluGrad,"
                              "Softmax,SoftmaxGrad,LayerNormalization,LayerNormGradInput,LayerNormGradWeight,MatMul,"
                              "Gemm,MatMulAdd,MatMulGradA,MatMulGradB,Gather,GatherGrad,SoftmaxCrossEntropyLoss,"
                              "SoftmaxCrossEntropyLossGrad,SumToShape,Transpose,Reshape,Flatten,Squeeze,Unsqueeze,Identity,Concat",
                              &pd, od);
    for (int o = 0; o < pp_runner_n_outputs(cpu); o++) assert_same(od[o], oc[o], pp_runner_output_name(cpu, o));
    int checked = 0;
    int64_t kernels = 0, copies = 0;
    for (int s = 0; s < pp_runner_n_stages(cpu); s++) {
        pp_stage *sc = pp_runner_stage(cpu, s), *sd = pp_runner_stage(dev, s);
        assert_null(pp_stage_device(sc));
        pp_device_stats st;
        pp_device_get_stats(pp_stage_device(sd), &st);
        kernels += st.kernels;
        copies += st.uploads + st.downloads;
        assert_int_equal(st.fallbacks, 0);
        for (int i = 0; i < pp_stage_n_params(sc); i++) {
            const char *name = pp_stage_param_name(sc, i);
            pp_tensor *gc, *gd, *pc_, *pd_;
            TU_OK(pp_runner_param_grad(cpu, name, &gc));
            TU_OK(pp_runner_param_grad(dev, name, &gd));
            assert_same(gd, gc, name);
            TU_OK(pp_runner_param(cpu, name, &pc_)); /* after the AdamW step */
            TU_OK(pp_runner_param(dev, name, &pd_));
            assert_same(pd_, pc_, name);
            pp_tensor_free(gc);
            pp_tensor_free(gd);
            pp_tensor_free(pc_);
            pp_tensor_free(pd_);
            checked++;
        }
    }
    assert_true(checked > 0);
    assert_true(kernels > 0 && copies > 0);
    for (int o = 0; o < 4; o++) {
        pp_tensor_free(oc[o]);
        pp_tensor_free(od[o]);
    }
    pp_runner_free(cpu);
    pp_runner_free(dev);
    pp_pipe_free(pc);
    pp_pipe_free(pd);
}

/* Without a GPU (or a CUDA build): an error naming the stage, the stage
 * still usable on the CPU. */
static void test_no_cuda_device_is_an_error(void **state) {
    (void)state;
    pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
    pp_pipe *p;
    TU_OK(pp_pipe_split(g, NULL, &p));
    pp_graph_free(g);
    pp_stage *st;
    TU_OK(pp_stage_from_pipe(p, 1, 0, &st));
    pp_status s = pp_stage_use_device(st, "cuda:0");
    if (s == PP_OK) { /* a machine with a GPU */
        assert_non_null(pp_stage_device(st));
    } else {
        assert_int_equal(s, PP_ERR_UNSUPPORTED);
        assert_non_null(strstr(pp_last_error(), "stage 1: device 'cuda:0': no CUDA device"));
        assert_null(pp_stage_device(st));
    }
    TU_OK(pp_stage_use_device(st, "cpu"));
    assert_null(pp_stage_device(st));
    pp_stage_free(st);
    pp_pipe_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_training_step_on_fake_device),
        cmocka_unit_test(test_no_cuda_device_is_an_error),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
