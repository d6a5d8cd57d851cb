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
# --schedule on a model without stages is refused, not ignored (regression:
# grad and train ran the model whole and dropped the schedule).
expect 1 "the model has no stages" "grad --schedule on a model without stages" -- grad "$FX/mlp/model_nosplit.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --microbatches 2 --schedule 1f1b --out "$tmp/g2"
expect 1 "the model has no stages" "train --schedule on a model without stages" -- train "$FX/mlp/model_nosplit.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 --microbatches 2 --schedule 1f1b --steps 1
expect 1 "--no-split" "train --schedule with --no-split" -- train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 --schedule 1f1b --no-split --steps 1
expect 1 "the model has no stages" "infer --schedule on a model without stages" -- infer "$FX/mlp/model_nosplit.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --schedule 1f1b --output-dir "$tmp/o3"
expect 0 "ran 1 stage, 2 microbatches" "infer --microbatches without stages runs one stage (grammar)" -- infer "$FX/mlp/model_nosplit.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --microbatches 2 --output-dir "$tmp/o4"
expect 0 "(1 stage, 2 microbatches)" "grad --microbatches 2 on a model without stages runs it as one stage, as infer does" -- grad "$FX/mlp/model_nosplit.onnx" --input "x=$FX/mlp/x.npy" --input "y=$FX/mlp/y.npy" --microbatches 2 --out "$tmp/g3"
expect 1 "positive integer" "split with a zero --dim (regression: SIGFPE)" -- split "$FX/gpt/model.onnx" --dim batch=0 -o "$tmp/s2"
expect 1 "not a dynamic input dim" "split with a misspelt --dim" -- split "$FX/gpt/model.onnx" --dim btach=4 -o "$tmp/s2"
n=$((n + 1))
"$PIPPIN" inspect --json "$FX/gpt/model.onnx" >"$tmp/inspect.json" 2>"$tmp/err"
if [ ! -x /usr/bin/python3 ] || /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert len(d['stages']) == 4" "$tmp/inspect.json" 2>"$tmp/err"; then
    echo "ok $n - inspect --json on a split model is one JSON document with the stage table"
else
    echo "not ok $n - inspect --json: $(cat "$tmp/err")"
fi
# json_check DESC FILE CODE: passes when FILE is one JSON document (json.load)
# and CODE, run with it as d, raises nothing.
json_check() {
    if ! command -v python3 >/dev/null 2>&1; then
        n=$((n + 1))
        echo "ok $n # SKIP $1: no python3"
        return
    fi
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); $3" "$2" 2>"$tmp/jerr"
    ok $? "$1$(if [ -s "$tmp/jerr" ]; then echo ": $(tail -c 300 "$tmp/jerr")"; fi)"
}
# Stash and edge bytes assume the same sizes for symbolic dims (regression:
# the stash took 1 for seq, the edges the probe's size); the sizes are shown.
"$PIPPIN" inspect --json "$FX/gpt/model.onnx" >"$tmp/i0.json" 2>"$tmp/err"
json_check "inspect --json names the assumed dim sizes" "$tmp/i0.json" \
    "assert d['batch_dim'] == 'batch' and d['dims']['seq'] > 1, d.get('dims')"
dims=$(python3 -c "import json,sys; print(' '.join('--dim %s=%d' % kv for kv in json.load(open(sys.argv[1]))['dims'].items()))" "$tmp/i0.json" 2>/dev/null)
"$PIPPIN" inspect --json $dims "$FX/gpt/model.onnx" >"$tmp/i1.json" 2>"$tmp/err"
json_check "inspect: stash and edge bytes without --dim equal those with the assumed sizes ($dims)" "$tmp/i1.json" \
    "e = json.load(open('$tmp/i0.json')); assert [s['stash_bytes_per_sample'] for s in d['stages']] == [s['stash_bytes_per_sample'] for s in e['stages']], (d['stages'], e['stages']); assert d['edges'] == e['edges']; assert all(s['stash_bytes_per_sample'] for s in d['stages'])"
