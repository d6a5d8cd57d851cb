#!/bin/sh
# Balanced stages (pippin split --auto) against an even split: for the
# example GPT (even = its PipeSplit markers at 4 stages, else --split-even) and the uneven MLP fixture
# (even = as many compute nodes per stage, --split-even), prints
#   simulated: the 1F1B step the simulator gives each split from the
#              measured node costs (what `pippin split --auto` prints), and
#   measured:  the median step time of `pippin train --transport inproc`
#              (one thread per stage, 1F1B, M microbatches) for each split,
# and the ratio even / balanced (above 1: the balanced split is faster).
# Each rank is a thread: give the machine at least as many cores as stages.
#
#   bench/bench_balance.sh [PIPPIN] [STAGES] [STEPS]    # default build/tools/pippin 4 30
set -eu
cd "$(dirname "$0")/.."
PIPPIN=${1:-build/tools/pippin}
S=${2:-4}
STEPS=${3:-30}
M=4
export OPENBLAS_NUM_THREADS=1 PIPPIN_LOG=error
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# median of the per-step times after the first 3 steps
median_ms() {
    sed -n 's/^step \([0-9]*\): loss [^(]*(\([0-9.]*\) ms.*/\1 \2/p' "$1" | awk '$1 >= 3 { print $2 }' | sort -n |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

# bench NAME MODEL "EVEN_FLAGS" "TRAIN_FLAGS" "SPLIT_FLAGS"
bench() {
    name=$1 model=$2 even=$3 train=$4 split=$5
    "$PIPPIN" split "$model" --auto "$S" --microbatches $M $split -o "$tmp/$name" >"$tmp/$name.split"
    sim=$(sed -n 's/^simulated 1F1B step (M=[0-9]*): balanced \([0-9.]*\) ms, even \([0-9.]*\) ms.*markers \([0-9.]*\) ms.*/\1 \3/p; t; s/^simulated 1F1B step (M=[0-9]*): balanced \([0-9.]*\) ms, even \([0-9.]*\) ms.*/\1 \2/p' "$tmp/$name.split")
    sed -n '/^  stage/,/^simulated/p' "$tmp/$name.split" | sed "s/^/  $name: /"
    # shellcheck disable=SC2086
    "$PIPPIN" train "$model" $train --schedule 1f1b --microbatches $M --steps "$STEPS" --transport inproc \
        --auto "$S" $split >"$tmp/$name.auto" 2>&1
    # shellcheck disable=SC2086
    "$PIPPIN" train "$model" $train --schedule 1f1b --microbatches $M --steps "$STEPS" --transport inproc \
        $even >"$tmp/$name.even" 2>&1
    ma=$(median_ms "$tmp/$name.auto")
    me=$(median_ms "$tmp/$name.even")
    echo "$sim $ma $me" | awk -v n="$name" -v s="$S" -v m=$M '{
        printf "%-8s %d stages, 1F1B M=%d  simulated: balanced %.3f ms, even %.3f ms, ratio %.2fx   measured: balanced %.2f ms, even %.2f ms, ratio %.2fx\n",
               n, s, m, $1, $2, $2 / $1, $3, $4, $4 / $3 }'
}

gpt_even="--split-even $S" # the model's 3 markers make 4 stages
[ "$S" -ne 4 ] || gpt_even=""
bench gpt examples/gpt/model.onnx "$gpt_even" \
    "--text examples/data/tiny.txt --vocab examples/gpt/vocab.json --batch-size 32 --dim seq=64" \
    "--auto-batch 8 --dim seq=64"
bench uneven test/fixtures/uneven/model.onnx "--split-even $S" \
    "--data x=test/fixtures/uneven/x.npy --data y=test/fixtures/uneven/y.npy --batch-size 256" \
    "--auto-batch 64"
