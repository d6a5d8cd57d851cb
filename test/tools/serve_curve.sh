#!/bin/sh
# CURVE with a client allow-list on the serving front (docs/serving.md
# "Security"): the example GPT as a 4-rank pipeline (its 4 stages; serving
# runs one stage per rank) over ipc with
# `security:` (rank keys from `pippin keygen`) and serve.client_keys:
#   - an allowed client (pippin request --server-key --key) is answered, the
#     same logits as `pippin infer`; pippin generate gets through too;
#   - a client whose key is not in the list, and a plaintext client, get no
#     answer: the request ends at its timeout with a client error naming
#     CURVE, exit 1; the service goes on answering the allowed one;
#   - the Python client: the same three cases (read_key, Client(keys));
#   - --server-key without --key is a usage error (2);
#   - config errors: serve.client_keys without security, security without
#     serve.client_keys: non-zero exit naming the key;
#   - SIGTERM ends every worker, exit 0, no process left.
# TAP output; every wait is bounded.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
# The workers and `pippin infer` compute on the same thread count: pippin's
# own kernels give the same bits at any count, OpenBLAS's GEMM does not.
export PIPPIN_THREADS=1
for k in rank0 rank1 rank2 rank3 alice mallory; do
    "$PIPPIN" keygen -o "$tmp/$k" >/dev/null 2>&1 || { echo "Bail out! pippin keygen failed"; exit 1; }
