/* Resize (opsets 10-19) and Upsample (7-9), float32, modes nearest and
 * (n-)linear, and their gradient helper pippin::ResizeGrad.
 *
 * Both modes are separable: each output coordinate along an axis reads at
 * most two input positions i0, i1 with weights w0, w1 (nearest: one, weight
 * 1). The kernel resizes one axis at a time; the gradient runs the adjoint
 * passes (scatter-add of dy with the same weights) in the reverse order.
 * Coordinates follow ONNX's reference (onnx/backend/test/case/node/resize.py):
 * positions outside the input read the edge. Cubic, antialias and
 * tf_crop_and_resize are refused at load time. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grad_kernels.h"
#include "shape_kernels.h"

#include "status_internal.h"

#define RS_DIM_MAX INT64_C(2147483647) /* bound on one output dim */
#define RS_SCALE_MAX 1048576.0         /* bound on one scale */
#define RS_NUMEL_MAX (INT64_C(1) << 40) /* bound on the output's element count */

enum { CT_HALF_PIXEL, CT_PYTORCH_HALF_PIXEL, CT_ALIGN_CORNERS, CT_ASYMMETRIC, CT_TF_HALF_PIXEL_NN,
       CT_HALF_PIXEL_SYMMETRIC };
enum { NM_ROUND_PREFER_FLOOR, NM_ROUND_PREFER_CEIL, NM_FLOOR, NM_CEIL };
/* How the node passes its scales: Resize 11+ (X, roi, scales, sizes),
 * Resize 10 and Upsample 9 (X, scales), Upsample 7 (attribute scales). */
enum { FORM_RESIZE, FORM_SCALES_INPUT, FORM_SCALES_ATTR };

typedef struct rs_plan {
    int nd;
    int linear;
    int coord, nearest;
    int64_t in[PP_MAX_DIMS], out[PP_MAX_DIMS];
    double scale[PP_MAX_DIMS];
} rs_plan;

