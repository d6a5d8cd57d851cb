/* ONNX function bodies of the activation derivatives (lib/ops/grad.c,
 * grad_act.c, dropout.c, misc.c): dx = dy * f'(t), t being x or the forward
 * output y as each kernel says. Scalar attributes are written into the body
 * as constants, with the kernel's defaults. */
#include <math.h>
#include <string.h>

#include "onnx_functions.h"

#include "status_internal.h"

static void sig(pp_fn_body *b, const char *inputs) {
    b->inputs = inputs;
    b->outputs = "dx";
}

/* dx = Where(COND(t), dy, 0) */
static void pass_where(pp_fn_body *b, const char *cond) {
    pp_fn_float(b, "zero", 0);
    pp_fn_line(b, "%s", cond);
    pp_fn_line(b, "dx = Where(keep, dy, zero)");
}

static pp_status relu(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, y");
    pass_where(b, "keep = Greater(y, zero)");
    return PP_OK;
}

static pp_status tanh_g(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, y");
    pp_fn_float(b, "one", 1);
    pp_fn_line(b, "yy = Mul(y, y)");
    pp_fn_line(b, "d = Sub(one, yy)");
    pp_fn_line(b, "dx = Mul(dy, d)");
    return PP_OK;
}

static pp_status sigmoid(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, y");
    pp_fn_float(b, "one", 1);
    pp_fn_line(b, "r = Sub(one, y)");
    pp_fn_line(b, "d = Mul(y, r)");
    pp_fn_line(b, "dx = Mul(dy, d)");
    return PP_OK;
}

static pp_status sqrt_g(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, y");
    pp_fn_float(b, "two", 2);
    pp_fn_line(b, "d = Mul(two, y)");
    pp_fn_line(b, "dx = Div(dy, d)");
    return PP_OK;
}

/* dy * 2/sqrt(pi) * exp(-x^2) */
static pp_status erf_g(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, x");
    pp_fn_float(b, "k", 1.12837916709551257);
    pp_fn_line(b, "xx = Mul(x, x)");
    pp_fn_line(b, "nxx = Neg(xx)");
    pp_fn_line(b, "e = Exp(nxx)");
    pp_fn_line(b, "d = Mul(k, e)");
    pp_fn_line(b, "dx = Mul(dy, d)");
    return PP_OK;
}

/* approximate none: Phi(x) + x phi(x); tanh: the derivative of
 * 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). */
static pp_status gelu(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    sig(b, "dy, x");
    const char *approx = pp_node_attr_string(n, "approximate", "none");
    pp_fn_float(b, "half", 0.5);
    pp_fn_float(b, "one", 1);
    pp_fn_line(b, "xx = Mul(x, x)");
    if (strcmp(approx, "tanh") == 0) {
        pp_fn_float(b, "k0", 0.79788456080286536);
        pp_fn_float(b, "k1", 0.044715);
        pp_fn_float(b, "k3", 3 * 0.044715);
        pp_fn_line(b, "x3 = Mul(xx, x)");
        pp_fn_line(b, "c = Mul(k1, x3)");
        pp_fn_line(b, "s = Add(x, c)");
        pp_fn_line(b, "u = Mul(k0, s)");
        pp_fn_line(b, "th = Tanh(u)");
        pp_fn_line(b, "t1 = Add(one, th)");
        pp_fn_line(b, "a = Mul(half, t1)");
        pp_fn_line(b, "q = Mul(k3, xx)");
        pp_fn_line(b, "q1 = Add(one, q)");
        pp_fn_line(b, "du = Mul(k0, q1)");
        pp_fn_line(b, "th2 = Mul(th, th)");
        pp_fn_line(b, "sech = Sub(one, th2)");
        pp_fn_line(b, "hx = Mul(half, x)");
        pp_fn_line(b, "p = Mul(hx, sech)");
        pp_fn_line(b, "p2 = Mul(p, du)");
        pp_fn_line(b, "d = Add(a, p2)");
    } else if (strcmp(approx, "none") == 0) {
        pp_fn_float(b, "rs2", 0.70710678118654752);
        pp_fn_float(b, "rs2pi", 0.39894228040143268);
        pp_fn_line(b, "xs = Mul(x, rs2)");
        pp_fn_line(b, "er = Erf(xs)");
        pp_fn_line(b, "e1 = Add(one, er)");
        pp_fn_line(b, "cdf = Mul(half, e1)");
        pp_fn_line(b, "hxx = Mul(half, xx)");
        pp_fn_line(b, "nh = Neg(hxx)");
        pp_fn_line(b, "ex = Exp(nh)");
        pp_fn_line(b, "pdf = Mul(rs2pi, ex)");
        pp_fn_line(b, "xp = Mul(x, pdf)");
        pp_fn_line(b, "d = Add(cdf, xp)");
    } else {
        return pp_error(PP_ERR_UNSUPPORTED, "approximate '%s' is neither 'none' nor 'tanh'", approx);
    }
    pp_fn_line(b, "dx = Mul(dy, d)");
    return PP_OK;
}

