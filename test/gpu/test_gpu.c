/* gpu: every op the CUDA backend claims, and the example GPT's training
 * step with its stages on cuda:0, against the CPU within 1e-5 relative:
 * |gpu - cpu| <= 1e-5 (|cpu| + max |cpu| over the tensor), the tensor's
 * scale standing in where a sum cancels to near zero (cuBLAS and OpenBLAS
 * add in different orders). Without a GPU the whole suite skips with the
 * reason (TAP "1..0 # SKIP"). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "test_util.h"

#include "test_filter.h"

#define RTOL 1e-5

/* Asserts got is within RTOL of want, relative to each element and to the
 * tensor's largest magnitude; frees both. */
static void expect_rel(pp_tensor *got, pp_tensor *want, const char *what) {
    double scale = 0;
    for (int64_t i = 0; want->dtype == PP_F32 && i < pp_tensor_numel(want); i++) {
        double v = fabs(((float *)want->data)[i]);
        if (v > scale) scale = v;
    }
    tu_expect(got, want, RTOL, RTOL * scale + 1e-12, what);
}

static pp_device *dev;

static pp_tensor *rand_f32(int nd, const int64_t *shape, uint64_t seed) {
    pp_tensor *t;
    TU_OK(pp_tensor_empty(PP_F32, nd, shape, &t));
    for (int64_t i = 0; i < pp_tensor_numel(t); i++) ((float *)t->data)[i] = (float)(2.0 * tu_urand(&seed));
    return t;
}

typedef void (*set_attrs)(pp_graph *g, int node);

/* The node on the CPU and on cuda:0 (claimed, not handed back): every
 * output within RTOL. Takes the inputs. */
static void check(const char *what, const char *op, const char *domain, int n_in, pp_tensor **ins, int n_out,
                  set_attrs attrs) {
    tu_node t;
    tu_node_init_dom(&t, op, domain, n_in, ins, n_out, NULL);
    if (attrs) attrs(t.g, t.node);
    pp_tensor *feed[TU_MAX_IN], *want[TU_MAX_OUT] = {0}, *got[TU_MAX_OUT] = {0};
    int n_feed = 0;
    for (int k = 0; k < n_in; k++)
        if (t.in[k]) feed[n_feed++] = t.in[k];
    pp_exec *cpu, *gpu;
    TU_OK(pp_exec_new(t.g, &cpu));
    TU_OK(pp_exec_new(t.g, &gpu));
    TU_OK(pp_exec_set_device(gpu, dev));
    if (strcmp(pp_exec_node_device(gpu, t.node), pp_device_name(dev)) != 0) fail_msg("%s: not claimed by the GPU", what);
    pp_device_stats s0, s1;
    pp_device_get_stats(dev, &s0);
    TU_OK(pp_exec_run(cpu, feed, want));
    TU_OK(pp_exec_run(gpu, feed, got));
    pp_device_get_stats(dev, &s1);
    if (s1.kernels != s0.kernels + 1 || s1.fallbacks != s0.fallbacks) fail_msg("%s: the GPU handed it back to the CPU", what);
    for (int o = 0; o < t.g->n_outputs; o++) {
        char w[160];
        snprintf(w, sizeof w, "%s output %d", what, o);
        expect_rel(got[o], want[o], w);
    }
    pp_exec_free(cpu);
    pp_exec_free(gpu);
    tu_node_free(&t);
}

#define INS(...) ((pp_tensor *[]){__VA_ARGS__})

static void attr_gelu_tanh(pp_graph *g, int n) { TU_OK(pp_node_set_string(g, n, "approximate", "tanh")); }
static void attr_axis1(pp_graph *g, int n) { TU_OK(pp_node_set_int(g, n, "axis", 1)); }
static void attr_gemm(pp_graph *g, int n) {
    TU_OK(pp_node_set_int(g, n, "transB", 1));
    TU_OK(pp_node_set_float(g, n, "alpha", 0.5f));
}
static void attr_mma(pp_graph *g, int n) { TU_OK(pp_node_set_string(g, n, "activation", "gelu")); }
static void attr_perm(pp_graph *g, int n) { TU_OK(pp_node_set_ints(g, n, "perm", 4, (int64_t[]){0, 2, 1, 3})); }
static void attr_ignore(pp_graph *g, int n) { TU_OK(pp_node_set_int(g, n, "ignore_index", 3)); }
static void attr_weight_t(pp_graph *g, int n) { TU_OK(pp_node_set_int(g, n, "weight_t", 1)); }
static void attr_attn(pp_graph *g, int n) { TU_OK(pp_node_set_float(g, n, "scale", 0.35f)); }
static void attr_attn_bthd(pp_graph *g, int n) {
    TU_OK(pp_node_set_float(g, n, "scale", 2.0f));
    TU_OK(pp_node_set_int(g, n, "scale_div", 1));
    TU_OK(pp_node_set_string(g, n, "q_layout", "bthd"));
    TU_OK(pp_node_set_string(g, n, "k_layout", "bthd"));
    TU_OK(pp_node_set_string(g, n, "v_layout", "bthd"));
    TU_OK(pp_node_set_string(g, n, "out_layout", "bthd"));
}

