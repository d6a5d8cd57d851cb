#!/bin/sh
# pippin train --transport: every rank a thread with its own ZeroMQ
# transport gives exactly the local runner's losses (bit for bit, compared
# as printed with 9 digits). TAP output.
. "$(dirname "$0")/tap.sh"
compare() { # DESCRIPTION -- ARGS...
    desc=$1
    shift 2
    n=$((n + 1))
    if ! "$PIPPIN" train "$@" --json >"$tmp/local" 2>"$tmp/err"; then
        echo "not ok $n - $desc: local run failed: $(head -c 300 "$tmp/err")"
        return
    fi
    for tr in inproc ipc tcp; do
        if ! "$PIPPIN" train "$@" --json --transport $tr >"$tmp/$tr" 2>"$tmp/err"; then
            echo "not ok $n - $desc over $tr: $(head -c 300 "$tmp/err")"
            return
        fi
        if ! cmp -s "$tmp/local" "$tmp/$tr"; then
            echo "not ok $n - $desc over $tr: losses differ: $(diff "$tmp/local" "$tmp/$tr" | head -4)"
            return
        fi
    done
    echo "ok $n - $desc: $(wc -l <"$tmp/local") steps, same losses over inproc, ipc and tcp"
}
compare "mlp 1f1b adamw" -- "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" \
    --batch-size 4 --microbatches 2 --schedule 1f1b --steps 3 --optimizer adamw --lr 0.01
compare "gpt example zbv (tied embedding replicas on one rank)" -- "$SRC/examples/gpt/model.onnx" \
    --text "$SRC/examples/data/tiny.txt" --vocab "$SRC/examples/gpt/vocab.json" --batch-size 8 --microbatches 4 \
    --schedule zbv --steps 3 --optimizer adamw --lr 3e-3
compare "gpt example interleaved-1f1b sgd" -- "$SRC/examples/gpt/model.onnx" \
    --text "$SRC/examples/data/tiny.txt" --vocab "$SRC/examples/gpt/vocab.json" --batch-size 8 --microbatches 2 \
    --schedule interleaved-1f1b --steps 3 --optimizer sgd --lr 0.1 --momentum 0.9
compare "skip zb-h1 (skip connection across 3 ranks)" -- "$FX/skip/model.onnx" --data "x=$FX/skip/train_x.npy" \
    --data "y=$FX/skip/train_y.npy" --batch-size 4 --microbatches 4 --schedule zb-h1 --steps 3 --optimizer adamw
n=$((n + 1))
if "$PIPPIN" train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" \
    --batch-size 4 --steps 1 --transport carrier-pigeon >/dev/null 2>"$tmp/err"; then
    echo "not ok $n - unknown transport accepted"
elif grep -q "inproc, ipc or tcp" "$tmp/err"; then
    echo "ok $n - unknown transport refused with the choices named"
else
    echo "not ok $n - unknown transport: $(cat "$tmp/err")"
fi
# --checkpoint / --resume: stopping after 3 steps and resuming gives exactly
# the losses of 5 uninterrupted steps (local runner, and ranks over tcp).
for mode in local tcp; do
    n=$((n + 1))
    extra=""
    [ $mode = tcp ] && extra="--transport tcp"
    for opt in "--optimizer adamw" "--optimizer sgd --lr 0.05 --momentum 0.9"; do
        ck="$tmp/ck-$mode"
        rm -rf "$ck"
        set -- "$SRC/examples/gpt/model.onnx" --text "$SRC/examples/data/tiny.txt" --vocab "$SRC/examples/gpt/vocab.json" \
            --batch-size 8 --microbatches 2 --schedule zbv $opt --json $extra
        "$PIPPIN" train "$@" --steps 5 >"$tmp/full" 2>"$tmp/err" &&
            "$PIPPIN" train "$@" --steps 3 --checkpoint "$ck" --checkpoint-every 2 >/dev/null 2>>"$tmp/err" &&
            "$PIPPIN" train "$@" --steps 5 --checkpoint "$ck" --resume >"$tmp/resumed" 2>>"$tmp/err"
        if [ $? -ne 0 ] || [ "$(tail -2 "$tmp/full")" != "$(cat "$tmp/resumed")" ]; then
            echo "not ok $n - resume ($mode, $opt): $(head -c 300 "$tmp/err") $(cat "$tmp/resumed")"
            continue 2
        fi
    done
    echo "ok $n - checkpoint after 3 steps + resume = 5 uninterrupted steps, bit for bit ($mode; adamw and sgd momentum)"