static pp_status leaky_relu(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    sig(b, "dy, x");
    pp_fn_float(b, "zero", 0);
    pp_fn_float(b, "alpha", pp_node_attr_float(n, "alpha", 0.01f));
    pp_fn_line(b, "pos = Greater(x, zero)");
    pp_fn_line(b, "neg = Mul(alpha, dy)");
    pp_fn_line(b, "dx = Where(pos, dy, neg)");
    return PP_OK;
}

/* Passes strictly inside (min, max): each bound an input when given, else
 * the attribute (opset < 11), else unbounded. */
static pp_status clip(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    sig(b, "dy, x, min, max");
    pp_fn_float(b, "zero", 0);
    const char *bound[2] = {"min", "max"};
    for (int k = 0; k < 2; k++) {
        if (!pp_fn_has_in(n, 2 + k)) {
            pp_fn_float(b, k ? "hi" : "lo", pp_node_attr_float(n, bound[k], k ? INFINITY : -INFINITY));
        } else {
            pp_fn_line(b, "%s = Identity(%s)", k ? "hi" : "lo", bound[k]);
        }
    }
    pp_fn_line(b, "a = Greater(x, lo)");
    pp_fn_line(b, "c = Less(x, hi)");
    pp_fn_line(b, "keep = And(a, c)");
    pp_fn_line(b, "dx = Where(keep, dy, zero)");
    return PP_OK;
}

static pp_status hard_sigmoid(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    sig(b, "dy, x");
    pp_fn_float(b, "zero", 0);
    pp_fn_float(b, "one", 1);
    pp_fn_float(b, "alpha", pp_node_attr_float(n, "alpha", 0.2f));
    pp_fn_float(b, "beta", pp_node_attr_float(n, "beta", 0.5f));
    pp_fn_line(b, "ax = Mul(alpha, x)");
    pp_fn_line(b, "u = Add(ax, beta)");
    pp_fn_line(b, "a = Greater(u, zero)");
    pp_fn_line(b, "c = Less(u, one)");
    pp_fn_line(b, "keep = And(a, c)");
    pp_fn_line(b, "ad = Mul(alpha, dy)");
    pp_fn_line(b, "dx = Where(keep, ad, zero)");
    return PP_OK;
}

static pp_status hard_swish(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, x");
    pp_fn_float(b, "zero", 0);
    pp_fn_float(b, "three", 3);
    pp_fn_float(b, "mthree", -3);
    pp_fn_float(b, "third", 1.0f / 3.0f);
    pp_fn_float(b, "half", 0.5);
    pp_fn_line(b, "xt = Mul(x, third)");
    pp_fn_line(b, "s = Add(xt, half)");
    pp_fn_line(b, "mid = Mul(dy, s)");
    pp_fn_line(b, "hi = Greater(x, three)");
    pp_fn_line(b, "upper = Where(hi, dy, mid)");
    pp_fn_line(b, "lo = Less(x, mthree)");
    pp_fn_line(b, "dx = Where(lo, zero, upper)");
    return PP_OK;
}