static void test_elementwise(void **state) {
    (void)state;
    static const char *const bin[] = {"Add", "Sub", "Mul", "Div"};
    for (int i = 0; i < 4; i++)
        check(bin[i], bin[i], "", 2, INS(rand_f32(3, SHAPE(4, 5, 6), 1), rand_f32(2, SHAPE(5, 1), 2)), 1, NULL);
    static const char *const un[] = {"Relu", "Tanh", "Gelu", "Neg", "Exp", "Sigmoid"};
    for (int i = 0; i < 6; i++) check(un[i], un[i], "", 1, INS(rand_f32(2, SHAPE(33, 65), 3)), 1, NULL);
    check("Gelu tanh", "Gelu", "", 1, INS(rand_f32(2, SHAPE(33, 65), 4)), 1, attr_gelu_tanh);
    pp_tensor *x = rand_f32(1, SHAPE(1000), 5);
    for (int64_t i = 0; i < 1000; i++) ((float *)x->data)[i] = 1.5f + ((float *)x->data)[i];
    check("Sqrt", "Sqrt", "", 1, INS(x), 1, NULL);
    static const char *const gr[] = {"ReluGrad", "TanhGrad", "GeluGrad"};
    for (int i = 0; i < 3; i++)
        check(gr[i], gr[i], "pippin", 2, INS(rand_f32(2, SHAPE(9, 40), 6), rand_f32(2, SHAPE(9, 40), 7)), 1, NULL);
    check("GeluGrad tanh", "GeluGrad", "pippin", 2, INS(rand_f32(1, SHAPE(300), 8), rand_f32(1, SHAPE(300), 9)), 1,
          attr_gelu_tanh);
}

static void test_rows(void **state) {
    (void)state;
    check("Softmax", "Softmax", "", 1, INS(rand_f32(3, SHAPE(4, 16, 16), 10)), 1, NULL);
    check("SoftmaxGrad", "SoftmaxGrad", "pippin", 2, INS(rand_f32(2, SHAPE(64, 16), 11), rand_f32(2, SHAPE(64, 16), 12)),
          1, NULL);
    check("LayerNormalization", "LayerNormalization", "", 3,
          INS(rand_f32(3, SHAPE(2, 16, 32), 13), rand_f32(1, SHAPE(32), 14), rand_f32(1, SHAPE(32), 15)), 3, NULL);
    check("LayerNormGradInput", "LayerNormGradInput", "pippin", 3,
          INS(rand_f32(3, SHAPE(2, 16, 32), 16), rand_f32(3, SHAPE(2, 16, 32), 17), rand_f32(1, SHAPE(32), 18)), 1,
          NULL);
    check("LayerNormGradWeight", "LayerNormGradWeight", "pippin", 2,
          INS(rand_f32(3, SHAPE(2, 16, 32), 19), rand_f32(3, SHAPE(2, 16, 32), 20)), 2, NULL);
}