done
n=$((n + 1))
if "$PIPPIN" train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" \
    --batch-size 4 --steps 2 --checkpoint "$tmp/none" --resume >/dev/null 2>"$tmp/err"; then
    echo "not ok $n - resume from an empty directory succeeded"
elif grep -q "no checkpoint here" "$tmp/err"; then
    echo "ok $n - resume without a checkpoint: $(head -c 120 "$tmp/err")"
else
    echo "not ok $n - resume without a checkpoint: $(cat "$tmp/err")"
fi
# a stage without parameters (split before /Tanh: stage 2 holds only
# elementwise ops) has its checkpoint file too; resume is bit for bit
n=$((n + 1))
set -- "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 \
    --split-before /Tanh --microbatches 2 --schedule 1f1b --json --transport tcp
if "$PIPPIN" train "$@" --steps 3 >"$tmp/full" 2>"$tmp/err" &&
    "$PIPPIN" train "$@" --steps 2 --checkpoint "$tmp/ck-noparam" >/dev/null 2>>"$tmp/err" &&
    "$PIPPIN" train "$@" --steps 3 --checkpoint "$tmp/ck-noparam" --resume >"$tmp/resumed" 2>>"$tmp/err" &&
    [ "$(tail -1 "$tmp/full")" = "$(cat "$tmp/resumed")" ] && [ -f "$tmp/ck-noparam/step_2/stage_2.safetensors" ]; then
    echo "ok $n - checkpoint and resume with a stage that has no parameters"
else
    echo "not ok $n - stage without parameters: $(head -c 300 "$tmp/err")"
fi
# a fresh run in a directory that holds another run's committed steps is
# refused (keep and resume would mix the two runs)
n=$((n + 1))
set -- "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 \
    --microbatches 2 --schedule 1f1b --transport tcp
"$PIPPIN" train "$@" --steps 3 --checkpoint "$tmp/ck-old" >/dev/null 2>"$tmp/err"
if "$PIPPIN" train "$@" --steps 2 --checkpoint "$tmp/ck-old" >/dev/null 2>"$tmp/err"; then
    echo "not ok $n - a fresh run wrote into another run's checkpoints"
elif grep -q "holds committed checkpoints up to step 2 of an earlier run" "$tmp/err" &&
    [ "$(ls "$tmp/ck-old")" = "step_2" ]; then
    echo "ok $n - fresh run into another run's checkpoints refused, nothing touched: $(head -c 150 "$tmp/err")"
else
    echo "not ok $n - fresh run into another run's checkpoints: $(cat "$tmp/err"; ls "$tmp/ck-old")"
