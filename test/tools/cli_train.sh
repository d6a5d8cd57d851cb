#!/bin/sh
# pippin grad and pippin train: outputs, torch's loss trajectories
# (train_ref.json), exit codes and messages. TAP.
. "$(dirname "$0")/tap.sh"

# The losses of optimizer $2 in $1/train_ref.json, one per line.
ref_losses() {
    awk -v opt="\"$2\": {" '
        index($0, opt) { inopt = 1 }
        inopt && /"losses"/ { inl = 1; next }
        inl && /\]/ { exit }
        inl { gsub(/[ ,]/, ""); print }' "$1/train_ref.json"
}

# Compares the {"step": i, "loss": x} lines in $tmp/out with ref_losses.
check_losses() {
    grep -o '"loss": [-0-9.e]*' "$tmp/out" | sed 's/"loss": //' >"$tmp/got"
    ref_losses "$1" "$2" >"$tmp/want"
    [ -s "$tmp/want" ] && [ "$(wc -l <"$tmp/got")" -eq "$(wc -l <"$tmp/want")" ] &&
        paste "$tmp/got" "$tmp/want" |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) bad = 1 } END { exit bad }'
}

# grad
expect 0 "gradients of 6 parameters" "grad mlp" -- grad "$FX/mlp/model.onnx" \
    --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --out "$tmp/g"
count=$(ls "$tmp/g" | grep -c '^grad_fc[123]\.\(weight\|bias\)\.npy$')
[ "$count" -eq 6 ] && [ -f "$tmp/g/loss.npy" ]
ok $? "grad wrote loss.npy and one grad_<initializer>.npy per parameter"
expect 0 "" "grad gpt" -- \
    grad "$FX/gpt/model.onnx" --input "idx=$FX/gpt/idx.npy" --input "targets=$FX/gpt/targets.npy" --out "$tmp/gg"
[ "$(ls "$tmp/gg" | grep -c '^grad_')" -eq 52 ] && [ -f "$tmp/gg/grad_tok_emb.weight.npy" ] &&
    [ ! -f "$tmp/gg/grad_blocks.0.attn.mask.npy" ]
ok $? "grad gpt wrote 52 gradients (tied embedding once, none for the causal-mask buffers)"
expect 0 "gradients of 6 parameters" "grad cnn (Conv)" -- grad "$FX/cnn/model.onnx" \
    --input "x=$FX/cnn/x.npy" --input "y=$FX/cnn/y.npy" --microbatches 2 --schedule 1f1b --out "$tmp/gc"
[ "$(ls "$tmp/gc" | grep -c '^grad_conv[12]\.\(weight\|bias\)\.npy$')" -eq 4 ]
ok $? "grad cnn wrote the conv gradients"

# Regression: float buffers and requires_grad=False parameters were trained.
expect 0 "frozen: 76 (0.3 KiB), never trained: gain, mask, fc2.weight" "inspect shows buffers as frozen" -- \
    inspect "$FX/buffer/model.onnx"
expect 0 "parameters: 76 (0.3 KiB) trainable" "inspect counts trainable parameters apart" -- \
    inspect "$FX/buffer/model.onnx"
expect 0 "" "grad buffer" -- grad "$FX/buffer/model.onnx" --input "x=$FX/buffer/x.npy" \
    --input "y=$FX/buffer/y.npy" --out "$tmp/gb"
[ "$(ls "$tmp/gb" | grep -c '^grad_')" -eq 3 ] && [ ! -f "$tmp/gb/grad_mask.npy" ] && [ ! -f "$tmp/gb/grad_gain.npy" ]
ok $? "grad buffer wrote gradients of the 3 trainable parameters only"
expect 0 "" "grad --freeze" -- grad "$FX/buffer/model.onnx" --input "x=$FX/buffer/x.npy" \
    --input "y=$FX/buffer/y.npy" --out "$tmp/gf" --freeze 'fc1.*'
[ "$(ls "$tmp/gf" | grep -c '^grad_')" -eq 1 ] && [ -f "$tmp/gf/grad_fc2.bias.npy" ]
ok $? "grad --freeze 'fc1.*' leaves only fc2.bias trainable"
expect 1 "freeze pattern 'nothing*' matches no trainable initializer" "--freeze matching nothing" -- \
    inspect "$FX/buffer/model.onnx" --freeze 'nothing*'