static void test_matmuls(void **state) {
    (void)state;
    check("MatMul 2-D", "MatMul", "", 2, INS(rand_f32(2, SHAPE(33, 70), 21), rand_f32(2, SHAPE(70, 17), 22)), 1, NULL);
    check("MatMul batch x 2-D", "MatMul", "", 2, INS(rand_f32(3, SHAPE(4, 16, 32), 23), rand_f32(2, SHAPE(32, 96), 24)),
          1, NULL);
    check("MatMul batched", "MatMul", "", 2,
          INS(rand_f32(4, SHAPE(2, 4, 16, 8), 25), rand_f32(4, SHAPE(2, 4, 8, 16), 26)), 1, NULL);
    check("Gemm", "Gemm", "", 3, INS(rand_f32(2, SHAPE(8, 32), 27), rand_f32(2, SHAPE(24, 32), 28), rand_f32(1, SHAPE(24), 29)),
          1, attr_gemm);
    check("MatMulGradA linear", "MatMulGradA", "pippin", 3,
          INS(rand_f32(3, SHAPE(4, 16, 96), 43), rand_f32(2, SHAPE(32, 96), 44), I64(1, SHAPE(3), 4, 16, 32)), 1, NULL);
    check("MatMulGradB linear", "MatMulGradB", "pippin", 3,
          INS(rand_f32(3, SHAPE(4, 16, 96), 45), rand_f32(3, SHAPE(4, 16, 32), 46), I64(1, SHAPE(2), 32, 96)), 1, NULL);
    check("MatMulGradA batched", "MatMulGradA", "pippin", 3,
          INS(rand_f32(4, SHAPE(2, 4, 16, 16), 47), rand_f32(4, SHAPE(2, 4, 8, 16), 48), I64(1, SHAPE(4), 2, 4, 16, 8)),
          1, NULL);
    check("MatMulGradB batched", "MatMulGradB", "pippin", 3,
          INS(rand_f32(4, SHAPE(2, 4, 16, 16), 49), rand_f32(4, SHAPE(2, 4, 16, 8), 50), I64(1, SHAPE(4), 2, 4, 8, 16)),
          1, NULL);
    /* weight_t: b is W^T and the node reads (GradA) or writes (GradB) W itself */
    check("MatMulGradA weight_t square", "MatMulGradA", "pippin", 3,
          INS(rand_f32(3, SHAPE(2, 16, 32), 52), rand_f32(2, SHAPE(32, 32), 53), I64(1, SHAPE(3), 2, 16, 32)), 1,
          attr_weight_t);
    check("MatMulGradA weight_t", "MatMulGradA", "pippin", 3,
          INS(rand_f32(3, SHAPE(2, 16, 96), 54), rand_f32(2, SHAPE(96, 32), 55), I64(1, SHAPE(3), 2, 16, 32)), 1,
          attr_weight_t);
    check("MatMulGradB weight_t square", "MatMulGradB", "pippin", 3,
          INS(rand_f32(3, SHAPE(2, 16, 32), 56), rand_f32(3, SHAPE(2, 16, 32), 57), I64(1, SHAPE(2), 32, 32)), 1,
          attr_weight_t);
    check("MatMulGradB weight_t", "MatMulGradB", "pippin", 3,
          INS(rand_f32(3, SHAPE(2, 16, 96), 58), rand_f32(3, SHAPE(2, 16, 32), 59), I64(1, SHAPE(2), 96, 32)), 1,
          attr_weight_t);
    check("MatMulAdd", "MatMulAdd", "pippin", 3,
          INS(rand_f32(3, SHAPE(2, 16, 32), 30), rand_f32(2, SHAPE(32, 128), 31), rand_f32(1, SHAPE(128), 32)), 1,
          attr_mma);
}

