#!/bin/sh
# pippin split --auto N: balanced stage files that pippin run (stages:),
# pippin train and pippin infer accept, with the unsplit model's losses and
# outputs; config split: {auto: N}; the even split; refusals. TAP.
. "$(dirname "$0")/tap.sh"
losses() { grep -o "^step [0-9]*: loss [0-9.]*" "$1"; }
FX=$(cd "$FX" && pwd) # the configs resolve paths against their own directory
M=$FX/uneven/model.onnx
DATA="--data x=$FX/uneven/x.npy --data y=$FX/uneven/y.npy"

# The reference: the unsplit model, gradients accumulated over 2 microbatches.
"$PIPPIN" train "$M" $DATA --batch-size 8 --microbatches 2 --steps 3 --optimizer adamw --lr 0.01 >"$tmp/ref" 2>&1
ok $? "unsplit reference trains"

"$PIPPIN" split "$M" --auto 3 --auto-batch 16 --microbatches 2 -o "$tmp/split" >"$tmp/split.out" 2>&1
rc=$?
stages=$(ls "$tmp/split" 2>/dev/null | grep -c '^stage_[0-9]*\.onnx$')
if [ $rc -ne 0 ] || [ "$stages" -ne 3 ] || [ ! -f "$tmp/split/pipe.json" ]; then
    ok 1 "split --auto 3: exit $rc, $stages stage files: $(tail -3 "$tmp/split.out")"
else
    ok 0 "split --auto 3 writes 3 stage files and pipe.json"
fi
grep -q "simulated 1F1B step (M=2): balanced" "$tmp/split.out"
ok $? "split --auto prints the plan and the simulated comparison with the even split"

cat >"$tmp/stages.yaml" <<YAML
stages: $tmp/split
mode: train
schedule: 1f1b
microbatches: 2
batch_size: 8
steps: 3
optimizer: {kind: adamw, lr: 0.01}
data: {x: $FX/uneven/x.npy, y: $FX/uneven/y.npy}
ranks: [ipc://$tmp/r0, ipc://$tmp/r1, ipc://$tmp/r2]
timeout_ms: 20000
YAML
if ! "$PIPPIN" run "$tmp/stages.yaml" >"$tmp/stages.out" 2>"$tmp/stages.err"; then
    ok 1 "pippin run on the --auto stage files failed: $(grep -v killed "$tmp/stages.err" | tail -3)"
else
    [ "$(losses "$tmp/stages.out")" = "$(losses "$tmp/ref")" ]
    ok $? "3 workers on the --auto stage files give the unsplit model's losses"
fi

"$PIPPIN" train "$M" $DATA --batch-size 8 --microbatches 2 --schedule 1f1b --steps 3 --optimizer adamw --lr 0.01 \
    --auto 3 >"$tmp/train.out" 2>&1
[ "$(losses "$tmp/train.out")" = "$(losses "$tmp/ref")" ] && grep -q "^training 3 stages" "$tmp/train.out"
ok $? "train --auto 3 runs 3 stages with the unsplit model's losses"

"$PIPPIN" train "$M" $DATA --batch-size 8 --microbatches 2 --schedule 1f1b --steps 3 --optimizer adamw --lr 0.01 \
    --split-even 3 >"$tmp/even.out" 2>&1
[ "$(losses "$tmp/even.out")" = "$(losses "$tmp/ref")" ] && grep -q "^training 3 stages" "$tmp/even.out"
ok $? "train --split-even 3 runs 3 stages with the unsplit model's losses"

"$PIPPIN" infer "$M" --input "x=$FX/uneven/x.npy" --input "y=$FX/uneven/y.npy" --output-dir "$tmp/inf0" >/dev/null 2>&1 &&
    "$PIPPIN" infer "$M" --input "x=$FX/uneven/x.npy" --input "y=$FX/uneven/y.npy" --auto 3 \
        --output-dir "$tmp/inf3" >/dev/null 2>&1 && cmp -s "$tmp/inf0/loss.npy" "$tmp/inf3/loss.npy"
ok $? "infer --auto 3 gives the unsplit loss bit for bit"

sed -e "s|^stages: .*|model: $M|" "$tmp/stages.yaml" >"$tmp/auto.yaml"
echo "split: {auto: 3}" >>"$tmp/auto.yaml"
if ! "$PIPPIN" run "$tmp/auto.yaml" >"$tmp/auto.out" 2>"$tmp/auto.err"; then
    ok 1 "pippin run with split: {auto: 3} failed: $(tail -3 "$tmp/auto.err")"
else
    [ "$(losses "$tmp/auto.out")" = "$(losses "$tmp/ref")" ]
    ok $? "config split: {auto: 3}: 3 workers agree on the cuts and give the unsplit model's losses"
fi

expect 1 "at most" "split --auto with more stages than nodes is refused" -- split "$M" --auto 1000 -o "$tmp/x"
expect 2 "need a count" "split --auto 0 is a usage error" -- split "$M" --auto 0 -o "$tmp/x"
expect 1 "memory cap" "split --auto under an impossible memory cap is refused" -- \
    split "$M" --auto 3 --auto-memory-cap 1K -o "$tmp/x"
expect 1 "no --split-before" "--auto with --split-before is refused" -- \
    split "$M" --auto 3 --split-before /layers.2/ -o "$tmp/x"
expect 0 "Mop" "split --auto-cost flops counts operations" -- split "$M" --auto 3 --auto-cost flops -o "$tmp/f"
echo "1..$n"
exit 0