done
cfg() { # NAME SECURITY-BLOCK EXTRA-SERVE-KEYS
    cat >"$tmp/$1.yaml" <<YAML
model: $SRC/examples/gpt/model.onnx
mode: serve
dims: {batch: 4, seq: 64}
ranks: [ipc://$tmp/$1-0, ipc://$tmp/$1-1, ipc://$tmp/$1-2, ipc://$tmp/$1-3]
timeout_ms: 3000
serve: {endpoint: ipc://$tmp/$1-front $3}
$2
YAML
}
SEC="security: {secret_keys: [rank0.key, rank1.key, rank2.key, rank3.key],
           public_keys: [rank0.pub, rank1.pub, rank2.pub, rank3.pub]}"
ALICE="--server-key $tmp/rank0.pub --key $tmp/alice"
MALLORY="--server-key $tmp/rank0.pub --key $tmp/mallory"

# config errors first: they need no service
cfg nosec "" ", client_keys: [alice.pub]"
timeout 30 "$PIPPIN" run "$tmp/nosec.yaml" >"$tmp/nosec.out" 2>"$tmp/nosec.err"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "serve.client_keys" "$tmp/nosec.err" && grep -q "security" "$tmp/nosec.err"
ok $? "serve.client_keys without security: exit $rc naming the key: $(head -c 200 "$tmp/nosec.err")"
cfg nokeys "$SEC" ""
timeout 30 "$PIPPIN" run "$tmp/nokeys.yaml" >"$tmp/nokeys.out" 2>"$tmp/nokeys.err"
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "serve.client_keys: needed with security" "$tmp/nokeys.err"
ok $? "security without serve.client_keys: exit $rc naming the key: $(head -c 200 "$tmp/nokeys.err")"

$PY - "$tmp" <<'PYEOF'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(7)
np.save(f"{d}/idx.npy", rng.integers(0, 58, (2, 64)).astype(np.int64))
np.save(f"{d}/tg.npy", rng.integers(0, 58, (2, 64)).astype(np.int64))
np.save(f"{d}/prompt.npy", rng.integers(0, 58, (1, 8)).astype(np.int64))
PYEOF
mkdir -p "$tmp/ref"
"$PIPPIN" infer "$SRC/examples/gpt/model.onnx" --input "idx=$tmp/idx.npy" --input "targets=$tmp/tg.npy" \
    --output-dir "$tmp/ref" >/dev/null 2>&1

EP="ipc://$tmp/c-front"
# no_answer FILE: FILE (a client's stderr) says the request got no answer:
# it timed out, or no connection took it (a refused handshake leaves the
# client reconnecting, and a send in that window has nowhere to go; CI saw
# it once).
no_answer() { grep -q "no response\|nothing took the request" "$1"; }
req() { # OUTDIR TIMEOUT [key options]: one request for the logits
    out=$1 t=$2
    shift 2
    mkdir -p "$out"
    timeout 30 "$PIPPIN" request "$EP" --input "idx=$tmp/idx.npy" --input "targets=$tmp/tg.npy" --output logits \
        --output-dir "$out" --timeout-ms "$t" "$@" >"$out.stdout" 2>"$out.stderr"
}
cfg c "$SEC" ", client_keys: [alice.pub]"
timeout 300 "$PIPPIN" run "$tmp/c.yaml" >"$tmp/c.out" 2>"$tmp/c.err" &
lpid=$!
up=1
for _ in $(seq 1 100); do
    kill -0 $lpid 2>/dev/null || break
    # shellcheck disable=SC2086
    timeout 5 "$PIPPIN" request "$EP" --stats --timeout-ms 500 $ALICE >/dev/null 2>&1 && { up=0; break; }
    sleep 0.1
done
if [ $up -ne 0 ]; then
    ok 1 "the CURVE service did not come up: $(tail -3 "$tmp/c.err")"
    kill -TERM $lpid 2>/dev/null
    wait $lpid
    echo "1..$n"
    exit 0
fi
ok 0 "pippin run serves the 4-rank GPT with a CURVE front; an allowed client gets stats"

# shellcheck disable=SC2086
req "$tmp/a1" 5000 $ALICE && cmp -s "$tmp/a1/logits.npy" "$tmp/ref/logits.npy"
ok $? "an allowed client's request is answered, equal to infer: $(head -c 200 "$tmp/a1.stderr")"

t0=$(date +%s)
# shellcheck disable=SC2086
req "$tmp/m1" 1500 $MALLORY
rc=$?
el=$(($(date +%s) - t0))
[ $rc -eq 1 ] && [ $el -lt 20 ] && no_answer "$tmp/m1.stderr" && grep -q "CURVE" "$tmp/m1.stderr" &&
    [ ! -e "$tmp/m1/logits.npy" ]
ok $? "a key not in serve.client_keys gets no answer: exit $rc after ${el}s: $(head -c 250 "$tmp/m1.stderr")"

req "$tmp/p1" 1500
rc=$?
[ $rc -eq 1 ] && no_answer "$tmp/p1.stderr" && [ ! -e "$tmp/p1/logits.npy" ]
ok $? "a plaintext client gets no answer: exit $rc: $(head -c 200 "$tmp/p1.stderr")"

# shellcheck disable=SC2086
req "$tmp/a2" 5000 $ALICE && cmp -s "$tmp/a2/logits.npy" "$tmp/ref/logits.npy"
ok $? "after the refused clients the allowed one is still answered: $(head -c 200 "$tmp/a2.stderr")"

# pippin generate talks CURVE too: the GPT (two inputs) is no generation
# model, so the service's answer is an error; what matters is that one came
# shellcheck disable=SC2086
timeout 30 "$PIPPIN" generate "$EP" --tokens "$tmp/prompt.npy" --max-tokens 2 --timeout-ms 5000 $ALICE \
    >"$tmp/g1.out" 2>"$tmp/g1.err"
rc=$?
[ $rc -le 1 ] && ! grep -q "no response" "$tmp/g1.err"
ok $? "pippin generate with the allowed key gets the service's answer (exit $rc): $(head -c 200 "$tmp/g1.err")"
# shellcheck disable=SC2086
timeout 30 "$PIPPIN" generate "$EP" --tokens "$tmp/prompt.npy" --max-tokens 2 --timeout-ms 1500 $MALLORY \
    >"$tmp/g2.out" 2>"$tmp/g2.err"
rc=$?
[ $rc -eq 1 ] && no_answer "$tmp/g2.err"
ok $? "pippin generate with a refused key gets no answer (exit $rc): $(head -c 200 "$tmp/g2.err")"

timeout 10 "$PIPPIN" request "$EP" --stats --server-key "$tmp/rank0.pub" >/dev/null 2>"$tmp/u.err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--key" "$tmp/u.err"
ok $? "--server-key without --key is a usage error (exit $rc)"
timeout 10 "$PIPPIN" request "$EP" --stats --server-key "$tmp/nothere.pub" --key "$tmp/alice" >/dev/null 2>"$tmp/u2.err"
rc=$?
[ $rc -eq 1 ] && grep -q "nothere.pub" "$tmp/u2.err"
ok $? "a missing key file is named (exit $rc): $(head -c 200 "$tmp/u2.err")"

if $PY -c 'import zmq' 2>/dev/null; then
    res=$(PYTHONPATH="$SRC/python" timeout 60 $PY - "$tmp" "$EP" <<'PYEOF'
import sys, numpy as np
from pippin_client import Client, read_key
d, ep = sys.argv[1], sys.argv[2]
server = read_key(f"{d}/rank0.pub")
inputs = {"idx": np.load(f"{d}/idx.npy"), "targets": np.load(f"{d}/tg.npy")}
c = Client(ep, server_key=server, public_key=read_key(f"{d}/alice.pub"), secret_key=read_key(f"{d}/alice.key"))
out = c.request(inputs, outputs=["logits"])
assert np.array_equal(out["logits"], np.load(f"{d}/ref/logits.npy")), "the allowed client's logits differ"
for name, kw in (("mallory", dict(server_key=server, public_key=read_key(f"{d}/mallory.pub"),
                                  secret_key=read_key(f"{d}/mallory.key"))), ("plaintext", {})):
    x = Client(ep, **kw)
    rid = x.submit(inputs, ["logits"], timeout_ms=1000)
    try:
        x.wait(rid, timeout_ms=1500)
        print("%s was answered" % name)
        sys.exit(0)
    except TimeoutError:
        pass
try:
    Client(ep, server_key=server)
    print("a lone server_key was taken")
    sys.exit(0)
except ValueError:
    pass
assert c.stats()["ok"] >= 3
print("ok")
PYEOF
)
    [ "$res" = ok ]
    ok $? "Python client: the allowed key is answered; a refused key and plaintext time out ${res#ok}"
else
    ok 1 "Python client: python3-zmq missing (scripts/install-deps installs it)"
fi

# SIGTERM: every worker ends, exit 0
kill -TERM $lpid
wait $lpid
rc=$?
sleep 0.2
[ $rc -eq 0 ] && ! pgrep -f "worker $tmp/c.yaml" >/dev/null
ok $? "SIGTERM ends the service: exit $rc, no worker left: $(tail -2 "$tmp/c.err")"
echo "1..$n"
