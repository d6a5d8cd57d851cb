#!/bin/sh
# examples/embed/worker_pipeline: the worker API in one process per rank
# gives the losses `pippin train` prints for the same pipeline. TAP.
# $1: the pippin binary, $2: the example binary.
. "$(dirname "$0")/tap.sh"
EXAMPLE=$2
losses() { grep -o "loss [0-9.]*" "$1"; }

"$PIPPIN" train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" \
    --batch-size 4 --microbatches 2 --schedule 1f1b --steps 3 --optimizer adamw --lr 0.01 \
    --weight-decay 0.01 >"$tmp/ref" 2>&1
cat >"$tmp/mlp.yaml" <<YAML
model: $FX/mlp/model.onnx
schedule: 1f1b
microbatches: 2
batch_size: 4
steps: 3
optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}
data: {x: $FX/mlp/train_x.npy, y: $FX/mlp/train_y.npy}
ranks: [ipc://$tmp/r0, ipc://$tmp/r1, ipc://$tmp/r2]
timeout_ms: 20000
output_dir: $tmp/out
YAML
n=$((n + 1))
if ! "$EXAMPLE" "$tmp/mlp.yaml" >"$tmp/out.txt" 2>"$tmp/err.txt"; then
    echo "not ok $n - worker_pipeline failed: $(tail -3 "$tmp/err.txt")"
elif [ "$(losses "$tmp/out.txt")" != "$(losses "$tmp/ref")" ]; then
    echo "not ok $n - worker_pipeline losses $(losses "$tmp/out.txt" | tr '\n' ' ') differ from pippin train's $(losses "$tmp/ref" | tr '\n' ' ')"
elif [ "$(ls "$tmp/out" | wc -l)" -ne 6 ] || ! grep -q "all ranks done" "$tmp/out.txt"; then
    echo "not ok $n - worker_pipeline: expected 6 parameter files and 'all ranks done'"
else
    echo "ok $n - worker_pipeline: 3 processes through the worker API match pippin train and save 6 parameters"
fi

expect_example_fail() { # description, config text
    n=$((n + 1))
    printf '%s\n' "$2" >"$tmp/bad.yaml"
    if "$EXAMPLE" "$tmp/bad.yaml" >"$tmp/bad.out" 2>"$tmp/bad.err"; then
        echo "not ok $n - $1: exit 0"
    elif ! grep -q "bad.yaml" "$tmp/bad.err"; then
        echo "not ok $n - $1: the error does not name the file: $(head -c 200 "$tmp/bad.err")"
    else
        echo "ok $n - $1: $(head -c 120 "$tmp/bad.err")"
    fi
}
expect_example_fail "a config with a missing key fails, naming the file" "model: $FX/mlp/model.onnx
ranks: [ipc://$tmp/q0]"
expect_example_fail "data for an input the model lacks is refused, naming the file" "model: $FX/mlp/model.onnx
schedule: 1f1b
batch_size: 4
data: {x: $FX/mlp/train_x.npy, y: $FX/mlp/train_y.npy, z: $FX/mlp/train_y.npy}
ranks: [ipc://$tmp/q0, ipc://$tmp/q1, ipc://$tmp/q2]
timeout_ms: 3000"

echo "1..$n"
[ "$fails" -eq 0 ]
