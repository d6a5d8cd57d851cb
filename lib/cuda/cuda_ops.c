/* The CUDA backend's ops: which nodes it claims (float32 transformer ops
 * and their gradient helpers), and running one: shapes checked on the
 * host, outputs from the device pool, the work queued on the compute
 * stream (cuBLAS for the GEMMs, lib/cuda/kernels.cu for the rest).
 * A claimed node it finds it cannot run (a dtype or layout only known at
 * run time) returns PP_ERR_UNSUPPORTED and the CPU runs it instead. */
#include "cuda_internal.h"
#include "op_attrs.h"
#include "attention_internal.h"
#include "shape_kernels.h"

#include <stdlib.h>
#include <string.h>

#include "status_internal.h"

typedef pp_status (*cuda_op_fn)(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx);

static pp_status fallback(void) { return PP_ERR_UNSUPPORTED; }

static int is_f32(const pp_tensor *t) { return t && t->dtype == PP_F32; }

static pp_status launched(pp_device *dev, int err, const char *what) {
    return err ? pp_cuda_error(dev, err, what) : PP_OK;
}

static pp_status new_out(pp_device *dev, pp_kernel_ctx *ctx, int k, pp_dtype dt, int nd, const int64_t *shape,
                         pp_tensor **out) {
    PP_TRY(pp_device_tensor_new(dev, PP_MEMORY_DEVICE, dt, nd, shape, out));
    ctx->out[k] = *out;
    return PP_OK;
}

/* A small host array (indices, labels) as a device int64 array, queued on
 * the compute stream; freed by the caller after use (pool, stream order). */
static pp_status upload_i64(pp_device *dev, cuda_device *c, const pp_tensor *t, pp_tensor **out) {
    pp_tensor *h = NULL;
    if (t->dtype == PP_I64) h = pp_tensor_retain((pp_tensor *)t);
    else PP_TRY(pp_tensor_cast(t, PP_I64, &h));
    pp_status s = pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_I64, h->ndim, h->shape, out);
    if (!s && h->nbytes) {
        /* pageable memory: the copy is done when this returns */
        cudaError_t e = cudaMemcpyAsync((*out)->data, h->data, h->nbytes, cudaMemcpyHostToDevice,
                                        c->stream[PP_STREAM_COMPUTE]);
        if (!e) e = cudaStreamSynchronize(c->stream[PP_STREAM_COMPUTE]);
        if (e) {
            pp_tensor_free(*out);
            *out = NULL;
            s = pp_cuda_error(dev, e, "uploading indices");
        }
    }
    pp_tensor_free(h);
    return s;
}

static int64_t axis_attr(const pp_node *n, const char *name, int64_t dflt, int ndim) {
    int64_t a = pp_node_attr_int(n, name, dflt);
    return a < 0 ? a + ndim : a;
}

/* ------------------------------------------------------------ elementwise */

static pp_status run_binary(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *a = ctx->in[0], *b = ctx->in[1];
    if (!is_f32(a) || !is_f32(b)) return fallback();
    static const char *const names[] = {"Add", "Sub", "Mul", "Div"};
    pp_km_binop op = PP_KM_ADD;
    for (int i = 0; i < 4; i++)
        if (!strcmp(ctx->node->op_type, names[i])) op = (pp_km_binop)i;
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    int64_t shape[PP_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        int ka = d - (nd - a->ndim), kb = d - (nd - b->ndim);
        int64_t da = ka >= 0 ? a->shape[ka] : 1, db = kb >= 0 ? b->shape[kb] : 1;
        shape[d] = da == 1 ? db : da;
    }
    pp_km_strides sa, sb;
    if (pp_km_broadcast(nd, shape, a->ndim, a->shape, &sa) || pp_km_broadcast(nd, shape, b->ndim, b->shape, &sb))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "inputs do not broadcast");
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, nd, shape, &y));
    return launched(dev, pp_cu_binary(c->stream[0], op, a->data, sa, b->data, sb, y->data, pp_tensor_numel(y)),
                    ctx->node->op_type);
}

static pp_status gelu_kind(pp_kernel_ctx *ctx, int *tanh_form) {
    const char *a = pp_node_attr_string(ctx->node, "approximate", "none");
    *tanh_form = !strcmp(a, "tanh");
    return *tanh_form || !strcmp(a, "none") ? PP_OK : fallback();
}

static pp_status run_unary(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    if (!is_f32(x)) return fallback();
    static const struct { const char *name; pp_km_unop op; } table[] = {
        {"Relu", PP_KM_RELU}, {"Tanh", PP_KM_TANH}, {"Neg", PP_KM_NEG},
        {"Exp", PP_KM_EXP},   {"Sqrt", PP_KM_SQRT}, {"Sigmoid", PP_KM_SIGMOID}};
    pp_km_unop op = PP_KM_GELU;
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(ctx->node->op_type, table[i].name)) op = table[i].op;
    if (!strcmp(ctx->node->op_type, "Gelu")) {
        int t;
        PP_TRY(gelu_kind(ctx, &t));
        op = t ? PP_KM_GELU_TANH : PP_KM_GELU;
    }
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, x->ndim, x->shape, &y));
    return launched(dev, pp_cu_unary(c->stream[0], op, x->data, y->data, pp_tensor_numel(y)), ctx->node->op_type);
}