static void test_gather_losses_movement(void **state) {
    (void)state;
    pp_tensor *idx = I64(2, SHAPE(2, 5), 0, 63, 5, 5, -1, 17, 2, 40, 63, 9);
    pp_tensor *idx2;
    TU_OK(pp_tensor_clone(idx, &idx2));
    check("Gather", "Gather", "", 2, INS(rand_f32(2, SHAPE(64, 32), 33), idx), 1, NULL);
    check("GatherGrad", "GatherGrad", "pippin", 3, INS(rand_f32(3, SHAPE(2, 5, 32), 34), idx2, I64(1, SHAPE(2), 64, 32)),
          1, NULL);
    pp_tensor *labels = I64(1, SHAPE(8), 0, 3, 7, 63, 3, 1, 9, 12), *labels2;
    TU_OK(pp_tensor_clone(labels, &labels2));
    check("SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLoss", "", 2, INS(rand_f32(2, SHAPE(8, 64), 35), labels), 1,
          attr_ignore);
    pp_tensor *dl;
    TU_OK(pp_tensor_scalar_f32(0.5f, &dl));
    check("SoftmaxCrossEntropyLossGrad", "SoftmaxCrossEntropyLossGrad", "pippin", 3,
          INS(dl, rand_f32(2, SHAPE(8, 64), 36), labels2), 1, attr_ignore);
    check("SumToShape", "SumToShape", "pippin", 2, INS(rand_f32(3, SHAPE(4, 16, 96), 51), I64(1, SHAPE(1), 96)), 1, NULL);
    check("Transpose", "Transpose", "", 1, INS(rand_f32(4, SHAPE(2, 16, 4, 8), 37)), 1, attr_perm);
    check("Reshape", "Reshape", "", 2, INS(rand_f32(3, SHAPE(2, 16, 32), 38), I64(1, SHAPE(4), 2, 16, 4, -1)), 1, NULL);
    check("Concat", "Concat", "", 2, INS(rand_f32(3, SHAPE(2, 3, 4), 39), rand_f32(3, SHAPE(2, 5, 4), 40)), 1, attr_axis1);
    check("Split", "Split", "", 1, INS(rand_f32(3, SHAPE(2, 9, 4), 41)), 3, attr_axis1);
    check("Split sizes axis 0", "Split", "", 2, INS(rand_f32(3, SHAPE(5, 3, 4), 42), I64(1, SHAPE(2), 2, 3)), 2, NULL);
}

/* The fused causal attention and its gradient: K^T and [B, T, H, D] forms, odd T. */
static void test_attention(void **state) {
    (void)state;
    check("CausalAttention", "CausalAttention", "pippin", 3,
          INS(rand_f32(4, SHAPE(2, 3, 37, 16), 43), rand_f32(4, SHAPE(2, 3, 16, 37), 44),
              rand_f32(4, SHAPE(2, 3, 37, 16), 45)),
          1, attr_attn);
    check("CausalAttention bthd", "CausalAttention", "pippin", 3,
          INS(rand_f32(4, SHAPE(2, 33, 4, 8), 46), rand_f32(4, SHAPE(2, 33, 4, 8), 47),
              rand_f32(4, SHAPE(2, 33, 4, 8), 48)),
          1, attr_attn_bthd);
    check("CausalAttentionGrad", "CausalAttentionGrad", "pippin", 4,
          INS(rand_f32(4, SHAPE(2, 3, 37, 16), 49), rand_f32(4, SHAPE(2, 3, 37, 16), 50),
              rand_f32(4, SHAPE(2, 3, 16, 37), 51), rand_f32(4, SHAPE(2, 3, 37, 16), 52)),
          3, attr_attn);
    check("CausalAttentionGrad bthd", "CausalAttentionGrad", "pippin", 4,
          INS(rand_f32(4, SHAPE(2, 33, 4, 8), 53), rand_f32(4, SHAPE(2, 33, 4, 8), 54),
              rand_f32(4, SHAPE(2, 33, 4, 8), 55), rand_f32(4, SHAPE(2, 33, 4, 8), 56)),
          3, attr_attn_bthd);
}

/* The optimizer kernels on the device against the formulas on the host
 * (the cuda-host suite checks those against stages/optim.c). */
static void test_optimizer_kernels(void **state) {
    (void)state;
    int64_t n = 4099;
    pp_tensor *p = rand_f32(1, &n, 41), *g = rand_f32(1, &n, 42), *m, *v, *dp, *dg, *dm, *dv;
    TU_OK(pp_tensor_new(PP_F32, 1, &n, &m));
    TU_OK(pp_tensor_new(PP_F32, 1, &n, &v));
    TU_OK(pp_device_upload(dev, p, &dp));
    TU_OK(pp_device_upload(dev, g, &dg));
    TU_OK(pp_device_upload(dev, m, &dm));
    TU_OK(pp_device_upload(dev, v, &dv));
    TU_OK(cudaDeviceSynchronize() == cudaSuccess ? PP_OK : PP_ERR_INTERNAL);
    pp_km_adamw k = pp_km_adamw_for_step(1e-3, 1e-2, 0.9, 0.999, 1e-8, 0, 1.0);
    assert_int_equal(pp_cu_adamw(NULL, k, dp->data, dg->data, dm->data, dv->data, n), 0);
    pp_km_sgd sk = {0.1f, 0.01f, 0.9f, 0.0f, 1.0f, 0, 1};
    assert_int_equal(pp_cu_sgd(NULL, sk, dp->data, dg->data, dm->data, n), 0);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    for (int64_t i = 0; i < n; i++) {
        pp_km_adamw_step(&k, p->data, g->data, m->data, v->data, i);
        pp_km_sgd_step(&sk, p->data, g->data, m->data, i);
    }
    pp_tensor *back;
    TU_OK(pp_device_download(dev, dp, &back));
    pp_tensor *want;
    TU_OK(pp_tensor_clone(p, &want));
    expect_rel(back, want, "AdamW then SGD on the device");
    back = NULL;
    pp_tensor *all[] = {p, g, m, v, dp, dg, dm, dv, back};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) pp_tensor_free(all[i]);
}