static int coord_mode(const char *s) {
    static const char *const names[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                        "asymmetric", "tf_half_pixel_for_nn",
                                        "half_pixel_symmetric"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

static int nearest_mode(const char *s) {
    static const char *const names[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

/* ----------------------------------------------------------------- check */

static pp_status string_attr(const pp_node *n, const char *name, const char **v) {
    const pp_attr *a = pp_node_attr(n, name);
    *v = NULL;
    if (!a) return PP_OK;
    if (a->type != PP_ATTR_STRING)
        return pp_node_error(n, PP_ERR_INVALID, "attribute '%s' must be a string", name);
    *v = a->s;
    return PP_OK;
}

static pp_status resize_check(const pp_graph *g, const pp_node *n) {
    int upsample = !strcmp(n->op_type, "Upsample");
    const char *mode, *coord, *nm, *kar;
    PP_TRY(string_attr(n, "mode", &mode));
    PP_TRY(string_attr(n, "coordinate_transformation_mode", &coord));
    PP_TRY(string_attr(n, "nearest_mode", &nm));
    PP_TRY(string_attr(n, "keep_aspect_ratio_policy", &kar));
    if (mode && strcmp(mode, "nearest") && strcmp(mode, "linear") && strcmp(mode, "bilinear"))
        return pp_node_error(n, strcmp(mode, "cubic") && strcmp(mode, "bicubic") ? PP_ERR_INVALID
                                                                                 : PP_ERR_UNSUPPORTED,
                             "mode '%s' is not supported (nearest and linear only)", mode);
    if (coord && !strcmp(coord, "tf_crop_and_resize"))
        return pp_node_error(n, PP_ERR_UNSUPPORTED,
                             "coordinate_transformation_mode 'tf_crop_and_resize' is not supported");
    if (coord && coord_mode(coord) < 0)
        return pp_node_error(n, PP_ERR_INVALID, "unknown coordinate_transformation_mode '%s'",
                             coord);
    if (nm && nearest_mode(nm) < 0)
        return pp_node_error(n, PP_ERR_INVALID, "unknown nearest_mode '%s'", nm);
    if (kar && strcmp(kar, "stretch") && strcmp(kar, "not_larger") && strcmp(kar, "not_smaller"))
        return pp_node_error(n, PP_ERR_INVALID, "unknown keep_aspect_ratio_policy '%s'", kar);
    if (pp_node_attr_int(n, "antialias", 0) != 0)
        return pp_node_error(n, PP_ERR_UNSUPPORTED, "antialias is not supported");
    const pp_attr *ax = pp_node_attr(n, "axes");
    if (ax && (ax->type != PP_ATTR_INTS || ax->n < 1 || ax->n > PP_MAX_DIMS))
        return pp_node_error(n, PP_ERR_INVALID, "axes must be a list of 1 to %d ints", PP_MAX_DIMS);
    const pp_attr *sc = pp_node_attr(n, "scales");
    if (sc && (!upsample || sc->type != PP_ATTR_FLOATS || sc->n < 1 || sc->n > PP_MAX_DIMS))
        return pp_node_error(n, PP_ERR_INVALID, "attribute 'scales' must be 1 to %d floats",
                             PP_MAX_DIMS);
    if (upsample && !sc && n->n_in < 2)
        return pp_node_error(n, PP_ERR_INVALID, "Upsample needs scales (attribute or input)");
    if (n->n_in > 0 && n->in[0] >= 0 && g) {
        pp_dtype dt = g->values[n->in[0]].dtype;
        if (dt != PP_DTYPE_UNDEFINED && dt != PP_F32)
            return pp_node_error(n, PP_ERR_UNSUPPORTED, "%s supports float32 only, not %s",
                                 n->op_type, pp_dtype_name(dt));
    }
    return PP_OK;
}

static pp_status resize_grad_check(const pp_graph *g, const pp_node *n) {
    (void)g;
    int64_t form = pp_node_attr_int(n, "form", -1);
    if (form < FORM_RESIZE || form > FORM_SCALES_ATTR)
        return pp_node_error(n, PP_ERR_INVALID, "attribute 'form' must be 0, 1 or 2");
    return resize_check(NULL, n);
}

/* ------------------------------------------------------------------ plan */

/* fin[k]: the forward node's input k (k >= 1; NULL if omitted). */
static pp_status plan_make(const pp_kernel_ctx *ctx, int form, int xnd, const int64_t *xs,
                           pp_tensor *const *fin, int nfin, rs_plan *p) {
    const pp_node *n = ctx->node;
    memset(p, 0, sizeof *p);
    p->nd = xnd;
    const char *mode = pp_node_attr_string(n, "mode", "nearest");
    p->linear = !strcmp(mode, "linear") || !strcmp(mode, "bilinear");
    if (!p->linear && strcmp(mode, "nearest"))
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED,
                               "mode '%s' is not supported (nearest and linear only)", mode);
    if (form == FORM_RESIZE) {
        p->coord = coord_mode(pp_node_attr_string(n, "coordinate_transformation_mode", "half_pixel"));
        p->nearest = nearest_mode(pp_node_attr_string(n, "nearest_mode", "round_prefer_floor"));
    } else {
        p->coord = CT_ASYMMETRIC;
        p->nearest = NM_FLOOR;
    }
    if (p->coord < 0 || p->nearest < 0)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "unsupported coordinate or nearest mode");
    /* axes (opset 18) */
    int axes[PP_MAX_DIMS], na = xnd;
    const int64_t *av;
    int nav = pp_node_attr_ints(n, "axes", &av);
    if (nav >= 0) {
        if (nav > xnd) return pp_kernel_error(ctx, PP_ERR_SHAPE, "more axes than input dims");
        na = nav;
        for (int i = 0; i < na; i++) {
            axes[i] = pp_norm_axis(av[i], xnd);
            if (axes[i] < 0)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %" PRId64 " out of range", av[i]);
            for (int j = 0; j < i; j++)
                if (axes[j] == axes[i])
                    return pp_kernel_error(ctx, PP_ERR_SHAPE, "axis %d repeated", axes[i]);
        }
    } else {
        for (int i = 0; i < xnd; i++) axes[i] = i;
    }
    for (int i = 0; i < xnd; i++) {
        p->in[i] = p->out[i] = xs[i];
        p->scale[i] = 1.0;
    }
    /* scales or sizes */
    double sc[PP_MAX_DIMS];
    int64_t sizes[PP_MAX_DIMS];
    int have_scales = 0, have_sizes = 0, ns = 0;
    if (form == FORM_SCALES_ATTR) {
        const pp_attr *a = pp_node_attr(n, "scales");
        if (!a || a->type != PP_ATTR_FLOATS || a->n > PP_MAX_DIMS)
            return pp_kernel_error(ctx, PP_ERR_INVALID, "attribute 'scales' missing");
        ns = a->n;
        for (int i = 0; i < ns; i++) sc[i] = a->floats[i];
        have_scales = 1;
    } else {
        const pp_tensor *st = nfin > (form == FORM_RESIZE ? 2 : 1) ? fin[form == FORM_RESIZE ? 2 : 1]
                                                                   : NULL;
        const pp_tensor *zt = form == FORM_RESIZE && nfin > 3 ? fin[3] : NULL;
        if (st && pp_tensor_numel(st) > 0) {
            if (!pp_dtype_is_float(st->dtype) || st->ndim != 1 || st->shape[0] > PP_MAX_DIMS)
                return pp_kernel_error(ctx, PP_ERR_INVALID, "scales must be a 1-D float tensor "
                                       "of at most %d entries", PP_MAX_DIMS);
            ns = (int)st->shape[0];
            for (int i = 0; i < ns; i++) sc[i] = pp_tensor_get_f64(st, i);
            have_scales = 1;
        }
        if (zt && pp_tensor_numel(zt) > 0) {
            PP_TRY(pp_read_ints(ctx, zt, "sizes", sizes, PP_MAX_DIMS, &ns));
            have_sizes = 1;
        }
    }
    if (have_scales == have_sizes)
        return pp_kernel_error(ctx, PP_ERR_INVALID, "exactly one of scales and sizes must be given");
    if (ns != na)
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "%d %s for %d axes", ns,
                               have_scales ? "scales" : "sizes", na);
    if (have_scales) {
        for (int i = 0; i < na; i++) {
            int a = axes[i];
            if (!(sc[i] > 0) || sc[i] > RS_SCALE_MAX)
                return pp_kernel_error(ctx, PP_ERR_INVALID, "scale %g on axis %d is not in (0, %g]",
                                       sc[i], a, RS_SCALE_MAX);
            if (sc[i] < 1 && strcmp(n->op_type, "Upsample") == 0)
                return pp_kernel_error(ctx, PP_ERR_INVALID, "Upsample scale %g on axis %d is below 1", sc[i], a);
            double o = floor((double)xs[a] * sc[i]);
            if (o > (double)RS_DIM_MAX)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "output dim %d too large", a);
            p->out[a] = (int64_t)o;
            p->scale[a] = sc[i];
        }
    } else {
        const char *kar = pp_node_attr_string(n, "keep_aspect_ratio_policy", "stretch");
        int policy = !strcmp(kar, "not_larger") ? 1 : !strcmp(kar, "not_smaller") ? 2 : 0;
        double common = policy == 1 ? INFINITY : 0;
        for (int i = 0; i < na; i++) {
            int a = axes[i];
            if (sizes[i] < 0 || sizes[i] > RS_DIM_MAX)
                return pp_kernel_error(ctx, PP_ERR_INVALID, "size %" PRId64 " on axis %d out of range",
                                       sizes[i], a);
            if (xs[a] == 0 && sizes[i] > 0)
                return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot resize empty axis %d", a);
            double s = xs[a] ? (double)sizes[i] / (double)xs[a] : 1.0;
            p->out[a] = sizes[i];
            p->scale[a] = s;
            if (policy == 1 && s < common) common = s;
            if (policy == 2 && s > common) common = s;
        }
        if (policy) {
            for (int i = 0; i < na; i++) {
                int a = axes[i];
                double o = nearbyint(common * (double)xs[a]);
                if (!(common > 0) || o > (double)RS_DIM_MAX)
                    return pp_kernel_error(ctx, PP_ERR_SHAPE, "bad keep_aspect_ratio result");
                p->out[a] = (int64_t)o;
                p->scale[a] = common;
            }
        }
    }
    size_t bytes;
    char buf[128];
    if (pp_shape_bytes(PP_F32, xnd, p->out, &bytes) != PP_OK || bytes / sizeof(float) > RS_NUMEL_MAX)
        return pp_kernel_error(ctx, PP_ERR_NOMEM, "output %s too large (at most 2^40 elements)",
                               pp_shape_str(xnd, p->out, buf, sizeof buf));
    return PP_OK;
}

