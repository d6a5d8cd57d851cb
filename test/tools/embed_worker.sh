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

# Two ranks, two processes: the GPT fixture's 4 stages under zero-bubble V.
"$PIPPIN" train "$FX/gpt/model.onnx" --data "idx=$FX/gpt/train_idx.npy" --data "targets=$FX/gpt/train_targets.npy" \
    --batch-size 4 --microbatches 4 --schedule zbv --steps 2 --optimizer sgd --lr 0.1 >"$tmp/ref2" 2>&1
cat >"$tmp/gpt.yaml" <<YAML
model: $FX/gpt/model.onnx
schedule: zbv
microbatches: 4
batch_size: 4
steps: 2
optimizer: {kind: sgd, lr: 0.1}
data: {idx: $FX/gpt/train_idx.npy, targets: $FX/gpt/train_targets.npy}
ranks: [ipc://$tmp/g0, ipc://$tmp/g1]
timeout_ms: 20000
YAML
n=$((n + 1))
if ! "$EXAMPLE" "$tmp/gpt.yaml" >"$tmp/gpt.txt" 2>"$tmp/gpt.err"; then
    echo "not ok $n - worker_pipeline with 2 ranks failed: $(tail -3 "$tmp/gpt.err")"
elif [ -z "$(losses "$tmp/ref2")" ] || [ "$(losses "$tmp/gpt.txt")" != "$(losses "$tmp/ref2")" ]; then
    echo "not ok $n - 2 ranks: losses $(losses "$tmp/gpt.txt" | tr '\n' ' ') differ from pippin train's $(losses "$tmp/ref2" | tr '\n' ' ')"
else
    echo "ok $n - worker_pipeline: 2 ranks in 2 processes (zbv, 4 stages) match pippin train"
fi

expect_example_fail() { # description, config text
    n=$((n + 1))
    printf '%s\n' "$2" >"$tmp/bad.yaml"
    if "$EXAMPLE" "$tmp/bad.yaml" >"$tmp/bad.out" 2>"$tmp/bad.err"; then
        echo "not ok $n - $1: exit 0"
    elif ! grep -q "bad.yaml" "$tmp/bad.err"; then
        echo "not ok $n - $1: the error does not name the file: $(head -c 200 "$tmp/bad.err" | tr "\n" " ")"
    else
        echo "ok $n - $1: $(head -c 120 "$tmp/bad.err" | tr "\n" " ")"
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