/* got against want as expect_rel judges it, without failing: prints one
 * TAP comment line (elements beyond the tolerance, the largest |diff| and
 * where) and returns 1 if any element is beyond it. */
static int report_rel_loose(const pp_tensor *got, const pp_tensor *want, const char *what, const pp_tensor *grad,
                            double loose);

static int report_rel(const pp_tensor *got, const pp_tensor *want, const char *what) {
    return report_rel_loose(got, want, what, NULL, 0);
}

/* The same; where grad (the CPU's gradient of the parameter) is given, an
 * element whose gradient is zero within the gradients' tolerance may
 * differ by `loose` more: AdamW's first step moves it by lr g / (|g| +
 * eps), which for a gradient of rounding noise (the attention's key bias:
 * softmax does not depend on it, its gradient is ~1e-12) is lr times a
 * ratio of noises, of either sign. The gradients themselves are compared
 * strictly. */
static int report_rel_loose(const pp_tensor *got, const pp_tensor *want, const char *what, const pp_tensor *grad,
                            double loose) {
    if (!got || !want || got->dtype != want->dtype || !pp_shape_equal(got->ndim, got->shape, want->ndim, want->shape)) {
        printf("# %-40s shape or dtype differs\n", what);
        return 1;
    }
    if (want->dtype != PP_F32) {
        int same = got->nbytes == want->nbytes && !memcmp(got->data, want->data, want->nbytes);
        if (!same) printf("# %-40s differs (not float32)\n", what);
        return !same;
    }
    const float *g = got->data, *w = want->data, *gr = grad && grad->dtype == PP_F32 &&
                                                          pp_tensor_numel(grad) == pp_tensor_numel(want)
                                                      ? grad->data
                                                      : NULL;
    int64_t n = pp_tensor_numel(want), bad = 0, worst = 0, first = -1, noise = 0;
    double scale = 0, max_diff = 0, gscale = 0;
    for (int64_t i = 0; i < n; i++) {
        if (fabs(w[i]) > scale) scale = fabs(w[i]);
        if (gr && fabs(gr[i]) > gscale) gscale = fabs(gr[i]);
    }
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - w[i]), tol = RTOL * fabs(w[i]) + RTOL * scale + 1e-12;
        if (gr && fabs(gr[i]) <= RTOL * gscale + 1e-12) tol += loose, noise++;
        if (!(d <= tol)) {
            if (!bad++) first = i;
        }
        if (!(d <= max_diff)) max_diff = d, worst = i;
    }
    int64_t cols = want->ndim >= 2 ? want->shape[want->ndim - 1] : 1;
    if (bad)
        printf("# %-40s BAD %lld of %lld beyond tolerance (first at %lld), max |diff| %.3g at %lld (row %lld col %lld):"
               " %.9g vs %.9g, max |want| %.3g\n",
               what, (long long)bad, (long long)n, (long long)first, max_diff, (long long)worst,
               (long long)(worst / cols), (long long)(worst % cols), g[worst], w[worst], scale);
    else if (noise)
        printf("# %-40s ok, max |diff| %.3g, max |want| %.3g (%lld elements with a zero gradient within %.0e: "
               "within %.1e)\n", what, max_diff, scale, (long long)noise, RTOL, loose);
    else
        printf("# %-40s ok, max |diff| %.3g, max |want| %.3g\n", what, max_diff, scale);
    return bad > 0;
}

/* The example GPT's training step and AdamW update, every stage on cuda:0:
 * every output, parameter gradient and updated parameter is reported (TAP
 * comments) before the test fails, so one GPU run shows all that differs. */