/* -------------------------------------------------------------- tables */

typedef struct rs_tab {
    int64_t *i0, *i1;
    float *w0, *w1;
    int identity;
} rs_tab;

/* Source position of output index x along an axis (ONNX's reference). */
static double source_coord(const rs_plan *p, int a, int64_t x) {
    double scale = p->scale[a], in = (double)p->in[a];
    double ow = scale * in; /* the reference's float output width */
    double xf = (double)x;
    switch (p->coord) {
    case CT_ALIGN_CORNERS: return ow == 1 ? 0.0 : xf * (in - 1) / (ow - 1);
    case CT_ASYMMETRIC: return xf / scale;
    case CT_PYTORCH_HALF_PIXEL: return ow == 1 ? -0.5 : (xf + 0.5) / scale - 0.5;
    case CT_TF_HALF_PIXEL_NN: return (xf + 0.5) / scale;
    case CT_HALF_PIXEL_SYMMETRIC: {
        double adj = (double)p->out[a] / ow, center = in / 2;
        return center * (1 - adj) + (xf + 0.5) / scale - 0.5;
    }
    default: return (xf + 0.5) / scale - 0.5;
    }
}

static int64_t clampi(int64_t v, int64_t n) { return v < 0 ? 0 : v >= n ? n - 1 : v; }