static pp_status run_unary_grad(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *dy = ctx->in[0], *t = ctx->in[1];
    if (!is_f32(dy) || !is_f32(t)) return fallback();
    if (!pp_shape_equal(dy->ndim, dy->shape, t->ndim, t->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and the forward value differ in shape");
    pp_km_gradop op = PP_KM_RELU_GRAD;
    if (!strcmp(ctx->node->op_type, "TanhGrad")) op = PP_KM_TANH_GRAD;
    if (!strcmp(ctx->node->op_type, "GeluGrad")) {
        int tf;
        PP_TRY(gelu_kind(ctx, &tf));
        op = tf ? PP_KM_GELU_TANH_GRAD : PP_KM_GELU_GRAD;
    }
    pp_tensor *dx;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, t->ndim, t->shape, &dx));
    return launched(dev, pp_cu_unary_grad(c->stream[0], op, dy->data, t->data, dx->data, pp_tensor_numel(dx)),
                    ctx->node->op_type);
}

/* ------------------------------------------------------------------ rows */

/* Softmax over the last axis only (opset 13's default). */
static pp_status softmax_rows(const pp_kernel_ctx *ctx, const pp_tensor *x, int64_t *rows, int64_t *n) {
    int dflt = ctx->graph && ctx->graph->opset > 0 && ctx->graph->opset < 13 ? 1 : -1;
    if (x->ndim < 1 || axis_attr(ctx->node, "axis", dflt, x->ndim) != x->ndim - 1) return fallback();
    *n = x->shape[x->ndim - 1];
    *rows = *n ? pp_tensor_numel(x) / *n : 0;
    return PP_OK;
}

static pp_status run_softmax(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    int64_t rows, n;
    if (!is_f32(x)) return fallback();
    PP_TRY(softmax_rows(ctx, x, &rows, &n));
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, x->ndim, x->shape, &y));
    return launched(dev, pp_cu_softmax(c->stream[0], x->data, y->data, rows, n), "Softmax");
}

static pp_status run_softmax_grad(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *dy = ctx->in[0], *y = ctx->in[1];
    int64_t rows, n;
    if (!is_f32(dy) || !is_f32(y)) return fallback();
    if (!pp_shape_equal(dy->ndim, dy->shape, y->ndim, y->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and y differ in shape");
    PP_TRY(softmax_rows(ctx, y, &rows, &n));
    pp_tensor *dx;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, y->ndim, y->shape, &dx));
    return launched(dev, pp_cu_softmax_grad(c->stream[0], dy->data, y->data, dx->data, rows, n), "SoftmaxGrad");
}

static pp_status ln_rows(pp_kernel_ctx *ctx, const pp_tensor *x, int *axis, int64_t *rows, int64_t *n) {
    int64_t a = axis_attr(ctx->node, "axis", -1, x->ndim);
    if (a < 0 || a >= x->ndim) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
    *axis = (int)a;
    *rows = pp_shape_numel((int)a, x->shape);
    *n = pp_shape_numel(x->ndim - (int)a, x->shape + a);
    return PP_OK;
}

static pp_status run_layernorm(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *w = ctx->in[1], *b = ctx->n_in > 2 ? ctx->in[2] : NULL;
    if (!is_f32(x) || !is_f32(w) || (b && !is_f32(b))) return fallback();
    int axis;
    int64_t rows, n;
    PP_TRY(ln_rows(ctx, x, &axis, &rows, &n));
    if (pp_tensor_numel(w) != n || (b && pp_tensor_numel(b) != n))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "scale and bias must have the normalised shape's %lld elements",
                               (long long)n);
    int stats_wanted = (ctx->n_out > 1 && ctx->node->out[1] >= 0) || (ctx->n_out > 2 && ctx->node->out[2] >= 0);
    if (stats_wanted && pp_node_attr_int(ctx->node, "stash_type", 1) != 1) return fallback(); /* double stats */
    pp_tensor *y, *stat[2] = {NULL, NULL};
    PP_TRY(new_out(dev, ctx, 0, PP_F32, x->ndim, x->shape, &y));
    int64_t sshape[PP_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) sshape[d] = d < axis ? x->shape[d] : 1;
    for (int k = 1; k < 3; k++)
        if (k < ctx->n_out && ctx->node->out[k] >= 0) PP_TRY(new_out(dev, ctx, k, PP_F32, x->ndim, sshape, &stat[k - 1]));
    float eps = pp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    return launched(dev, pp_cu_layernorm(c->stream[0], x->data, w->data, b ? b->data : NULL, eps, y->data,
                                         stat[0] ? stat[0]->data : NULL, stat[1] ? stat[1]->data : NULL, rows, n),
                    "LayerNormalization");
}

static pp_status run_ln_grad_input(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1], *w = ctx->in[2];
    if (!is_f32(dy) || !is_f32(x) || !is_f32(w)) return fallback();
    int axis;
    int64_t rows, n;
    PP_TRY(ln_rows(ctx, x, &axis, &rows, &n));
    if (!pp_shape_equal(dy->ndim, dy->shape, x->ndim, x->shape) || pp_tensor_numel(w) != n)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy, x and scale do not fit together");
    pp_tensor *dx;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, x->ndim, x->shape, &dx));
    float eps = pp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    return launched(dev, pp_cu_ln_grad_input(c->stream[0], dy->data, x->data, w->data, eps, dx->data, rows, n),
                    "LayerNormGradInput");
}

