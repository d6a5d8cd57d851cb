#!/bin/sh
# Fault suite: recovery without restarting everyone. One of 4 training
# workers (checkpoint after every step) is SIGKILLed at a random moment
# while the run is on (kill_rank);
# the three others do not exit but wait for it (rejoin_timeout_ms), and
# once it is started again every rank rolls back to the newest committed
# checkpoint. The run must end with the uninterrupted run's losses and
# trained parameters, bit for bit. Trials alternate between
#   - `pippin run --restart 3` over ipc (the launcher restarts the worker),
#   - workers started by hand over tcp, the dead one restarted by hand with
#     --resume-if-any after a random pause,
#   - `pippin run --restart 3` with no checkpoint: everyone starts over.
# Then a rank that never comes back: every survivor exits with an error
# naming it once rejoin_timeout_ms has passed. TAP output; bounded.
. "$(dirname "$0")/../tools/tap.sh"
TRIALS=${PIPPIN_FAULT_REJOIN_TRIALS:-6}
STEPS=40
losses() { grep -o "^step [0-9]*: loss [0-9.]*" "$1"; }
last_losses() { losses "$1" | awk '{last[$2] = $0} END {for (s in last) print last[s]}' | sort -t' ' -k2 -n; }
. "$(dirname "$0")/kill.sh"
cfg() { # NAME OUTDIR RANKS [EXTRA LINE]
    cat >"$tmp/$1.yaml" <<YAML
model: $SRC/examples/gpt/model.onnx
schedule: 1f1b
microbatches: 2
batch_size: 8
steps: $STEPS
optimizer: {kind: adamw, lr: 0.002}
text: {file: $SRC/examples/data/tiny.txt, vocab: $SRC/examples/gpt/vocab.json, seq: 64}
ranks: [$3]
timeout_ms: 3000
output_dir: $2
$4
YAML
}
ipc_ranks() { echo "ipc://$tmp/$1-0, ipc://$tmp/$1-1, ipc://$tmp/$1-2, ipc://$tmp/$1-3"; }
tcp_ranks() {
    base=$((20000 + $(rand 12000))) # below the ephemeral ports (32768-): no tcp self-connect
    echo "tcp://127.0.0.1:$base, tcp://127.0.0.1:$((base + 1)), tcp://127.0.0.1:$((base + 2)), tcp://127.0.0.1:$((base + 3))"
}
crashed() { grep -l "AddressSanitizer\|runtime error:\|LeakSanitizer" "$@" 2>/dev/null | head -1; }
# workers NAME REJOIN_MS: ranks 0-3 of NAME.yaml by hand, their pids in $pids,
# output in NAME-R.out/.err
workers() {
    pids=""
    for r in 0 1 2 3; do
        timeout 300 "$PIPPIN" worker "$tmp/$1.yaml" --rank $r --rejoin-timeout-ms "$2" \
            >"$tmp/$1-$r.out" 2>"$tmp/$1-$r.err" &
        pids="$pids $!"
    done
}

cfg full "$tmp/full-params" "$(ipc_ranks full)"
start=$(date +%s%N)
if ! timeout 120 "$PIPPIN" run "$tmp/full.yaml" >"$tmp/full.out" 2>"$tmp/full.err"; then
    ok 1 "uninterrupted run: $(grep -v "^pippin worker: rank . of" "$tmp/full.err" | tail -5)"
    echo "1..$n"
    exit 0
fi
run_ms=$(( ($(date +%s%N) - start) / 1000000 ))
ok 0 "uninterrupted run: $(losses "$tmp/full.out" | wc -l) steps in $run_ms ms"

# check TRIAL DESC OUT PARAMS: the run's last loss of every step and its
# trained parameters are the uninterrupted run's.
check() {
    if [ "$(last_losses "$3")" != "$(losses "$tmp/full.out")" ]; then
        verdict 1 "trial $1 ($2): losses differ from the uninterrupted run's"
    elif ! diff -r "$tmp/full-params" "$4" >/dev/null 2>&1; then
        verdict 1 "trial $1 ($2): trained parameters differ"
    else
        verdict 0 "trial $1: $2; losses and parameters as uninterrupted"
    fi
}