static pp_status elu(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    sig(b, "dy, x");
    pp_fn_float(b, "zero", 0);
    pp_fn_float(b, "alpha", pp_node_attr_float(n, "alpha", 1.0f));
    pp_fn_line(b, "e = Exp(x)");
    pp_fn_line(b, "ae = Mul(alpha, e)");
    pp_fn_line(b, "neg = Mul(dy, ae)");
    pp_fn_line(b, "lo = Less(x, zero)");
    pp_fn_line(b, "dx = Where(lo, neg, dy)");
    return PP_OK;
}

static pp_status selu(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    sig(b, "dy, x");
    pp_fn_float(b, "zero", 0);
    pp_fn_float(b, "alpha", pp_node_attr_float(n, "alpha", 1.67326319217681884765625f));
    pp_fn_float(b, "gamma", pp_node_attr_float(n, "gamma", 1.05070102214813232421875f));
    pp_fn_line(b, "e = Exp(x)");
    pp_fn_line(b, "ae = Mul(alpha, e)");
    pp_fn_line(b, "gae = Mul(gamma, ae)");
    pp_fn_line(b, "neg = Mul(dy, gae)");
    pp_fn_line(b, "pos = Mul(dy, gamma)");
    pp_fn_line(b, "lo = LessOrEqual(x, zero)");
    pp_fn_line(b, "dx = Where(lo, neg, pos)");
    return PP_OK;
}

static pp_status softplus(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, x");
    pp_fn_line(b, "s = Sigmoid(x)");
    pp_fn_line(b, "dx = Mul(dy, s)");
    return PP_OK;
}

static pp_status softsign(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, x");
    pp_fn_float(b, "one", 1);
    pp_fn_line(b, "a = Abs(x)");
    pp_fn_line(b, "q = Add(one, a)");
    pp_fn_line(b, "qq = Mul(q, q)");
    pp_fn_line(b, "dx = Div(dy, qq)");
    return PP_OK;
}

/* mish(x) = x tanh(sp), sp = softplus(x): tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2) */
static pp_status mish(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g, (void)n;
    sig(b, "dy, x");
    pp_fn_float(b, "one", 1);
    pp_fn_line(b, "sp = Softplus(x)");
    pp_fn_line(b, "t = Tanh(sp)");
    pp_fn_line(b, "tt = Mul(t, t)");
    pp_fn_line(b, "sech = Sub(one, tt)");
    pp_fn_line(b, "s = Sigmoid(x)");
    pp_fn_line(b, "xs = Mul(x, s)");
    pp_fn_line(b, "p = Mul(xs, sech)");
    pp_fn_line(b, "d = Add(t, p)");
    pp_fn_line(b, "dx = Mul(dy, d)");
    return PP_OK;
}

/* dx = mask ? dy * scale : 0 */
static pp_status dropout(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    (void)g;
    sig(b, "dy, mask");
    pp_fn_float(b, "zero", 0);
    pp_fn_float(b, "scale", pp_node_attr_float(n, "scale", 1.0f));
    pp_fn_line(b, "ds = Mul(dy, scale)");
    pp_fn_line(b, "dx = Where(mask, ds, zero)");
    return PP_OK;
}

const pp_fn_entry pp_fn_act[] = {
    {"ReluGrad", relu},
    {"TanhGrad", tanh_g},
    {"SigmoidGrad", sigmoid},
    {"SqrtGrad", sqrt_g},
    {"ErfGrad", erf_g},
    {"GeluGrad", gelu},
    {"LeakyReluGrad", leaky_relu},
    {"ClipGrad", clip},
    {"HardSigmoidGrad", hard_sigmoid},
    {"HardSwishGrad", hard_swish},
    {"EluGrad", elu},
    {"SeluGrad", selu},
    {"SoftplusGrad", softplus},
    {"SoftsignGrad", softsign},
    {"MishGrad", mish},
    {"DropoutGrad", dropout},
    {NULL, NULL},
};