static pp_status run_ln_grad_weight(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *dy = ctx->in[0], *x = ctx->in[1];
    if (!is_f32(dy) || !is_f32(x)) return fallback();
    int axis;
    int64_t rows, n;
    PP_TRY(ln_rows(ctx, x, &axis, &rows, &n));
    if (!pp_shape_equal(dy->ndim, dy->shape, x->ndim, x->shape))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy and x differ in shape");
    pp_tensor *out[2] = {NULL, NULL}, *stats = NULL;
    pp_status s = PP_OK;
    for (int k = 0; k < 2 && !s; k++) /* both are computed; an unused one is scratch */
        s = pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, x->ndim - axis, x->shape + axis, &out[k]);
    if (!s) s = pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, 1, (int64_t[]){2 * rows}, &stats);
    float eps = pp_node_attr_float(ctx->node, "epsilon", 1e-5f);
    if (!s)
        s = launched(dev, pp_cu_ln_grad_weight(c->stream[0], dy->data, x->data, eps, stats->data, rows, n,
                                               out[0]->data, out[1]->data),
                     "LayerNormGradWeight");
    pp_tensor_free(stats);
    for (int k = 0; k < 2; k++) {
        if (!s && k < ctx->n_out && ctx->node->out[k] >= 0) ctx->out[k] = out[k];
        else pp_tensor_free(out[k]);
    }
    return s;
}

/* ------------------------------------------------------------- matmuls */

/* C[b] = op(A[b]) op(B[b]) for row-major A (M x K), B (K x N), C (M x N);
 * a stride of 0 repeats a 2-D operand over the batch. cuBLAS is
 * column-major: pp_km_gemm_blas maps the call (C^T = B^T A^T), which the
 * cuda-host suite checks against a column-major reference. */
static pp_status gemm(pp_device *dev, cuda_device *c, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                      float alpha, const float *A, int64_t stride_a, const float *B, int64_t stride_b, float beta,
                      float *C, int64_t batch) {
    if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff || batch > 0x7fffffff) return fallback();
    pp_km_gemm g = {trans_a, trans_b, 0, M, N, K, batch, stride_a, stride_b, M * N};
    pp_km_blas b = pp_km_gemm_blas(&g);
    cublasStatus_t st = cublasSgemmStridedBatched(
        c->blas, b.op_first ? CUBLAS_OP_T : CUBLAS_OP_N, b.op_second ? CUBLAS_OP_T : CUBLAS_OP_N, (int)b.m, (int)b.n,
        (int)b.k, &alpha, B, (int)b.ld_first, b.stride_first, A, (int)b.ld_second, b.stride_second, &beta, C,
        (int)b.ld_c, b.stride_c, (int)b.batch);
    return st == CUBLAS_STATUS_SUCCESS ? PP_OK
                                       : pp_error(PP_ERR_INTERNAL, "%s: cublasSgemmStridedBatched failed (%d)",
                                                  dev->name, (int)st);
}

/* MatMul of [..., M, K] and [..., K, N]: equal batch dims, or one side 2-D. */
static pp_status run_matmul(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *a = ctx->in[0], *b = ctx->in[1];
    if (!is_f32(a) || !is_f32(b) || a->ndim < 2 || b->ndim < 2) return fallback();
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    if (b->shape[b->ndim - 2] != K) return pp_kernel_error(ctx, PP_ERR_SHAPE, "inner dimensions differ");
    int64_t ba = pp_shape_numel(a->ndim - 2, a->shape), bb = pp_shape_numel(b->ndim - 2, b->shape);
    const pp_tensor *big = a->ndim >= b->ndim ? a : b;
    if (b->ndim > 2 && a->ndim > 2 && !pp_shape_equal(a->ndim - 2, a->shape, b->ndim - 2, b->shape)) return fallback();
    int64_t shape[PP_MAX_DIMS];
    for (int d = 0; d < big->ndim - 2; d++) shape[d] = big->shape[d];
    shape[big->ndim - 2] = M;
    shape[big->ndim - 1] = N;
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, big->ndim, shape, &y));
    int64_t batch = ba > bb ? ba : bb;
    if (batch == 0 || M == 0 || N == 0) return PP_OK;
    if (K == 0) return launched(dev, cudaMemsetAsync(y->data, 0, y->nbytes, c->stream[0]), "MatMul");
    return gemm(dev, c, 0, 0, M, N, K, 1.0f, a->data, a->ndim > 2 ? M * K : 0, b->data, b->ndim > 2 ? K * N : 0,
                0.0f, y->data, batch);
}

/* pippin::MatMulGradA(dy, b, shape_a) = dy b^T and MatMulGradB(dy, a,
 * shape_b) = a^T dy, each summed to the target shape, weight_t honoured
 * (b is W^T: dA = dy W, dW = dy^T a): one GEMM as pp_km_matmul_grad_plan
 * lays it out. Other broadcasts: the CPU's. */
static pp_status run_matmul_grad(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *dy = ctx->in[0], *o = ctx->in[1], *sh = ctx->in[2];
    int want_a = !strcmp(ctx->node->op_type, "MatMulGradA");
    int weight_t = pp_node_attr_int(ctx->node, "weight_t", 0) != 0;
    if (!is_f32(dy) || !is_f32(o) || sh->ndim != 1 || sh->shape[0] < 2 || sh->shape[0] > PP_MAX_DIMS)
        return fallback();
    int nd = (int)sh->shape[0];
    int64_t ts[PP_MAX_DIMS];
    for (int d = 0; d < nd; d++) ts[d] = pp_tensor_get_i64(sh, d);
    pp_km_gemm g;
    if (pp_km_matmul_grad_plan(want_a, weight_t, dy->ndim, dy->shape, o->ndim, o->shape, nd, ts, &g)) return fallback();
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, nd, ts, &y));
    const float *A = g.a_is_dy ? dy->data : o->data, *B = g.a_is_dy ? o->data : dy->data;
    return gemm(dev, c, g.trans_a, g.trans_b, g.M, g.N, g.K, 1.0f, A, g.stride_a, B, g.stride_b, 0.0f, y->data,
                g.batch);
}