expect 0 "symbolic dims: bytes are per sample of batch, at seq=" "inspect text shows the assumed dim sizes" -- inspect "$FX/gpt/model.onnx"
"$PIPPIN" inspect --json --dim seq=1 "$FX/gpt/model.onnx" >"$tmp/i2.json" 2>"$tmp/err"
json_check "inspect: the stash follows --dim seq" "$tmp/i2.json" \
    "e = json.load(open('$tmp/i0.json')); assert d['stages'][1]['stash_bytes_per_sample'] < e['stages'][1]['stash_bytes_per_sample']; assert d['dims'] == {'seq': 1}"
# --json --backward: one JSON document, the training graph inside it
# (regression: a text line followed the document).
"$PIPPIN" inspect --json --backward -o "$tmp/tg.onnx" "$FX/gpt/model.onnx" >"$tmp/ib.json" 2>"$tmp/err"
json_check "inspect --json --backward -o is one JSON document" "$tmp/ib.json" \
    "t = d['training_graph']; assert t['trainable_parameters'] == 52 and t['stash_bytes_per_sample'] > 0 and t['file'] == '$tmp/tg.onnx', t; assert len(d['stages']) == 4"
"$PIPPIN" inspect --json --backward $dims "$FX/gpt/model_nosplit.onnx" >"$tmp/ib1.json" 2>"$tmp/err"
"$PIPPIN" inspect --json --backward "$FX/gpt/model_nosplit.onnx" >"$tmp/ib2.json" 2>"$tmp/err"
json_check "inspect --json --backward without stages: one document, stash at the assumed sizes" "$tmp/ib2.json" \
    "e = json.load(open('$tmp/ib1.json')); assert d['dims'] == e['dims'] and d['training_graph'] == e['training_graph'], (d['training_graph'], e['training_graph']); assert 'stages' not in d"
# Numbers JSON cannot hold (nan, inf) are null, not NaN/Infinity.
"$PIPPIN" train "$FX/mlp/model.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 4 --steps 3 \
    --optimizer sgd --lr 1e30 --json >"$tmp/tr.jsonl" 2>"$tmp/err"
python3 -c "import json,sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])]))" "$tmp/tr.jsonl" >"$tmp/tr.json" 2>"$tmp/err"
json_check "train --json with a diverging loss: every line is JSON (nan as null)" "$tmp/tr.json" \
    "assert len(d) == 3 and d[2]['loss'] is None, d"
"$PIPPIN" simulate --kind 1f1b --ranks 2 --microbatches 2 --cost F=1e308,I=1e308,W=1e308 --json >"$tmp/sim.json" 2>"$tmp/err"
json_check "simulate --json with overflowing costs is JSON (inf as null)" "$tmp/sim.json" \
    "assert d['makespan'] is None and d['peak_activations'] == [2, 1], d"
expect 0 "step 0: loss" "train without a pipeline, 2048 microbatches (regression: fixed arrays overflowed)" -- train "$FX/mlp/model_nosplit.onnx" --data "x=$FX/mlp/train_x.npy" --data "y=$FX/mlp/train_y.npy" --batch-size 2048 --microbatches 2048 --steps 1
# pippin generate / request: usage errors exit 2 before any network
expect 2 "usage: pippin generate" "generate without an endpoint" -- generate --prompt hi
expect 2 "usage: pippin generate" "generate with both --prompt and --tokens" -- generate ipc:///nowhere --prompt hi --tokens x.npy
expect 2 "--temperature '-1'" "generate with a negative temperature" -- generate ipc:///nowhere --prompt hi --temperature -1
expect 2 "--max-tokens '0'" "generate with --max-tokens 0" -- generate ipc:///nowhere --prompt hi --max-tokens 0
expect 1 "No such file" "generate with a missing token file" -- generate ipc:///nowhere --tokens "$tmp/none.npy"
expect 2 "usage: pippin request" "request with neither inputs, --stats nor --end-session" -- request ipc:///nowhere
echo "1..$n"
exit 0
