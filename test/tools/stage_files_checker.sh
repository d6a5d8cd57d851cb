#!/bin/sh
# stage_K.onnx files written by `pippin split` pass onnx.checker (Debian's
# python3-onnx); skipped with a message where it is missing. And (issue 18)
# ONNX Runtime runs each stage file of every fixture with pippin's outputs
# (ort_stages.py; npm's onnxruntime-node under $ORT_DIR, default
# ~/.cache/pippin-bench-ort, skipped where it is not). TAP output.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
if ! $PY -c "import onnx" 2>/dev/null; then
    echo "1..0 # SKIP python3-onnx is not installed"
    exit 0
fi
for case in "mlp model.onnx" "skip model.onnx" "gpt model.onnx --dim seq=16" \
            "gpt model_nosplit.onnx --split-before /blocks.2/ --transmit-shared"; do
    set -- $case
    fx=$1
    model=$2
    shift 2
    n=$((n + 1))
    out="$tmp/$n"
    if ! "$PIPPIN" split "$SRC/test/fixtures/$fx/$model" "$@" -o "$out" >"$tmp/log" 2>&1; then
        echo "not ok $n - split $fx $model $*: $(cat "$tmp/log")"
        continue
    fi
    if $PY - "$out" >"$tmp/log" 2>&1 <<'PYEOF'
import glob, json, sys
import onnx
d = sys.argv[1]
pipe = json.load(open(d + "/pipe.json"))
files = sorted(glob.glob(d + "/stage_*.onnx"))
assert len(files) == len(pipe["stages"]), (files, len(pipe["stages"]))
for f in files:
    m = onnx.load(f)
    onnx.checker.check_model(m, full_check=True)
    for vi in list(m.graph.input) + list(m.graph.output):
        assert vi.type.tensor_type.elem_type != 0, (f, vi.name, "untyped")
PYEOF
    then
        echo "ok $n - $fx $model $*: $(ls "$out" | grep -c onnx) stage files pass onnx.checker"
    else
        echo "not ok $n - $fx $model $*: $(tail -3 "$tmp/log")"
    fi
done
# The training graph `pippin inspect --backward -o` writes is valid ONNX too.
for fx in mlp gpt; do
    n=$((n + 1))
    if ! "$PIPPIN" inspect "$SRC/test/fixtures/$fx/model.onnx" --backward -o "$tmp/$fx-train.onnx" >"$tmp/log" 2>&1; then
        echo "not ok $n - inspect --backward $fx: $(tail -3 "$tmp/log")"
    elif $PY -c "import onnx, sys; m = onnx.load(sys.argv[1]); onnx.checker.check_model(m); assert any(n.doc_string == 'pippin.region=W' for n in m.graph.node)" "$tmp/$fx-train.onnx" >"$tmp/log" 2>&1; then
        echo "ok $n - $fx training graph passes onnx.checker, W region tagged"
    else
        echo "not ok $n - $fx training graph: $(tail -3 "$tmp/log")"
    fi
done
# Each stage file in ONNX Runtime, fed as the pipeline feeds it.
ORT_DIR=${ORT_DIR:-$HOME/.cache/pippin-bench-ort}
export ORT_DIR
for case in "mlp x y" "skip x y" "cnn x y" "gpt idx targets" "unet x y" "tv_vit x y" "bn x y" "rnn x y" \
            "gpt idx targets model_nosplit.onnx --split-before /blocks.2/ --transmit-shared"; do
    set -- $case
    fx=$1 a=$2 b=$3
    model=${4:-model.onnx}
    shift 3
    [ $# -gt 0 ] && shift
    n=$((n + 1))
    if ! command -v node >/dev/null 2>&1 || [ ! -d "$ORT_DIR/node_modules/onnxruntime-node" ]; then
        echo "ok $n - $fx $model $*: ONNX Runtime runs each stage file # SKIP no onnxruntime-node under $ORT_DIR"
        continue
    fi
    out="$tmp/ort-$n"
    d=$SRC/test/fixtures/$fx
    if "$PIPPIN" split "$d/$model" "$@" -o "$out" >"$tmp/log" 2>&1 &&
        $PY "$(dirname "$0")/ort_stages.py" "$PIPPIN" "$(dirname "$0")/ort_run.js" "$out" "$a=$d/$a.npy" "$b=$d/$b.npy" \
            >"$tmp/count" 2>"$tmp/log"; then
        echo "ok $n - $fx $model $*: ONNX Runtime runs each of $(ls "$out"/stage_*.onnx | wc -l) stage files with pippin's $(cat "$tmp/count") outputs"
    else
        echo "not ok $n - $fx $model $*: ONNX Runtime on the stage files: $(tail -3 "$tmp/log")"
    fi
done
echo "1..$n"