static void fill_tab(const rs_plan *p, int a, rs_tab *t) {
    int64_t n = p->in[a];
    t->identity = p->in[a] == p->out[a];
    for (int64_t x = 0; x < p->out[a]; x++) {
        double c = source_coord(p, a, x), f = floor(c), r = c - f;
        int64_t fi = (int64_t)f;
        if (p->linear) {
            t->i0[x] = clampi(fi, n);
            t->i1[x] = clampi(fi + 1, n);
            t->w0[x] = (float)(1 - r);
            t->w1[x] = (float)r;
        } else {
            int64_t i = fi;
            if (r != 0) {
                switch (p->nearest) {
                case NM_ROUND_PREFER_FLOOR: i = r <= 0.5 ? fi : fi + 1; break;
                case NM_ROUND_PREFER_CEIL: i = r < 0.5 ? fi : fi + 1; break;
                case NM_FLOOR: i = fi; break;
                default: i = fi + 1; break;
                }
            }
            t->i0[x] = t->i1[x] = clampi(i, n);
            t->w0[x] = 1;
            t->w1[x] = 0;
        }
        if (t->i0[x] != x || t->w1[x] != 0) t->identity = 0;
    }
}

/* One table per axis in one block; NULL on failure. */
static void *make_tabs(const rs_plan *p, rs_tab *tabs) {
    int64_t total = 0;
    for (int a = 0; a < p->nd; a++) total += p->out[a];
    char *mem = malloc((size_t)(total ? total : 1) * (2 * sizeof(int64_t) + 2 * sizeof(float)));
    if (!mem) return NULL;
    int64_t *ip = (int64_t *)mem;
    float *fp = (float *)(ip + 2 * total);
    for (int a = 0; a < p->nd; a++) {
        tabs[a].i0 = ip;
        tabs[a].i1 = ip + p->out[a];
        tabs[a].w0 = fp;
        tabs[a].w1 = fp + p->out[a];
        ip += 2 * p->out[a];
        fp += 2 * p->out[a];
        fill_tab(p, a, &tabs[a]);
    }
    return mem;
}