"$PIPPIN" split "$FX/buffer/model.onnx" -o "$tmp/bs" >/dev/null 2>&1 &&
    "$PIPPIN" inspect "$tmp/bs/stage_1.onnx" 2>&1 | grep -qF "never trained: mask, fc2.weight"
ok $? "stage files keep buffers and frozen parameters frozen"
expect 1 "training needs a float scalar loss" "grad with a non-scalar loss" -- grad "$FX/mlp/model.onnx" \
    --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --out "$tmp/g" --loss logits
expect 1 "no output 'nope'" "grad with an unknown loss" -- grad "$FX/mlp/model.onnx" \
    --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --out "$tmp/g" --loss nope
expect 1 "input 'y' not given" "grad with a missing input" -- grad "$FX/mlp/model.onnx" \
    --input "x=$FX/mlp/x.npy" --out "$tmp/g"
expect 2 "" "grad without --out" -- grad "$FX/mlp/model.onnx" --input "x=$FX/mlp/x.npy"

# train: torch's trajectories
for m in mlp gpt skip buffer cnn; do
    if [ $m = gpt ]; then data="--data idx=$FX/gpt/train_idx.npy --data targets=$FX/gpt/train_targets.npy"
    else data="--data x=$FX/$m/train_x.npy --data y=$FX/$m/train_y.npy"; fi
    bs=$(awk '/"batch_size"/ { gsub(/[^0-9]/, ""); print }' "$FX/$m/train_ref.json")
    # shellcheck disable=SC2086
    "$PIPPIN" train "$FX/$m/model.onnx" $data --batch-size "$bs" --steps 3 --json \
        --optimizer sgd --lr 0.1 --momentum 0.9 --weight-decay 0.01 >"$tmp/out" 2>"$tmp/err"
    check_losses "$FX/$m" sgd
    ok $? "train $m sgd (momentum, weight decay) matches torch"
    # shellcheck disable=SC2086
    "$PIPPIN" train "$FX/$m/model.onnx" $data --batch-size "$bs" --steps 3 --json \
        --optimizer sgd --lr 0.1 --momentum 0.9 --nesterov >"$tmp/out" 2>"$tmp/err"
    check_losses "$FX/$m" sgd_nesterov
    ok $? "train $m sgd nesterov matches torch"
    # shellcheck disable=SC2086
    "$PIPPIN" train "$FX/$m/model.onnx" $data --batch-size "$bs" --steps 3 --json \
        --optimizer adamw --lr 0.01 --beta1 0.9 --beta2 0.999 --eps 1e-8 --weight-decay 0.01 \
        --microbatches 2 >"$tmp/out" 2>"$tmp/err"
    check_losses "$FX/$m" adamw
    ok $? "train $m adamw with 2 microbatches matches torch"
done
expect 0 "step 1: loss" "train prints one line per step" -- train "$FX/mlp/model.onnx" \
    --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 3 --steps 2 \
    --save "$tmp/p"
[ -f "$tmp/p/fc1.weight.npy" ]
ok $? "train --save wrote the parameters"
# BatchNorm's running statistics are state: --save writes them, checkpoints
# hold them, and a resumed run ends where an uninterrupted one does
bn="$FX/bn/model.onnx --data x=$FX/bn/x.npy --data y=$FX/bn/y.npy --batch-size 4 --microbatches 2 --schedule 1f1b"
# shellcheck disable=SC2086
"$PIPPIN" train $bn --steps 4 --save "$tmp/bn-full" >/dev/null 2>"$tmp/err"
ok $? "train bn: $(head -c 200 "$tmp/err")"
[ -f "$tmp/bn-full/bn1.running_mean.npy" ] && [ -f "$tmp/bn-full/bn3.running_var.npy" ] &&
    ! cmp -s "$tmp/bn-full/bn1.running_mean.npy" "$tmp/bn-full/bn1.running_var.npy"
ok $? "train --save wrote BatchNorm's running statistics"
# shellcheck disable=SC2086
"$PIPPIN" train $bn --steps 2 --checkpoint "$tmp/bn-ck" --checkpoint-every 1 >/dev/null 2>"$tmp/err" &&
    "$PIPPIN" train $bn --steps 4 --checkpoint "$tmp/bn-ck" --checkpoint-every 1 --resume \
        --save "$tmp/bn-resumed" >/dev/null 2>>"$tmp/err" && diff -r "$tmp/bn-full" "$tmp/bn-resumed" >"$tmp/diff"
