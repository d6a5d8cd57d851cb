#!/bin/sh
# ONNX external data from the command line: `pippin split --external-data`
# writes stage_K.onnx.data side files that onnx.checker accepts (offsets
# aligned for mapping); a model whose weights are external data (the
# external fixture: mlp re-saved by onnx) trains and infers exactly as the
# original; a missing side file is an error naming it. TAP output.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
# 1-2: split with forced external data
out=$tmp/split
"$PIPPIN" split "$FX/mlp/model.onnx" --external-data -o "$out" >"$tmp/log" 2>&1
ok $? "split --external-data: $(tail -1 "$tmp/log")"
if ! $PY -c "import onnx" 2>/dev/null; then
    ok 0 "onnx.checker # SKIP python3-onnx is not installed"
elif $PY - "$out" >"$tmp/log" 2>&1 <<'PYEOF'
import glob, os, sys
import onnx
d = sys.argv[1]
files = sorted(glob.glob(d + "/stage_*.onnx"))
assert len(files) == 3, files
for f in files:
    assert os.path.exists(f + ".data"), f + ".data missing"
    onnx.checker.check_model(f, full_check=True)
    m = onnx.load(f, load_external_data=False)
    ext = [t for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert ext, f + ": no external initializer"
    for t in ext:
        kv = {e.key: e.value for e in t.external_data}
        assert kv["location"] == os.path.basename(f) + ".data", kv
        assert int(kv["offset"]) % 64 == 0, kv
    onnx.load(f)  # reads the side file
PYEOF
then
    ok 0 "stage files with external data pass onnx.checker, offsets aligned"
else
    ok 1 "stage files with external data: $(tail -3 "$tmp/log")"
fi

# 3: training the external-data model gives the original's losses
train() {
    "$PIPPIN" train "$1" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 \
        --steps 3 --json 2>"$tmp/err" | grep -v '"seconds"\|time' >"$2"
}
train "$FX/mlp/model.onnx" "$tmp/train-mlp" && train "$FX/external/model.onnx" "$tmp/train-ext" &&
    [ -s "$tmp/train-mlp" ] && cmp -s "$tmp/train-mlp" "$tmp/train-ext"
ok $? "train on the external-data model equals the original: $(head -c 200 "$tmp/err")"

# 4: so does inference
"$PIPPIN" infer "$FX/mlp/model.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --output-dir "$tmp/i1" \
    >/dev/null 2>"$tmp/err" &&
    "$PIPPIN" infer "$FX/external/model.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" \
        --output-dir "$tmp/i2" >/dev/null 2>>"$tmp/err" &&
    cmp -s "$tmp/i1/loss.npy" "$tmp/i2/loss.npy" && cmp -s "$tmp/i1/logits.npy" "$tmp/i2/logits.npy"
ok $? "infer on the external-data model equals the original $(head -c 200 "$tmp/err")"

# 5: a small model split without the flag keeps its weights inline
"$PIPPIN" split "$FX/external/model.onnx" -o "$tmp/inline" >/dev/null 2>"$tmp/err" &&
    [ -f "$tmp/inline/stage_0.onnx" ] && ! ls "$tmp/inline" | grep -q '\.data$'
ok $? "split of the external-data model without --external-data writes no side file"

# 6: a model without its side file is refused, naming the file and the initializer
mkdir "$tmp/lonely" && cp "$FX/external/model.onnx" "$tmp/lonely/"
expect 1 "model.data" "missing side file is an error naming it" -- inspect "$tmp/lonely/model.onnx"
grep -qF "fc1.weight" "$tmp/err" || echo "# message does not name the initializer: $(cat "$tmp/err")"
echo "1..$n"
exit 0
