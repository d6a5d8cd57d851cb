#!/bin/sh
# Fault suite: a rank whose config or files differ from the others' is
# refused before the first step, every rank naming the difference (no run
# to exit 0 with wrong losses, no timeout). TAP output.
. "$(dirname "$0")/../tools/tap.sh"
errors() { cat "$@" | grep 'pippin worker:' | grep -v ', stages [0-9]'; }
base() { # NAME: a 3-rank mlp config on ipc
    cat >"$tmp/$1.yaml" <<YAML
model: $FX/mlp/model.onnx
schedule: 1f1b
microbatches: 2
batch_size: 4
steps: 3
optimizer: {kind: adamw, lr: 0.01, weight_decay: 0.01}
data: {x: $FX/mlp/train_x.npy, y: $FX/mlp/train_y.npy}
ranks: [ipc://$tmp/$1-0, ipc://$tmp/$1-1, ipc://$tmp/$1-2]
timeout_ms: 5000
YAML
}
# skew NAME NEEDLE DESCRIPTION SED-EXPRESSION: rank 1 reads the edited config
skew() {
    base "$1"
    sed -e "$4" "$tmp/$1.yaml" >"$tmp/$1-odd.yaml"
    for r in 0 1 2; do
        cfg="$tmp/$1.yaml"
        [ $r = 1 ] && cfg="$tmp/$1-odd.yaml"
        timeout -k 5 60 "$PIPPIN" worker "$cfg" --rank $r >"$tmp/$1-$r.out" 2>"$tmp/$1-$r.err" &
    done
    wait
    refused=0
    for r in 0 1 2; do errors "$tmp/$1-$r.err" | grep -q -- "$2" && refused=$((refused + 1)); done
    if [ $refused -eq 3 ] && ! grep -q "^step" "$tmp/$1-2.out"; then
        ok 0 "$3: every rank refused before a step: $(errors "$tmp/$1-0.err" | head -c 160)"
    else
        ok 1 "$3: $refused of 3 ranks named '$2': $(errors "$tmp/$1"-?.err | head -3)"
    fi
}
skew lr "optimizer.lr" "a different learning rate" 's/lr: 0.01/lr: 0.02/'
skew mb "microbatches" "different microbatches" 's/microbatches: 2/microbatches: 4/'
skew sched "schedule" "a different schedule" 's/schedule: 1f1b/schedule: gpipe/'
cp "$FX/mlp/train_x.npy" "$tmp/x-copy.npy"
printf '\001' | dd of="$tmp/x-copy.npy" bs=1 seek=200 conv=notrunc 2>/dev/null
skew data "data.x" "a data file that differs in one byte" "s|x: [^,]*,|x: $tmp/x-copy.npy,|"

# checkpoint settings given on the command line count as much as the config's
base cke
for r in 0 1 2; do
    every=1
    [ $r = 1 ] && every=2
    timeout -k 5 60 "$PIPPIN" worker "$tmp/cke.yaml" --rank $r --checkpoint "$tmp/cke-ck" --checkpoint-every $every \
        >"$tmp/cke-$r.out" 2>"$tmp/cke-$r.err" &
done
wait
[ "$(errors "$tmp"/cke-?.err | grep -c 'checkpoint.every')" -eq 3 ]
ok $? "--checkpoint-every 2 on one rank, 1 on the others: refused naming checkpoint.every ($(errors "$tmp/cke-0.err" | head -c 120))"

# run_id: the same on every rank trains; a rank of another run (another
# run_id) is not heard at all (its messages carry another wire run id), so
# the others fail at their deadline instead of mixing two runs
base rid
echo "run_id: exp-1" >>"$tmp/rid.yaml"
sed -e 's/timeout_ms: 5000/timeout_ms: 2000/' "$tmp/rid.yaml" >"$tmp/rid2.yaml"
sed -e 's/run_id: exp-1/run_id: exp-2/' "$tmp/rid2.yaml" >"$tmp/rid-odd.yaml"
for r in 0 1 2; do timeout -k 5 60 "$PIPPIN" worker "$tmp/rid2.yaml" --rank $r >"$tmp/rid-$r.out" 2>"$tmp/rid-$r.err" & done
wait
[ -z "$(errors "$tmp"/rid-?.err)" ] && grep -q "^step 2" "$tmp/rid-2.out"
ok $? "the same run_id on every rank: the run trains"
for r in 0 1 2; do
    cfg="$tmp/rid2.yaml"
    [ $r = 1 ] && cfg="$tmp/rid-odd.yaml"
    timeout -k 5 60 "$PIPPIN" worker "$cfg" --rank $r >"$tmp/rid-$r.out" 2>"$tmp/rid-$r.err" &
done
wait
[ "$(errors "$tmp"/rid-?.err | wc -l)" -ge 2 ] && ! grep -q "^step" "$tmp/rid-2.out"
ok $? "a rank with another run_id is not heard: no step runs ($(errors "$tmp/rid-0.err" | head -c 120))"

# stages: a tied parameter. The GPT example split into stage files; rank
# 3's stage file holds the tied embedding too. Without pipe.json's
# shared_parameters each copy would train on its own: refused.
"$PIPPIN" split "$SRC/examples/gpt/model.onnx" -o "$tmp/split" >/dev/null 2>"$tmp/split.err"
cat >"$tmp/gpt.yaml" <<YAML
stages: $tmp/split
schedule: 1f1b
microbatches: 2
batch_size: 8
steps: 2
text: {file: $SRC/examples/data/tiny.txt, vocab: $SRC/examples/gpt/vocab.json, seq: 64}
ranks: [ipc://$tmp/g0, ipc://$tmp/g1, ipc://$tmp/g2, ipc://$tmp/g3]
timeout_ms: 5000
YAML
run4() { # TAG
    for r in 0 1 2 3; do
        timeout -k 5 60 "$PIPPIN" worker "$tmp/gpt.yaml" --rank $r >"$tmp/$1-$r.out" 2>"$tmp/$1-$r.err" &
    done
    wait
}
run4 gpt-ok
if [ -n "$(errors "$tmp"/gpt-ok-?.err)" ]; then
    ok 1 "stage files as split: $(errors "$tmp"/gpt-ok-?.err | head -2)"
else
    ok 0 "stage files as split: 4 workers agree and train"
fi
python3 - "$tmp/split/pipe.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["shared_parameters"] = []
json.dump(p, open(sys.argv[1], "w"))
PY
run4 gpt-noshare
if errors "$tmp"/gpt-noshare-0.err | grep -q "shared" && errors "$tmp"/gpt-noshare-3.err | grep -q "shared"; then
    ok 0 "pipe.json without its shared_parameters refused: $(errors "$tmp/gpt-noshare-3.err" | head -c 200)"
else
    ok 1 "pipe.json without shared_parameters: $(errors "$tmp"/gpt-noshare-?.err | head -3) $(head -2 "$tmp/gpt-noshare-3.out")"
fi
echo "1..$n"