ok $? "train bn resumed from a checkpoint ends with the uninterrupted run's parameters and statistics: $(cat "$tmp/err" "$tmp/diff" | head -c 300 | tr '\n' ' ')"
# training-mode Dropout (p 0.3): masks are a function of (step, microbatch,
# node), so GPipe, 1F1B, 2 processes over ipc, the single-graph trainer and
# a run resumed from a checkpoint all end with the same parameters
dr="$FX/dropout/model.onnx --data x=$FX/dropout/x.npy --data y=$FX/dropout/y.npy --batch-size 4 --microbatches 2"
# shellcheck disable=SC2086
"$PIPPIN" train $dr --schedule gpipe --steps 4 --save "$tmp/dr-gpipe" >/dev/null 2>"$tmp/err" &&
    "$PIPPIN" train $dr --schedule 1f1b --steps 4 --save "$tmp/dr-1f1b" >/dev/null 2>>"$tmp/err" &&
    "$PIPPIN" train $dr --schedule 1f1b --steps 4 --transport ipc --save "$tmp/dr-ipc" >/dev/null 2>>"$tmp/err" &&
    "$PIPPIN" train $dr --no-split --steps 4 --save "$tmp/dr-unsplit" >/dev/null 2>>"$tmp/err" &&
    "$PIPPIN" train $dr --schedule 1f1b --steps 2 --checkpoint "$tmp/dr-ck" --checkpoint-every 1 >/dev/null 2>>"$tmp/err" &&
    "$PIPPIN" train $dr --schedule 1f1b --steps 4 --checkpoint "$tmp/dr-ck" --resume --save "$tmp/dr-resumed" \
        >/dev/null 2>>"$tmp/err"
ok $? "train with dropout under 5 set-ups: $(head -c 300 "$tmp/err")"
same=0
for d in 1f1b ipc unsplit resumed; do diff -r "$tmp/dr-gpipe" "$tmp/dr-$d" >/dev/null || same=1; done
ok $same "dropout: GPipe, 1F1B, ipc ranks, unsplit and resumed runs end bit-identical"
# activation recomputation: the same bits as storing the stash (BatchNorm's
# statistics not updated twice, the same Dropout masks), under 1F1B, ZB-H1
# (I and W apart) and ranks over ipc
# shellcheck disable=SC2086
"$PIPPIN" train $bn --steps 4 --recompute --save "$tmp/bn-rc" >"$tmp/out" 2>"$tmp/err" &&
    diff -r "$tmp/bn-full" "$tmp/bn-rc" >"$tmp/diff" && grep -q "recompute stage 1: stash" "$tmp/out"
ok $? "train bn --recompute ends with the parameters and statistics of a run without: $(cat "$tmp/err" "$tmp/diff" | head -c 300 | tr '\n' ' ')"
# shellcheck disable=SC2086
"$PIPPIN" train $dr --schedule 1f1b --steps 4 --recompute --save "$tmp/dr-rc" >/dev/null 2>"$tmp/err" &&
    "$PIPPIN" train $dr --schedule zb-h1 --steps 4 --recompute-stages 0 --save "$tmp/dr-rc0" >/dev/null 2>>"$tmp/err" &&
    "$PIPPIN" train $dr --schedule 1f1b --steps 4 --recompute-stages 1,0 --transport ipc --save "$tmp/dr-rc-ipc" \
        >/dev/null 2>>"$tmp/err" &&
    diff -r "$tmp/dr-gpipe" "$tmp/dr-rc" >"$tmp/diff" && diff -r "$tmp/dr-gpipe" "$tmp/dr-rc0" >>"$tmp/diff" &&
    diff -r "$tmp/dr-gpipe" "$tmp/dr-rc-ipc" >>"$tmp/diff"
