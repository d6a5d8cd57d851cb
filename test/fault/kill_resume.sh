#!/bin/sh
# Fault suite: random SIGKILLs of a checkpointing 4-rank run (a thread and a
# tcp transport per rank, checkpoint after every step), each followed by a
# resume: every resume finishes with the losses and the trained parameters
# of the uninterrupted run, bit for bit. TAP output.
. "$(dirname "$0")/../tools/tap.sh"
TRIALS=${PIPPIN_FAULT_TRIALS:-20}
STEPS=10
set -- "$SRC/examples/gpt/model.onnx" --text "$SRC/examples/data/tiny.txt" --vocab "$SRC/examples/gpt/vocab.json" \
    --batch-size 8 --microbatches 2 --schedule 1f1b --optimizer adamw --lr 3e-3 --transport tcp --json \
    --steps $STEPS
n=1
if ! "$PIPPIN" train "$@" --save "$tmp/full-params" >"$tmp/full" 2>"$tmp/err"; then
    echo "not ok $n - uninterrupted run: $(head -c 300 "$tmp/err")"
    echo "1..$n"
    exit 0
fi
echo "ok $n - uninterrupted run: $(wc -l <"$tmp/full") steps"
start=$(date +%s%N)
"$PIPPIN" train "$@" --checkpoint "$tmp/timing" --checkpoint-every 1 >/dev/null 2>&1
run_ms=$(( ($(date +%s%N) - start) / 1000000 ))
killed=0 resumed_from_ckpt=0
for trial in $(seq 1 "$TRIALS"); do
    n=$((n + 1))
    ck="$tmp/ck$trial"
    # a kill anywhere in the run, including mid-save
    delay_ms=$(( $(od -An -N2 -tu2 /dev/urandom) % (run_ms + 1) ))
    "$PIPPIN" train "$@" --checkpoint "$ck" --checkpoint-every 1 >"$tmp/part" 2>"$tmp/err" &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
    kill -9 $pid 2>/dev/null && killed=$((killed + 1))
    wait $pid 2>/dev/null
    # resume: from the newest committed step, or from scratch when none was
    if "$PIPPIN" checkpoint list "$ck" 2>/dev/null | grep -q "newest committed"; then
        resumed_from_ckpt=$((resumed_from_ckpt + 1))
        "$PIPPIN" train "$@" --checkpoint "$ck" --resume --save "$tmp/params$trial" >"$tmp/rest" 2>"$tmp/err"
    else
        "$PIPPIN" train "$@" --checkpoint "$ck" --save "$tmp/params$trial" >"$tmp/rest" 2>"$tmp/err"
    fi
    rc=$?
    lines=$(wc -l <"$tmp/rest")
    if [ $rc -ne 0 ]; then
        echo "not ok $n - trial $trial (kill after ${delay_ms} ms): resume failed: $(head -c 300 "$tmp/err")"
    elif [ "$lines" -gt 0 ] && [ "$(tail -n "$lines" "$tmp/full")" != "$(cat "$tmp/rest")" ]; then
        echo "not ok $n - trial $trial (kill after ${delay_ms} ms): losses differ: $(diff "$tmp/full" "$tmp/rest" | head -3)"
    elif ! diff -r "$tmp/full-params" "$tmp/params$trial" >/dev/null; then
        echo "not ok $n - trial $trial (kill after ${delay_ms} ms): trained parameters differ"
    else
        echo "ok $n - trial $trial: killed after ${delay_ms} ms, resumed for the last $lines steps, bit-identical"
        # (0 steps: the kill came after the last step's commit)
    fi
    rm -rf "$ck" "$tmp/params$trial"
done
n=$((n + 1))
# Most kills should land mid-run with a committed step to resume from.
if [ "$resumed_from_ckpt" -ge 1 ]; then
    echo "ok $n - $resumed_from_ckpt of $TRIALS trials resumed from a committed checkpoint ($killed killed mid-run)"
else
    echo "not ok $n - no trial resumed from a checkpoint (run ${run_ms} ms)"
fi
echo "1..$n"