/* out += bias (broadcast over rows), then the activation, in place. */
static pp_status bias_act(pp_device *dev, cuda_device *c, pp_tensor *y, const pp_tensor *bias, int act) {
    int64_t n = pp_tensor_numel(y);
    if (bias) {
        pp_km_strides sy, sb;
        if (pp_km_broadcast(y->ndim, y->shape, y->ndim, y->shape, &sy) ||
            pp_km_broadcast(y->ndim, y->shape, bias->ndim, bias->shape, &sb))
            return pp_error(PP_ERR_SHAPE, "bias does not broadcast to the output");
        PP_TRY(launched(dev, pp_cu_binary(c->stream[0], PP_KM_ADD, y->data, sy, bias->data, sb, y->data, n), "bias"));
    }
    if (act >= 0) PP_TRY(launched(dev, pp_cu_unary(c->stream[0], (pp_km_unop)act, y->data, y->data, n), "activation"));
    return PP_OK;
}

/* Gemm: 2-D A and B, alpha, C broadcast with beta 1 (or absent). */
static pp_status run_gemm(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *a = ctx->in[0], *b = ctx->in[1], *cc = ctx->n_in > 2 ? ctx->in[2] : NULL;
    if (!is_f32(a) || !is_f32(b) || (cc && !is_f32(cc)) || a->ndim != 2 || b->ndim != 2) return fallback();
    int ta = pp_node_attr_int(ctx->node, "transA", 0) != 0, tb = pp_node_attr_int(ctx->node, "transB", 0) != 0;
    float alpha = pp_node_attr_float(ctx->node, "alpha", 1.0f), beta = pp_node_attr_float(ctx->node, "beta", 1.0f);
    if (cc && beta != 1.0f) return fallback();
    int64_t M = a->shape[ta], K = a->shape[1 - ta], N = b->shape[1 - tb];
    if (b->shape[tb] != K) return pp_kernel_error(ctx, PP_ERR_SHAPE, "inner dimensions differ");
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, 2, (int64_t[]){M, N}, &y));
    if (M == 0 || N == 0) return PP_OK;
    if (K == 0) PP_TRY(launched(dev, cudaMemsetAsync(y->data, 0, y->nbytes, c->stream[0]), "Gemm"));
    else PP_TRY(gemm(dev, c, ta, tb, M, N, K, alpha, a->data, 0, b->data, 0, 0.0f, y->data, 1));
    return bias_act(dev, c, y, cc, -1);
}

/* pippin::MatMulAdd: act(A [..., K] op(B) + bias), B a 2-D weight. */
static pp_status run_matmul_add(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *a = ctx->in[0], *b = ctx->in[1], *bias = ctx->n_in > 2 ? ctx->in[2] : NULL;
    if (!is_f32(a) || !is_f32(b) || (bias && !is_f32(bias)) || a->ndim < 1 || b->ndim != 2) return fallback();
    if ((ctx->n_in > 3 && ctx->in[3]) || ctx->n_out > 1) return fallback(); /* a residual or Split taken in */
    int tb = pp_node_attr_int(ctx->node, "transB", 0) != 0;
    const char *act_name = pp_node_attr_string(ctx->node, "activation", "");
    int act = !act_name[0] ? -1 : !strcmp(act_name, "relu") ? PP_KM_RELU : !strcmp(act_name, "gelu") ? PP_KM_GELU
              : !strcmp(act_name, "gelu_tanh") ? PP_KM_GELU_TANH : -2;
    if (act == -2) return fallback();
    int64_t K = a->shape[a->ndim - 1], N = b->shape[1 - tb], M = K ? pp_tensor_numel(a) / K : 0;
    if (b->shape[tb] != K) return pp_kernel_error(ctx, PP_ERR_SHAPE, "inner dimensions differ");
    int64_t shape[PP_MAX_DIMS];
    memcpy(shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    shape[a->ndim - 1] = N;
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, a->ndim, shape, &y));
    if (M == 0 || N == 0) return PP_OK;
    if (K == 0) PP_TRY(launched(dev, cudaMemsetAsync(y->data, 0, y->nbytes, c->stream[0]), "MatMulAdd"));
    else PP_TRY(gemm(dev, c, 0, tb, M, N, K, 1.0f, a->data, 0, b->data, 0, 0.0f, y->data, 1));
    return bias_act(dev, c, y, bias, act);
}

/* pippin::SumToShape(grad, shape) where shape is grad's trailing dims (a
 * bias's gradient): a column sum over the leading rows. Other shapes
 * (broadcast inside): the CPU's. */
static pp_status run_sum_to_shape(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *g = ctx->in[0], *sh = ctx->in[1];
    if (!is_f32(g) || sh->ndim != 1 || sh->shape[0] > g->ndim) return fallback();
    int nd = (int)sh->shape[0];
    int64_t ts[PP_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        ts[d] = pp_tensor_get_i64(sh, d);
        if (ts[d] != g->shape[g->ndim - nd + d]) return fallback();
    }
    int64_t inner = pp_shape_numel(nd, ts);
    if (inner == 0) return fallback();
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, nd, ts, &y));
    return launched(dev, pp_cu_reduce_sum(c->stream[0], g->data, y->data, 1, pp_tensor_numel(g) / inner, inner),
                    "SumToShape");
}

/* ------------------------------------------------------ gather, losses */

