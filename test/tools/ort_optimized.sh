#!/bin/sh
# The graph as inference runs it, written as ONNX (`pippin inspect
# --optimized -o`), loads in other ONNX tools: every pippin::MatMulAdd form
# the optimizer makes (a fused Relu, Gelu or tanh Gelu, a residual Add,
# a Split, their combinations, with and without a bias, packed weights
# from pippin::PackWeight or not, from a Gemm) and the GPT fixture. Once
# these forms had no function body: the export warned and ONNX Runtime
# and onnx.checker refused the file. Per model (ort_matmul_forms.py's, and
# the GPT's): written without a warning, onnx.checker's full check with a
# function for each pippin op used, no initializer no node reads, the
# MatMulAdd of the form wanted, and
# ONNX Runtime running the bodies gives the outputs of the unoptimized
# model (pippin's, and ONNX Runtime's where it loads) and of pippin's fused
# kernel, the exported file read back by pippin too (relative 1e-5). ONNX Runtime: npm's
# onnxruntime-node under $ORT_DIR (default ~/.cache/pippin-bench-ort);
# skipped where it is not, as is all of it without python3-onnx.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
ORT_DIR=${ORT_DIR:-$HOME/.cache/pippin-bench-ort}
export ORT_DIR
if ! $PY -c "import onnx, numpy" 2>/dev/null; then
    echo "1..0 # SKIP python3-onnx (or numpy) is not installed"
    exit 0
fi
have_ort=0
command -v node >/dev/null 2>&1 && [ -d "$ORT_DIR/node_modules/onnxruntime-node" ] && have_ort=1

