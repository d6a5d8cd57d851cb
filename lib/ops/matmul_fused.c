/* pippin::MatMulAdd, what the optimizer makes of a Linear layer
 * (lib/opt_matmul.c): Y = act(A op(B) + bias) with A float32 [..., K]
 * (every leading dim folded into the GEMM's rows), B a 2-D weight ([K, N],
 * or [N, K] with transB = 1, read in place), bias [N] (optional input 2)
 * and activation "" (none), "relu", "gelu" or "gelu_tanh"; in inference
 * graphs, a residual R (optional input 3) added after the activation:
 * Y = act(A op(B) + bias) + R, as the Add the optimizer took in; and in
 * place of one output Y, the parts of the Split it took in (attributes
 * "axis" and "split", as Split's): with packed panels, the cut along the
 * last axis at multiples of 16 columns and nothing after the bias, each
 * tile is stored straight into its part; otherwise Y is made whole and
 * the Split kernel cuts it.
 *
 * The output rows start as the bias and the GEMM (the call MatMul makes,
 * lib/ops/gemm.h) adds the product to them (beta 1: OpenBLAS then skips
 * its pass zeroing C, and no pass adds the bias after); without a bias the
 * GEMM writes them (beta 0). Then one pass over the rows applies the
 * activation with the arithmetic of the Relu and Gelu kernels
 * (lib/ops/elementwise.c). The sum is the unfused nodes' within float
 * rounding: the same bits when the GEMM adds its product to C once (K
 * within one OpenBLAS block, and no transB; on AVX-512, K within one k
 * block of the packed kernel, 128), else the bias joins the sum earlier. Rows split between threads, never inside one, so any thread
 * count of pippin's pool gives the same bits. With packed panels and no
 * activation, R is added to each tile as the GEMM makes it
 * (pp_gemm_packed_residual); otherwise in the one pass over the
 * rows after it. An R of another shape than Y (the Add broadcast it)
 * is added by the Add kernel after, as the graph did. In training, a weight that
 * is a parameter is read from the executor's copy made once per step
 * (lib/pack_cache.c) when the row count makes that pay. */
#include <inttypes.h>
#include <limits.h>
#include <string.h>

#include "gemm.h"
#include "op.h"
#include "pack_cache.h"
#include "thread_pool.h"
#include "vec.h"

#include "status_internal.h"

enum { ACT_NONE, ACT_RELU, ACT_GELU, ACT_GELU_TANH };

#define PP_SPLIT_MAX 16 /* outputs of a Split taken in (the optimizer's limit too) */

static int activation_of(const pp_node *n) {
    const char *a = pp_node_attr_string(n, "activation", "");
    if (!a[0]) return ACT_NONE;
    if (strcmp(a, "relu") == 0) return ACT_RELU;
    if (strcmp(a, "gelu") == 0) return ACT_GELU;
    if (strcmp(a, "gelu_tanh") == 0) return ACT_GELU_TANH;
    return -1;
}

static pp_status matmul_add_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    if (activation_of(n) < 0)
        return pp_node_error(n, PP_ERR_INVALID,
                             "attribute 'activation' must be \"\", \"relu\", \"gelu\" or \"gelu_tanh\"");
    int64_t tb = pp_node_attr_int(n, "transB", 0);
    if (tb != 0 && tb != 1) return pp_node_error(n, PP_ERR_INVALID, "attribute 'transB' must be 0 or 1");
    const int64_t *split;
    if (n->n_out > 1 && pp_node_attr_ints(n, "split", &split) != n->n_out)
        return pp_node_error(n, PP_ERR_INVALID, "%d outputs need attribute 'split' with as many sizes", n->n_out);
    return PP_OK;
}