static pp_status run_gather(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0], *ix = ctx->in[1]; /* indices on the host: checked here */
    if (x->ndim < 1 || (ix->dtype != PP_I64 && ix->dtype != PP_I32)) return fallback();
    int64_t axis = axis_attr(ctx->node, "axis", 0, x->ndim);
    if (axis < 0 || axis >= x->ndim) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
    int64_t dim = x->shape[axis], ni = pp_tensor_numel(ix);
    for (int64_t j = 0; j < ni; j++) {
        int64_t v = pp_tensor_get_i64(ix, j);
        if (v < -dim || v >= dim)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "index %lld out of range [-%lld,%lld)", (long long)v,
                                   (long long)dim, (long long)dim);
    }
    int nd = x->ndim - 1 + ix->ndim;
    if (nd > PP_MAX_DIMS) return fallback();
    int64_t shape[PP_MAX_DIMS];
    int o = 0;
    for (int d = 0; d < axis; d++) shape[o++] = x->shape[d];
    for (int d = 0; d < ix->ndim; d++) shape[o++] = ix->shape[d];
    for (int d = (int)axis + 1; d < x->ndim; d++) shape[o++] = x->shape[d];
    pp_tensor *idx, *y;
    PP_TRY(upload_i64(dev, c, ix, &idx));
    pp_status s = new_out(dev, ctx, 0, x->dtype, nd, shape, &y);
    int64_t inner = pp_shape_numel(x->ndim - (int)axis - 1, x->shape + axis + 1);
    if (!s)
        s = launched(dev, pp_cu_gather(c->stream[0], x->data, (int)pp_dtype_size(x->dtype), idx->data, ni, dim, inner,
                                       y->data, pp_tensor_numel(y)),
                     "Gather");
    pp_tensor_free(idx);
    return s;
}

/* pippin::GatherGrad(dy, indices, data shape): the embedding gradient. */
static pp_status run_gather_grad(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *dy = ctx->in[0], *ix = ctx->in[1], *sh = ctx->in[2];
    if (!is_f32(dy) || (ix->dtype != PP_I64 && ix->dtype != PP_I32) || sh->ndim != 1 || sh->shape[0] > PP_MAX_DIMS)
        return fallback();
    int r = (int)sh->shape[0];
    int64_t ds[PP_MAX_DIMS];
    for (int d = 0; d < r; d++) ds[d] = pp_tensor_get_i64(sh, d);
    int64_t axis = axis_attr(ctx->node, "axis", 0, r);
    if (axis < 0 || axis >= r) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
    int64_t dim = ds[axis], ni = pp_tensor_numel(ix), inner = pp_shape_numel(r - (int)axis - 1, ds + axis + 1);
    if (pp_tensor_numel(dy) != pp_shape_numel((int)axis, ds) * ni * inner)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy does not match indices and data shape");
    for (int64_t j = 0; j < ni; j++) {
        int64_t v = pp_tensor_get_i64(ix, j);
        if (v < -dim || v >= dim) return pp_kernel_error(ctx, PP_ERR_INVALID, "index %lld out of range", (long long)v);
    }
    pp_tensor *idx, *y;
    PP_TRY(upload_i64(dev, c, ix, &idx));
    pp_status s = new_out(dev, ctx, 0, PP_F32, r, ds, &y);
    if (!s)
        s = launched(dev, pp_cu_gather_grad(c->stream[0], dy->data, idx->data, ni, dim, inner, y->data,
                                            pp_tensor_numel(y), pp_tensor_numel(dy)),
                     "GatherGrad");
    pp_tensor_free(idx);
    return s;
}

/* Labels checked on the host; the rows not ignored counted. */
static pp_status sce_labels(pp_kernel_ctx *ctx, const pp_tensor *sc, const pp_tensor *lb, int64_t *ignore,
                            int64_t *count) {
    int64_t rows = sc->shape[0], C = sc->shape[1];
    if (pp_tensor_numel(lb) != rows) return pp_kernel_error(ctx, PP_ERR_SHAPE, "labels do not match the scores");
    int has_ignore = pp_node_attr(ctx->node, "ignore_index") != NULL;
    *ignore = has_ignore ? pp_node_attr_int(ctx->node, "ignore_index", 0) : INT64_MIN;
    *count = 0;
    for (int64_t j = 0; j < rows; j++) {
        int64_t l = pp_tensor_get_i64(lb, j);
        if (l == *ignore) continue;
        if (l < 0 || l >= C)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "label %lld out of range [0,%lld)", (long long)l, (long long)C);
        (*count)++;
    }
    return PP_OK;
}

/* SoftmaxCrossEntropyLoss, scores [N, C], mean, no weights, loss only. */
static int sce_claimable(pp_kernel_ctx *ctx, const pp_tensor *sc, const pp_tensor *lb, int weights_at) {
    const char *red = pp_node_attr_string(ctx->node, "reduction", "mean");
    return is_f32(sc) && sc->ndim == 2 && (lb->dtype == PP_I64 || lb->dtype == PP_I32) && !strcmp(red, "mean") &&
           !(ctx->n_in > weights_at && ctx->in[weights_at]);
}

static pp_status run_sce(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *sc = ctx->in[0], *lb = ctx->in[1];
    if (!sce_claimable(ctx, sc, lb, 2) || (ctx->n_out > 1 && ctx->node->out[1] >= 0)) return fallback();
    int64_t ignore, count;
    PP_TRY(sce_labels(ctx, sc, lb, &ignore, &count));
    pp_tensor *labels, *work = NULL, *loss;
    PP_TRY(upload_i64(dev, c, lb, &labels));
    pp_status s = pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, 1, sc->shape, &work);
    if (!s) s = new_out(dev, ctx, 0, PP_F32, 0, NULL, &loss);
    if (!s)
        s = launched(dev, pp_cu_sce_loss(c->stream[0], sc->data, labels->data, sc->shape[0], sc->shape[1], ignore,
                                         work->data, loss->data),
                     "SoftmaxCrossEntropyLoss");
    pp_tensor_free(work);
    pp_tensor_free(labels);
    return s;
}

