#!/bin/sh
# pippin checkpoint: list (committed and partial steps), inspect (metadata,
# tensors, hashes), export (a committed step's parameters as the .npy files
# training writes). TAP output.
. "$(dirname "$0")/tap.sh"
set -- "$SRC/examples/gpt/model.onnx" --text "$SRC/examples/data/tiny.txt" --vocab "$SRC/examples/gpt/vocab.json" \
    --batch-size 8 --microbatches 2 --schedule 1f1b --steps 4 --optimizer adamw
ck=$tmp/ck
"$PIPPIN" train "$@" --checkpoint "$ck" --checkpoint-every 1 --save "$tmp/saved" >/dev/null 2>"$tmp/err"
ok $? "train with a checkpoint after every step: $(head -c 200 "$tmp/err")"
expect 0 "" "list" -- checkpoint list "$ck"
grep -q "^3  *committed  *4  *4 .*newest committed" "$tmp/out" && [ "$(grep -c committed "$tmp/out")" -eq 2 ]
ok $? "list shows steps 2 and 3 committed (keep 2), 3 the newest: $(tr '\n' '|' <"$tmp/out")"
expect 0 "" "inspect a step" -- checkpoint inspect "$ck"
grep -q "step 3, 4 stages" "$tmp/out" && [ "$(grep -c 'hash ok' "$tmp/out")" -eq 4 ] &&
    grep -q "pippin.optim.exp_avg " "$tmp/out" && grep -q "tok_emb.weight  *float32  *\[58,64\]" "$tmp/out"
ok $? "inspect: 4 stage files, hashes ok, parameters and AdamW state listed"
expect 0 "pippin.step = 2" "inspect one file" -- checkpoint inspect "$ck/step_2/stage_1.safetensors"
expect 0 "wrote 52 parameters" "export" -- checkpoint export "$ck" --output-dir "$tmp/exported"
diff -r "$tmp/saved" "$tmp/exported" >/dev/null
ok $? "export of the last step equals the parameters training saved, byte for byte"
# a crash while step 4 was being written: files, no manifest
mkdir "$ck/step_4" && cp "$ck/step_3/stage_0.safetensors" "$ck/step_4/"
expect 0 "" "list with a partial step" -- checkpoint list "$ck"
grep -q "^4  *partial" "$tmp/out" && grep -q "^3 .*newest committed" "$tmp/out"
ok $? "a step without a manifest is listed as partial; the newest committed is still 3"
expect 1 "step 4 is not committed" "export of a partial step refused" -- checkpoint export "$ck" --step 4 --output-dir "$tmp/x"
expect 1 "no step 9" "export of a missing step refused" -- checkpoint export "$ck" --step 9 --output-dir "$tmp/x"
f="$ck/step_3/stage_2.safetensors"
printf 'X' | dd of="$f" bs=1 seek=$(($(stat -c %s "$f") - 10)) conv=notrunc 2>/dev/null # in the data
expect 1 "stage_2.safetensors: the contents' hash differs" "a damaged file is refused by inspect" -- checkpoint inspect "$ck"
expect 1 "the file is damaged" "and by export" -- checkpoint export "$ck" --output-dir "$tmp/y"
expect 1 "No such file" "list of a missing directory" -- checkpoint list "$tmp/nothing"
expect 2 "usage" "no verb" -- checkpoint
expect 2 "usage" "unknown verb" -- checkpoint frobnicate "$ck"
expect 2 "need a step number" "bad --step" -- checkpoint inspect "$ck" --step 99999999999999999999999
echo "1..$n"
[ $fails -eq 0 ]
