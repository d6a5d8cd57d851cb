#!/bin/sh
# pippin worker / pippin run from a YAML config: one process per rank over
# ipc and tcp gives the losses `pippin train` prints; a missing peer is
# reported, not waited on forever; bad configs name file and line. TAP.
. "$(dirname "$0")/tap.sh"
losses() { grep -o "^step [0-9]*: loss [0-9.]*" "$1"; }

"$PIPPIN" train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" \
    --batch-size 4 --microbatches 2 --schedule 1f1b --steps 3 --optimizer adamw --lr 0.01 \
    --weight-decay 0.01 >"$tmp/ref" 2>&1

# below the ephemeral range (32768 and up), where other processes' connections
# and listeners (the replicas' direct links) take ports at random
port=$((20000 + $$ % 12000))
for kind in ipc tcp; do
    if [ $kind = ipc ]; then
        r0="ipc://$tmp/r0"; r1="ipc://$tmp/r1"; r2="ipc://$tmp/r2"
    else
        r0="tcp://127.0.0.1:$port"; r1="tcp://127.0.0.1:$((port + 1))"; r2="tcp://127.0.0.1:$((port + 2))"
    fi
    cat >"$tmp/$kind.yaml" <<YAML
model: $FX/mlp/model.onnx
mode: train
schedule: 1f1b
microbatches: 2
batch_size: 4
steps: 3
optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}
data: {x: $FX/mlp/train_x.npy, y: $FX/mlp/train_y.npy}
ranks: [$r0, $r1, $r2]
timeout_ms: 20000
output_dir: $tmp/out-$kind
YAML
    n=$((n + 1))
    if ! "$PIPPIN" run "$tmp/$kind.yaml" >"$tmp/$kind.out" 2>"$tmp/$kind.err"; then
        echo "not ok $n - pippin run over $kind failed: $(tail -3 "$tmp/$kind.err")"
    elif [ "$(losses "$tmp/$kind.out")" != "$(losses "$tmp/ref")" ]; then
        echo "not ok $n - pippin run over $kind: losses differ from pippin train: $(losses "$tmp/$kind.out" | tr '\n' ' ')"
    elif [ "$(ls "$tmp/out-$kind" | wc -l)" -ne 6 ]; then
        echo "not ok $n - pippin run over $kind: expected 6 parameter files, got $(ls "$tmp/out-$kind" | tr '\n' ' ')"
    else
        echo "ok $n - pippin run: 3 worker processes over $kind match pippin train's losses and save 6 parameters"
    fi
    port=$((port + 3))
done

# shared_memory: false keeps every byte on the sockets: same losses.
n=$((n + 1))
sed -e "s|output_dir: .*|output_dir: $tmp/out-noshm|" "$tmp/tcp.yaml" >"$tmp/noshm.yaml"
echo "shared_memory: false" >>"$tmp/noshm.yaml"
if ! "$PIPPIN" run "$tmp/noshm.yaml" >"$tmp/noshm.out" 2>"$tmp/noshm.err"; then
    echo "not ok $n - run with shared_memory: false failed: $(tail -3 "$tmp/noshm.err")"
elif [ "$(losses "$tmp/noshm.out")" != "$(losses "$tmp/ref")" ]; then
    echo "not ok $n - run with shared_memory: false: losses differ: $(losses "$tmp/noshm.out" | tr '\n' ' ')"
else
    echo "ok $n - 3 workers over tcp with shared_memory: false match pippin train"
fi

# freeze: the workers train what `pippin train --freeze` trains.
n=$((n + 1))
"$PIPPIN" train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" \
    --batch-size 4 --microbatches 2 --schedule 1f1b --steps 3 --optimizer adamw --lr 0.01 \
    --weight-decay 0.01 --freeze 'fc2.*' >"$tmp/ref-frozen" 2>&1
sed -e "s|output_dir: .*|output_dir: $tmp/out-frozen|" "$tmp/ipc.yaml" >"$tmp/frozen.yaml"
echo "freeze: [\"fc2.*\"]" >>"$tmp/frozen.yaml"
if ! "$PIPPIN" run "$tmp/frozen.yaml" >"$tmp/frozen.out" 2>"$tmp/frozen.err"; then
    echo "not ok $n - run with freeze failed: $(tail -3 "$tmp/frozen.err")"
elif [ "$(losses "$tmp/frozen.out")" != "$(losses "$tmp/ref-frozen")" ] ||
    [ "$(losses "$tmp/frozen.out")" = "$(losses "$tmp/ref")" ]; then
    echo "not ok $n - run with freeze: losses $(losses "$tmp/frozen.out" | tr '\n' ' ') vs train --freeze's"