static pp_status run_sce_grad(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *dl = ctx->in[0], *sc = ctx->in[1], *lb = ctx->in[2];
    if (!is_f32(dl) || pp_tensor_numel(dl) != 1 || !sce_claimable(ctx, sc, lb, 3)) return fallback();
    int64_t ignore, count;
    PP_TRY(sce_labels(ctx, sc, lb, &ignore, &count));
    pp_tensor *labels, *dx;
    PP_TRY(upload_i64(dev, c, lb, &labels));
    pp_status s = new_out(dev, ctx, 0, PP_F32, sc->ndim, sc->shape, &dx);
    if (!s)
        s = launched(dev, pp_cu_sce_grad(c->stream[0], dl->data, sc->data, labels->data, sc->shape[0], sc->shape[1],
                                         ignore, count, dx->data),
                     "SoftmaxCrossEntropyLossGrad");
    pp_tensor_free(labels);
    return s;
}

/* ------------------------------------------------------- data movement */

static pp_status run_transpose(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    int64_t perm[PP_MAX_DIMS];
    const pp_attr *p = pp_node_attr(ctx->node, "perm");
    for (int d = 0; d < x->ndim; d++) perm[d] = x->ndim - 1 - d;
    if (p) {
        if (p->n != x->ndim) return pp_kernel_error(ctx, PP_ERR_INVALID, "perm has %d entries for %d dims", p->n, x->ndim);
        for (int d = 0; d < x->ndim; d++) perm[d] = p->ints[d] < 0 ? p->ints[d] + x->ndim : p->ints[d];
    }
    pp_km_strides st;
    pp_km_transpose(x->ndim, x->shape, perm, &st);
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, x->dtype, x->ndim, st.shape, &y));
    return launched(dev, pp_cu_strided_copy(c->stream[0], x->data, (int)pp_dtype_size(x->dtype), 0, st, y->data,
                                            pp_tensor_numel(y)),
                    "Transpose");
}

/* Reshape, Flatten, Squeeze, Unsqueeze, Identity: the CPU kernel works out
 * the shape from a tensor that only describes the input (its data is never
 * read), then the bytes are copied on the device. */
static pp_status run_view(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0], *desc, *ins[8], *outs[1] = {NULL};
    if (ctx->n_in > 8) return fallback();
    PP_TRY(pp_tensor_wrap(x->dtype, x->ndim, x->shape, x->data, NULL, NULL, &desc));
    for (int k = 0; k < ctx->n_in; k++) ins[k] = k ? ctx->in[k] : desc;
    pp_kernel_ctx shape_ctx = *ctx;
    shape_ctx.in = ins;
    shape_ctx.out = outs;
    pp_status s = ctx->node->op->run(&shape_ctx);
    pp_tensor_free(desc);
    if (s) return s;
    pp_tensor *y;
    s = new_out(dev, ctx, 0, x->dtype, outs[0]->ndim, outs[0]->shape, &y);
    pp_tensor_free(outs[0]);
    if (!s && x->nbytes)
        s = launched(dev, cudaMemcpyAsync(y->data, x->data, x->nbytes, cudaMemcpyDeviceToDevice, c->stream[0]),
                     ctx->node->op_type);
    return s;
}

static pp_status run_concat(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *x0 = ctx->in[0];
    int64_t axis = axis_attr(ctx->node, "axis", 0, x0->ndim);
    if (axis < 0 || axis >= x0->ndim) return pp_kernel_error(ctx, PP_ERR_INVALID, "axis out of range");
    int64_t shape[PP_MAX_DIMS], total = 0;
    memcpy(shape, x0->shape, sizeof(int64_t) * (size_t)x0->ndim);
    for (int k = 0; k < ctx->n_in; k++) {
        const pp_tensor *x = ctx->in[k];
        if (!x || x->dtype != x0->dtype || x->ndim != x0->ndim) return fallback();
        for (int d = 0; d < x->ndim; d++)
            if (d != axis && x->shape[d] != x0->shape[d])
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "input %d differs in dim %d", k, d);
        total += x->shape[axis];
    }
    shape[axis] = total;
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, x0->dtype, x0->ndim, shape, &y));
    int64_t inner = pp_shape_numel(x0->ndim - (int)axis - 1, x0->shape + axis + 1), off = 0;
    for (int k = 0; k < ctx->n_in; k++) {
        const pp_tensor *x = ctx->in[k];
        PP_TRY(launched(dev, pp_cu_concat_part(c->stream[0], x->data, (int)pp_dtype_size(x->dtype), x->shape[axis],
                                               inner, total, off, y->data, pp_tensor_numel(x)),
                        "Concat"));
        off += x->shape[axis];
    }
    return PP_OK;
}

/* Split along any axis, sizes from the `split` input (read on the host) or
 * attribute, else num_outputs or equal parts (pp_split_sizes, the CPU
 * kernel's). A part that is one contiguous block (nothing before the
 * axis) is a view of the input, as on the CPU; the others are copied. */