static void test_gpt_training_step(void **state) {
    (void)state;
    static const char *const names[2] = {"idx", "targets"};
    pp_runner *r[2];
    pp_pipe *p[2];
    pp_tensor *outs[2][4] = {{0}};
    for (int k = 0; k < 2; k++) {
        pp_graph *g = tu_fixture_onnx("gpt", "model.onnx");
        TU_OK(pp_pipe_split(g, NULL, &p[k]));
        pp_graph_free(g);
        TU_OK(pp_runner_new(p[k], 1, &r[k]));
        for (int s = 0; k && s < pp_runner_n_stages(r[k]); s++) TU_OK(pp_stage_use_device(pp_runner_stage(r[k], s), "cuda:0"));
        pp_optim_config oc;
        pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
        TU_OK(pp_runner_set_optimizer(r[k], &oc));
        pp_tensor *ins[2] = {tu_fixture_npy("gpt", "idx.npy"), tu_fixture_npy("gpt", "targets.npy")};
        TU_OK(pp_runner_step(r[k], 2, NULL, 2, names, ins, outs[k]));
        pp_tensor_free(ins[0]);
        pp_tensor_free(ins[1]);
    }
    int bad = 0;
    for (int o = 0; o < pp_runner_n_outputs(r[0]); o++) bad += report_rel(outs[1][o], outs[0][o], pp_runner_output_name(r[0], o));
    int64_t kernels = 0;
    int n_params[16] = {0};
    pp_tensor *cpu_grads[16][64] = {{0}};
    int n_stages = pp_runner_n_stages(r[0]);
    for (int s = 0; s < n_stages && s < 16; s++) {
        pp_stage *st = pp_runner_stage(r[0], s);
        pp_device_stats ds;
        pp_device_get_stats(pp_stage_device(pp_runner_stage(r[1], s)), &ds);
        kernels += ds.kernels;
        printf("# stage %d on cuda:0: %lld nodes run there, %lld handed back, %lld uploads, %lld downloads\n", s,
               (long long)ds.kernels, (long long)ds.fallbacks, (long long)ds.uploads, (long long)ds.downloads);
        n_params[s] = pp_stage_n_params(st);
        for (int i = 0; i < n_params[s]; i++) {
            const char *name = pp_stage_param_name(st, i);
            pp_tensor *a, *b;
            TU_OK(pp_runner_param_grad(r[0], name, &a));
            TU_OK(pp_runner_param_grad(r[1], name, &b));
            char what[200];
            snprintf(what, sizeof what, "stage %d grad %s", s, name);
            bad += report_rel(b, a, what);
            if (i < 64) cpu_grads[s][i] = a;
            else pp_tensor_free(a);
            pp_tensor_free(b);
        }
    }
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    for (int k = 0; k < 2; k++) TU_OK(pp_runner_optimizer_step(r[k]));
    for (int s = 0; s < n_stages && s < 16; s++) {
        pp_stage *st = pp_runner_stage(r[0], s);
        for (int i = 0; i < n_params[s]; i++) {
            const char *name = pp_stage_param_name(st, i);
            pp_tensor *a, *b;
            TU_OK(pp_runner_param(r[0], name, &a));
            TU_OK(pp_runner_param(r[1], name, &b));
            char what[200];
            snprintf(what, sizeof what, "stage %d param %s after AdamW", s, name);
            bad += report_rel_loose(b, a, what, i < 64 ? cpu_grads[s][i] : NULL, 2.0 * oc.lr);
            if (i < 64) pp_tensor_free(cpu_grads[s][i]);
            pp_tensor_free(a);
            pp_tensor_free(b);
        }
    }
    printf("# GPT step: %d tensors differ beyond %g relative\n", bad, RTOL);
    for (int k = 0; k < 2; k++) {
        for (int o = 0; o < 4; o++) pp_tensor_free(outs[k][o]);
        pp_runner_free(r[k]);
        pp_pipe_free(p[k]);
    }
    assert_true(kernels > 0);
    assert_int_equal(bad, 0);
}

int main(void) {
    if (pp_device_open("cuda:0", &dev) != PP_OK) {
        printf("1..0 # SKIP %s\n", pp_last_error());
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_matmuls),
        cmocka_unit_test(test_gather_losses_movement),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_optimizer_kernels),
        cmocka_unit_test(test_gpt_training_step),
    };
    tu_filter_from_env();
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    pp_device_close(dev);
    return rc;
}