elif [ "$(ls "$tmp/out-frozen" | wc -l)" -ne 4 ]; then
    echo "not ok $n - run with freeze: expected 4 parameter files, got $(ls "$tmp/out-frozen" | tr '\n' ' ')"
else
    echo "ok $n - workers with freeze: [fc2.*] match train --freeze and save the 4 trained parameters"
fi

# Stage files: each worker loads pipe.json and only its own stage_K.onnx.
n=$((n + 1))
"$PIPPIN" split "$FX/mlp/model.onnx" -o "$tmp/split" >/dev/null 2>&1
sed -e "s|^model: .*|stages: $tmp/split|" -e "s|output_dir: .*|output_dir: $tmp/out-stages|" "$tmp/ipc.yaml" >"$tmp/stages.yaml"
if ! "$PIPPIN" run "$tmp/stages.yaml" >"$tmp/stages.out" 2>"$tmp/stages.err"; then
    echo "not ok $n - run from stage files failed: $(tail -3 "$tmp/stages.err")"
elif [ "$(losses "$tmp/stages.out")" != "$(losses "$tmp/ref")" ]; then
    echo "not ok $n - run from stage files: losses differ: $(losses "$tmp/stages.out" | tr '\n' ' ')"
else
    echo "ok $n - 3 workers loading only their stage files (pippin split output) match pippin train"
fi

# CURVE: with a key pair per rank every link is encrypted and the losses
# are the same; a worker with a key the others do not list delivers nothing.
n=$((n + 1))
for r in 0 1 2; do "$PIPPIN" keygen -o "$tmp/key$r" >/dev/null 2>&1; done
"$PIPPIN" keygen -o "$tmp/stranger" >/dev/null 2>&1
sed -e "s|output_dir: .*|output_dir: $tmp/out-curve|" "$tmp/ipc.yaml" >"$tmp/curve.yaml"
cat >>"$tmp/curve.yaml" <<YAML
security:
  secret_keys: [$tmp/key0.key, $tmp/key1.key, $tmp/key2.key]
  public_keys: [$tmp/key0.pub, $tmp/key1.pub, $tmp/key2.pub]
YAML
if ! "$PIPPIN" run "$tmp/curve.yaml" >"$tmp/curve.out" 2>"$tmp/curve.err"; then
    echo "not ok $n - CURVE run failed: $(tail -3 "$tmp/curve.err")"
elif [ "$(losses "$tmp/curve.out")" != "$(losses "$tmp/ref")" ]; then
    echo "not ok $n - CURVE run: losses differ"
else
    echo "ok $n - 3 workers over CURVE-encrypted links match pippin train's losses"
fi
n=$((n + 1))
sed -e "s|secret_keys: .*|secret_keys: [$tmp/key0.key, $tmp/stranger.key, $tmp/key2.key]|" \
    -e 's/timeout_ms: 20000/timeout_ms: 1500/' "$tmp/curve.yaml" >"$tmp/impostor.yaml"
if timeout 60 "$PIPPIN" run "$tmp/impostor.yaml" >"$tmp/imp.out" 2>"$tmp/imp.err"; then
    echo "not ok $n - a rank with an unlisted key took part"
elif grep -q "^step" "$tmp/imp.out"; then
    echo "not ok $n - a step completed with an impostor rank"
else
    echo "ok $n - a rank whose key is not listed cannot take part: $(grep -m1 "rank" "$tmp/imp.err" | head -c 150)"
fi

# Inference mode: no backward, outputs written by the rank that computes them.
sed -e 's/^mode: train/mode: infer/' -e "s|output_dir: .*|output_dir: $tmp/out-infer|" "$tmp/ipc.yaml" >"$tmp/infer.yaml"
n=$((n + 1))
if ! "$PIPPIN" run "$tmp/infer.yaml" >"$tmp/infer.out" 2>"$tmp/infer.err"; then
    echo "not ok $n - inference run failed: $(tail -3 "$tmp/infer.err")"
elif [ "$(losses "$tmp/infer.out" | head -1)" != "$(losses "$tmp/ref" | head -1)" ] || \
     [ ! -f "$tmp/out-infer/logits.npy" ] || [ ! -f "$tmp/out-infer/step2_logits.npy" ]; then
    echo "not ok $n - inference run: $(cat "$tmp/infer.out" | tr '\n' ' '); files: $(ls "$tmp/out-infer" | tr '\n' ' ')"