/* ----------------------------------------------------------------- passes */

/* dst [outer, nout, inner] from src [outer, nin, inner] along one axis. */
static void pass_fwd(const float *restrict src, float *restrict dst, int64_t outer, int64_t nin,
                     int64_t nout, int64_t inner, const rs_tab *t) {
    for (int64_t o = 0; o < outer; o++) {
        const float *s = src + o * nin * inner;
        float *d = dst + o * nout * inner;
        for (int64_t x = 0; x < nout; x++, d += inner) {
            const float *a = s + t->i0[x] * inner, *b = s + t->i1[x] * inner;
            float w0 = t->w0[x], w1 = t->w1[x];
            if (w1 == 0 && w0 == 1) memcpy(d, a, (size_t)inner * sizeof(float));
            else
                for (int64_t k = 0; k < inner; k++) d[k] = w0 * a[k] + w1 * b[k];
        }
    }
}

/* The adjoint: dst [outer, nin, inner] = sum of src [outer, nout, inner]. */
static void pass_adj(const float *restrict src, float *restrict dst, int64_t outer, int64_t nin,
                     int64_t nout, int64_t inner, const rs_tab *t) {
    memset(dst, 0, (size_t)(outer * nin * inner) * sizeof(float));
    for (int64_t o = 0; o < outer; o++) {
        const float *s = src + o * nout * inner;
        float *d = dst + o * nin * inner;
        for (int64_t x = 0; x < nout; x++, s += inner) {
            float *a = d + t->i0[x] * inner, *b = d + t->i1[x] * inner;
            float w0 = t->w0[x], w1 = t->w1[x];
            for (int64_t k = 0; k < inner; k++) a[k] += w0 * s[k];
            if (w1 != 0)
                for (int64_t k = 0; k < inner; k++) b[k] += w1 * s[k];
        }
    }
}

/* Runs the passes (adjoint: in reverse) from src (shape p->in, or p->out
 * for the adjoint) into dst (the other shape). */
static pp_status run_passes(const pp_kernel_ctx *ctx, const rs_plan *p, int adjoint,
                            const float *src, float *dst) {
    rs_tab tabs[PP_MAX_DIMS];
    void *mem = make_tabs(p, tabs);
    if (!mem) return pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory for the resize tables");
    int order[PP_MAX_DIMS], n = 0;
    for (int a = 0; a < p->nd; a++)
        if (!tabs[a].identity) order[n++] = a;
    int64_t cur[PP_MAX_DIMS];
    for (int a = 0; a < p->nd; a++) cur[a] = adjoint ? p->out[a] : p->in[a];
    const int64_t *final = adjoint ? p->in : p->out;
    pp_status s = PP_OK;
    float *bufs[2] = {NULL, NULL};
    const float *from = src;
    if (n == 0) memcpy(dst, src, (size_t)pp_shape_numel(p->nd, final) * sizeof(float));
    for (int k = 0; k < n; k++) {
        int a = order[adjoint ? n - 1 - k : k];
        int64_t outer = 1, inner = 1;
        for (int i = 0; i < a; i++) outer *= cur[i];
        for (int i = a + 1; i < p->nd; i++) inner *= cur[i];
        int64_t nin = cur[a], nout = final[a];
        cur[a] = nout;
        float *to = dst;
        if (k + 1 < n) {
            free(bufs[k & 1]);
            bufs[k & 1] = malloc((size_t)pp_shape_numel(p->nd, cur) * sizeof(float) + 1);
            if (!bufs[k & 1]) {
                s = pp_kernel_error(ctx, PP_ERR_NOMEM, "out of memory");
                break;
            }
            to = bufs[k & 1];
        }
        if (adjoint) pass_adj(from, to, outer, nout, nin, inner, &tabs[a]);
        else pass_fwd(from, to, outer, nin, nout, inner, &tabs[a]);
        from = to;
    }
    free(bufs[0]);
    free(bufs[1]);
    free(mem);
    return s;
}

