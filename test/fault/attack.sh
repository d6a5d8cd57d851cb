#!/bin/sh
# Fault suite: a stranger against a real run. A 4-worker training run of
# the example GPT (no CURVE, run_id in the config, which the stranger has
# read) is attacked for its whole length by another process that connects
# to every rank and sends forged activations and gradients for the coming
# steps under the real names, ABORTs, goodbyes, ring announcements and a
# flood of 64 KiB messages for future steps (test/fault/stranger.c). The run
# must end as if nothing happened: every worker exits 0, the losses and the
# trained parameters are the unattacked run's bit for bit, the workers
# report dropping the stranger's messages, and their peak memory stays
# within 96 MiB of the unattacked run's (the flood alone is 192 MiB per
# rank; libzmq queues up to rcvhwm = 1000 messages, 62.5 MiB of these,
# before pippin reads and drops them). Over ipc and over tcp on 127.0.0.1 (the stranger shares the
# ranks' IP). TAP output; bounded.
. "$(dirname "$0")/../tools/tap.sh"
STRANGER=$2
losses() { grep -o "^step [0-9]*: loss [0-9.]*" "$1"; }
cfg() { # NAME OUTDIR RANKS
    cat >"$tmp/$1.yaml" <<YAML
model: $SRC/examples/gpt/model.onnx
schedule: 1f1b
microbatches: 2
batch_size: 8
steps: 40
optimizer: {kind: adamw, lr: 0.002}
text: {file: $SRC/examples/data/tiny.txt, vocab: $SRC/examples/gpt/vocab.json, seq: 64}
ranks: [$3]
timeout_ms: 10000
output_dir: $2
run_id: attack-run
YAML
}
# peak RSS (kB) of CONFIG's workers while PID runs, sampled every 50 ms
peak_rss() {
    peak=0
    while kill -0 "$2" 2>/dev/null; do
        for p in $(pgrep -f "worker $1" 2>/dev/null); do
            kb=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null)
            [ -n "$kb" ] && [ "$kb" -gt "$peak" ] && peak=$kb
        done
        sleep 0.05
    done
    echo "$peak"
}
# run NAME: pippin run NAME.yaml, peak RSS in $tmp/NAME.rss, exit code in $tmp/NAME.rc
run() {
    PIPPIN_LOG=warn timeout 300 "$PIPPIN" run "$tmp/$1.yaml" >"$tmp/$1.out" 2>"$tmp/$1.err" &
    lpid=$!
    peak_rss "$tmp/$1.yaml" $lpid >"$tmp/$1.rss"
    wait $lpid
    echo $? >"$tmp/$1.rc"
}

# AddressSanitizer keeps freed memory in quarantine: peak memory means
# nothing there (the losses and parameters are still checked)
sanitized=""
ldd "$PIPPIN" 2>/dev/null | grep -q libasan && sanitized=" (memory not checked under AddressSanitizer)"
for kind in ipc tcp; do
    if [ $kind = ipc ]; then
        eps() { echo "ipc://$tmp/$1-0, ipc://$tmp/$1-1, ipc://$tmp/$1-2, ipc://$tmp/$1-3"; }
    else
        base=$((20000 + $(od -An -N2 -tu2 /dev/urandom) % 12000)) # below the ephemeral ports
        eps() { echo "tcp://127.0.0.1:$base, tcp://127.0.0.1:$((base + 1)), tcp://127.0.0.1:$((base + 2)), tcp://127.0.0.1:$((base + 3))"; }
    fi
    cfg $kind-calm "$tmp/$kind-calm-params" "$(eps $kind-calm)"
    run $kind-calm
    if [ "$(cat "$tmp/$kind-calm.rc")" != 0 ]; then
        ok 1 "$kind: the unattacked run failed: $(tail -3 "$tmp/$kind-calm.err" | tr '\n' ' ')"
        continue
    fi
    [ $kind = tcp ] && base=$((base + 10))
    cfg $kind-attacked "$tmp/$kind-attacked-params" "$(eps $kind-attacked)"
    # the stranger runs for as long as the run (it cannot know when it ends)
    "$STRANGER" 20 attack-run $(eps $kind-attacked | tr -d ',') >"$tmp/$kind-stranger.out" 2>&1 &
    spid=$!
    run $kind-attacked
    kill $spid 2>/dev/null
    wait $spid 2>/dev/null
    calm_kb=$(cat "$tmp/$kind-calm.rss")
    attacked_kb=$(cat "$tmp/$kind-attacked.rss")
    drops=$(grep -c "dropped a message" "$tmp/$kind-attacked.err")
    if [ "$(cat "$tmp/$kind-attacked.rc")" != 0 ]; then
        ok 1 "$kind: the attacked run failed: $(grep -v 'dropped a message' "$tmp/$kind-attacked.err" | grep -v '^pippin run: rank' | tail -3 | tr '\n' ' ')"
    elif [ "$(losses "$tmp/$kind-attacked.out")" != "$(losses "$tmp/$kind-calm.out")" ]; then
        ok 1 "$kind: the attacked run's losses differ"
    elif ! diff -r "$tmp/$kind-calm-params" "$tmp/$kind-attacked-params" >/dev/null; then
        ok 1 "$kind: the attacked run's trained parameters differ"
    elif [ "$drops" -eq 0 ]; then
        ok 1 "$kind: no worker reported dropping a message: the attack did not reach them"
    elif [ "$attacked_kb" -gt $((calm_kb + 98304)) ] && [ -z "$sanitized" ]; then
        ok 1 "$kind: peak worker memory $attacked_kb kB under attack, $calm_kb kB without"
    else
        ok 0 "$kind: 40 steps under attack as without, bit for bit; $drops drop reports; peak worker RSS $((attacked_kb / 1024)) MiB (unattacked $((calm_kb / 1024)) MiB)$sanitized"
    fi
done
echo "1..$n"
