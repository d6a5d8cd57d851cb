#!/bin/sh
# The training graph (`pippin inspect --backward -o`) loads in other ONNX
# tools (issue 18): pippin's own ops carry model-local ONNX functions
# (lib/onnx_functions.h). For the MLP, GPT, CNN, skip, U-Net, ViT, BatchNorm,
# RNN (two-layer bidirectional LSTM and a GRU: one Loop per direction in
# the bodies, SplitLike with 2 and 3 pieces as two functions) and ResNet
# fixtures and the small models of ort_ops.py (AveragePool, GroupNorm,
# eval-mode BatchNorm, Gather on any axis, ConvTranspose, Resize geometries,
# LSTM/GRU directions, layouts, sequence_lens, clip, peepholes, initial
# states, linear_before_reset, losses on Y, Y_h or Y_c alone):
# onnx.checker's full check passes, pippin reads the file back (inspect,
# infer), and ONNX Runtime runs it with pippin's loss and every gradient
# (relative 1e-4). BatchNormalization in training mode: `pippin
# infer` runs a training graph's forward in training mode (as ONNX Runtime
# and PyTorch do; it used to rewrite it to eval mode as for inference, and
# the numbers differed). tv_resnet is also the regression test of MaxPool's
# gradient, whose second MaxPool once left its first output empty (ONNX
# Runtime refused the file). ONNX Runtime: npm's onnxruntime-node under
# $ORT_DIR (default ~/.cache/pippin-bench-ort, scripts/install-deps puts it
# there); skipped where it is not, as is the checker without python3-onnx.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
ORT_DIR=${ORT_DIR:-$HOME/.cache/pippin-bench-ort}
export ORT_DIR
have_onnx=0
$PY -c "import onnx, numpy" 2>/dev/null && have_onnx=1
have_ort=0
command -v node >/dev/null 2>&1 && [ -d "$ORT_DIR/node_modules/onnxruntime-node" ] && [ $have_onnx = 1 ] && have_ort=1
# the seed of the backward: d loss / d loss = 1
$PY -c "import numpy as np; np.save('$tmp/one.npy', np.array(1.0, np.float32))" 2>/dev/null

# check NAME DIR INPUT...: the training graph of DIR/model.onnx, fed
# DIR/INPUT.npy for each INPUT and the seed.
check() {
    f=$1 d=$2
    shift 2
    out=$tmp/$f.onnx
    "$PIPPIN" inspect "$d/model.onnx" --backward -o "$out" >/dev/null 2>"$tmp/err" && ! grep -q "warn" "$tmp/err"
    ok $? "$f: the training graph is written with a function for each pippin op $(head -c 300 "$tmp/err")"
    if [ $have_onnx = 0 ]; then
        ok 0 "$f: onnx.checker # SKIP python3-onnx is not installed"
    elif ! $PY -c "import onnx, sys; sys.exit(max(o.version for o in onnx.load(sys.argv[1]).opset_import if o.domain in ('', 'ai.onnx')) > onnx.defs.onnx_opset_version())" "$out"; then
        ok 0 "$f: onnx.checker # SKIP the model's opset is newer than python3-onnx's"
    else
        $PY -c "import onnx, sys; m = onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True); \
used = {n.op_type for n in m.graph.node if n.domain == 'pippin'}; \
assert used == {fn.name for fn in m.functions}, used" "$out" >"$tmp/err" 2>&1
        ok $? "$f: onnx.checker (full check) accepts the training graph $(tail -1 "$tmp/err")"
    fi
    "$PIPPIN" inspect "$out" >/dev/null 2>"$tmp/err"
    ok $? "$f: pippin inspect reads the written file $(head -c 300 "$tmp/err")"
    if [ $have_ort = 0 ]; then
        ok 0 "$f: ONNX Runtime runs the training graph # SKIP no onnxruntime-node under $ORT_DIR (or no numpy)"
        return
    fi
    pp_in="" ort_in=""
    for a in "$@"; do
        pp_in="$pp_in --input $a=$d/$a.npy"
        ort_in="$ort_in $a=$d/$a.npy"
    done
    # shellcheck disable=SC2086 # the feeds are words
    "$PIPPIN" infer "$out" $pp_in --input "loss_grad=$tmp/one.npy" \
        --no-split --no-optimize --output-dir "$tmp/pp-$f" >/dev/null 2>"$tmp/err" &&
        node "$HERE/ort_run.js" "$out" "$tmp/ort-$f" $ort_in "loss_grad=$tmp/one.npy" 2>>"$tmp/err" &&
        $PY -c "
import glob, os, sys
import numpy as np
pp, ort = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(pp + '/*.npy'))
assert len(files) == len(glob.glob(ort + '/*.npy')) and len(files) >= 2, 'output counts differ'
outs = [(np.load(f), np.load(os.path.join(ort, os.path.basename(f))), os.path.basename(f)) for f in files]
# the error allowed: relative to each output, and to the largest for those
# that are zero but for rounding (a bias before BatchNorm: its gradient is
# noise, 1.2e-6 in pippin and 2.6e-6 away from it in ONNX Runtime 1.30 on
# an AMD EPYC host, where the largest output is 2.39; 1e-6 of the largest,
# allowed before, failed there)
top = max(float(np.abs(a).max()) for a, _, _ in outs)
nonzero = 0
for a, b, f in outs:
    assert a.shape == b.shape, (f, a.shape, b.shape)
    nonzero += bool(np.abs(a).max() > 0)
    assert np.allclose(a, b, rtol=1e-4, atol=1e-4 * max(1e-1 * top, float(np.abs(a).max()))), \
        (f, float(np.abs(a - b).max()))