# check NAME DIR: DIR/model.onnx fed DIR/<input>.npy for each name of
# DIR/inputs.txt; DIR/expect.txt (if any) the MatMulAdd wanted.
check() {
    f=$1 d=$2
    out=$tmp/$f.onnx
    "$PIPPIN" inspect "$d/model.onnx" --optimized -o "$out" >/dev/null 2>"$tmp/err" && ! grep -qi "warn" "$tmp/err"
    ok $? "$f: the optimized graph is written with a function for each pippin op $(head -c 300 "$tmp/err")"
    expect=""
    [ -f "$d/expect.txt" ] && expect=$(cat "$d/expect.txt")
    $PY - "$out" "$expect" >"$tmp/err" 2>&1 <<'PYEOF'
import sys
import onnx
m = onnx.load(sys.argv[1])
onnx.checker.check_model(m, full_check=True)
used = {n.op_type for n in m.graph.node if n.domain == 'pippin'}
assert used == {fn.name for fn in m.functions}, (used, [fn.name for fn in m.functions])
# no initializer left unread (constants folding orphaned: ONNX Runtime warned of each)
read = {x for n in m.graph.node for x in n.input} | {o.name for o in m.graph.output}
unread = [i.name for i in m.graph.initializer if i.name not in read]
assert not unread, ('initializers no node reads', unread[:5])
if sys.argv[2]:
    want = dict(w.split('=', 1) for w in sys.argv[2].split())
    mm = [n for n in m.graph.node if n.domain == 'pippin' and n.op_type.startswith('MatMulAdd')]
    assert len(mm) == 1, [n.op_type for n in m.graph.node]
    n = mm[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    got = {'activation': attrs.get('activation', b'').decode(), 'n_in': str(len(n.input)),
           'n_out': str(len(n.output)), 'packed': str(int(attrs.get('packed_n', 0) > 0)),
           'trans_b': str(attrs.get('transB', 0))}
    if len(n.input) > 2:
        got['bias'] = 'absent' if n.input[2] == 'pippin.absent' else 'zeros' if 'zero_bias' in n.input[2] else 'given'
    # a node without a bias is written with zeros for it (three inputs)
    if want.get('n_in') == '2':
        want['n_in'], want['bias'] = '3', 'zeros'
    for k, v in want.items():
        assert got.get(k) == v, (k, got.get(k), v, got)
PYEOF
    ok $? "$f: onnx.checker (full check) accepts it, one function per pippin op, MatMulAdd $expect $(tail -1 "$tmp/err")"
    if [ $have_ort = 0 ]; then
        ok 0 "$f: ONNX Runtime runs the bodies # SKIP no onnxruntime-node under $ORT_DIR"
        return
    fi
    pp_in="" ort_in=""
    for a in $(cat "$d/inputs.txt"); do
        pp_in="$pp_in --input $a=$d/$a.npy"
        ort_in="$ort_in $a=$d/$a.npy"
    done
    # shellcheck disable=SC2086 # the feeds are words
    # the unoptimized model in ONNX Runtime where it loads (not the GPT
    # fixture's: its pippin::PipeSplit markers have no function there)
    others=""
    # shellcheck disable=SC2086 # the feeds are words
    node "$HERE/ort_run.js" "$d/model.onnx" "$tmp/ort-ref-$f" $ort_in 2>/dev/null && others="$tmp/ort-ref-$f"
    # shellcheck disable=SC2086 # the feeds are words
    "$PIPPIN" infer "$d/model.onnx" $pp_in --no-split --no-optimize --output-dir "$tmp/ref-$f" >/dev/null 2>"$tmp/err" &&
        "$PIPPIN" infer "$d/model.onnx" $pp_in --no-split --output-dir "$tmp/pp-$f" >/dev/null 2>>"$tmp/err" &&
        "$PIPPIN" infer "$out" $pp_in --no-split --output-dir "$tmp/pp-back-$f" >/dev/null 2>>"$tmp/err" &&
        node "$HERE/ort_run.js" "$out" "$tmp/ort-$f" $ort_in 2>"$tmp/err.ort" &&
        $PY - "$tmp/ref-$f" "$tmp/ort-$f" "$tmp/pp-$f" "$tmp/pp-back-$f" $others >"$tmp/n" 2>>"$tmp/err" <<'PYEOF'
import glob, os, sys
import numpy as np
ref, others = sys.argv[1], sys.argv[2:]
files = sorted(glob.glob(ref + '/*.npy'))
assert files, 'no outputs'
for f in files:
    a = np.load(f)
    top = float(np.abs(a).max())
    assert top > 0, (f, 'zero')
    for o in others:
        b = np.load(os.path.join(o, os.path.basename(f)))
        assert a.shape == b.shape, (o, f, a.shape, b.shape)
        assert np.allclose(a, b, rtol=1e-5, atol=1e-5 * top), (o, f, float(np.abs(a - b).max()))
print(len(files))
PYEOF
    ok $? "$f: ONNX Runtime running the bodies, pippin's fused kernel (and the file read back) give the unoptimized model's $(cat "$tmp/n" 2>/dev/null) outputs$([ -n "$others" ] && echo " (pippin's and ONNX Runtime's)") $(tail -c 300 "$tmp/err")"
}

if $PY "$HERE/ort_matmul_forms.py" "$tmp/forms" 2>"$tmp/err"; then
    for d in "$tmp"/forms/*/; do
        d=${d%/}
        check "$(basename "$d")" "$d"
    done
else
    ok 1 "ort_matmul_forms.py: $(tail -1 "$tmp/err")"
fi
# The GPT: its QKV projection's Split, the residual Adds, the tanh Gelu.
printf 'idx targets\n' >"$tmp/gpt_inputs.txt"
mkdir -p "$tmp/gpt" && ln -s "$(cd "$FX/gpt" && pwd)"/model.onnx "$(cd "$FX/gpt" && pwd)"/idx.npy \
    "$(cd "$FX/gpt" && pwd)"/targets.npy "$tmp/gpt/" && cp "$tmp/gpt_inputs.txt" "$tmp/gpt/inputs.txt"
check gpt "$tmp/gpt"
echo "1..$n"
[ "$fails" -eq 0 ]