PP_VINLINE float gelu_f32(float x) { return 0.5f * x * (1.0f + pp_verff(x * 0.70710678118654752f)); }
PP_VINLINE float gelu_tanh_f32(float x) {
    return 0.5f * x * (1.0f + pp_vtanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

/* y[i] = act(y[i]) over one row. */
PP_VEC_CLONES static void epilogue_row(int64_t n, float *restrict y, int act) {
    switch (act) {
    case ACT_RELU: PP_VFOR(i, n, float x = y[i]; y[i] = x < 0 ? 0.0f : x;); break;
    case ACT_GELU: PP_VFOR(i, n, float x = y[i]; y[i] = gelu_f32(x);); break;
    case ACT_GELU_TANH: PP_VFOR(i, n, float x = y[i]; y[i] = gelu_tanh_f32(x);); break;
    default: break;
    }
}

/* y[i] += r[i] over one row: Add's arithmetic (a + b is b + a in floats). */
PP_VEC_CLONES static void residual_row(int64_t n, float *restrict y, const float *restrict r) {
    PP_VFOR(i, n, y[i] += r[i];);
}

typedef struct {
    float *y;
    const float *bias;
    int64_t n;
    int act;
    const float *residual; /* [rows, n], or NULL */
} epilogue_job;

static void epilogue_piece(void *arg, int64_t lo, int64_t hi) {
    const epilogue_job *j = arg;
    for (int64_t r = lo; r < hi; r++) {
        epilogue_row(j->n, j->y + r * j->n, j->act);
        if (j->residual) residual_row(j->n, j->y + r * j->n, j->residual + r * j->n);
    }
}

/* Y + R by the Add kernel, for an R of another shape (broadcast): *y
 * becomes the sum. */
static pp_status add_broadcast(pp_kernel_ctx *ctx, pp_tensor **y, const pp_tensor *r) {
    const pp_op *add = pp_op_find("", "Add");
    if (!add) return pp_kernel_error(ctx, PP_ERR_INTERNAL, "no Add kernel for the residual");
    pp_tensor *in[2] = {*y, (pp_tensor *)r}, *sum = NULL;
    pp_kernel_ctx sub = *ctx;
    sub.n_in = 2, sub.in = in, sub.n_out = 1, sub.out = &sum, sub.into = NULL, sub.added = NULL;
    PP_TRY(add->run(&sub));
    pp_tensor_free(*y);
    *y = sum;
    return PP_OK;
}

/* Outputs cut from the product y as the Split the optimizer took in
 * would ("axis", "split"): the Split kernel run on y. */
static pp_status split_by_kernel(pp_kernel_ctx *ctx, pp_tensor *y) {
    const pp_op *split = pp_op_find("", "Split");
    if (!split) return pp_kernel_error(ctx, PP_ERR_INTERNAL, "no Split kernel for the outputs");
    pp_kernel_ctx sub = *ctx;
    sub.n_in = 1, sub.in = &y, sub.into = NULL, sub.added = NULL; /* the sizes from the attribute */
    return split->run(&sub);
}

/* The packed GEMM's tiles stored straight into the outputs: the cut is
 * along the last axis at multiples of its panel width, every output is
 * wanted and nothing is applied after the bias. 0: not this case. */
static int split_direct(const pp_kernel_ctx *ctx, int ndim, int64_t N, int *starts) {
    const pp_node *n = ctx->node;
    const int64_t *split;
    int k = pp_node_attr_ints(n, "split", &split);
    int64_t axis = pp_node_attr_int(n, "axis", 0);
    if (k != ctx->n_out || k > PP_SPLIT_MAX || (axis != -1 && axis != ndim - 1)) return 0;
    int64_t at = 0;
    for (int o = 0; o < k; o++) {
        if (n->out[o] < 0 || split[o] < 0 || split[o] > N - at || at % PP_PACK_NR) return 0;
        starts[o] = (int)at;
        at += split[o];
    }
    starts[k] = (int)at;
    return at == N;
}

static int same_shape(const pp_tensor *a, const pp_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

static void bias_piece(void *arg, int64_t lo, int64_t hi) {
    const epilogue_job *j = arg;
    for (int64_t r = lo; r < hi; r++) memcpy(j->y + r * j->n, j->bias, sizeof(float) * (size_t)j->n);
}

static pp_status matmul_add_run(pp_kernel_ctx *ctx) {
    const pp_tensor *a = ctx->in[0], *b = ctx->in[1];
    const pp_tensor *bias = ctx->n_in > 2 ? ctx->in[2] : NULL;
    char sa[128], sb[128];
    if (a->dtype != PP_F32 || b->dtype != PP_F32 || (bias && bias->dtype != PP_F32))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "float32 only, got %s, %s%s%s", pp_dtype_name(a->dtype),
                               pp_dtype_name(b->dtype), bias ? " and " : "", bias ? pp_dtype_name(bias->dtype) : "");
    int tb = pp_node_attr_int(ctx->node, "transB", 0) != 0;
    int act = activation_of(ctx->node);
    int64_t packed_n = pp_node_attr_int(ctx->node, "packed_n", 0); /* B from pippin::PackWeight */
    if (a->ndim < 1 || (packed_n ? b->ndim != 3 : b->ndim != 2))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "A must have at least 1 dim and B %s, got %s and %s",
                               packed_n ? "3 (packed)" : "2", pp_shape_str(a->ndim, a->shape, sa, sizeof sa),
                               pp_shape_str(b->ndim, b->shape, sb, sizeof sb));
    int64_t K = a->shape[a->ndim - 1], Kb = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    if (packed_n) {
        Kb = b->shape[1];
        N = packed_n;
        if (b->shape[0] != (N + PP_PACK_NR - 1) / PP_PACK_NR || b->shape[2] != PP_PACK_NR)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "packed B %s does not hold %" PRId64 " columns",
                                   pp_shape_str(3, b->shape, sb, sizeof sb), N);
    }
    if (K != Kb)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot multiply %s by %s%s (inner dims %" PRId64 " and %" PRId64 ")",
                               pp_shape_str(a->ndim, a->shape, sa, sizeof sa),
                               pp_shape_str(2, b->shape, sb, sizeof sb), tb ? "^T" : "", K, Kb);
    if (bias && (bias->ndim != 1 || bias->shape[0] != N))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "bias %s is not [%" PRId64 "]",
                               pp_shape_str(bias->ndim, bias->shape, sa, sizeof sa), N);
    int64_t oshape[PP_MAX_DIMS];
    for (int d = 0; d < a->ndim - 1; d++) oshape[d] = a->shape[d];
    oshape[a->ndim - 1] = N;
    int64_t M = pp_shape_numel(a->ndim - 1, a->shape);
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "matrix dims exceed BLAS int range");
    const pp_tensor *res = ctx->n_in > 3 ? ctx->in[3] : NULL;
    int starts[PP_SPLIT_MAX + 1];
    if (ctx->n_out > 1 && packed_n && act == ACT_NONE && !res && M > 0 && K > 0 &&
        split_direct(ctx, a->ndim, N, starts)) { /* a Split after the GEMM: no copy */
        float *outs[PP_SPLIT_MAX];
        for (int o = 0; o < ctx->n_out; o++) {
            oshape[a->ndim - 1] = starts[o + 1] - starts[o];
            PP_TRY(pp_tensor_empty(PP_F32, a->ndim, oshape, &ctx->out[o]));
            outs[o] = ctx->out[o]->data;
        }
        pp_gemm_packed_split((int)M, (int)N, (int)K, a->data, (int)K, b->data, bias ? bias->data : NULL, ctx->n_out,
                             outs, starts);
        return PP_OK;
    }
    if (ctx->n_out > 1) { /* the whole product, then the Split kernel's cut */
        pp_tensor *whole = NULL;
        pp_kernel_ctx one = *ctx;
        one.n_out = 1, one.out = &whole;
        pp_status s = matmul_add_run(&one);
        if (s == PP_OK) s = split_by_kernel(ctx, whole);
        pp_tensor_free(whole);
        return s;
    }
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_F32, a->ndim, oshape, &y));
    ctx->out[0] = y;
    int res_here = res && res->dtype == PP_F32 && same_shape(res, y); /* else the Add kernel's, after */
    if (!y->nbytes) return res && !res_here ? add_broadcast(ctx, &ctx->out[0], res) : PP_OK;
    epilogue_job j = {y->data, bias ? bias->data : NULL, N, act, res_here ? res->data : NULL};
    /* Training: a copy of the parameter W made once per step by the
     * executor (lib/pack_cache.c) where reading it beats OpenBLAS's
     * packing W with transB on every call: panels for pippin's packed GEMM
     * at a microbatch's rows, W^T for OpenBLAS at more. */
    const float *panels = NULL, *wt = NULL;
    int choice = packed_n || K == 0 ? -1 : pp_pack_choice(M, K, N, tb);
    if (choice == PP_PACK_TRANSPOSED) PP_TRY(pp_kernel_packed_weight(ctx, 1, choice, &wt));
    else if (choice >= 0) PP_TRY(pp_kernel_packed_weight(ctx, 1, choice, &panels));
    /* held W^T panels where pp_gemm_f32 would pack them per call
     * (AVX-512): its product, its bits, the bias and R as it has them */
    const float *any_panels = NULL;
    if (panels && tb && pp_gemm_packed_any_takes((int)M, (int)N, (int)K, 1.0f, bias ? 1.0f : 0.0f))
        any_panels = panels, panels = NULL;
    /* R is added to each tile as it is stored; an activation is not (its
     * math inside the GEMM's loop measured slower than a pass after it,
     * which then adds R too; again with AVX-512: 0.97-0.99x) */
    int tiles = (packed_n || panels) && act == ACT_NONE && j.residual;
    if (packed_n || panels) /* the bias (and R) added as each tile is stored, then the epilogue */
        pp_gemm_packed_residual((int)M, (int)N, (int)K, a->data, (int)K, panels ? panels : b->data,
                                bias ? bias->data : NULL, tiles ? j.residual : NULL, y->data, (int)N);
    else if (bias)
        pp_parallel_for(M, pp_grain_rows(N, PP_GRAIN_ELEMS), bias_piece, &j);
    else if (K == 0)
        memset(y->data, 0, y->nbytes);
    if (K > 0 && !packed_n && !panels) {
        if (any_panels)
            pp_gemm_packed_any_panels((int)M, (int)N, (int)K, a->data, (int)K, any_panels, bias ? 1.0f : 0.0f, y->data,
                                      (int)N);
        else if (wt) /* W^T [K, N] */
            pp_gemm_f32(0, 0, (int)M, (int)N, (int)K, 1.0f, a->data, (int)K, wt, (int)N, bias ? 1.0f : 0.0f, y->data,
                        (int)N);
        else
            pp_gemm_f32(0, tb, (int)M, (int)N, (int)K, 1.0f, a->data, (int)K, b->data, (int)b->shape[1],
                        bias ? 1.0f : 0.0f, y->data, (int)N);
    }
    if (!tiles && (act != ACT_NONE || j.residual)) {
        int64_t grain = act == ACT_GELU || act == ACT_GELU_TANH ? PP_GRAIN_ROW_ELEMS : PP_GRAIN_ELEMS;
        pp_parallel_for(M, pp_grain_rows(N, grain), epilogue_piece, &j);
    }
    return res && !res_here ? add_broadcast(ctx, &ctx->out[0], res) : PP_OK;
}

