#!/bin/sh
# bfloat16 on the wire (wire_dtype: bfloat16): the example GPT's pipeline
# (examples/gpt/pipeline.yaml: 4 stages on 2 ranks, zbv, ipc) trained for
# STEPS steps (default 150) with float32 and with bfloat16 activations and
# gradients between the ranks; prints the losses side by side, the largest
# difference, the final loss ratio, the bytes the ranks sent and the time.
#   bench/bench_wire_bf16.sh [BUILD_DIR] [STEPS]
set -eu
build=${1:-build}
steps=${2:-150}
src=$(cd "$(dirname "$0")/.." && pwd)
pippin="$build/tools/pippin"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for wire in float32 bfloat16; do
    sed -e "s|^model: model.onnx|model: $src/examples/gpt/model.onnx|" \
        -e "s|^text: {file: ../data/tiny.txt, vocab: vocab.json|text: {file: $src/examples/data/tiny.txt, vocab: $src/examples/gpt/vocab.json|" \
        -e "s|^steps: .*|steps: $steps|" -e "s|^output_dir: .*|output_dir: $tmp/out-$wire|" \
        -e "s|ipc:///tmp/pippin-example-gpt-rank|ipc://$tmp/rank-$wire-|" \
        "$src/examples/gpt/pipeline.yaml" >"$tmp/$wire.yaml"
    echo "wire_dtype: $wire" >>"$tmp/$wire.yaml"
    start=$(date +%s%N)
    PIPPIN_LOG=debug "$pippin" run "$tmp/$wire.yaml" >"$tmp/$wire.out" 2>"$tmp/$wire.err"
    echo $((($(date +%s%N) - start) / 1000000)) >"$tmp/$wire.ms"
    grep -o "step [0-9]*: loss [0-9.]*" "$tmp/$wire.out" | awk '{print $2, $4}' | tr -d ':' | sort -n | uniq >"$tmp/$wire.loss"
done
sent() { sed -n 's/.*transport rank [0-9]*: closing: sent=\([0-9]*\).*/\1/p' "$tmp/$1.err" | awk '{s += $1} END {print s + 0}'; }
echo "example GPT, 4 stages on 2 ranks (zbv, 4 microbatches of 4), $steps steps of AdamW"
join "$tmp/float32.loss" "$tmp/bfloat16.loss" | awk -v steps="$steps" '
    { d = $3 - $2; if (d < 0) d = -d; if (d > worst) { worst = d; at = $1 }
      if ($1 % 25 == 0 || $1 == steps - 1) printf "step %4d  float32 %.6f  bfloat16 %.6f\n", $1, $2, $3
      last32 = $2; last16 = $3 }
    END { printf "largest |difference| %.6f (step %d); final loss bfloat16 / float32 = %.4f\n", worst, at, last16 / last32 }'
echo "bytes sent between the ranks: float32 $(sent float32), bfloat16 $(sent bfloat16)"
echo "wall time: float32 $(cat "$tmp/float32.ms") ms, bfloat16 $(cat "$tmp/bfloat16.ms") ms"
