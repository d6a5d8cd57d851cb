#!/bin/sh
# Stage markers every ONNX tool can load, and markers from other exporters
# (issue 18): the MLP fixture with PipeSplit defined as a model-local
# function (mlp/model_function.onnx, what pippin_torch.export writes) passes
# onnx.checker's full check, trains exactly as the original, and runs in
# ONNX Runtime with pippin's outputs, as does each of its stage files; the
# markers as Identity nodes named stage_cut_K (mlp/model_identity.onnx) cut
# the same stages with --marker-identity or split.marker_identity, and a
# pattern that matches nothing is an error naming it. ONNX Runtime: npm's
# onnxruntime-node under $ORT_DIR (default ~/.cache/pippin-bench-ort, where
# bench/bench_serve.py installs it); skipped where it is not. TAP output.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
M=$FX/mlp
HERE=$(cd "$(dirname "$0")" && pwd)

# 1: onnx.checker accepts the function form
if ! $PY -c "import onnx" 2>/dev/null; then
    ok 0 "onnx.checker # SKIP python3-onnx is not installed"
else
    $PY -c "import onnx, sys; m = onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True); \
assert [(f.domain, f.name) for f in m.functions] == [('pippin', 'PipeSplit')]" "$M/model_function.onnx" >"$tmp/err" 2>&1
    ok $? "onnx.checker (full check) accepts PipeSplit as a model-local function $(tail -1 "$tmp/err")"
fi

# 2-4: the same stages and losses from every form of the markers
train() {
    out=$1
    shift
    "$PIPPIN" train "$@" --data "x=$M/train_x.npy" --data "y=$M/train_y.npy" --batch-size 4 --microbatches 2 \
        --schedule 1f1b --steps 3 --json 2>"$tmp/err" | grep -v '"seconds"\|time' >"$out"
}
train "$tmp/t-orig" "$M/model.onnx" && train "$tmp/t-func" "$M/model_function.onnx" &&
    [ -s "$tmp/t-orig" ] && cmp -s "$tmp/t-orig" "$tmp/t-func"
ok $? "the function form trains as the original (3 stages, 1f1b) $(head -c 200 "$tmp/err")"
train "$tmp/t-id" "$M/model_identity.onnx" --marker-identity 'stage_cut_*' && cmp -s "$tmp/t-orig" "$tmp/t-id"
ok $? "Identity markers with --marker-identity train as the original $(head -c 200 "$tmp/err")"
"$PIPPIN" inspect "$M/model_identity.onnx" --marker-identity 'stage_cut_*' >"$tmp/insp" 2>&1 &&
    grep -q "^stages: 3" "$tmp/insp" && grep -q "stage_cut_1 (node" "$tmp/insp"
ok $? "inspect --marker-identity shows 3 stages"

# 5: a pattern that matches nothing
expect 1 "--marker-identity 'nope*' matches no Identity node" "a pattern that matches no Identity node is an error" -- \
    inspect "$M/model_identity.onnx" --marker-identity 'nope*'

# 6: the config key, through pippin run (3 worker processes over ipc)
cfg() {
    cat >"$tmp/$1.yaml" <<YAML
model: $2
schedule: 1f1b
microbatches: 2
batch_size: 4
steps: 3
optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}
data: {x: $M/train_x.npy, y: $M/train_y.npy}
ranks: [ipc://$tmp/$1-0, ipc://$tmp/$1-1, ipc://$tmp/$1-2]
threads: 1
$3
YAML
}
cfg orig "$M/model.onnx" ""
cfg ident "$M/model_identity.onnx" "split: {marker_identity: 'stage_cut_*'}"
"$PIPPIN" run "$tmp/orig.yaml" >"$tmp/raw-orig" 2>&1
"$PIPPIN" run "$tmp/ident.yaml" >"$tmp/raw-ident" 2>&1
grep -o "step [0-9]*: loss [0-9.]*" "$tmp/raw-orig" >"$tmp/r-orig"
grep -o "step [0-9]*: loss [0-9.]*" "$tmp/raw-ident" >"$tmp/r-ident"
grep "error" "$tmp/raw-ident" >"$tmp/err"
[ "$(wc -l <"$tmp/r-orig")" -eq 3 ] && cmp -s "$tmp/r-orig" "$tmp/r-ident"
ok $? "split.marker_identity in a config: the workers' losses equal the original's $(head -c 200 "$tmp/err")"

# 7-8: ONNX Runtime runs the model and every stage file, with pippin's outputs
ORT_DIR=${ORT_DIR:-$HOME/.cache/pippin-bench-ort}
if ! command -v node >/dev/null 2>&1 || [ ! -d "$ORT_DIR/node_modules/onnxruntime-node" ]; then
    ok 0 "ONNX Runtime loads the function form # SKIP no onnxruntime-node under $ORT_DIR"
    ok 0 "ONNX Runtime runs each stage file # SKIP no onnxruntime-node under $ORT_DIR"
else
    export ORT_DIR
    close() { # FILE_A FILE_B: float32 arrays equal within 1e-5 relative
        $PY -c "import numpy as np, sys; a, b = np.load(sys.argv[1]), np.load(sys.argv[2]); \
assert a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-6), (a.shape, b.shape, abs(a - b).max())" "$1" "$2"
    }
    "$PIPPIN" infer "$M/model_function.onnx" --input "x=$M/x.npy" --input "y=$M/y.npy" --output-dir "$tmp/pp" \
        >/dev/null 2>"$tmp/err" &&
        node "$HERE/ort_run.js" "$M/model_function.onnx" "$tmp/ort" "x=$M/x.npy" "y=$M/y.npy" 2>>"$tmp/err" &&
        close "$tmp/pp/loss.npy" "$tmp/ort/loss.npy" 2>>"$tmp/err" && close "$tmp/pp/logits.npy" "$tmp/ort/logits.npy" 2>>"$tmp/err"
    ok $? "ONNX Runtime runs the function form with pippin's loss and logits $(head -c 300 "$tmp/err")"
    # each stage file, fed pippin's outputs of the stage before
    "$PIPPIN" split "$M/model_function.onnx" -o "$tmp/st" >/dev/null 2>"$tmp/err"
    rc=$?
    feeds="x=$M/x.npy"
    for k in 0 1 2; do
        [ $rc -eq 0 ] || break
        [ $k -eq 2 ] && feeds="$feeds y=$M/y.npy"
        args=""
        for f in $feeds; do args="$args --input $f"; done
        # shellcheck disable=SC2086
        "$PIPPIN" infer "$tmp/st/stage_$k.onnx" $args --output-dir "$tmp/pp$k" >/dev/null 2>>"$tmp/err" &&
            node "$HERE/ort_run.js" "$tmp/st/stage_$k.onnx" "$tmp/ort$k" $feeds 2>>"$tmp/err" || { rc=1; break; }
        next=""
        for f in "$tmp/pp$k"/*.npy; do
            close "$f" "$tmp/ort$k/$(basename "$f")" 2>>"$tmp/err" || rc=1
            name=$($PY -c "import onnx, sys; m = onnx.load(sys.argv[1]); print(' '.join(o.name for o in m.graph.output))" \
                "$tmp/st/stage_$k.onnx")
        done
        for o in $name; do next="$next $o=$tmp/pp$k/$(echo "$o" | tr '/:' '__').npy"; done
        feeds=$next
    done
    ok $rc "ONNX Runtime runs each of the 3 stage files with pippin's outputs $(head -c 300 "$tmp/err")"
fi
echo "1..$n"
[ "$fails" -eq 0 ]