else
    echo "ok $n - inference over 3 worker processes: first loss as trained, logits saved per step"
fi

# One worker alone: its peers never come; it fails within the timeout, naming a rank.
sed -e 's/timeout_ms: 20000/timeout_ms: 1000/' "$tmp/ipc.yaml" >"$tmp/alone.yaml"
n=$((n + 1))
start=$(date +%s)
if timeout 60 "$PIPPIN" worker "$tmp/alone.yaml" --rank 1 >"$tmp/alone.out" 2>"$tmp/alone.err"; then
    echo "not ok $n - a worker without peers succeeded"
elif [ $(( $(date +%s) - start )) -gt 30 ]; then
    echo "not ok $n - a worker without peers took $(( $(date +%s) - start )) s to give up"
elif grep -q "rank" "$tmp/alone.err"; then
    echo "ok $n - a worker without peers gives up: $(tail -1 "$tmp/alone.err" | head -c 150)"
else
    echo "not ok $n - a worker without peers: $(cat "$tmp/alone.err")"
fi

# Configuration errors name the file, the line and the key.
printf 'model: %s\nbatch_size: four\nranks: [a]\n' "$FX/mlp/model.onnx" >"$tmp/bad.yaml"
n=$((n + 1))
if "$PIPPIN" run "$tmp/bad.yaml" >/dev/null 2>"$tmp/bad.err"; then
    echo "not ok $n - a bad batch_size was accepted"
elif grep -q "bad.yaml:2" "$tmp/bad.err" && grep -q "batch_size" "$tmp/bad.err"; then
    echo "ok $n - bad config: $(head -c 150 "$tmp/bad.err")"
else
    echo "not ok $n - bad config message: $(cat "$tmp/bad.err")"
fi
n=$((n + 1))
if "$PIPPIN" worker "$tmp/ipc.yaml" --rank 7 >/dev/null 2>"$tmp/rank.err"; then
    echo "not ok $n - rank 7 of 3 accepted"
else
    echo "ok $n - rank out of range refused: $(head -c 150 "$tmp/rank.err")"
fi
# SIGINT in the middle of a run: every worker stops after the same step with
# a checkpoint; --resume finishes with the uninterrupted run's losses.
n=$((n + 1))
cat >"$tmp/sig.yaml" <<YAML
model: $SRC/examples/gpt/model.onnx
schedule: 1f1b
microbatches: 4
batch_size: 16
steps: 30
optimizer: {kind: adamw, lr: 0.002}
text: {file: $SRC/examples/data/tiny.txt, vocab: $SRC/examples/gpt/vocab.json, seq: 64}
ranks: [ipc://$tmp/s0, ipc://$tmp/s1, ipc://$tmp/s2, ipc://$tmp/s3]
timeout_ms: 20000
YAML
"$PIPPIN" run "$tmp/sig.yaml" >"$tmp/sig-full.out" 2>&1
pids=""
for r in 0 1 2 3; do
    "$PIPPIN" worker "$tmp/sig.yaml" --rank $r --checkpoint "$tmp/sig-ck" >"$tmp/sig$r.out" 2>"$tmp/sig$r.err" &
    pids="$pids $!"
done
# The signal once their run is on: a worker installs its handler after
# loading the model, which under a sanitizer on a loaded machine can take
# longer than the fixed second this waited (then SIGINT killed it outright).
for _ in $(seq 600); do
    grep -q '^step 1:' "$tmp/sig3.out" 2>/dev/null && break
    sleep 0.1
done
# shellcheck disable=SC2086
kill -INT $pids 2>/dev/null
wait
stopped=$(cat "$tmp"/sig?.err | grep -o "stopped after step [0-9]*" | sort -u)
for r in 0 1 2 3; do
    "$PIPPIN" worker "$tmp/sig.yaml" --rank $r --checkpoint "$tmp/sig-ck" --resume >"$tmp/res$r.out" 2>"$tmp/res$r.err" &
done
wait
if [ "$(echo "$stopped" | wc -l)" -ne 1 ]; then
    echo "not ok $n - SIGINT: the workers stopped after different steps: $stopped"
elif [ "$(cat "$tmp/sig3.out" "$tmp/res3.out" | grep -o '^step [0-9]*: loss [0-9.]*')" != "$(losses "$tmp/sig-full.out")" ]; then
    echo "not ok $n - SIGINT then --resume: losses differ from the uninterrupted run"
else
    echo "ok $n - SIGINT to 4 workers: all ${stopped:-ran to the end}; --resume gives the uninterrupted losses"
fi
echo "1..$n"