# run_trial TRIAL: one trial; its verdict in $vstatus and $vmsg.
verdict() { vstatus=$1; vmsg=$2; }
run_trial() {
    trial=$1
    victim=$(rand 4)
    kind=$((trial % 3))
    t=t$trial${attempt:+r$attempt}
    missed=0
    if [ $kind -ne 2 ]; then
        ck="checkpoint: {dir: $tmp/ck$t, every: 1}"
    else
        ck=""
    fi
    if [ $kind -ne 1 ]; then # pippin run restarts the dead worker
        cfg $t "$tmp/p$t" "$(ipc_ranks $t)" "$ck"
        timeout 300 "$PIPPIN" run "$tmp/$t.yaml" --restart 3 >"$tmp/$t.out" 2>"$tmp/$t.err" &
        lpid=$!
        kill_rank "$tmp/$t.out" "worker $tmp/$t.yaml --rank $victim"
        killed=$?
        wait $lpid
        rc=$?
        desc="pippin run --restart, rank $victim killed $kill_desc"
        [ -z "$ck" ] && desc="$desc, no checkpoint"
        if [ $killed -ne 0 ] && [ $rc -eq 0 ]; then
            missed=1
            verdict 1 "trial $trial ($desc): not killed while the run was on"
        elif [ $rc -ne 0 ]; then
            verdict 1 "trial $trial ($desc): pippin run exited $rc: $(grep -v 'dropped a message' "$tmp/$t.err" | grep -v '^pippin run:' | tail -3 | tr '\n' ' ')/ $(grep '^pippin run:' "$tmp/$t.err" | tail -3 | tr '\n' ' ')"
        elif [ -n "$(crashed "$tmp/$t.err")" ]; then
            verdict 1 "trial $trial ($desc): a sanitizer report: $(grep -m1 -A3 "Sanitizer\|runtime error" "$tmp/$t.err")"
        elif [ "$(grep -c "pippin worker: rank [0-3] of 4" "$tmp/$t.err")" -gt 5 ]; then
            verdict 1 "trial $trial ($desc): more than the dead worker was started again: $(grep 'pippin run:' "$tmp/$t.err" | tr '\n' ' ')$(grep -m3 'Sanitizer\|runtime error\|Assertion\|assert' "$tmp/$t.err" | tr '\n' ' ')"
        else
            restarts=$(grep -c "restarted rank" "$tmp/$t.err")
            if [ "$restarts" -eq 0 ]; then
                verdict 1 "trial $trial ($desc): pippin run restarted no rank"
            else
                check $trial "$desc, $restarts restart(s)" "$tmp/$t.out" "$tmp/p$t"
            fi
        fi
        return
    fi
    # by hand over tcp: the dead rank is started again after a pause
    cfg $t "$tmp/p$t" "$(tcp_ranks)" "$ck"
    workers $t 20000
    kill_rank "$tmp/$t-3.out" "worker $tmp/$t.yaml --rank $victim "
    killed=$?
    if [ $killed -ne 0 ]; then # the victim went on: nothing to start again
        codes=""
        for p in $pids; do
            wait "$p"
            codes="$codes $?"
        done
        desc="by hand over tcp, rank $victim killed $kill_desc"
        [ "$(echo $codes)" = "0 0 0 0" ] && missed=1
        verdict 1 "trial $trial ($desc): not killed while the run was on (exit codes$codes)"
        return
    fi
    pause_ms=$(rand 1500)
    msleep $pause_ms
    timeout 300 "$PIPPIN" worker "$tmp/$t.yaml" --rank $victim --rejoin-timeout-ms 20000 --resume-if-any \
        >"$tmp/$t-again.out" 2>"$tmp/$t-again.err" &
    again=$!
    codes=""
    r=0
    for p in $pids; do
        wait "$p"
        c=$?
        [ $r -ne $victim ] && codes="$codes $c"
        r=$((r + 1))
    done
    wait $again
    codes="$codes $?"
    desc="by hand over tcp, rank $victim killed $kill_desc, back $pause_ms ms later"
    if [ "$(echo $codes)" != "0 0 0 0" ]; then
        verdict 1 "trial $trial ($desc): exit codes$codes: $(cat "$tmp/$t"-*.err | grep -v 'dropped a message' | grep 'pippin worker: rank [0-9]:' | head -3)"
    elif [ -n "$(crashed "$tmp/$t"-*.err)" ]; then
        verdict 1 "trial $trial ($desc): a sanitizer report in $(crashed "$tmp/$t"-*.err)"
    else
        cat "$tmp/$t-3.out" >"$tmp/$t-losses" # rank 3 computes the loss: before and after its restart
        [ $victim -eq 3 ] && cat "$tmp/$t-again.out" >>"$tmp/$t-losses"
        check $trial "$desc" "$tmp/$t-losses" "$tmp/p$t"
    fi
}