/* ---------------------------------------------------------------- kernels */

static int forward_form(const pp_kernel_ctx *ctx) {
    if (!strcmp(ctx->node->op_type, "Upsample"))
        return pp_node_attr(ctx->node, "scales") ? FORM_SCALES_ATTR : FORM_SCALES_INPUT;
    return ctx->graph && ctx->graph->opset <= 10 ? FORM_SCALES_INPUT : FORM_RESIZE;
}

static pp_status resize_run(pp_kernel_ctx *ctx) {
    const pp_tensor *x = ctx->in[0];
    if (x->dtype != PP_F32)
        return pp_kernel_error(ctx, PP_ERR_UNSUPPORTED, "float32 only, not %s",
                               pp_dtype_name(x->dtype));
    rs_plan p;
    PP_TRY(plan_make(ctx, forward_form(ctx), x->ndim, x->shape, ctx->in, ctx->n_in, &p));
    for (int a = 0; a < p.nd; a++)
        if (p.in[a] == 0 && p.out[a] > 0)
            return pp_kernel_error(ctx, PP_ERR_SHAPE, "cannot resize empty axis %d", a);
    pp_tensor *y;
    PP_TRY(pp_tensor_empty(PP_F32, x->ndim, p.out, &y));
    if (y->nbytes) {
        pp_status s = run_passes(ctx, &p, 0, x->data, y->data);
        if (s != PP_OK) {
            pp_tensor_free(y);
            return s;
        }
    }
    ctx->out[0] = y;
    return PP_OK;
}

/* ResizeGrad(dy, shape_x, forward inputs 1..) -> dx, with the forward's
 * attributes and 'form' (how the forward passed its scales). */
static pp_status resize_grad_run(pp_kernel_ctx *ctx) {
    PP_TRY(pp_grad_k_f32(ctx, 0, "dy"));
    int xnd;
    int64_t xs[PP_MAX_DIMS];
    PP_TRY(pp_grad_k_shape(ctx, 1, &xnd, xs));
    const pp_tensor *dy = ctx->in[0];
    pp_tensor *fin[4] = {NULL, NULL, NULL, NULL};
    int nfin = ctx->n_in - 1;
    for (int k = 1; k < nfin && k < 4; k++) fin[k] = ctx->in[k + 1];
    rs_plan p;
    PP_TRY(plan_make(ctx, (int)pp_node_attr_int(ctx->node, "form", 0), xnd, xs, fin, nfin, &p));
    char a[128], b[128];
    if (!pp_shape_equal(dy->ndim, dy->shape, xnd, p.out))
        return pp_kernel_error(ctx, PP_ERR_SHAPE, "dy is %s, the resize's output is %s",
                               pp_shape_str(dy->ndim, dy->shape, a, sizeof a),
                               pp_shape_str(xnd, p.out, b, sizeof b));
    pp_tensor *dx;
    PP_TRY(pp_tensor_new(PP_F32, xnd, xs, &dx));
    if (dx->nbytes && pp_tensor_numel(dy)) {
        pp_status s = run_passes(ctx, &p, 1, dy->data, dx->data);
        if (s != PP_OK) {
            pp_tensor_free(dx);
            return s;
        }
    }
    ctx->out[0] = dx;
    return PP_OK;
}

const pp_op pp_ops_resize[] = {
    {"Resize", "", 1, 4, 1, 1, resize_check, resize_run},
    {"Upsample", "", 1, 2, 1, 1, resize_check, resize_run},
    /* dy, shape_x, the forward's inputs 1.. -> dx */
    {"ResizeGrad", "pippin", 2, 5, 1, 1, resize_grad_check, resize_grad_run},
    {NULL},
};
