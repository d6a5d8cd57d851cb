#!/bin/sh
# Loading a large model: exports test/fixtures/gen_fixtures.py's GPT (large,
# the default: d 768, 4 layers, 12 heads, T 256, about 110 MiB; SIZE=medium:
# d 384, 6 layers, 6 heads, T 128, about 41 MiB; vocab 65, random weights,
# pipe-split markers between the blocks) once into ~/.cache/pippin-bench-load,
# then prints file size, peak RSS, RSS/file and time for
#   1. pp_onnx_load against the former loader, same run (pippin-bench-load);
#   2. `pippin inspect` and `pippin split` on it (/usr/bin/time -v);
#   3. a `pippin run` of `model:` workers (zbv: one stage per layer, two
#      per rank, so 2 ranks for large, 3 for medium; one training step of
#      batch 4 in 4 microbatches, seq 64, SGD), each worker's peak RSS
#      from its own /usr/bin/time -v (the launcher's tells only its own).
# With BASE_BUILD (a build of an older commit), 2. and 3. run for it too,
# interleaved, and the ratios are printed.
# Usage: bench/bench_load.sh [BUILD_DIR [BASE_BUILD]] (default build)
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
BASE=${2:-}
SIZE=${SIZE:-large}
case $SIZE in
large) D=768 L=4 H=12 T=256 ;;
medium) D=384 L=6 H=6 T=128 ;;
*) echo "SIZE must be large or medium" >&2; exit 2 ;;
esac
RANKS=$((L / 2))
DIR=$HOME/.cache/pippin-bench-load/gpt_${D}_l${L}
M=$DIR/model.onnx
if [ ! -f "$M" ]; then
    mkdir -p "$DIR"
    /usr/bin/python3 - "$ROOT" "$DIR" "$D" "$L" "$H" "$T" <<'PYEOF'
import os, sys, warnings
root, d = sys.argv[1], sys.argv[2]
n_embd, n_layer, n_head, block = (int(x) for x in sys.argv[3:7])
sys.path.insert(0, os.path.join(root, "test", "fixtures"))
sys.path.insert(0, os.path.join(root, "python"))
import torch
import gen_fixtures as gf
import pippin_torch as pp
cfg = dict(vocab_size=65, block_size=block, n_embd=n_embd, n_head=n_head, n_layer=n_layer)
torch.manual_seed(0)
model = gf.GPT(split=True, **cfg)
idx = torch.randint(0, 65, (2, block))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pp.export(model, (idx, idx), d + "/model.onnx.tmp", input_names=["idx", "targets"],
              output_names=["loss", "logits"],
              dynamic_axes=dict(idx={0: "batch"}, targets={0: "batch"}, logits={0: "batch"}))
os.replace(d + "/model.onnx.tmp", d + "/model.onnx")
PYEOF
fi
SIZE=$(stat -c %s "$M")
echo "model: $M, $SIZE bytes; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bench/pippin-bench-load" "$M" 3
echo
# peak NAME LOGFILE: prints time -v's peak RSS, its ratio to the file, the wall time
peak() {
    kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$2")
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$2")
    awk -v n="$1" -v kb="$kb" -v f="$SIZE" -v w="$wall" \
        'BEGIN { printf "%-26s peak RSS %7.1f MiB = %.2fx the file, wall %s\n", n, kb / 1024, kb * 1024 / f, w }'
}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/run.yaml" <<YEOF
model: $M
mode: train
schedule: zbv
microbatches: 4
batch_size: 4
steps: 1
optimizer: {kind: sgd, lr: 0.001}
text: {file: $ROOT/examples/data/tiny.txt, vocab: $ROOT/examples/gpt/vocab.json, seq: 64}
ranks:
$(r=0; while [ $r -lt $RANKS ]; do echo "  - ipc://$TMP/rank$r"; r=$((r + 1)); done)
timeout_ms: 120000
output_dir: $TMP/out
YEOF
kib() { sed -n 's/.*Maximum resident set size (kbytes): //p' "$1"; }
# one LABEL BUILD: inspect, split and a run of RANKS workers with BUILD's
# pippin; leaves the peak RSS in KiB in $TMP/LABEL.inspect and
# $TMP/LABEL.worker (the largest)
one() {
    /usr/bin/time -v -o "$TMP/inspect.time" "$2/tools/pippin" inspect "$M" >/dev/null
    peak "$1: pippin inspect" "$TMP/inspect.time"
    kib "$TMP/inspect.time" >"$TMP/$1.inspect"
    rm -rf "$TMP/split"
    /usr/bin/time -v -o "$TMP/split.time" "$2/tools/pippin" split "$M" -o "$TMP/split" >/dev/null
    peak "$1: pippin split" "$TMP/split.time"
    rm -rf "$TMP/out" "$TMP/split"
    r=0
    while [ $r -lt $RANKS ]; do
        /usr/bin/time -v -o "$TMP/rank$r.time" "$2/tools/pippin" worker "$TMP/run.yaml" --rank $r \
            >"$TMP/rank$r.log" 2>&1 &
        r=$((r + 1))
    done
    wait
    most=0 r=0
    while [ $r -lt $RANKS ]; do
        grep -q "Exit status: 0" "$TMP/rank$r.time" || { echo "worker $r failed:"; tail -5 "$TMP/rank$r.log"; }
        peak "$1: $RANKS-rank run, worker $r" "$TMP/rank$r.time"
        a=$(kib "$TMP/rank$r.time")
        [ "$a" -gt "$most" ] && most=$a
        r=$((r + 1))
    done
    echo "$most" >"$TMP/$1.worker"
}
for rep in 1 2 3; do
    one new "$BUILD"
    [ -n "$BASE" ] && one base "$BASE"
    if [ -n "$BASE" ]; then
        awk -v a="$(cat "$TMP/new.inspect")" -v b="$(cat "$TMP/base.inspect")" \
            -v c="$(cat "$TMP/new.worker")" -v d="$(cat "$TMP/base.worker")" \
            'BEGIN { printf "run %d: new/base peak RSS: inspect %.2fx, largest worker %.2fx\n", '"$rep"', a / b, c / d }'
    fi
    [ -n "$BASE" ] || break
done
