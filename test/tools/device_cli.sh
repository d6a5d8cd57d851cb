#!/bin/sh
# Devices from the command line and the config: `pippin inspect --device`
# says which nodes run where (text and JSON); cuda without a GPU (or a CUDA
# build) is a clear error; workers with `device: fake` / `stage_devices:`
# (the test backend: separate memory, the CPU's kernels) give the losses of
# the CPU run. TAP.
. "$(dirname "$0")/tap.sh"
losses() { grep -o "^step [0-9]*: loss [0-9.]*" "$1"; }

expect 0 "placement on fake: " "inspect --device fake:MatMul,Add places nodes" -- \
    inspect "$FX/gpt/model_nosplit.onnx" --device fake:MatMul,Add
ok "$(grep -c "^  fake  *MatMul " "$tmp/out" | grep -qx 1; echo $?)" "inspect --device: MatMul listed on the device"
ok "$(grep -c "^  cpu  *Softmax " "$tmp/out" | grep -qx 1; echo $?)" "inspect --device: Softmax listed on the CPU"
expect 0 '"placement"' "inspect --json --backward --device lists every node" -- \
    inspect "$FX/mlp/model.onnx" --json --backward --device fake:Gemm,MatMul,Relu
/usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["placement"]
assert p["device"] == "fake" and p["on_device"] > 0 and p["on_cpu"] > 0, p
assert len(p["nodes"]) == p["on_device"] + p["on_cpu"]
assert all(n["device"] == ("fake" if n["op"] in ("Gemm", "MatMul", "Relu") else "cpu") for n in p["nodes"])
' "$tmp/out" 2>"$tmp/err"
ok $? "inspect --json: each node's device follows its op $(tail -1 "$tmp/err")"
if "$PIPPIN" inspect "$FX/mlp/model.onnx" --device cuda:0 >"$tmp/out" 2>"$tmp/err"; then
    ok 0 "inspect --device cuda:0 # SKIP a GPU is present"
else
    grep -q "no CUDA device" "$tmp/err"
    ok $? "inspect --device cuda:0 without a GPU: $(head -c 200 "$tmp/err")"
fi
expect 1 "expected cpu, cuda, cuda:N or fake" "inspect --device gpu is refused" -- \
    inspect "$FX/mlp/model.onnx" --device gpu

# Workers on the fake device train as on the CPU.
port=$((20000 + ($$ + 7) % 12000)) # below the ephemeral range (32768 and up)
for dev in "device: fake:Gemm,MatMul,Relu,Add,Gelu" "stage_devices: [cpu, fake, fake:Gemm]" ""; do
    cat >"$tmp/run.yaml" <<YAML
model: $FX/mlp/model.onnx
mode: train
schedule: 1f1b
microbatches: 2
batch_size: 4
steps: 3
optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}
data: {x: $FX/mlp/train_x.npy, y: $FX/mlp/train_y.npy}
ranks: [ipc://$tmp/r0, ipc://$tmp/r1, ipc://$tmp/r2]
timeout_ms: 20000
$dev
YAML
    name=${dev:-cpu}
    "$PIPPIN" run "$tmp/run.yaml" >"$tmp/run.out" 2>"$tmp/run.err"
    rc=$?
    if [ -z "$dev" ]; then
        cp "$tmp/run.out" "$tmp/ref"
        ok $rc "workers on the CPU train ($(losses "$tmp/run.out" | tail -1))"
    else
        ok $rc "workers with '$name' run $([ $rc -eq 0 ] || tail -2 "$tmp/run.err" | tr '\n' ' ')"
        cp "$tmp/run.out" "$tmp/with_$n"
    fi
done
for f in "$tmp"/with_*; do
    [ "$(losses "$f")" = "$(losses "$tmp/ref")" ]
    ok $? "run $(basename "$f"): the CPU's losses"
done
echo "1..$n"
[ $fails -eq 0 ]