static pp_status run_split(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    pp_tensor *x = ctx->in[0];
    int nout = ctx->n_out, axis = 0;
    if (x->ndim < 1) return fallback();
    int64_t *sizes = calloc((size_t)(nout ? nout : 1), sizeof *sizes);
    if (!sizes) return pp_error(PP_ERR_NOMEM, "%s: out of memory", dev->name);
    pp_status s = pp_split_sizes(ctx, x, &axis, sizes);
    int64_t dim = x->shape[axis], start = 0, es = (int64_t)pp_dtype_size(x->dtype);
    int64_t outer = pp_shape_numel(axis, x->shape);
    int64_t inner = pp_shape_numel(x->ndim - axis - 1, x->shape + axis + 1);
    for (int i = 0; i < nout && s == PP_OK; i++) {
        int64_t shape[PP_MAX_DIMS];
        memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        shape[axis] = sizes[i];
        int64_t off = start;
        start += sizes[i];
        if (!pp_kernel_want_out(ctx, i)) continue;
        if (outer == 1 && sizes[i] * inner > 0) {
            s = pp_device_tensor_view(x, (size_t)(off * inner * es), x->dtype, x->ndim, shape, &ctx->out[i]);
            continue;
        }
        pp_tensor *y;
        s = new_out(dev, ctx, i, x->dtype, x->ndim, shape, &y);
        if (!s)
            s = launched(dev, pp_cu_split_part(c->stream[0], x->data, (int)es, sizes[i], inner, dim, off, y->data,
                                               pp_tensor_numel(y)),
                         "Split");
    }
    free(sizes);
    return s;
}

/* ---------------------------------------------------- causal attention */

static pp_km_attn_view km_view(const pp_attn_view *v) { return (pp_km_attn_view){v->sb, v->sh, v->st, v->sd}; }

/* The kernels' description of an attention's operands (checked by
 * pp_attn_operands_of, the CPU kernels' own checks). */
static pp_km_attn km_attn(const pp_kernel_ctx *ctx, const pp_attn_operands *o) {
    pp_km_attn a;
    memset(&a, 0, sizeof a);
    a.heads = o->q.heads, a.tq = o->q.rows, a.tk = o->k.rows, a.d = o->q.cols, a.dv = o->v.cols;
    a.mask_a = o->mask_a, a.mask_b = o->mask_b;
    a.scale = pp_node_attr_float(ctx->node, "scale", 1.0f);
    a.scale_div = pp_node_attr_int(ctx->node, "scale_div", 0) != 0;
    a.q = km_view(&o->q), a.k = km_view(&o->k), a.v = km_view(&o->v);
    return a;
}

/* pippin::CausalAttention(Q, K, V[, mask_ref]): mask_ref is read for its
 * shape alone (on the host). */
static pp_status run_attention(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *Q = ctx->in[0], *K = ctx->in[1], *V = ctx->in[2];
    const pp_tensor *M = ctx->n_in > 3 ? ctx->in[3] : NULL;
    if (!is_f32(Q) || !is_f32(K) || !is_f32(V)) return fallback();
    pp_attn_operands o;
    PP_TRY(pp_attn_operands_of(ctx, Q, K, V, M, &o));
    int64_t shape[PP_MAX_DIMS], ys[3];
    int nd;
    PP_TRY(pp_attn_out_shape(ctx, Q, &o, shape, &nd, ys));
    pp_km_attn a = km_attn(ctx, &o);
    a.y = (pp_km_attn_view){ys[0], ys[1], ys[2], 1};
    pp_tensor *y;
    PP_TRY(new_out(dev, ctx, 0, PP_F32, nd, shape, &y));
    return launched(dev, pp_cu_attention(c->stream[0], a, Q->data, K->data, V->data, y->data, o.q.batch * o.q.heads),
                    "CausalAttention");
}

/* pippin::CausalAttentionGrad(dY, Q, K, V[, mask_ref]) -> dQ, dK, dV (each
 * shaped and laid out as its operand; those not wanted not computed). */
static pp_status run_attention_grad(pp_device *dev, cuda_device *c, pp_kernel_ctx *ctx) {
    const pp_tensor *dY = ctx->in[0], *Q = ctx->in[1], *K = ctx->in[2], *V = ctx->in[3];
    const pp_tensor *M = ctx->n_in > 4 ? ctx->in[4] : NULL;
    if (!is_f32(dY) || !is_f32(Q) || !is_f32(K) || !is_f32(V)) return fallback();
    pp_attn_operands o;
    PP_TRY(pp_attn_operands_of(ctx, Q, K, V, M, &o));
    pp_attn_view dyv;
    PP_TRY(pp_attn_view_of(ctx, "dY", dY, o.ol, &dyv));
    if (dyv.batch * dyv.heads != o.q.batch * o.q.heads || dyv.rows != o.q.rows || dyv.cols != o.v.cols)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dY is not the output of this attention's Q");
    pp_km_attn a = km_attn(ctx, &o);
    /* dY read with Y's strides: the same heads in the same order as Q's */
    if (o.ol == L_BTHD) a.y.sh = o.v.cols, a.y.st = o.q.heads * o.v.cols, a.y.sb = o.q.rows * a.y.st;
    else a.y.st = o.v.cols, a.y.sh = o.q.rows * o.v.cols, a.y.sb = o.q.heads * a.y.sh;
    a.y.sd = 1;
    const pp_tensor *like[3] = {Q, K, V};
    pp_tensor *g[3] = {NULL, NULL, NULL}, *stats = NULL;
    for (int k = 0; k < 3; k++)
        if (k < ctx->n_out && ctx->node->out[k] >= 0) PP_TRY(new_out(dev, ctx, k, PP_F32, like[k]->ndim, like[k]->shape, &g[k]));
    int64_t n_bh = o.q.batch * o.q.heads;
    PP_TRY(pp_device_tensor_new(dev, PP_MEMORY_DEVICE, PP_F32, 1, (int64_t[]){3 * n_bh * o.q.rows}, &stats));
    float cf = a.scale_div ? 1.0f / a.scale : a.scale;
    pp_status s = launched(dev,
                           pp_cu_attention_grad(c->stream[0], a, Q->data, K->data, V->data, dY->data, cf, stats->data,
                                                g[0] ? g[0]->data : NULL, g[1] ? g[1]->data : NULL,
                                                g[2] ? g[2]->data : NULL, n_bh),
                           "CausalAttentionGrad");
    pp_tensor_free(stats); /* back to the pool: reused in stream order */
    return s;
}