/* pippin::PackWeight(W) with transB: op(W) [K, N] packed for
 * pp_gemm_packed_f32 as [ceil(N/16), K, 16]. The optimizer's matmul pass
 * puts one before each MatMulAdd by a transposed weight in inference
 * graphs; it depends on the weight alone, so the executor packs once
 * (pp_exec_set_constant_params) and every call reads the panels. */
static pp_status pack_weight_run(pp_kernel_ctx *ctx) {
    const pp_tensor *w = ctx->in[0];
    char sw[128];
    if (w->dtype != PP_F32 || w->ndim != 2)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "a 2-D float32 weight only, got %s%s",
                               pp_dtype_name(w->dtype), pp_shape_str(w->ndim, w->shape, sw, sizeof sw));
    int tb = pp_node_attr_int(ctx->node, "transB", 0) != 0;
    int64_t K = tb ? w->shape[1] : w->shape[0], N = tb ? w->shape[0] : w->shape[1];
    if (K > INT_MAX || N > INT_MAX) return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "weight dims exceed int range");
    int64_t shape[3] = {(N + PP_PACK_NR - 1) / PP_PACK_NR, K, PP_PACK_NR};
    pp_tensor *p;
    PP_TRY(pp_tensor_empty(PP_F32, 3, shape, &p));
    ctx->out[0] = p;
    if (p->nbytes) pp_pack_b_f32(tb, (int)K, (int)N, w->data, (int)w->shape[1], p->data);
    return PP_OK;
}

const pp_op pp_ops_matmul_fused[] = {
    {"MatMulAdd", "pippin", 2, 4, 1, PP_SPLIT_MAX, matmul_add_check, matmul_add_run},
    {"PackWeight", "pippin", 1, 1, 1, 1, NULL, pack_weight_run, 1}, /* pure: packed once per weight */
    {NULL},
};
