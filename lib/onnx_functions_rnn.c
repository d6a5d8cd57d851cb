/* ONNX function bodies of the recurrent training ops (lib/ops/rnn.c,
 * grad_rnn.c): pippin::LSTMTrain / GRUTrain (the forward and its stash),
 * LSTMGrad / GRUGrad (the sweep back through time: dX, the initial states'
 * gradients and the gate gradients dG) and LSTMGradWeight / GRUGradWeight
 * (dW, dR, dB, dP from dG and the stash).
 *
 * Each direction is one ONNX Loop over the steps, whose body reads the
 * step's rows with Gather at index t (t = T-1-s for a reverse sweep) and
 * carries the state; a Loop stacks its scan outputs in iteration order, so
 * a sweep that runs against time is put back in time order by a Slice
 * with step -1. X W^T and the weight gradients (einsums over all steps) stay
 * outside the loops, as in the kernels.
 *
 * The stash and dG only pass between these bodies, so inside ONNX they have
 * their own layout (not pippin's, which packs clip's mask as bytes): per
 * direction [T,B,K] in time order, directions stacked, flattened. LSTM K:
 * h_prev c_prev c_new i o f c, GRU: h_prev q z r h, each H wide, and with
 * clip the gates' masks (1.0 where clip cut a pre-activation) after them.
 * dG: LSTM i o f c, GRU z r h and with linear_before_reset q's gradient.
 *
 * The body is written for the node's configuration (direction, layout,
 * clip, which inputs it has), so nodes that differ call different
 * functions (lib/onnx_functions.h). Every configuration pippin runs is
 * written: the activations are always the default ones (rnn_core.c). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "onnx_functions.h"

#include "status_internal.h"

typedef struct rnn_cfg {
    int lstm, nd, direction, layout, lbr;
    double clip; /* 0: none */
    int has_b, has_seq, has_h0, has_c0, has_p;
} rnn_cfg;

static int direction_of(const pp_node *n) {
    const char *s = pp_node_attr_string(n, "direction", "forward");
    return !strcmp(s, "reverse") ? 1 : !strcmp(s, "bidirectional") ? 2 : 0;
}

/* The node's configuration; inputs X W R B sequence_lens initial_h
 * [initial_c P] in ONNX order for every one of the six ops. */
static void cfg_of(const pp_node *n, int lstm, rnn_cfg *c) {
    memset(c, 0, sizeof *c);
    c->lstm = lstm;
    c->direction = direction_of(n);
    c->nd = c->direction == 2 ? 2 : 1;
    c->layout = (int)pp_node_attr_int(n, "layout", 0);
    c->lbr = !lstm && pp_node_attr_int(n, "linear_before_reset", 0);
    c->clip = pp_node_attr(n, "clip") ? (double)pp_node_attr_float(n, "clip", 0) : 0;
    c->has_b = pp_fn_has_in(n, 3);
    c->has_seq = pp_fn_has_in(n, 4);
    c->has_h0 = pp_fn_has_in(n, 5);
    c->has_c0 = lstm && pp_fn_has_in(n, 6);
    c->has_p = lstm && pp_fn_has_in(n, 7);
}

/* The bodies use the opset 13 forms of Split, Squeeze, Unsqueeze and
 * ReduceSum (axes and split as inputs). */
static pp_status check_opset(const pp_graph *g) {
    if (g->opset < 13)
        return pp_error(PP_ERR_UNSUPPORTED, "opset %d (the LSTM/GRU bodies need 13 or later)", g->opset);
    return PP_OK;
}

static int reverse_dir(const rnn_cfg *c, int d) { return c->direction == 1 || d == 1; }

/* A line with every '$' replaced by tag: the names of one direction ("f_",
 * "r_"), so the two directions of a bidirectional node do not collide. */
