#!/bin/sh
# A serving pipeline survives a stage worker's death (docs/serving.md,
# "Failures"): the decoder fixture as 3 workers started by hand, with
# rejoin_timeout_ms. Rank 2 is killed (SIGKILL):
#   - the front notices at once, though idle: stats say "degraded" naming
#     rank 2; requests are answered "unavailable" at once (no hang);
#   - rank 2 is started again; the others were never restarted (same pids);
#     the service is back to "serving" and generates PyTorch's greedy tokens;
#   - a session opened before the failure is told "session lost" once, then
#     starts afresh;
#   - SIGTERM ends every worker with exit 0.
# TAP output; every wait is bounded.
. "$(dirname "$0")/tap.sh"
PY=/usr/bin/python3
DEC=$FX/decoder
FRONT=ipc://$tmp/front
cat >"$tmp/s.yaml" <<YAML
model: $DEC/decoder.onnx
mode: serve
ranks: [ipc://$tmp/r0, ipc://$tmp/r1, ipc://$tmp/r2]
timeout_ms: 2000
rejoin_timeout_ms: 60000
serve: {endpoint: $FRONT, context: 32, vocab: $DEC/vocab.json}
YAML
$PY -c 'import numpy as np, sys; np.save(sys.argv[1], np.array([[3, 4, 5]], np.int64))' "$tmp/seq.npy"
worker() { # RANK
    timeout 120 "$PIPPIN" worker "$tmp/s.yaml" --rank "$1" >"$tmp/w$1.out" 2>>"$tmp/w$1.err" &
    eval "pid$1=\$!"
}
state() { timeout 5 "$PIPPIN" request "$FRONT" --stats --timeout-ms 1000 2>/dev/null; }
wait_state() { # STATE: up to 30 s
    for _ in $(seq 1 150); do
        state | grep -q "\"state\": \"$1\"" && return 0
        sleep 0.2
    done
    return 1
}
req() { timeout 30 "$PIPPIN" request "$FRONT" --input "idx=$tmp/seq.npy" --output-dir "$tmp/o" "$@" >/dev/null 2>"$tmp/req.err"; }
cleanup() {
    for p in $pid0 $pid1 $pid2; do kill -TERM "$p" 2>/dev/null; done
    for p in $pid0 $pid1 $pid2; do wait "$p" 2>/dev/null; done
}

worker 0
worker 1
worker 2
if ! wait_state serving; then
    ok 1 "the service did not come up: $(tail -3 "$tmp/w0.err")"
    cleanup
    echo "1..$n"
    exit 0
fi
req --session s
ok $? "serving; a session is open: $(cat "$tmp/req.err")"
first0=$pid0 first1=$pid1

pkill -9 -f "worker $tmp/s.yaml --rank 2" # the worker itself, not its timeout wrapper
for _ in $(seq 1 50); do kill -0 "$pid2" 2>/dev/null || break; sleep 0.1; done
wait_state degraded
rc=$?
why=$(state | $PY -c 'import json, sys; print(json.load(sys.stdin)["why"])' 2>/dev/null)
if [ $rc -ne 0 ] || ! echo "$why" | grep -q "rank 2"; then
    ok 1 "rank 2 killed: the idle front did not say degraded naming rank 2: $(state)"
else
    ok 0 "rank 2 killed: the idle front says: $why"
fi
# "at once": well before the request's 30 s timeout (a whole client
# process, slow to start and end under a sanitizer, is timed)
t0=$(date +%s)
req --timeout-ms 30000
rc=$?
took=$(($(date +%s) - t0))
if [ $rc -ne 1 ] || ! grep -q "unavailable: degraded" "$tmp/req.err" || [ $took -gt 10 ]; then
    ok 1 "while degraded: exit $rc after $took s: $(cat "$tmp/req.err")"
else
    ok 0 "while degraded a request is answered at once: $(cut -c1-120 "$tmp/req.err")"
fi

worker 2
if ! wait_state serving; then
    ok 1 "rank 2 restarted: the service did not serve again: $(state) $(tail -2 "$tmp/w0.err" "$tmp/w2.err")"
else
    same=0
    [ "$pid0" = "$first0" ] && [ "$pid1" = "$first1" ] && kill -0 "$pid0" && kill -0 "$pid1" && same=1
    [ $same = 1 ]
    ok $? "rank 2 restarted: serving again, ranks 0 and 1 still their first processes (rejoins: $(state | $PY -c 'import json, sys; print(json.load(sys.stdin)["rejoins"])'))"
    timeout 30 "$PIPPIN" generate "$FRONT" --tokens "$DEC/prompt.npy" --max-tokens 20 --tokens-out >"$tmp/gen" 2>"$tmp/gen.err"
    rc=$?
    $PY -c 'import sys, numpy as np; a=[int(x) for x in open(sys.argv[1]).read().split()]; sys.exit(a != np.load(sys.argv[2]).tolist())' \
        "$tmp/gen" "$DEC/greedy_cache.npy"
    ok $((rc + $?)) "after the rejoin greedy generation equals PyTorch's (exit $rc $(cat "$tmp/gen.err"))"
    req --session s
    rc=$?
    grep -q "session lost: the service lost a rank" "$tmp/req.err"
    lost=$?
    cp "$tmp/req.err" "$tmp/lost.err"
    req --session s
    rc2=$?
    [ $rc -eq 1 ] && [ $lost -eq 0 ] && [ $rc2 -eq 0 ]
    ok $? "the session opened before: told once ($(cut -c1-100 "$tmp/lost.err")), then afresh (exit $rc2)"
fi

for p in $pid0 $pid1 $pid2; do kill -TERM "$p" 2>/dev/null; done
rcs=""
for p in $pid0 $pid1 $pid2; do
    wait "$p"
    rcs="$rcs $?"
done
[ "$rcs" = " 0 0 0" ]
ok $? "SIGTERM: every worker exits 0 (exits:$rcs)"
echo "1..$n"
