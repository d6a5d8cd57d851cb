#!/bin/sh
# The pippin command: bad input gives a clear message naming what and where
# and a non-zero exit (2 for usage, 1 for failures); good input works. TAP.
. "$(dirname "$0")/tap.sh"

head -c 300 /bin/sh >"$tmp/garbage.onnx"
printf 'not numpy' >"$tmp/bad.npy"

expect 2 "usage" "no command" --
expect 2 "unknown command" "unknown command" -- frobnicate
expect 0 "inspect" "help lists commands" -- --help
expect 1 "No such file" "missing model" -- inspect "$tmp/none.onnx"
expect 1 "not an ONNX model" "garbage model" -- inspect "$tmp/garbage.onnx"
expect 2 "" "inspect without model" -- inspect
expect 0 "pipe-split markers: 2" "inspect shows markers" -- inspect "$FX/mlp/model.onnx"
expect 0 "\"parameters\"" "inspect --json" -- inspect --json "$FX/gpt/model.onnx"
expect 1 "input 'y' not given" "infer with a missing input" -- infer "$FX/mlp/model.onnx" --input "x=$FX/mlp/x.npy" --output-dir "$tmp/o"
expect 1 "no input 'z'" "infer with an unknown input" -- infer "$FX/mlp/model.onnx" --input "z=$FX/mlp/x.npy" --output-dir "$tmp/o"
expect 1 "bad.npy" "infer with a bad .npy" -- infer "$FX/mlp/model.onnx" --input "x=$tmp/bad.npy" --output-dir "$tmp/o"
expect 1 "expected NAME=FILE.npy" "infer with a malformed --input" -- infer "$FX/mlp/model.onnx" --input "x" --output-dir "$tmp/o"
expect 1 "expected int64, got float32" "infer with the wrong dtype" -- infer "$FX/mlp/model.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/x.npy" --output-dir "$tmp/o"
expect 0 "logits" "infer mlp" -- infer "$FX/mlp/model.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --output-dir "$tmp/o"
n=$((n + 1))
if [ -f "$tmp/o/logits.npy" ] && [ -f "$tmp/o/loss.npy" ]; then echo "ok $n - infer wrote logits.npy and loss.npy"; else echo "not ok $n - infer outputs missing"; fi
expect 0 "" "infer through 3 stages, 2 microbatches" -- infer "$FX/mlp/model.onnx" --microbatches 2 --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --output-dir "$tmp/o2"
expect 1 "too few" "more microbatches than samples" -- infer "$FX/mlp/model.onnx" --microbatches 9 --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --output-dir "$tmp/o3"
expect 1 "--split-before '/nope/' matches no node" "split with a bad prefix" -- split "$FX/mlp/model_nosplit.onnx" --split-before /nope/ -o "$tmp/s"
expect 1 "leaves stage 0 empty" "split before the first node" -- split "$FX/mlp/model_nosplit.onnx" --split-before /fc1/ -o "$tmp/s"
expect 0 "3 stages" "split at markers" -- split "$FX/mlp/model.onnx" -o "$tmp/s"
expect 2 "NAME=N" "split with a bad --dim" -- split "$FX/mlp/model.onnx" --dim seq -o "$tmp/s"
printf 'ab\001cd\n' >"$tmp/bad.txt"
expect 1 "bad.txt:1: character" "train --text with a character outside the vocabulary" -- train "$SRC/examples/gpt/model.onnx" --text "$tmp/bad.txt" --vocab "$SRC/examples/gpt/vocab.json" --batch-size 2 --steps 1
expect 2 "--vocab" "train --text without --vocab" -- train "$SRC/examples/gpt/model.onnx" --text "$tmp/bad.txt" --batch-size 2 --steps 1
expect 0 "step 1: loss" "train the example GPT on text through 4 stages" -- train "$SRC/examples/gpt/model.onnx" --text "$SRC/examples/data/tiny.txt" --vocab "$SRC/examples/gpt/vocab.json" --batch-size 4 --microbatches 2 --schedule zb-h1 --steps 2 --optimizer adamw
expect 1 "schedule" "train with a schedule that needs 2 stages per rank on an odd pipe" -- train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 --microbatches 2 --schedule zbv --steps 1
expect 0 "gradients of 6 parameters (3 stages, 2 microbatches)" "grad through the stages" -- grad "$FX/mlp/model.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --microbatches 2 --schedule 1f1b --out "$tmp/g"
expect 1 "positive integer" "split with a zero --dim (regression: SIGFPE)" -- split "$FX/gpt/model.onnx" --dim batch=0 -o "$tmp/s2"
expect 1 "not a dynamic input dim" "split with a misspelt --dim" -- split "$FX/gpt/model.onnx" --dim btach=4 -o "$tmp/s2"
n=$((n + 1))
"$PIPPIN" inspect --json "$FX/gpt/model.onnx" >"$tmp/inspect.json" 2>"$tmp/err"
if [ ! -x /usr/bin/python3 ] || /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d['stages']) == 4" "$tmp/inspect.json" 2>"$tmp/err"; then
    echo "ok $n - inspect --json on a split model is one JSON document with the stage table"
else
    echo "not ok $n - inspect --json: $(cat "$tmp/err")"
fi
expect 0 "step 0: loss" "train without a pipeline, 2048 microbatches (regression: fixed arrays overflowed)" -- train "$FX/mlp/model_nosplit.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 2048 --microbatches 2048 --steps 1
echo "1..$n"
exit 0