assert nonzero >= 2, 'the loss and its gradients are zero'
print(len(files))" "$tmp/pp-$f" "$tmp/ort-$f" >"$tmp/n" 2>>"$tmp/err"
    ok $? "$f: ONNX Runtime gives pippin's loss and all $(cat "$tmp/n" 2>/dev/null) outputs $(tail -c 300 "$tmp/err")"
}

for case in "mlp x y" "gpt idx targets" "cnn x y" "skip x y" "unet x y" "tv_vit x y" "bn x y" "rnn x y"; do
    # shellcheck disable=SC2086 # the case is words
    set -- $case
    check "$1" "$FX/$1" "$2" "$3"
done
# Regression: `pippin infer` ran a training graph's BatchNormalization in eval
# mode (the inference rewrite) while its gradient helpers took the batch's
# statistics; it now gives PyTorch's loss and gradients (the bn fixture).
"$PIPPIN" inspect "$FX/bn/model.onnx" --backward -o "$tmp/bn-train.onnx" >/dev/null 2>&1 &&
    "$PIPPIN" infer "$tmp/bn-train.onnx" --input "x=$FX/bn/x.npy" --input "y=$FX/bn/y.npy" \
        --input "loss_grad=$tmp/one.npy" --no-split --output-dir "$tmp/bn-pp" >/dev/null 2>"$tmp/err" &&
    $PY -c "
import sys
import numpy as np
d, pp = sys.argv[1], sys.argv[2]
assert np.allclose(np.load(pp + '/loss.npy'), np.load(d + '/m1_loss.npy'), rtol=1e-5)
for k in (1, 2, 3):
    g = np.load(pp + '/_bn%d_BatchNormalization_grad_BatchNormGradWeight_%d_out0.npy' % (k, (23, 16, 7)[k - 1]))
    assert np.allclose(g, np.load(d + '/m1_grad_bn%d.weight.npy' % k), rtol=1e-4, atol=1e-6), k
" "$FX/bn" "$tmp/bn-pp" 2>>"$tmp/err"
ok $? "bn: pippin infer runs a training graph's BatchNorm in training mode (PyTorch's loss and gradients) $(tail -c 300 "$tmp/err")"
# ONNX Runtime's graph optimizations (ConvBNFusion, level basic) fold a Conv
# and the training-mode BatchNormalization after it into one Conv with the
# running statistics, which is eval mode: its loss is not PyTorch's. Without
# them ONNX Runtime gives PyTorch's and pippin's numbers (docs/architecture.md).
ORT_OPT=disabled check tv_resnet "$FX/tv_resnet" x y
# One small model per gradient helper geometry the fixtures lack (ort_ops.py).
if [ $have_onnx = 1 ] && $PY "$HERE/ort_ops.py" "$tmp/ops" 2>"$tmp/err"; then
    for d in "$tmp"/ops/*/; do
        d=${d%/}
        check "$(basename "$d")" "$d" x
    done
else
    ok 0 "gradient helper models # SKIP python3-onnx is not installed $(tail -1 "$tmp/err")"
fi
echo "1..$n"
[ "$fails" -eq 0 ]