static void tline(pp_fn_body *b, const char *tag, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void tline(pp_fn_body *b, const char *tag, const char *fmt, ...) {
    char raw[1024], out[2048];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t o = 0, tl = strlen(tag);
    if (k < 0 || (size_t)k >= sizeof raw) {
        b->overflow = 1;
        return;
    }
    for (const char *p = raw; *p && o + tl + 1 < sizeof out; p++) {
        if (*p == '$') memcpy(out + o, tag, tl), o += tl;
        else out[o++] = *p;
    }
    out[o] = '\0';
    pp_fn_line(b, "%s", out);
}

/* Constants and shapes every body uses: xt = X as [T,B,I]; tv, bv, hv: T,
 * B, H as 1-D; ts, tm1: T and T-1 as scalars; rs, re: the bounds of a Slice
 * that reverses; one: 1.0; lens: sequence_lens as int64; zbh: zeros [B,H];
 * h3, h4: [H, H, H(, H)] for Split; the clip bounds cl, ncl. */
static void prelude(pp_fn_body *b, const rnn_cfg *c) {
    pp_fn_line(b, "c0 = Constant<value_ints=[0]>()");
    pp_fn_line(b, "c1 = Constant<value_ints=[1]>()");
    pp_fn_line(b, "c2 = Constant<value_ints=[2]>()");
    pp_fn_line(b, "c3 = Constant<value_ints=[3]>()");
    pp_fn_line(b, "c01 = Constant<value_ints=[0, 1]>()");
    pp_fn_line(b, "m1 = Constant<value_ints=[-1]>()");
    pp_fn_line(b, "i1 = Constant<value_int=1>()");
    pp_fn_float(b, "one", 1.0);
    if (c->layout) pp_fn_line(b, "xt = Transpose<perm=[1, 0, 2]>(X)");
    else pp_fn_line(b, "xt = Identity(X)");
    pp_fn_line(b, "sx = Shape(xt)");
    pp_fn_line(b, "tv = Slice(sx, c0, c1)");
    pp_fn_line(b, "bv = Slice(sx, c1, c2)");
    pp_fn_line(b, "sr = Shape(R)");
    pp_fn_line(b, "hv = Slice(sr, c2, c3)");
    pp_fn_line(b, "ts = Squeeze(tv, c0)");
    pp_fn_line(b, "tm1 = Sub(ts, i1)");
    pp_fn_line(b, "rs = Constant<value_ints=[-1]>()"); /* Slice(v, rs, re, c0, m1): v reversed on axis 0 */
    pp_fn_line(b, "re = Constant<value_ints=[-9223372036854775807]>()");
    pp_fn_line(b, "bh = Concat<axis=0>(bv, hv)");
    pp_fn_line(b, "zbh = ConstantOfShape(bh)");
    pp_fn_line(b, "h3 = Concat<axis=0>(hv, hv, hv)");
    pp_fn_line(b, "h4 = Concat<axis=0>(hv, hv, hv, hv)");
    if (c->has_seq) pp_fn_line(b, "lens = Cast<to=7>(sequence_lens)");
    if (c->clip > 0) {
        pp_fn_float(b, "cl", c->clip);
        pp_fn_float(b, "ncl", -c->clip);
    }
}

/* Direction d's weights: $w [GH,I], $r [GH,H], $wT, $rT; LSTM: the
 * peepholes $pi $po $pf [H] (if P); GRU: $rzr [2H,H], $rh [H,H] and their
 * transposes. $xw = X W^T plus the biases added at every step, [T,B,GH]
 * (GRU with linear_before_reset: $rbh, added to q, is left out). */
static void dir_weights(pp_fn_body *b, const rnn_cfg *c, const char *t, int d) {
    tline(b, t, "$i = Constant<value_int=%d>()", d);
    tline(b, t, "$w = Gather<axis=0>(W, $i)");
    tline(b, t, "$r = Gather<axis=0>(R, $i)");
    tline(b, t, "$wT = Transpose<perm=[1, 0]>($w)");
    tline(b, t, "$rT = Transpose<perm=[1, 0]>($r)");
    tline(b, t, "$xw0 = MatMul(xt, $wT)");
    if (c->lstm) {
        if (c->has_p) {
            tline(b, t, "$p = Gather<axis=0>(P, $i)");
            tline(b, t, "$pi, $po, $pf = Split<axis=0>($p, h3)");
        }
        if (c->has_b) {
            tline(b, t, "$b = Gather<axis=0>(B, $i)");
            tline(b, t, "$b2 = Reshape($b, c2m1)");
            tline(b, t, "$bs = ReduceSum<keepdims=0>($b2, c0)");
            tline(b, t, "$xw = Add($xw0, $bs)");
        } else {
            tline(b, t, "$xw = Identity($xw0)");
        }
        return;
    }
    tline(b, t, "$rz, $rr, $rh = Split<axis=0>($r, h3)");
    tline(b, t, "$rzr = Concat<axis=0>($rz, $rr)");
    tline(b, t, "$rzrT = Transpose<perm=[1, 0]>($rzr)");
    tline(b, t, "$rhT = Transpose<perm=[1, 0]>($rh)");
    if (c->has_b) {
        tline(b, t, "$b = Gather<axis=0>(B, $i)");
        tline(b, t, "$h6 = Concat<axis=0>(h3, h3)");
        tline(b, t, "$wbz, $wbr, $wbh, $rbz, $rbr, $rbh = Split<axis=0>($b, $h6)");
        tline(b, t, "$bz = Add($wbz, $rbz)");
        tline(b, t, "$br = Add($wbr, $rbr)");
        if (c->lbr) tline(b, t, "$bh = Identity($wbh)");
        else tline(b, t, "$bh = Add($wbh, $rbh)");
        tline(b, t, "$bs = Concat<axis=0>($bz, $br, $bh)");
        tline(b, t, "$xw = Add($xw0, $bs)");
    } else {
        tline(b, t, "$xw = Identity($xw0)");
    }
}

/* In a loop body: $Ltt, the time index of iteration $Ls; forward sweeps
 * (back = 0) run s's order in direction d, backward ones against it. */
static void time_index(pp_fn_body *b, const rnn_cfg *c, const char *t, int d, int back) {
    if (reverse_dir(c, d) != back) tline(b, t, "$Ltt = Sub(tm1, $Ls)");
    else tline(b, t, "$Ltt = Identity($Ls)");
    if (c->has_seq) {
        tline(b, t, "$Lal = Less($Ltt, lens)");
        tline(b, t, "$Lact = Unsqueeze($Lal, c1)");
    }
}

/* $Lname = Clip($Lsrc) and its mask $Lm<name> (with clip), else a copy. */
static void clip_gate(pp_fn_body *b, const rnn_cfg *c, const char *t, const char *src, const char *dst) {
    if (c->clip > 0) {
        tline(b, t, "$L%s = Clip($L%s, ncl, cl)", dst, src);
        tline(b, t, "$La%s = Abs($L%s)", dst, src);
        tline(b, t, "$Lg%s = Greater($La%s, cl)", dst, dst);
        tline(b, t, "$Lm%s = Cast<to=1>($Lg%s)", dst, dst);
    } else {
        tline(b, t, "$L%s = Identity($L%s)", dst, src);
    }
}

/* The state outputs of a step: active rows take the new value, the others
 * keep theirs (and give zeros as Y). */
static void step_select(pp_fn_body *b, const rnn_cfg *c, const char *t, const char *newv, const char *old,
                        const char *dst) {
    if (c->has_seq) tline(b, t, "$L%s = Where($Lact, $L%s, $L%s)", dst, newv, old);
    else tline(b, t, "$L%s = Identity($L%s)", dst, newv);
}

/* The initial state $<name>0 of direction d from input in (or zeros). */
static void initial_state(pp_fn_body *b, const rnn_cfg *c, const char *t, int has, const char *in,
                          const char *name) {
    if (!has) {
        tline(b, t, "$%s0 = Identity(zbh)", name);
        return;
    }
    if (c->layout) tline(b, t, "$%sl = Transpose<perm=[1, 0, 2]>(%s)", name, in);
    else tline(b, t, "$%sl = Identity(%s)", name, in);
    tline(b, t, "$%s0 = Gather<axis=0>($%sl, $i)", name, name);
}

/* Direction d of LSTMTrain: $y [T,B,H] in time order, $hT, $cT, $st. */
static void lstm_forward_dir(pp_fn_body *b, const rnn_cfg *c, const char *t, int d) {
    dir_weights(b, c, t, d);
    initial_state(b, c, t, c->has_h0, "initial_h", "h");
    initial_state(b, c, t, c->has_c0, "initial_c", "c");
    tline(b, t,
          "graph $body($Ls:int64[], $Lcin:bool[], $Lh:float, $Lc:float)"
          " -> ($Lcout:bool[], $Lh2:float, $Lc2:float, $Ly:float, $Lst:float)");
    tline(b, t, "$Lcout = Identity($Lcin)");
    time_index(b, c, t, d, 0);
    tline(b, t, "$Lxs = Gather<axis=0>($xw, $Ltt)");
    tline(b, t, "$Lrec = MatMul($Lh, $rT)");
    tline(b, t, "$Lpre = Add($Lxs, $Lrec)");
    tline(b, t, "$Lpi, $Lpo, $Lpf, $Lpc = Split<axis=1>($Lpre, h4)");
    if (c->has_p) {
        tline(b, t, "$Lpic = Mul($pi, $Lc)");
        tline(b, t, "$Lpi2 = Add($Lpi, $Lpic)");
        tline(b, t, "$Lpfc = Mul($pf, $Lc)");
        tline(b, t, "$Lpf2 = Add($Lpf, $Lpfc)");
    } else {
        tline(b, t, "$Lpi2 = Identity($Lpi)");
        tline(b, t, "$Lpf2 = Identity($Lpf)");
    }
    clip_gate(b, c, t, "pi2", "ki");
    clip_gate(b, c, t, "pf2", "kf");
    clip_gate(b, c, t, "pc", "kc");
    tline(b, t, "$Lig = Sigmoid($Lki)");
    tline(b, t, "$Lfg = Sigmoid($Lkf)");
    tline(b, t, "$Lcg = Tanh($Lkc)");
    tline(b, t, "$Lfc = Mul($Lfg, $Lc)");
    tline(b, t, "$Lic = Mul($Lig, $Lcg)");
    tline(b, t, "$Lcn = Add($Lfc, $Lic)");
    if (c->has_p) {
        tline(b, t, "$Lpoc = Mul($po, $Lcn)");
        tline(b, t, "$Lpo2 = Add($Lpo, $Lpoc)");
    } else {
        tline(b, t, "$Lpo2 = Identity($Lpo)");
    }
    clip_gate(b, c, t, "po2", "ko");
    tline(b, t, "$Log = Sigmoid($Lko)");
    tline(b, t, "$Ltc = Tanh($Lcn)");
    tline(b, t, "$Lhn = Mul($Log, $Ltc)");
    step_select(b, c, t, "hn", "h", "h2");
    step_select(b, c, t, "cn", "c", "c2");
    if (c->has_seq) tline(b, t, "$Ly = Where($Lact, $Lhn, zbh)");
    else tline(b, t, "$Ly = Identity($Lhn)");
    if (c->clip > 0)
        tline(b, t, "$Lst = Concat<axis=1>($Lh, $Lc, $Lcn, $Lig, $Log, $Lfg, $Lcg, $Lmki, $Lmko, $Lmkf, $Lmkc)");
    else
        tline(b, t, "$Lst = Concat<axis=1>($Lh, $Lc, $Lcn, $Lig, $Log, $Lfg, $Lcg)");
    tline(b, t, "end");
    tline(b, t, "$hT, $cT, $ys, $sts = Loop<body=%%$body>(ts, , $h0, $c0)");
}

/* Direction d of GRUTrain: $y, $hT, $st. */
static void gru_forward_dir(pp_fn_body *b, const rnn_cfg *c, const char *t, int d) {
    dir_weights(b, c, t, d);
    initial_state(b, c, t, c->has_h0, "initial_h", "h");
    tline(b, t,
          "graph $body($Ls:int64[], $Lcin:bool[], $Lh:float)"
          " -> ($Lcout:bool[], $Lh2:float, $Ly:float, $Lst:float)");
    tline(b, t, "$Lcout = Identity($Lcin)");
    time_index(b, c, t, d, 0);
    tline(b, t, "$Lxs = Gather<axis=0>($xw, $Ltt)");
    tline(b, t, "$Lxz, $Lxr, $Lxh = Split<axis=1>($Lxs, h3)");
    tline(b, t, "$Lrec = MatMul($Lh, $rzrT)");
    tline(b, t, "$Lrz, $Lrr = Split<axis=1>($Lrec, h2)");
    tline(b, t, "$Lpz = Add($Lxz, $Lrz)");
    tline(b, t, "$Lpr = Add($Lxr, $Lrr)");
    clip_gate(b, c, t, "pz", "kz");
    clip_gate(b, c, t, "pr", "kr");
    tline(b, t, "$Lzg = Sigmoid($Lkz)");
    tline(b, t, "$Lrg = Sigmoid($Lkr)");
    if (c->lbr) {
        if (c->has_b) {
            tline(b, t, "$Lq0 = MatMul($Lh, $rhT)");
            tline(b, t, "$Lq = Add($Lq0, $rbh)");
        } else {
            tline(b, t, "$Lq = MatMul($Lh, $rhT)");
        }
        tline(b, t, "$Lrq = Mul($Lrg, $Lq)");
    } else {
        tline(b, t, "$Lq = Mul($Lrg, $Lh)");
        tline(b, t, "$Lrq = MatMul($Lq, $rhT)");
    }
    tline(b, t, "$Lph = Add($Lxh, $Lrq)");
    clip_gate(b, c, t, "ph", "kh");
    tline(b, t, "$Lhh = Tanh($Lkh)");
    tline(b, t, "$Lz1 = Sub(one, $Lzg)");
    tline(b, t, "$Lnh = Mul($Lz1, $Lhh)");
    tline(b, t, "$Lzh = Mul($Lzg, $Lh)");
    tline(b, t, "$Lhn = Add($Lnh, $Lzh)");
    step_select(b, c, t, "hn", "h", "h2");
    if (c->has_seq) tline(b, t, "$Ly = Where($Lact, $Lhn, zbh)");
    else tline(b, t, "$Ly = Identity($Lhn)");
    if (c->clip > 0)
        tline(b, t, "$Lst = Concat<axis=1>($Lh, $Lq, $Lzg, $Lrg, $Lhh, $Lmkz, $Lmkr, $Lmkh)");
    else
        tline(b, t, "$Lst = Concat<axis=1>($Lh, $Lq, $Lzg, $Lrg, $Lhh)");
    tline(b, t, "end");
    tline(b, t, "$hT, $ys, $sts = Loop<body=%%$body>(ts, , $h0)");
}

/* The name prefix of direction d's values. */
static const char *dir_tag(const rnn_cfg *c, int d) { return reverse_dir(c, d) ? "r_" : "f_"; }

/* dst = the directions' [..] tensors src ("$y") stacked on axis (names with
 * the direction tags). */
static void stack_dirs(pp_fn_body *b, const rnn_cfg *c, const char *src, int axis, const char *dst) {
    char list[256];
    size_t len = 0;
    pp_fn_line(b, "ax_%s = Constant<value_ints=[%d]>()", dst, axis);
    for (int d = 0; d < c->nd; d++) {
        tline(b, dir_tag(c, d), "%s_u$ = Unsqueeze(%s, ax_%s)", dst, src, dst);
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s_u%s", d ? ", " : "", dst, dir_tag(c, d));
    }
    pp_fn_line(b, "%s = Concat<axis=%d>(%s)", dst, axis, list);
}

/* LSTMTrain / GRUTrain(X W R B sequence_lens initial_h [initial_c P])
 * -> Y Y_h [Y_c] stash */
static pp_status rnn_train(const pp_node *n, pp_fn_body *b, int lstm) {
    rnn_cfg c;
    cfg_of(n, lstm, &c);
    b->inputs = lstm ? "X, W, R, B, sequence_lens, initial_h, initial_c, P"
                     : "X, W, R, B, sequence_lens, initial_h";
    b->outputs = lstm ? "Y, Y_h, Y_c, stash" : "Y, Y_h, stash";
    prelude(b, &c);
    pp_fn_line(b, "c2m1 = Constant<value_ints=[2, -1]>()");
    pp_fn_line(b, "h2 = Concat<axis=0>(hv, hv)");
    for (int d = 0; d < c.nd; d++) {
        const char *t = dir_tag(&c, d);
        if (lstm) lstm_forward_dir(b, &c, t, d);
        else gru_forward_dir(b, &c, t, d);
        if (reverse_dir(&c, d)) { /* the loop ran from T-1 down */
            tline(b, t, "$y = Slice($ys, rs, re, c0, m1)");
            tline(b, t, "$st = Slice($sts, rs, re, c0, m1)");
        } else {
            tline(b, t, "$y = Identity($ys)");
            tline(b, t, "$st = Identity($sts)");
        }
    }
    stack_dirs(b, &c, "$y", 1, "yt"); /* [T, nd, B, H] */
    stack_dirs(b, &c, "$hT", 0, "yh");
    stack_dirs(b, &c, "$st", 0, "sall");
    pp_fn_line(b, "stash = Reshape(sall, m1)");
    if (c.layout) {
        pp_fn_line(b, "Y = Transpose<perm=[2, 0, 1, 3]>(yt)");
        pp_fn_line(b, "Y_h = Transpose<perm=[1, 0, 2]>(yh)");
    } else {
        pp_fn_line(b, "Y = Identity(yt)");
        pp_fn_line(b, "Y_h = Identity(yh)");
    }
    if (lstm) {
        stack_dirs(b, &c, "$cT", 0, "yc");
        if (c.layout) pp_fn_line(b, "Y_c = Transpose<perm=[1, 0, 2]>(yc)");
        else pp_fn_line(b, "Y_c = Identity(yc)");
    }
    return PP_OK;
}

static pp_status lstm_train(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    PP_TRY(check_opset(g));
    return rnn_train(n, b, 1);
}

static pp_status gru_train(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    PP_TRY(check_opset(g));
    return rnn_train(n, b, 0);
}

/* sd = the stash as [nd, T, B, K]; $s: direction d's [T,B,K]; its pieces
 * over all steps ($shp, $scp, $scn for the LSTM; $shp, $sq for the GRU). */
static void stash_dir(pp_fn_body *b, const rnn_cfg *c, const char *t, const char *stash) {
    tline(b, t, "$s = Gather<axis=0>(%s, $i)", stash);
    if (c->lstm) tline(b, t, "$shp, $scp, $scn, $sx = Split<axis=2>($s, kparts)");
    else tline(b, t, "$shp, $sq, $sx = Split<axis=2>($s, kparts)");
}

/* The widths of the stash's parts as stash_dir splits them: kparts. */
static void stash_parts(pp_fn_body *b, const rnn_cfg *c) {
    pp_fn_line(b, "nd = Constant<value_ints=[%d]>()", (int)c->nd);
    int rest = c->lstm ? 4 : 3; /* the gates */
    if (c->clip > 0) rest *= 2;
    pp_fn_line(b, "krest = Constant<value_ints=[%d]>()", rest);
    pp_fn_line(b, "hrest = Mul(hv, krest)");
    if (c->lstm) pp_fn_line(b, "kparts = Concat<axis=0>(hv, hv, hv, hrest)");
    else pp_fn_line(b, "kparts = Concat<axis=0>(hv, hv, hrest)");
    pp_fn_line(b, "sshape = Concat<axis=0>(nd, tv, bv, m1)");
}

/* Direction d's weight gradients from $dg ([T,B,G*H] or GRU with
 * linear_before_reset [T,B,4H], time order) and the stash parts: $dW
 * [GH,I], $dR [GH,H], $dB [2GH], LSTM $dP [3H]. */
static void weight_grads_dir(pp_fn_body *b, const rnn_cfg *c, const char *t) {
    if (c->lstm) {
        tline(b, t, "$dW = Einsum<equation='tbg,tbi->gi'>($dg, xt)");
        tline(b, t, "$dR = Einsum<equation='tbg,tbh->gh'>($dg, $shp)");
        tline(b, t, "$dbs = ReduceSum<keepdims=0>($dg, c01)");
        tline(b, t, "$dB = Concat<axis=0>($dbs, $dbs)");
        tline(b, t, "$gi, $go, $gf, $gc = Split<axis=2>($dg, h4)");
        tline(b, t, "$pi_ = Mul($gi, $scp)");
        tline(b, t, "$po_ = Mul($go, $scn)");
        tline(b, t, "$pf_ = Mul($gf, $scp)");
        tline(b, t, "$dpi = ReduceSum<keepdims=0>($pi_, c01)");
        tline(b, t, "$dpo = ReduceSum<keepdims=0>($po_, c01)");
        tline(b, t, "$dpf = ReduceSum<keepdims=0>($pf_, c01)");
        tline(b, t, "$dP = Concat<axis=0>($dpi, $dpo, $dpf)");
        return;
    }
    if (c->lbr) {
        tline(b, t, "$gz, $gr, $gh, $gq = Split<axis=2>($dg, h4)");
        tline(b, t, "$g3 = Concat<axis=2>($gz, $gr, $gh)");
        tline(b, t, "$dRh = Einsum<equation='tbg,tbh->gh'>($gq, $shp)");
        tline(b, t, "$dbh = ReduceSum<keepdims=0>($gq, c01)");
    } else {
        tline(b, t, "$gz, $gr, $gh = Split<axis=2>($dg, h3)");
        tline(b, t, "$g3 = Identity($dg)");
        tline(b, t, "$dRh = Einsum<equation='tbg,tbh->gh'>($gh, $sq)");
        tline(b, t, "$dbh = ReduceSum<keepdims=0>($gh, c01)");
    }
    tline(b, t, "$gzr = Concat<axis=2>($gz, $gr)");
    tline(b, t, "$dW = Einsum<equation='tbg,tbi->gi'>($g3, xt)");
    tline(b, t, "$dRzr = Einsum<equation='tbg,tbh->gh'>($gzr, $shp)");
    tline(b, t, "$dR = Concat<axis=0>($dRzr, $dRh)");
    tline(b, t, "$dws = ReduceSum<keepdims=0>($g3, c01)");
    tline(b, t, "$dbzr = ReduceSum<keepdims=0>($gzr, c01)");
    tline(b, t, "$dB = Concat<axis=0>($dws, $dbzr, $dbh)");
}

/* The weight outputs from every direction's $dW $dR $dB [$dP]. */
static void weight_outputs(pp_fn_body *b, const rnn_cfg *c) {
    stack_dirs(b, c, "$dW", 0, "dW");
    stack_dirs(b, c, "$dR", 0, "dR");
    stack_dirs(b, c, "$dB", 0, "dB");
    if (c->lstm) stack_dirs(b, c, "$dP", 0, "dP");
}

/* The LSTM sweep of direction d: $dg (time order), $dhT, $dcT. */
static void lstm_backward_dir(pp_fn_body *b, const rnn_cfg *c, const char *t, int d, int has_dy) {
    tline(b, t,
          "graph $body($Ls:int64[], $Lcin:bool[], $Ldh:float, $Ldc:float)"
          " -> ($Lcout:bool[], $Ldh2:float, $Ldc2:float, $Ldg:float)");
    tline(b, t, "$Lcout = Identity($Lcin)");
    time_index(b, c, t, d, 1);
    tline(b, t, "$Lrow = Gather<axis=0>($s, $Ltt)");
    if (c->clip > 0)
        tline(b, t,
              "$Lhp, $Lcp, $Lcn, $Lig, $Log, $Lfg, $Lcg, $Lmi, $Lmo, $Lmf, $Lmc = Split<axis=1>($Lrow, k11)");
    else
        tline(b, t, "$Lhp, $Lcp, $Lcn, $Lig, $Log, $Lfg, $Lcg = Split<axis=1>($Lrow, k7)");
    if (has_dy) {
        tline(b, t, "$Ldy = Gather<axis=0>($dy, $Ltt)");
        tline(b, t, "$Ldht = Add($Ldh, $Ldy)");
    } else {
        tline(b, t, "$Ldht = Identity($Ldh)");
    }
    tline(b, t, "$Ltc = Tanh($Lcn)");
    /* dpo = dht tc o (1 - o) */
    tline(b, t, "$Lo1 = Sub(one, $Log)");
    tline(b, t, "$La1 = Mul($Ldht, $Ltc)");
    tline(b, t, "$La2 = Mul($La1, $Log)");
    tline(b, t, "$Ldpo0 = Mul($La2, $Lo1)");
    if (c->clip > 0) {
        tline(b, t, "$Lko = Sub(one, $Lmo)");
        tline(b, t, "$Ldpo = Mul($Ldpo0, $Lko)");
    } else {
        tline(b, t, "$Ldpo = Identity($Ldpo0)");
    }
    /* dC = dc + dht o (1 - tc^2) [+ Po dpo] */
    tline(b, t, "$Lt2 = Mul($Ltc, $Ltc)");
    tline(b, t, "$Lt1 = Sub(one, $Lt2)");
    tline(b, t, "$Lb1 = Mul($Ldht, $Log)");
    tline(b, t, "$Lb2 = Mul($Lb1, $Lt1)");
    if (c->has_p) {
        tline(b, t, "$LdC0 = Add($Ldc, $Lb2)");
        tline(b, t, "$Lpod = Mul($po, $Ldpo)");
        tline(b, t, "$LdC = Add($LdC0, $Lpod)");
    } else {
        tline(b, t, "$LdC = Add($Ldc, $Lb2)");
    }
    /* dpi = dC c i (1 - i); dpf = dC c_prev f (1 - f); dpc = dC i (1 - c^2) */
    tline(b, t, "$Li1 = Sub(one, $Lig)");
    tline(b, t, "$Le1 = Mul($LdC, $Lcg)");
    tline(b, t, "$Le2 = Mul($Le1, $Lig)");
    tline(b, t, "$Ldpi0 = Mul($Le2, $Li1)");
    tline(b, t, "$Lf1 = Sub(one, $Lfg)");
    tline(b, t, "$Lg1 = Mul($LdC, $Lcp)");
    tline(b, t, "$Lg2 = Mul($Lg1, $Lfg)");
    tline(b, t, "$Ldpf0 = Mul($Lg2, $Lf1)");
    tline(b, t, "$Lc2 = Mul($Lcg, $Lcg)");
    tline(b, t, "$Lc1 = Sub(one, $Lc2)");
    tline(b, t, "$Lj1 = Mul($LdC, $Lig)");
    tline(b, t, "$Ldpc0 = Mul($Lj1, $Lc1)");
    if (c->clip > 0) {
        static const char *const g[3] = {"i", "f", "c"};
        for (int k = 0; k < 3; k++) {
            tline(b, t, "$Lk%s = Sub(one, $Lm%s)", g[k], g[k]);
            tline(b, t, "$Ldp%s = Mul($Ldp%s0, $Lk%s)", g[k], g[k], g[k]);
        }
    } else {
        tline(b, t, "$Ldpi = Identity($Ldpi0)");
        tline(b, t, "$Ldpf = Identity($Ldpf0)");
        tline(b, t, "$Ldpc = Identity($Ldpc0)");
    }
    /* dc_prev = dC f [+ Pi dpi + Pf dpf] */
    if (c->has_p) {
        tline(b, t, "$Ldcp0 = Mul($LdC, $Lfg)");
        tline(b, t, "$Lpid = Mul($pi, $Ldpi)");
        tline(b, t, "$Lpfd = Mul($pf, $Ldpf)");
        tline(b, t, "$Ldcp1 = Add($Ldcp0, $Lpid)");
        tline(b, t, "$Ldcp = Add($Ldcp1, $Lpfd)");
    } else {
        tline(b, t, "$Ldcp = Mul($LdC, $Lfg)");
    }
    tline(b, t, "$Ldgn = Concat<axis=1>($Ldpi, $Ldpo, $Ldpf, $Ldpc)");
    tline(b, t, "$Ldhp = MatMul($Ldgn, $r)");
    if (c->has_seq) {
        tline(b, t, "$Ldg = Where($Lact, $Ldgn, zbg)");
        tline(b, t, "$Ldh2 = Where($Lact, $Ldhp, $Ldh)");
        tline(b, t, "$Ldc2 = Where($Lact, $Ldcp, $Ldc)");
    } else {
        tline(b, t, "$Ldg = Identity($Ldgn)");
        tline(b, t, "$Ldh2 = Identity($Ldhp)");
        tline(b, t, "$Ldc2 = Identity($Ldcp)");
    }
    tline(b, t, "end");
    tline(b, t, "$dhT, $dcT, $dgs = Loop<body=%%$body>(ts, , $dh0, $dc0)");
}

/* The GRU sweep of direction d: $dg (time order), $dhT. */
static void gru_backward_dir(pp_fn_body *b, const rnn_cfg *c, const char *t, int d, int has_dy) {
    tline(b, t, "graph $body($Ls:int64[], $Lcin:bool[], $Ldh:float) -> ($Lcout:bool[], $Ldh2:float, $Ldg:float)");
    tline(b, t, "$Lcout = Identity($Lcin)");
    time_index(b, c, t, d, 1);
    tline(b, t, "$Lrow = Gather<axis=0>($s, $Ltt)");
    if (c->clip > 0)
        tline(b, t, "$Lhp, $Lq, $Lzg, $Lrg, $Lhh, $Lmz, $Lmr, $Lmh = Split<axis=1>($Lrow, k8)");
    else
        tline(b, t, "$Lhp, $Lq, $Lzg, $Lrg, $Lhh = Split<axis=1>($Lrow, k5)");
    if (has_dy) {
        tline(b, t, "$Ldy = Gather<axis=0>($dy, $Ltt)");
        tline(b, t, "$Ldht = Add($Ldh, $Ldy)");
    } else {
        tline(b, t, "$Ldht = Identity($Ldh)");
    }
    /* dpz = dht (h_prev - hh) z (1 - z); dph = dht (1 - z) (1 - hh^2) */
    tline(b, t, "$Lz1 = Sub(one, $Lzg)");
    tline(b, t, "$Lhd = Sub($Lhp, $Lhh)");
    tline(b, t, "$La1 = Mul($Ldht, $Lhd)");
    tline(b, t, "$La2 = Mul($La1, $Lzg)");
    tline(b, t, "$Ldpz0 = Mul($La2, $Lz1)");
    tline(b, t, "$Lh2s = Mul($Lhh, $Lhh)");
    tline(b, t, "$Lh1 = Sub(one, $Lh2s)");
    tline(b, t, "$Lb1 = Mul($Ldht, $Lz1)");
    tline(b, t, "$Ldph0 = Mul($Lb1, $Lh1)");
    if (c->clip > 0) {
        tline(b, t, "$Lkz = Sub(one, $Lmz)");
        tline(b, t, "$Ldpz = Mul($Ldpz0, $Lkz)");
        tline(b, t, "$Lkh = Sub(one, $Lmh)");
        tline(b, t, "$Ldph = Mul($Ldph0, $Lkh)");
    } else {
        tline(b, t, "$Ldpz = Identity($Ldpz0)");
        tline(b, t, "$Ldph = Identity($Ldph0)");
    }
    tline(b, t, "$Ltmp = Mul($Ldht, $Lzg)");
    tline(b, t, "$Lr1 = Sub(one, $Lrg)");
    if (c->lbr) { /* dpr = dph q r (1 - r); dq = dph r */
        tline(b, t, "$Le1 = Mul($Ldph, $Lq)");
        tline(b, t, "$Ldq = Mul($Ldph, $Lrg)");
        tline(b, t, "$Lhq = MatMul($Ldq, $rh)");
    } else { /* du = dph R_h; dpr = du h_prev r (1 - r) */
        tline(b, t, "$Ldu = MatMul($Ldph, $rh)");
        tline(b, t, "$Le1 = Mul($Ldu, $Lhp)");
        tline(b, t, "$Lhq = Mul($Ldu, $Lrg)");
    }
    tline(b, t, "$Le2 = Mul($Le1, $Lrg)");
    tline(b, t, "$Ldpr0 = Mul($Le2, $Lr1)");
    if (c->clip > 0) {
        tline(b, t, "$Lkr = Sub(one, $Lmr)");
        tline(b, t, "$Ldpr = Mul($Ldpr0, $Lkr)");
    } else {
        tline(b, t, "$Ldpr = Identity($Ldpr0)");
    }
    tline(b, t, "$Ldzr = Concat<axis=1>($Ldpz, $Ldpr)");
    tline(b, t, "$Lhz = MatMul($Ldzr, $rzr)");
    tline(b, t, "$Ls1 = Add($Ltmp, $Lhq)");
    tline(b, t, "$Ldhp = Add($Ls1, $Lhz)");
    if (c->lbr) tline(b, t, "$Ldgn = Concat<axis=1>($Ldpz, $Ldpr, $Ldph, $Ldq)");
    else tline(b, t, "$Ldgn = Concat<axis=1>($Ldpz, $Ldpr, $Ldph)");
    if (c->has_seq) {
        tline(b, t, "$Ldg = Where($Lact, $Ldgn, zbg)");
        tline(b, t, "$Ldh2 = Where($Lact, $Ldhp, $Ldh)");
    } else {
        tline(b, t, "$Ldg = Identity($Ldgn)");
        tline(b, t, "$Ldh2 = Identity($Ldhp)");
    }
    tline(b, t, "end");
    tline(b, t, "$dhT, $dgs = Loop<body=%%$body>(ts, , $dh0)");
}

/* LSTMGrad(X W R B sequence_lens initial_h initial_c P dY dY_h dY_c stash)
 *   -> dX dW dR dB dinitial_h dinitial_c dP dG
 * GRUGrad(X W R B sequence_lens initial_h dY dY_h stash)
 *   -> dX dW dR dB dinitial_h dG */
static pp_status rnn_grad(const pp_node *n, pp_fn_body *b, int lstm) {
    rnn_cfg c;
    cfg_of(n, lstm, &c);
    int k0 = lstm ? 8 : 6; /* dY */
    int has_dy = pp_fn_has_in(n, k0), has_dyh = pp_fn_has_in(n, k0 + 1), has_dyc = lstm && pp_fn_has_in(n, k0 + 2);
    if (!pp_fn_has_in(n, k0 + (lstm ? 3 : 2)))
        return pp_error(PP_ERR_UNSUPPORTED, "no stash input (the body does not rerun the forward)");
    b->inputs = lstm ? "X, W, R, B, sequence_lens, initial_h, initial_c, P, dY, dY_h, dY_c, stash"
                     : "X, W, R, B, sequence_lens, initial_h, dY, dY_h, stash";
    b->outputs = lstm ? "dX, dW, dR, dB, dinitial_h, dinitial_c, dP, dG" : "dX, dW, dR, dB, dinitial_h, dG";
    prelude(b, &c);
    stash_parts(b, &c);
    int nk = lstm ? (c.clip > 0 ? 11 : 7) : (c.clip > 0 ? 8 : 5);
    char list[256];
    size_t len = 0;
    for (int k = 0; k < nk; k++) len += (size_t)snprintf(list + len, sizeof list - len, "%shv", k ? ", " : "");
    pp_fn_line(b, "k%d = Concat<axis=0>(%s)", nk, list);
    pp_fn_line(b, "sd = Reshape(stash, sshape)");
    if (c.has_seq) {
        pp_fn_line(b, "ghw = Constant<value_ints=[%d]>()", lstm ? 4 : c.lbr ? 4 : 3);
        pp_fn_line(b, "ghv = Mul(hv, ghw)");
        pp_fn_line(b, "bg = Concat<axis=0>(bv, ghv)");
        pp_fn_line(b, "zbg = ConstantOfShape(bg)");
    }
    /* dY as [T, nd, B, H], dY_h / dY_c as [nd, B, H] */
    if (has_dy) pp_fn_line(b, "dyt = %s(dY)", c.layout ? "Transpose<perm=[1, 2, 0, 3]>" : "Identity");
    if (has_dyh) pp_fn_line(b, "dyh = %s(dY_h)", c.layout ? "Transpose<perm=[1, 0, 2]>" : "Identity");
    if (has_dyc) pp_fn_line(b, "dyc = %s(dY_c)", c.layout ? "Transpose<perm=[1, 0, 2]>" : "Identity");
    for (int d = 0; d < c.nd; d++) {
        const char *t = dir_tag(&c, d);
        tline(b, t, "$i = Constant<value_int=%d>()", d);
        tline(b, t, "$w = Gather<axis=0>(W, $i)");
        tline(b, t, "$r = Gather<axis=0>(R, $i)");
        if (lstm && c.has_p) {
            tline(b, t, "$p = Gather<axis=0>(P, $i)");
            tline(b, t, "$pi, $po, $pf = Split<axis=0>($p, h3)");
        }
        if (!lstm) tline(b, t, "$rz, $rr, $rh = Split<axis=0>($r, h3)");
        if (!lstm) tline(b, t, "$rzr = Concat<axis=0>($rz, $rr)");
        stash_dir(b, &c, t, "sd");
        if (has_dy) tline(b, t, "$dy = Gather<axis=1>(dyt, $i)");
        if (has_dyh) tline(b, t, "$dh0 = Gather<axis=0>(dyh, $i)");
        else tline(b, t, "$dh0 = Identity(zbh)");
        if (lstm) {
            if (has_dyc) tline(b, t, "$dc0 = Gather<axis=0>(dyc, $i)");
            else tline(b, t, "$dc0 = Identity(zbh)");
            lstm_backward_dir(b, &c, t, d, has_dy);
        } else {
            gru_backward_dir(b, &c, t, d, has_dy);
        }
        /* the sweep ran against the direction's time order */
        if (reverse_dir(&c, d)) tline(b, t, "$dg = Identity($dgs)");
        else tline(b, t, "$dg = Slice($dgs, rs, re, c0, m1)");
        if (!lstm && c.lbr) {
            tline(b, t, "$gz_, $gr_, $gh_, $gq_ = Split<axis=2>($dg, h4)");
            tline(b, t, "$dg3 = Concat<axis=2>($gz_, $gr_, $gh_)");
            tline(b, t, "$dx = MatMul($dg3, $w)");
        } else {
            tline(b, t, "$dx = MatMul($dg, $w)");
        }
        weight_grads_dir(b, &c, t);
    }
    if (c.nd == 2) pp_fn_line(b, "dxt = Add(f_dx, r_dx)");
    else pp_fn_line(b, "dxt = Identity(%sdx)", dir_tag(&c, 0));
    pp_fn_line(b, "dX = %s(dxt)", c.layout ? "Transpose<perm=[1, 0, 2]>" : "Identity");
    weight_outputs(b, &c);
    stack_dirs(b, &c, "$dhT", 0, "dh0s");
    pp_fn_line(b, "dinitial_h = %s(dh0s)", c.layout ? "Transpose<perm=[1, 0, 2]>" : "Identity");
    if (lstm) {
        stack_dirs(b, &c, "$dcT", 0, "dc0s");
        pp_fn_line(b, "dinitial_c = %s(dc0s)", c.layout ? "Transpose<perm=[1, 0, 2]>" : "Identity");
    }
    stack_dirs(b, &c, "$dg", 0, "dgall");
    pp_fn_line(b, "dG = Reshape(dgall, m1)");
    return PP_OK;
}

static pp_status lstm_grad(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    PP_TRY(check_opset(g));
    return rnn_grad(n, b, 1);
}

static pp_status gru_grad(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    PP_TRY(check_opset(g));
    return rnn_grad(n, b, 0);
}

/* LSTMGradWeight(X W R B - - - P stash dG) -> dW dR dB dP
 * GRUGradWeight(X W R B - - stash dG) -> dW dR dB */
static pp_status rnn_grad_weight(const pp_node *n, pp_fn_body *b, int lstm) {
    rnn_cfg c;
    cfg_of(n, lstm, &c);
    int ks = lstm ? 8 : 6;
    if (!pp_fn_has_in(n, ks) || !pp_fn_has_in(n, ks + 1))
        return pp_error(PP_ERR_UNSUPPORTED, "no stash or dG input");
    b->inputs = lstm ? "X, W, R, B, sequence_lens, initial_h, initial_c, P, stash, dG"
                     : "X, W, R, B, sequence_lens, initial_h, stash, dG";
    b->outputs = lstm ? "dW, dR, dB, dP" : "dW, dR, dB";
    prelude(b, &c);
    stash_parts(b, &c);
    pp_fn_line(b, "sd = Reshape(stash, sshape)");
    pp_fn_line(b, "gd = Reshape(dG, sshape)");
    for (int d = 0; d < c.nd; d++) {
        const char *t = dir_tag(&c, d);
        tline(b, t, "$i = Constant<value_int=%d>()", d);
        stash_dir(b, &c, t, "sd");
        tline(b, t, "$dg = Gather<axis=0>(gd, $i)");
        weight_grads_dir(b, &c, t);
    }
    weight_outputs(b, &c);
    return PP_OK;
}

static pp_status lstm_grad_weight(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    PP_TRY(check_opset(g));
    return rnn_grad_weight(n, b, 1);
}

static pp_status gru_grad_weight(const pp_graph *g, const pp_node *n, pp_fn_body *b) {
    PP_TRY(check_opset(g));
    return rnn_grad_weight(n, b, 0);
}

const pp_fn_entry pp_fn_rnn[] = {
    {"LSTMTrain", lstm_train},       {"GRUTrain", gru_train},
    {"LSTMGrad", lstm_grad},         {"GRUGrad", gru_grad},
    {"LSTMGradWeight", lstm_grad_weight}, {"GRUGradWeight", gru_grad_weight},
    {NULL, NULL},
};