# Every trial counts: no second attempt. (The --restart trials used to fail
# now and then: rank 0 drew a new run id each time it reopened its transport
# in a rejoin, and ranks that had learned the previous one waited for it
# until rejoin_timeout_ms; see test_rejoin_rank0_reopens in
# test/runtime/test_worker.c.)
# A trial whose kill came too late (the run ended untouched: a miss of the
# test, proven by the SIGSTOP protocol of kill_rank, not of pippin) runs
# again with the kill in its first steps, at most twice more.
for trial in $(seq 1 "$TRIALS"); do
    attempt=""
    early=""
    run_trial "$trial"
    for attempt in 2 3; do
        [ "$missed" -eq 1 ] || break
        early=1
        run_trial "$trial"
        vmsg="$vmsg (run $attempt: the kill of run $((attempt - 1)) missed)"
    done
    ok "$vstatus" "$vmsg"
done
early=""

# Data-parallel replicas (2 stages x 2 replicas; the replicas sum their
# gradients through shared memory, runtime/grad_shm.c): a rank killed at a
# random moment and started again by pippin run. Every rank drops its
# segments with its run and agrees on new ones after the rollback (the
# dead rank's are swept); the run ends as the uninterrupted one.
rep_cfg="split: {auto: 2}
replicas: 2"
cfg rfull "$tmp/rfull-params" "$(ipc_ranks rfull)" "$rep_cfg"
if ! timeout 120 "$PIPPIN" run "$tmp/rfull.yaml" >"$tmp/rfull.out" 2>"$tmp/rfull.err"; then
    ok 1 "replicas: uninterrupted run: $(tail -3 "$tmp/rfull.err")"
else
    for attempt in 1 2 3; do # again when the kill missed, as above
        rt=rtrial$attempt
        victim=$(rand 4)
        cfg $rt "$tmp/$rt-params" "$(ipc_ranks $rt)" "$rep_cfg
checkpoint: {dir: $tmp/ck-$rt, every: 1}"
        timeout 300 "$PIPPIN" run "$tmp/$rt.yaml" --restart 3 >"$tmp/$rt.out" 2>"$tmp/$rt.err" &
        lpid=$!
        [ $attempt -gt 1 ] && early=1
        kill_rank "$tmp/$rt.out" "worker $tmp/$rt.yaml --rank $victim"
        killed=$?
        early=""
        wait $lpid
        rc=$?
        [ $killed -ne 0 ] && [ $rc -eq 0 ] || break
    done
    restarts=$(grep -c "restarted rank" "$tmp/$rt.err")
    desc="replicas: rank $victim killed $kill_desc, $restarts restart(s)"
    [ $attempt -gt 1 ] && desc="$desc (run $attempt: the kills before missed)"
    if [ $killed -ne 0 ] && [ $rc -eq 0 ]; then
        ok 1 "$desc: not killed while the run was on"
    elif [ $rc -ne 0 ]; then
        ok 1 "$desc: pippin run exited $rc: $(grep -v 'dropped a message' "$tmp/$rt.err" | tail -3 | tr '\n' ' ')"
    elif [ -n "$(crashed "$tmp/$rt.err")" ]; then
        ok 1 "$desc: a sanitizer report: $(grep -m1 -A3 "Sanitizer\|runtime error" "$tmp/$rt.err")"
    elif [ "$(last_losses "$tmp/$rt.out")" != "$(last_losses "$tmp/rfull.out")" ]; then
        ok 1 "$desc: losses differ from the uninterrupted run's"
    elif ! diff -r "$tmp/rfull-params" "$tmp/$rt-params" >/dev/null 2>&1; then
        ok 1 "$desc: trained parameters differ"
    elif [ "$restarts" -eq 0 ]; then
        ok 1 "$desc: pippin run restarted no rank"
    else
        ok 0 "$desc; losses and parameters as uninterrupted"
    fi
fi

# A failure that comes back after every rollback (rank 3 stalls past
# timeout_ms each time it finishes a step from 20 on, like a slow evaluation) ends the
# run once rejoin_timeout_ms has passed since it first failed, instead of
# rolling back forever. (Regression: each completed step restarted the wait.)
cfg stall "$tmp/stall-params" "$(ipc_ranks stall)" "checkpoint: {dir: $tmp/stall-ck, every: 5}"
workers stall 10000
p3=""
started "worker $tmp/stall.yaml --rank 3 " && p3=$vpid # the worker, not timeout(1)
seen=0
stalls=0
t0=$(date +%s)
while kill -0 "$p3" 2>/dev/null && [ $(($(date +%s) - t0)) -lt 100 ]; do
    # every step from 20 on stalls: whichever checkpoint a rollback lands on
    # (15, or 20 when its save was agreed before the stall), the failure comes
    # back (regression of the test: stalling at step 20 alone let a rollback
    # to 20 run on, and the run went on now and then)
    k=$(grep -c "^step \(2[0-9]\|3[0-9]\|40\):" "$tmp/stall-3.out")
    if [ "$k" -gt $seen ]; then
        seen=$k
        stalls=$((stalls + 1))
        kill -STOP "$p3"
        sleep 6 # twice timeout_ms: detected even when the peers run slowly (a loaded machine)
        kill -CONT "$p3"
    fi
    sleep 0.01