/* ----------------------------------------------------------- the table */

static const struct {
    const char *domain, *name;
    cuda_op_fn run;
    int host_inputs; /* bit k: input k is read on the host */
} ops[] = {
    {"", "Add", run_binary, 0},
    {"", "Sub", run_binary, 0},
    {"", "Mul", run_binary, 0},
    {"", "Div", run_binary, 0},
    {"", "Relu", run_unary, 0},
    {"", "Tanh", run_unary, 0},
    {"", "Gelu", run_unary, 0},
    {"", "Neg", run_unary, 0},
    {"", "Exp", run_unary, 0},
    {"", "Sqrt", run_unary, 0},
    {"", "Sigmoid", run_unary, 0},
    {"pippin", "ReluGrad", run_unary_grad, 0},
    {"pippin", "TanhGrad", run_unary_grad, 0},
    {"pippin", "GeluGrad", run_unary_grad, 0},
    {"", "Softmax", run_softmax, 0},
    {"pippin", "SoftmaxGrad", run_softmax_grad, 0},
    {"", "LayerNormalization", run_layernorm, 0},
    {"pippin", "LayerNormGradInput", run_ln_grad_input, 0},
    {"pippin", "LayerNormGradWeight", run_ln_grad_weight, 0},
    {"", "MatMul", run_matmul, 0},
    {"", "Gemm", run_gemm, 0},
    {"pippin", "MatMulAdd", run_matmul_add, 0},
    {"pippin", "MatMulGradA", run_matmul_grad, 1 << 2},
    {"pippin", "MatMulGradB", run_matmul_grad, 1 << 2},
    {"pippin", "SumToShape", run_sum_to_shape, 1 << 1},
    {"", "Gather", run_gather, 1 << 1},
    {"pippin", "GatherGrad", run_gather_grad, 1 << 1 | 1 << 2},
    {"", "SoftmaxCrossEntropyLoss", run_sce, 1 << 1},
    {"pippin", "SoftmaxCrossEntropyLossGrad", run_sce_grad, 1 << 2},
    {"", "Transpose", run_transpose, 0},
    {"", "Reshape", run_view, 1 << 1},
    {"", "Flatten", run_view, 0},
    {"", "Squeeze", run_view, 1 << 1},
    {"", "Unsqueeze", run_view, 1 << 1},
    {"", "Identity", run_view, 0},
    {"", "Concat", run_concat, 0},
    {"", "Split", run_split, 1 << 1},
    {"pippin", "CausalAttention", run_attention, 1 << 3},
    {"pippin", "CausalAttentionGrad", run_attention_grad, 1 << 4},
};

static int find_op(const pp_node *n) {
    const char *dom = !strcmp(n->domain, "ai.onnx") ? "" : n->domain;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (!strcmp(ops[i].name, n->op_type) && !strcmp(ops[i].domain, dom)) return (int)i;
    return -1;
}

int pp_cuda_supports(const pp_device *dev, const pp_graph *g, const pp_node *n) {
    int i = find_op(n);
    if (i < 0) return 0;
    /* a residual or Split the inference optimizer took into MatMulAdd: the
     * CPU's (claimed, it would only go back there on every run) */
    if (ops[i].run == run_matmul_add && ((n->n_in > 3 && n->in[3] >= 0) || n->n_out > 1)) return 0;
    /* an attribute this backend does not read: the CPU honours it */
    for (int a = 0; a < n->n_attr; a++)
        if (!pp_cuda_attr_known(n->op_type, n->attrs[a].name)) return 0;
    /* inputs of a known dtype other than float32 (indices aside): the CPU's */
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] < 0 || (ops[i].host_inputs >> k & 1)) continue;
        pp_dtype dt = g->values[n->in[k]].dtype;
        if (dt != PP_DTYPE_UNDEFINED && dt != PP_F32 && ops[i].run != run_view && ops[i].run != run_transpose &&
            ops[i].run != run_concat && ops[i].run != run_split && !(ops[i].run == run_gather && k == 0))
            return 0;
    }
    return 1;
}

int pp_cuda_input_on_host(const pp_node *n, int k) {
    int i = find_op(n);
    return i >= 0 && (ops[i].host_inputs >> k & 1);
}

pp_status pp_cuda_run(pp_device *dev, pp_kernel_ctx *ctx) {
    cuda_device *c = dev->impl;
    int i = find_op(ctx->node);
    if (i < 0) return fallback();
    for (int k = 0; k < ctx->n_in; k++)
        if (!ctx->in[k] && k < 2 && ops[i].run != run_concat && ops[i].run != run_split)
            return fallback(); /* an omitted input the table does not expect */
    pp_status s = ops[i].run(dev, c, ctx);
    if (s != PP_OK) { /* the executor expects no outputs set on failure or fallback */
        for (int k = 0; k < ctx->n_out; k++) {
            pp_tensor_free(ctx->out[k]);
            ctx->out[k] = NULL;
        }
        return s;
    }
    dev->stats.kernels++;
    return PP_OK;
}