ok $? "train dropout with recomputation (1F1B, ZB-H1 on stage 0, ipc ranks) is bit-identical: $(cat "$tmp/err" "$tmp/diff" | head -c 300 | tr '\n' ' ')"
"$PIPPIN" inspect "$FX/dropout/model.onnx" --json --backward >"$tmp/insp.json" 2>"$tmp/err" &&
    python3 -c "import json; d = json.load(open('$tmp/insp.json')); s = d['stages']; \
assert all(0 < x['recompute_stash_bytes_per_sample'] < x['stash_bytes_per_sample'] for x in s), s; \
t = d['training_graph']; assert t['recompute_stash_bytes_per_sample'] < t['stash_bytes_per_sample'], t; \
g = t['gemm_scratch_bytes_per_thread']; assert g == 0 or 4 << 20 <= g <= 16 << 20, t"
ok $? "inspect shows the stash per sample with recomputation, smaller, and the GEMM scratch per thread: $(head -c 300 "$tmp/err")"
# The memory plan (lib/mem_plan.c): the same bits with it off, and inspect reports its peak.
gd="$FX/gpt/model.onnx --data idx=$FX/gpt/train_idx.npy --data targets=$FX/gpt/train_targets.npy --batch-size 4"
# shellcheck disable=SC2086
"$PIPPIN" train $gd --microbatches 4 --schedule 1f1b --steps 3 --save "$tmp/plan-on" >/dev/null 2>"$tmp/err" &&
    PIPPIN_MEMORY_PLAN=0 "$PIPPIN" train $gd --microbatches 4 --schedule 1f1b --steps 3 --save "$tmp/plan-off" \
        >/dev/null 2>>"$tmp/err" &&
    diff -r "$tmp/plan-on" "$tmp/plan-off" >"$tmp/diff"
ok $? "train gpt (1F1B, 4 microbatches) with the memory plan on and off is bit-identical: $(cat "$tmp/err" "$tmp/diff" | head -c 300 | tr '\n' ' ')"
"$PIPPIN" inspect "$FX/gpt/model.onnx" --json --backward >"$tmp/insp.json" 2>"$tmp/err" &&
    python3 -c "import json; d = json.load(open('$tmp/insp.json')); s = d['stages']; \
assert all(x['plan_bytes_per_sample'] > 0 and x['plan_fixed_bytes'] is not None for x in s), s; \
assert all(x['plan_phases']['W']['fixed_bytes'] > 0 and x['plan_fixed_bytes'] >= x['plan_phases']['W']['fixed_bytes'] for x in s), s; \
t = d['training_graph']; assert t['plan_bytes_per_sample'] > 0 and t['plan_bytes_per_sample'] + t['plan_fixed_bytes'] > 0, t" &&
    "$PIPPIN" inspect "$FX/gpt/model.onnx" --backward >"$tmp/insp.txt" 2>>"$tmp/err" &&
    grep -q "plan/sample" "$tmp/insp.txt" && grep -q "^memory plan (covers each of F, I and W): .* per sample" "$tmp/insp.txt"
ok $? "inspect reports each stage's memory plan and the training graph's: $(head -c 300 "$tmp/err")"
# shellcheck disable=SC2086
expect 1 "--recompute-stages: stage 7, but the pipeline has 2 stages (0-1)" "train --recompute-stages past the stages" -- \
    train $dr --steps 1 --recompute-stages 0,7
# shellcheck disable=SC2086
expect 2 "--recompute-stages '0,x': expected stage indices separated by commas" "train --recompute-stages 0,x" -- \
    train $dr --steps 1 --recompute-stages 0,x
# shellcheck disable=SC2086
expect 2 "stage 1 is listed twice" "train --recompute-stages 1,1" -- train $dr --steps 1 --recompute-stages 1,1
# shellcheck disable=SC2086
expect 2 "exclude each other" "train --recompute with --recompute-stages" -- \
    train $dr --steps 1 --recompute --recompute-stages 1
expect 1 "--recompute: the model has no stages" "train --recompute without stages" -- train "$FX/mlp/model.onnx" \
    --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 --steps 1 --recompute --no-split
expect 2 "unknown optimizer 'adam'" "train with an unknown optimizer" -- train "$FX/mlp/model.onnx" \
    --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 --steps 1 --optimizer adam
expect 2 "nesterov" "train nesterov without momentum" -- train "$FX/mlp/model.onnx" \
    --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 --steps 1 --nesterov
expect 2 "--lr expects a number" "train with a bad number" -- train "$FX/mlp/model.onnx" \
    --data "x=$FX/mlp/train_x.npy" --batch-size 4 --steps 1 --lr fast
expect 2 "" "train without --batch-size" -- train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --steps 1
expect 1 "no input 'z'" "train with unknown data" -- train "$FX/mlp/model.onnx" \
    --data "z=$FX/mlp/train_x.npy" --batch-size 4 --steps 1
expect 0 "usage: pippin train" "train --help" -- train --help

echo "1..$n"
[ "$fails" -eq 0 ]
