#!/bin/sh
# The training graph (`pippin inspect --backward -o`) loads in other ONNX
# tools (issue 18): pippin's own ops carry model-local ONNX functions
# (lib/onnx_functions.h). For the MLP, GPT, CNN, skip, U-Net and ViT
# fixtures and the small models of ort_ops.py (AveragePool, GroupNorm,
# Gather on any axis, ConvTranspose, Resize geometries): onnx.checker's full
# check passes, pippin reads the file back (inspect, infer), and ONNX Runtime
# runs it with pippin's loss and every gradient (relative 1e-4). ONNX Runtime: npm's onnxruntime-node under
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
nonzero = 0
for f in files:
    a, b = np.load(f), np.load(os.path.join(ort, os.path.basename(f)))
    assert a.shape == b.shape, (f, a.shape, b.shape)
    nonzero += bool(np.abs(a).max() > 0)
    assert np.allclose(a, b, rtol=1e-4, atol=1e-4 * max(1e-3, float(np.abs(a).max()))), \
        (os.path.basename(f), float(np.abs(a - b).max()))
assert nonzero >= 2, 'the loss and its gradients are zero'
print(len(files))" "$tmp/pp-$f" "$tmp/ort-$f" >"$tmp/n" 2>>"$tmp/err"
    ok $? "$f: ONNX Runtime gives pippin's loss and all $(cat "$tmp/n" 2>/dev/null) outputs $(tail -c 300 "$tmp/err")"
}

for case in "mlp x y" "gpt idx targets" "cnn x y" "skip x y" "unet x y" "tv_vit x y"; do
    # shellcheck disable=SC2086 # the case is words
    set -- $case
    check "$1" "$FX/$1" "$2" "$3"
done
# One small model per gradient helper geometry the fixtures lack (ort_ops.py).
if [ $have_onnx = 1 ] && $PY "$HERE/ort_ops.py" "$tmp/ops" 2>"$tmp/err"; then
    for d in "$tmp"/ops/*/; do
        d=${d%/}
        check "$(basename "$d")" "$d" x
    done
else
    ok 0 "gradient helper models # SKIP python3-onnx is not installed $(tail -1 "$tmp/err")"
fi
# Regression: MaxPool's gradient takes the argmax indices from a second
# MaxPool whose first output was left empty, which ONNX forbids (ONNX
# Runtime refused the file). tv_resnet's training graph loads and runs
# there; its numbers are not compared: ONNX Runtime's BatchNormalization in
# training mode differs from PyTorch's and pippin's in the forward already.
d=$FX/tv_resnet
out=$tmp/tv_resnet.onnx
"$PIPPIN" inspect "$d/model.onnx" --backward -o "$out" >/dev/null 2>"$tmp/err"
ok $? "tv_resnet: the training graph is written $(head -c 300 "$tmp/err")"
if [ $have_onnx = 0 ]; then
    ok 0 "tv_resnet: onnx.checker # SKIP python3-onnx is not installed"
else
    $PY -c "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)" "$out" >"$tmp/err" 2>&1
    ok $? "tv_resnet: onnx.checker (full check) accepts the training graph (MaxPool's Y named) $(tail -1 "$tmp/err")"
fi
if [ $have_ort = 0 ]; then
    ok 0 "tv_resnet: ONNX Runtime runs the training graph # SKIP no onnxruntime-node under $ORT_DIR (or no numpy)"
else
    node "$HERE/ort_run.js" "$out" "$tmp/ort-tv_resnet" "x=$d/x.npy" "y=$d/y.npy" "loss_grad=$tmp/one.npy" >/dev/null 2>"$tmp/err"
    ok $? "tv_resnet: ONNX Runtime runs the training graph $(tail -c 300 "$tmp/err")"
fi
echo "1..$n"
[ "$fails" -eq 0 ]