fi
# a checkpoint edited to a negative optimizer step count is refused, naming
# the file, rather than turning AdamW's parameters into NaN (the file's hash
# covers its metadata, so the edit shows as damage)
n=$((n + 1))
ck="$tmp/ck-neg"
set -- "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4
if "$PIPPIN" train "$@" --steps 2 --checkpoint "$ck" --checkpoint-every 1 >/dev/null 2>"$tmp/err"; then
    # rewrite each stage file's safetensors header (8-byte length, JSON, padding to 8)
    for f in "$ck"/step_1/stage_*.safetensors; do
        perl -e 'local $/; open(F, "<", $ARGV[0]) or die; binmode F; my $b = <F>; close F;
            my $n = unpack("Q<", substr($b, 0, 8)); my $h = substr($b, 8, $n); my $d = substr($b, 8 + $n);
            $h =~ s/\s+$//; $h =~ s/"pippin.optimizer_steps":"\d+"/"pippin.optimizer_steps":"-3"/ or die;
            $h .= " " x ((8 - length($h) % 8) % 8);
            open(F, ">", $ARGV[0]) or die; binmode F; print F pack("Q<", length $h), $h, $d; close F' "$f"
    done
    if "$PIPPIN" train "$@" --steps 3 --checkpoint "$ck" --resume >/dev/null 2>"$tmp/err"; then
        echo "not ok $n - a negative optimizer step count in a checkpoint was accepted"
    elif grep -q "stage_0.safetensors: pippin.optimizer_steps is '-3', not a count" "$tmp/err"; then
        # the header is checked before any tensor is read into the stage (the hash comes after)
        echo "ok $n - negative optimizer_steps in a checkpoint refused: $(head -c 160 "$tmp/err")"
    else
        echo "not ok $n - negative optimizer_steps: $(cat "$tmp/err")"
    fi
else
    echo "not ok $n - checkpoint for the negative-steps test: $(cat "$tmp/err")"
fi

# --trace/--svg: the last step's timeline, every compute action of every rank.
n=$((n + 1))
for mode in local tcp; do
    extra=""
    [ $mode = tcp ] && extra="--transport tcp"
    if ! "$PIPPIN" train "$SRC/examples/gpt/model.onnx" --text "$SRC/examples/data/tiny.txt" \
        --vocab "$SRC/examples/gpt/vocab.json" --batch-size 8 --microbatches 4 --schedule zbv --steps 2 \
        --optimizer adamw $extra --trace "$tmp/$mode.json" --svg "$tmp/$mode.svg" >/dev/null 2>"$tmp/err"; then
        echo "not ok $n - trace ($mode): $(head -c 300 "$tmp/err")"
        continue 2
    fi
done
# 4 stages x 4 microbatches x (F, I, W) = 48 compute events on 2 ranks, in JSON
# that parses; over tcp the waits for the other rank's tensors are on the comm
# lane (RECV_F / RECV_B), each ending where its action starts; the local runner
# has none.
count() { grep '"ph":"X"' "$1" | grep -c "\"tid\":$2,"; }
waits_ok() {
    [ ! -x /usr/bin/python3 ] && return 0
    /usr/bin/python3 - "$1" <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
act = {(e["pid"], e["args"]["stage"], e["args"]["mb"], e["name"].lstrip("0123456789")[0]): e
       for e in ev if e["tid"] == 0}
waits = [e for e in ev if e["tid"] == 1]
for w in waits:
    kind = w["name"].lstrip("0123456789")
    a = act.get((w["pid"], w["args"]["stage"], w["args"]["mb"], "F" if kind.startswith("RECV_F") else "I"))
    if not kind.startswith("RECV_") or not a or abs(w["ts"] + w["dur"] - a["ts"]) > 0.01:
        sys.exit("wait %s not right before its action" % w["name"])
sys.exit(0 if waits else "no waits")
PY
}
if [ "$(count "$tmp/local.json" 0)" -eq 48 ] && [ "$(count "$tmp/tcp.json" 0)" -eq 48 ] && \
    [ "$(count "$tmp/local.json" 1)" -eq 0 ] && waits_ok "$tmp/tcp.json" && \
    grep -q '"name":"rank 1"' "$tmp/tcp.json" && grep -q "<svg" "$tmp/tcp.svg"; then
    echo "ok $n - --trace/--svg record the last step's 48 actions on 2 ranks (local runner and tcp), waits apart"
else
    echo "not ok $n - trace: $(count "$tmp/local.json" 0) / $(count "$tmp/tcp.json" 0) events, $(count "$tmp/local.json" 1) / $(count "$tmp/tcp.json" 1) waits"
fi
echo "1..$n"
