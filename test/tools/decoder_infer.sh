#!/bin/sh
# The KV-cache decoder fixture (test/fixtures/decoder, made by
# gen_fixtures.py decoder): `pippin infer` on decoder.onnx gives torch's
# logits and presents within 1e-4
#   - for a step with an EMPTY past (past_key_values.* [1,4,0,8], the prompt:
#     the first step of a generation), through the stages and --no-split;
#   - for a step with a past (P = 6, 3 new tokens: the mask slice and the
#     positions start at P);
# nocache.onnx (same weights, idx -> logits) gives the empty-past step's
# logits and its argmax is the first greedy token; `pippin inspect` names
# the decoder inputs and outputs with their dynamic dims. The optimizer:
# --no-optimize gives torch's numbers too; `inspect --optimized` reports the
# passes and the fused ops, and with PIPPIN_OPTIMIZE=0 no pass.
# Numbers are compared with Debian's numpy (/usr/bin/python3). TAP output.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
D=$FX/decoder

if ! $PY -c 'import numpy' 2>/dev/null; then
    echo "1..0 # SKIP python3-numpy missing (scripts/install-deps installs it)"
    exit 0
fi

# close DIR PREFIX: every DIR/<name>.npy equals $D/PREFIX<name>.npy within
# 1e-4 (same shape and dtype); prints the worst difference or what differs.
close() {
    $PY - "$1" "$D" "$2" <<'PYEOF'
import glob, os, sys
import numpy as np
out, fx, prefix = sys.argv[1:]
files = sorted(glob.glob(os.path.join(out, "*.npy")))
if len(files) != 7:
    sys.exit("%d outputs, wanted 7 (logits and 6 presents)" % len(files))
worst = 0.0
for f in files:
    name = os.path.basename(f)
    got, exp = np.load(f), np.load(os.path.join(fx, prefix + name))
    if got.shape != exp.shape or got.dtype != exp.dtype:
        sys.exit("%s: %s %s, wanted %s %s" % (name, got.dtype, got.shape, exp.dtype, exp.shape))
    d = float(np.abs(got - exp).max()) if got.size else 0.0
    if not d <= 1e-4:
        sys.exit("%s: max abs diff %g" % (name, d))
    worst = max(worst, d)
print("max abs diff %.3g" % worst)
PYEOF
}

# step PREFIX OUTDIR [ARGS]: pippin infer on the PREFIX step's inputs.
step() {
    prefix=$1 dir=$2
    shift 2
    set -- --input "idx=$D/${prefix}idx.npy" "$@"
    for i in 0 1 2; do
        for kv in key value; do
            set -- "$@" --input "past_key_values.$i.$kv=$D/${prefix}past_key_values.$i.$kv.npy"
        done
    done
    "$PIPPIN" infer "$D/decoder.onnx" "$@" --output-dir "$dir" >"$tmp/out" 2>"$tmp/err"
}

for case in "step0_:empty past (P=0), 3 stages:" "step0_:empty past (P=0), --no-split:--no-split" \
            "step0_:empty past (P=0), --no-split --no-optimize:--no-split --no-optimize" \
            "step0_:empty past (P=0), 3 stages --no-optimize:--no-optimize" \
            "step_:past P=6, 3 new tokens, 3 stages:"; do
    prefix=${case%%:*}
    rest=${case#*:}
    desc=${rest%%:*}
    extra=${rest#*:}
    dir=$tmp/o$n
    if step "$prefix" "$dir" $extra; then
        res=$(close "$dir" "$prefix" 2>&1)
        ok $? "decoder step, $desc: logits and presents match torch ($res)"
    else
        ok 1 "decoder step, $desc: pippin infer failed: $(head -c 300 "$tmp/err")"
    fi
done

"$PIPPIN" infer "$D/nocache.onnx" --input "idx=$D/prompt.npy" --output-dir "$tmp/nc" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ]; then
    res=$($PY - "$tmp/nc/logits.npy" "$D" <<'PYEOF' 2>&1
import sys
import numpy as np
got = np.load(sys.argv[1])
exp = np.load(sys.argv[2] + "/step0_logits.npy")
first = int(np.load(sys.argv[2] + "/greedy_cache.npy")[0])
assert got.shape == exp.shape, (got.shape, exp.shape)
d = float(np.abs(got - exp).max())
assert d <= 1e-4, "max abs diff %g" % d
assert int(got[0, -1].argmax()) == first, (int(got[0, -1].argmax()), first)
print("max abs diff %.3g" % d)
PYEOF
)
    ok $? "nocache.onnx on the prompt: the empty-past step's logits, argmax = first greedy token ($res)"
else
    ok 1 "nocache.onnx: pippin infer failed: $(head -c 300 "$tmp/err")"
fi

"$PIPPIN" inspect "$D/decoder.onnx" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 0 ] && grep -q "past_key_values.0.key  *float32\[batch,4,past,8\]" "$tmp/out" &&
    grep -q "present.2.value  *float32\[batch,4,total,8\]" "$tmp/out" &&
    grep -q "logits  *float32\[batch,seq,58\]" "$tmp/out"
ok $? "inspect shows the decoder's inputs and outputs with dims past and total"

"$PIPPIN" inspect "$D/decoder.onnx" --optimized >"$tmp/out" 2>"$tmp/err"
rc=$?
sed -n '/^optimized for inference/,$p' "$tmp/out" >"$tmp/opt"
[ $rc -eq 0 ] && grep -q "^optimized for inference: [0-9]* nodes -> [0-9]*" "$tmp/opt" &&
    grep -q "^  pass matmul  *[1-9]" "$tmp/opt" && grep -q "^  MatMulAdd  *[1-9]" "$tmp/opt" &&
    ! grep -q "^  Tanh " "$tmp/opt" && grep -q "^  Tanh " "$tmp/out"
ok $? "inspect --optimized: the passes' counts and the fused ops ($(head -n 1 "$tmp/err"))"

PIPPIN_OPTIMIZE=0 "$PIPPIN" inspect "$D/decoder.onnx" --optimized >"$tmp/out" 2>"$tmp/err"
line=$(grep "^optimized for inference" "$tmp/out")
set -- $line
[ "$4" = "$7" ] && ! grep -q MatMulAdd "$tmp/out"
ok $? "PIPPIN_OPTIMIZE=0: no pass runs ($line)"

echo "1..$n"
[ $fails -eq 0 ]