done
codes=""
for p in $pids; do
    wait "$p"
    codes="$codes $?"
done
took=$(( $(date +%s) - t0 ))
if [ "$(echo $codes)" = "0 0 0 0" ]; then
    ok 1 "a failure that repeats after every rollback: the run went on (steps from 20 reached $seen times)"
# (stalls, not step lines, are counted: on a loaded machine rank 3 can
# report a few steps before the poll stops it; CI-like load once gave 10
# lines in 31 s)
elif [ "$stalls" -gt 8 ] || [ $took -gt 60 ]; then
    ok 1 "a failure that repeats after every rollback: $stalls stalls, steps from 20 reached $seen times in $took s (rank 3 reported: $(grep -o '^step [0-9]*' "$tmp/stall-3.out" | cut -c6- | tr '\n' ' '))"
else
    ok 0 "a failure that repeats after every rollback ends the run ($stalls stalls, steps from 20 reached $seen times, $took s)"
fi

# Files that change on disk while the run is on (here the text data) are
# not picked up by a rejoin, which reloads them: the rejoining ranks refuse
# to go on, naming what differs. (Regression: the run went on with other
# losses.)
cp "$SRC/examples/data/tiny.txt" "$tmp/changing.txt"
cfg changed "$tmp/changed-params" "$(ipc_ranks changed)" "checkpoint: {dir: $tmp/changed-ck, every: 1}"
sed -i "s|file: $SRC/examples/data/tiny.txt|file: $tmp/changing.txt|" "$tmp/changed.yaml"
timeout 120 "$PIPPIN" run "$tmp/changed.yaml" --restart 3 >"$tmp/changed.out" 2>"$tmp/changed.err" &
lpid=$!
# every rank has loaded the data once step 0 is reported: changed then, and
# rank 2 killed while the run is on (kill_rank)
wait_step "$tmp/changed.out" 0 "worker $tmp/changed.yaml --rank 2"
tr 'a-y' 'b-z' <"$SRC/examples/data/tiny.txt" >"$tmp/changing.txt"
kill_rank "$tmp/changed.out" "worker $tmp/changed.yaml --rank 2" "$(($(rand 10) + 1))"
killed=$?
wait $lpid
rc=$?
if [ $killed -ne 0 ] && [ $rc -eq 0 ]; then
    ok 1 "data changed on disk before a rejoin: rank 2 not killed while the run was on ($kill_desc)"
elif [ $rc -eq 0 ]; then
    ok 1 "data changed on disk before a rejoin: the run went on"
elif ! grep -q "differs from what the run started with" "$tmp/changed.err"; then
    ok 1 "data changed on disk before a rejoin: exit $rc without naming it: $(grep -v dropped "$tmp/changed.err" | tail -2)"
else
    ok 0 "data changed on disk before a rejoin: refused ($(grep -o 'differs from what the run started with[^:]*: [^(]*' "$tmp/changed.err" | head -1 | cut -c1-120))"
fi

# A rank that never comes back: the survivors wait rejoin_timeout_ms, then
# exit 1 naming it.
cfg gone "$tmp/gone-params" "$(ipc_ranks gone)" "checkpoint: {dir: $tmp/gone-ck, every: 1}"
victim=$(rand 4)
workers gone 2000
kill_rank "$tmp/gone-3.out" "worker $tmp/gone.yaml --rank $victim " "$(rand $((STEPS / 2)))"
killed=$?
t0=$(date +%s)
bad=""
r=0
for p in $pids; do
    wait "$p"
    c=$?
    if [ $r -ne $victim ]; then
        [ $c -ne 1 ] && bad="$bad rank $r exited $c;"
        grep -q "ranks $victim (.*) did not come back within rejoin_timeout_ms 2000" "$tmp/gone-$r.err" ||
            bad="$bad rank $r does not name rank $victim: $(tail -c 300 "$tmp/gone-$r.err");"
    fi
    r=$((r + 1))
done
took=$(( $(date +%s) - t0 ))
if [ $killed -ne 0 ]; then
    ok 1 "rank $victim never back: not killed while the run was on ($kill_desc):$bad"
elif [ -n "$bad" ]; then
    ok 1 "rank $victim never back:$bad"
elif [ $took -gt 20 ]; then
    ok 1 "rank $victim never back: the survivors took $took s to give up"
else
    ok 0 "rank $victim never back: every survivor exits 1 naming it after rejoin_timeout_ms (${took} s)"
fi
echo "1..$n"
