#!/bin/sh
# Sessions and generation (docs/serving.md) on test/fixtures/decoder: a
# 3-layer char GPT exported with a KV cache (decoder.onnx) and without
# (nocache.onnx), trained in PyTorch, served as a 3-rank pipeline over ipc:
#   - greedy generation equals PyTorch's greedy generation token for token,
#     with the cache (state kept per stage) and without (whole sequence fed);
#   - a text prompt through serve.vocab; a session continued across
#     generations equals one generation over the whole text; requests with a
#     session give the logits of one request over the whole sequence;
#   - sampling is reproducible for a seed; stop tokens; cancel;
#   - sessions end: idle expiry, serve.max_sessions, the per-rank byte bound,
#     end-session; each tells the next request "session lost", once;
#   - bad requests name what is wrong; params: DIR replaces the weights.
# TAP output; every wait is bounded.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
DEC=$FX/decoder
cfg() { # NAME MODEL EXTRA-SERVE-KEYS [EXTRA-TOP-LEVEL]
    cat >"$tmp/$1.yaml" <<YAML
model: $DEC/$2
mode: serve
ranks: [ipc://$tmp/$1-0, ipc://$tmp/$1-1, ipc://$tmp/$1-2]
timeout_ms: 3000
serve: {endpoint: ipc://$tmp/$1-front, context: 32, vocab: $DEC/vocab.json, $3}
$4
YAML
}
up() { # NAME PID: waits for the front to answer while pippin run lives
    for _ in $(seq 1 100); do
        kill -0 "$2" 2>/dev/null || return 1
        timeout 5 "$PIPPIN" request "ipc://$tmp/$1-front" --stats --timeout-ms 500 >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}
start() { # NAME: pippin run in the background ($lpid)
    timeout 300 "$PIPPIN" run "$tmp/$1.yaml" >"$tmp/$1.out" 2>"$tmp/$1.err" &
    lpid=$!
    up "$1" $lpid
}
stop() {
    kill -TERM $lpid 2>/dev/null
    wait $lpid
}
gen() { # NAME OUT ARGS...: pippin generate, token ids one per line into OUT
    name=$1 out=$2
    shift 2
    timeout 30 "$PIPPIN" generate "ipc://$tmp/$name-front" --tokens-out "$@" >"$out" 2>"$out.err"
}
same_tokens() { # FILE NPY: the ids in FILE equal the .npy's
    $PY -c 'import sys, numpy as np; a=[int(x) for x in open(sys.argv[1]).read().split()]; b=np.load(sys.argv[2]).ravel().tolist(); sys.exit(a != b)' "$1" "$2"
}

# ---- with the KV cache ----
cfg c decoder.onnx "session_idle_ms: 3000, max_sessions: 4"
if ! start c; then
    ok 1 "the decoder service did not come up: $(tail -3 "$tmp/c.err")"
    echo "1..$n"
    exit 0
fi
ok 0 "pippin run serves the 3-rank decoder (state kept on the stages)"

gen c "$tmp/g1" --tokens "$DEC/prompt.npy" --max-tokens 20
rc=$?
same_tokens "$tmp/g1" "$DEC/greedy_cache.npy"
ok $((rc + $?)) "greedy generation with the cache equals PyTorch's 20 tokens (exit $rc) $(cat "$tmp/g1.err")"

timeout 30 "$PIPPIN" generate "ipc://$tmp/c-front" --prompt "CELIA:" --max-tokens 20 >"$tmp/text" 2>"$tmp/text.err"
rc=$?
want=$($PY -c 'import json, sys, numpy as np; v=json.load(open(sys.argv[1]))["chars"]; print("".join(v[t] for t in np.load(sys.argv[2])), end="")' "$DEC/vocab.json" "$DEC/greedy_cache.npy")
got=$(head -c 200 "$tmp/text")
[ $rc -eq 0 ] && [ "$got" = "$want" ]
ok $? "a text prompt ('CELIA:') through serve.vocab prints PyTorch's continuation: '$(printf %s "$got" | tr '\n' '/')' (exit $rc $(cat "$tmp/text.err"))"

res=$(PYTHONPATH="$SRC/python" $PY - "ipc://$tmp/c-front" "$DEC" <<'PYEOF' 2>&1
import json, sys, numpy as np
from pippin_client import Client, ServeError
ep, dec = sys.argv[1], sys.argv[2]
stoi = {ch: i for i, ch in enumerate(json.load(open(dec + "/vocab.json"))["chars"])}
enc = lambda s: [stoi[ch] for ch in s]
c = Client(ep)
toks = lambda **kw: [t for r in c.generate(**kw) for t in r.tokens]
# a session continued: the last token of a generation is fed first next time
a = toks(text="CELIA:", max_tokens=5, session="conv")
b = toks(text=" and", max_tokens=6, session="conv")
whole = toks(tokens=enc("CELIA:") + a + enc(" and"), max_tokens=6)
assert b == whole, "continued session %s, one generation %s" % (b, whole)
# requests with a session: the state feeds the next one
seq = np.array([enc("CELIA: and so")], np.int64)
o1 = c.request({"idx": seq[:, :7]}, session="r")
o2 = c.request({"idx": seq[:, 7:]}, session="r")
one = c.request({"idx": seq})
d = float(np.abs(o2["logits"] - one["logits"][:, 7:]).max())
assert d < 1e-5, "session logits differ by %g" % d
assert sorted(o1) == ["logits"], "state outputs were sent back: %s" % sorted(o1)
c.end_session("r")
o3 = c.request({"idx": seq[:, 7:]}, session="r")   # a new session: no state
alone = c.request({"idx": seq[:, 7:]})
assert np.array_equal(o3["logits"], alone["logits"]), "after end_session the state was still there"
c.end_session("r")
# sampling: reproducible for a seed, different for another; top_k 1 is greedy
s1 = toks(text="CELIA:", max_tokens=12, temperature=0.9, top_k=8, seed=3)
s2 = toks(text="CELIA:", max_tokens=12, temperature=0.9, top_k=8, seed=3)
s3 = toks(text="CELIA:", max_tokens=12, temperature=0.9, top_k=8, seed=4)
g = toks(text="CELIA:", max_tokens=12)
k1 = toks(text="CELIA:", max_tokens=12, temperature=5.0, top_k=1, seed=9)
assert s1 == s2 and s1 != s3 and k1 == g, (s1, s2, s3, k1, g)
# a stop token ends the generation (and is produced)
stop = g[3]
st = toks(text="CELIA:", max_tokens=12, stop=[stop])
assert st == g[:g.index(stop) + 1], (st, g)
# streamed: one message per token, more set on all but the last
msgs = list(c.generate(text="CELIA:", max_tokens=4))
assert [len(m.tokens) for m in msgs] == [1] * 4 and [m.more for m in msgs] == [True] * 3 + [False]
# cancel: the generation stops, the service goes on
it = c.generate(text="CELIA:", max_tokens=30)
next(it)
it.close()
assert toks(text="CELIA:", max_tokens=3) == g[:3]
# bad requests
for kw, needle in [(dict(inputs={"idx": seq, "past_key_values.0.key": np.zeros((1, 4, 0, 8), np.float32)}),
                    "is state the service keeps"),
                   (dict(inputs={"idx": seq}, outputs=["present.0.key"]), "is state the service keeps")]:
    try:
        c.request(**kw)
        raise AssertionError("answered: %s" % kw)
    except ServeError as e:
        assert e.kind == "bad request" and needle in str(e), str(e)
try:
    toks(text="CELIA:\x01", max_tokens=2)
    raise AssertionError("a character outside the vocabulary was taken")
except ServeError as e:
    assert e.kind == "bad request" and "not in serve.vocab" in str(e), str(e)
# a session's requests run in the order they came, one at a time, even sent together
seq1 = toks(text="CELIA:", max_tokens=8, session="o1") + toks(text=" and", max_tokens=8, session="o1")
r1 = c.submit(None, kind=2, session="o2", extra=b"\x3a\x06CELIA:\x40\x08")
r2 = c.submit(None, kind=2, session="o2", extra=b"\x3a\x04 and\x40\x08")
got = {r1: [], r2: []}
for rid in (r1, r2):
    while True:
        m = c.wait(rid)
        assert m.code == 0, m.error
        got[rid] += m.tokens
        if not m.more:
            break
assert got[r1] + got[r2] == seq1, (got, seq1)
# serve.context (32) counts the session's positions: a generation stops there, a prompt past it is refused
n1 = toks(text="CELIA:", max_tokens=8, session="ctx")   # 6 + 7 fed, 1 pending
n2 = toks(text=" and", max_tokens=8, session="ctx")     # 13 + 5 + 7 = 25
n3 = toks(text=" so", max_tokens=8, session="ctx")      # 25 + 4 = 29, then 3 more steps to 32
assert (len(n1), len(n2), len(n3)) == (8, 8, 4), (n1, n2, n3)
try:
    toks(text=" ok", max_tokens=2, session="ctx")
    raise AssertionError("a prompt past serve.context was taken")
except ServeError as e:
    assert e.kind == "bad request" and "serve.context 32" in str(e), str(e)
try:
    toks(text="CELIA: " * 6, max_tokens=2)
    raise AssertionError("a 42-token prompt was taken with serve.context 32")
except ServeError as e:
    assert e.kind == "bad request" and "serve.context 32" in str(e), str(e)
# two ends of one session, sent together: both answered ok
toks(text="CELIA:", max_tokens=2, session="twice")
e1, e2 = (c.submit(None, kind=4, session="twice") for _ in range(2))
assert c.wait(e1).code == 0 and c.wait(e2).code == 0
import time
time.sleep(0.5)  # the ranks report their counters when idle
stats = c.stats()
assert stats["tokens"] > 50, stats
ranks = stats["ranks"]
assert [r["rank"] for r in ranks] == [0, 1, 2] and all(r["batches"] > 20 and r["compute_ms"] > 0 for r in ranks), ranks
print("ok")
PYEOF
)
[ "$res" = ok ]
ok $? "Python client: a continued session equals one generation; session requests give one request's logits; end_session; seeded sampling; stop token; streaming; cancel; bad requests named; per-rank stats${res#ok}"

# sessions end; the next request is told once, then starts afresh
lost() { # DESC NEEDLE SESSION
    timeout 30 "$PIPPIN" request "ipc://$tmp/c-front" --input "idx=$tmp/seq.npy" --session "$3" --output-dir "$tmp" \
        >/dev/null 2>"$tmp/lost.err"
    rc=$?
    timeout 30 "$PIPPIN" request "ipc://$tmp/c-front" --input "idx=$tmp/seq.npy" --session "$3" --output-dir "$tmp" \
        >/dev/null 2>"$tmp/lost2.err"
    rc2=$?
    if [ $rc -ne 1 ] || ! grep -qF -- "session lost: $2" "$tmp/lost.err" || [ $rc2 -ne 0 ]; then
        ok 1 "$1: exit $rc ($(cat "$tmp/lost.err")), then exit $rc2 ($(cat "$tmp/lost2.err"))"
    else
        ok 0 "$1: $(cat "$tmp/lost.err"); the next request starts afresh"
    fi
}
$PY -c 'import numpy as np, sys; np.save(sys.argv[1], np.array([[3, 4, 5]], np.int64))' "$tmp/seq.npy"
sreq() { timeout 30 "$PIPPIN" request "ipc://$tmp/c-front" --input "idx=$tmp/seq.npy" --session "$1" --output-dir "$tmp" >/dev/null 2>&1; }
sreq idle
sleep 3.5
lost "an idle session expires (session_idle_ms 3000)" "unused for 3000 ms" idle
# m1 must still be fresh when m5 comes, or it expires instead of making
# room: 5 client processes (slow under a sanitizer) within the 3 s
t0=$(date +%s%N)
for s in m1 m2 m3 m4 m5; do sreq $s; sleep 0.05; done
took_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
if [ $took_ms -lt 2500 ]; then
    lost "the least recently used of 5 sessions makes room (max_sessions 4)" "ended to make room" m1
else
    n=$((n + 1))
    echo "ok $n # SKIP the 5 sessions took $took_ms ms, too close to session_idle_ms for the room test"
fi
stop

# ---- the per-rank byte bound ----
cfg b decoder.onnx "session_max_bytes: 2500"
if start b; then
    # 3 tokens of state: 2 x [1, 4, 3, 8] floats = 768 bytes per rank; y's
    # third request makes y 2304 bytes, past the bound with x's 768: x goes
    breq() { timeout 30 "$PIPPIN" request "ipc://$tmp/b-front" --input "idx=$tmp/seq.npy" --session "$1" --output-dir "$tmp" >/dev/null 2>"$tmp/b.err"; }
    breq x && breq y && breq y && breq y && breq x
    rc=$?
    cp "$tmp/b.err" "$tmp/b.lost"
    breq x # told once: this one starts afresh
    rc2=$?
    if [ $rc -ne 1 ] || ! grep -q "session lost: rank 0 no longer holds" "$tmp/b.lost" || [ $rc2 -ne 0 ]; then
        ok 1 "byte bound: x's state was dropped for y's: exit $rc ($(cat "$tmp/b.lost")), then exit $rc2 ($(cat "$tmp/b.err"))"
    else
        ok 0 "byte bound (2500 bytes per rank): the least recently used session's state is dropped: $(cat "$tmp/b.lost"); told once"
    fi
    stop
else
    ok 1 "the byte-bound service did not come up: $(tail -3 "$tmp/b.err")"
fi

# ---- without the cache: the whole sequence each step ----
cfg n nocache.onnx ""
if start n; then
    gen n "$tmp/g2" --tokens "$DEC/prompt.npy" --max-tokens 20
    rc=$?
    same_tokens "$tmp/g2" "$DEC/greedy_nocache.npy"
    ok $((rc + $?)) "greedy generation without a cache equals PyTorch's 20 tokens (exit $rc) $(cat "$tmp/g2.err")"
    gen n "$tmp/g3" --prompt "CELIA:" --max-tokens 40
    rc=$?
    [ "$(wc -l <"$tmp/g3")" = 40 ]
    ok $((rc + $?)) "without a cache a generation goes past the model's 32 positions (serve.context keeps the last 32): exit $rc $(cat "$tmp/g3.err")"
    res=$(PYTHONPATH="$SRC/python" $PY - "ipc://$tmp/n-front" <<'PYEOF' 2>&1
import sys, time, zmq
from pippin_client import Client
ep = sys.argv[1]
t0 = Client(ep).stats()["tokens"]
c = Client(ep, context=zmq.Context())
g = c.generate(text="CELIA:", max_tokens=4000)
next(g)
c._sock.close(linger=0)  # the client goes away mid-stream, without a cancel
# until the service is idle and its token count holds for a second (a
# fixed 1.5 s was short for a loaded machine or a sanitizer), at most 20 s;
# the generation must have stopped well before its 4000 tokens
deadline = time.time() + 20
st = Client(ep).stats()
while time.time() < deadline:
    time.sleep(1.0)
    again = Client(ep).stats()
    settled = again["tokens"] == st["tokens"] and again["in_system"] == 0
    st = again
    if settled:
        break
made = st["tokens"] - t0
print("ok" if settled and made < 2000 else
      "after 20 s: %d tokens made, in_system %d, settled %s" % (made, st["in_system"], settled))
PYEOF
)
    [ "$res" = ok ]
    ok $? "a client gone mid-stream: its generation stops (no tokens for nobody) ${res#ok}"
    timeout 30 "$PIPPIN" request "ipc://$tmp/n-front" --input "idx=$tmp/seq.npy" --session s --output-dir "$tmp" \
        >/dev/null 2>"$tmp/ns.err"
    rc=$?
    [ $rc -eq 1 ] && grep -q "keeps no state between requests" "$tmp/ns.err"
    ok $? "a session on a model without state is a bad request: $(cat "$tmp/ns.err")"
    stop
else
    ok 1 "the no-cache service did not come up: $(tail -3 "$tmp/n.err")"
fi

# ---- params: DIR ----
if $PY -c 'import onnx' 2>/dev/null; then
    $PY - "$DEC/decoder.onnx" "$tmp" <<'PYEOF'
import json, os, sys, numpy as np, onnx
from onnx import numpy_helper
m = onnx.load(sys.argv[1])
trainable = json.loads({p.key: p.value for p in m.metadata_props}["pippin.trainable"])
for name in ("zero", "missing", "shape"):
    os.makedirs(os.path.join(sys.argv[2], name), exist_ok=True)
for t in m.graph.initializer:
    if t.name not in trainable:
        continue
    a = numpy_helper.to_array(t)
    np.save(os.path.join(sys.argv[2], "zero", t.name + ".npy"), np.zeros_like(a))
    if t.name != "ln_f.bias":
        np.save(os.path.join(sys.argv[2], "missing", t.name + ".npy"), a)
    np.save(os.path.join(sys.argv[2], "shape", t.name + ".npy"), a if t.name != "ln_f.bias" else a[:-1])
PYEOF
    cfg z decoder.onnx "" "params: $tmp/zero"
    if start z; then
        gen z "$tmp/g4" --prompt "CELIA:" --max-tokens 5
        rc=$?
        [ "$(tr '\n' ' ' <"$tmp/g4")" = "0 0 0 0 0 " ]
        ok $((rc + $?)) "params: DIR replaces the weights (all zero: equal logits, greedy picks token 0): $(tr '\n' ' ' <"$tmp/g4")"
        stop
    else
        ok 1 "the params service did not come up: $(tail -3 "$tmp/z.err")"
    fi
    cfg e decoder.onnx "" "params: $tmp/missing"
    expect 1 "has no file for parameter 'ln_f.bias'" "params: DIR without a trained parameter's file is refused" \
        -- worker "$tmp/e.yaml" --rank 0
    cfg f decoder.onnx "" "params: $tmp/shape"
    expect 1 "parameter 'ln_f.bias' of the model is float32[32]" "params: DIR with a wrong shape is refused" \
        -- worker "$tmp/f.yaml" --rank 0
else
    ok 1 "params: python3-onnx missing (scripts/install-deps installs it)"
fi
echo "1..$n"
