#!/bin/sh
# pippin run and signals: SIGTERM or SIGINT to the launcher stops every
# worker after the same step and leaves no process; a second signal kills
# them; a launcher killed with SIGKILL takes its workers with it (they stop
# by themselves: PR_SET_PDEATHSIG); --restart N restarts a worker that dies
# while the others wait for it, and ends with the uninterrupted run's losses. Every run is
# bounded with timeout. TAP.
. "$(dirname "$0")/tap.sh"
losses() { grep -o "^step [0-9]*: loss [0-9.]*" "$1"; }
workers() { pgrep -f "worker $1" | tr '\n' ' '; } # the pids of CONFIG's workers
cfg() { # NAME STEPS [EXTRA LINE]: a 4-rank GPT pipeline over ipc
    cat >"$tmp/$1.yaml" <<YAML
model: $SRC/examples/gpt/model.onnx
schedule: 1f1b
microbatches: 2
batch_size: 8
steps: $2
optimizer: {kind: adamw, lr: 0.002}
text: {file: $SRC/examples/data/tiny.txt, vocab: $SRC/examples/gpt/vocab.json, seq: 64}
ranks: [ipc://$tmp/$1-0, ipc://$tmp/$1-1, ipc://$tmp/$1-2, ipc://$tmp/$1-3]
timeout_ms: 3000
$3
YAML
}
# Starts pippin run CONFIG ARGS... in the background ($lpid: pippin run
# itself, so no `timeout` in between) and waits (at most 60 s) until it has
# printed a step: every worker is then training.
launch() {
    name=$1
    shift
    "$PIPPIN" run "$tmp/$name.yaml" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    lpid=$!
    for _ in $(seq 600); do
        grep -q "^step" "$tmp/$name.out" 2>/dev/null && return 0
        kill -0 $lpid 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
# finish PID SECONDS: waits for pippin run; $rc gets its exit status, 137
# when it had to be killed after SECONDS (and its workers with it).
finish() {
    for _ in $(seq $(($2 * 10))); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$1" 2>/dev/null; then
        kill -9 "$1"
        pkill -9 -f "worker $tmp/"
    fi
    wait "$1"
    rc=$?
}
# Waits (at most $2 seconds) until no worker of config $1 is left.
gone() {
    for _ in $(seq $(($2 * 10))); do
        [ -z "$(workers "$1")" ] && return 0
        sleep 0.1
    done
    return 1
}

# 1-2. One signal: every worker stops after the same step, pippin run exits
# 1 within seconds, no worker is left.
for sig in TERM INT; do
    n=$((n + 1))
    cfg "sig$sig" 100000
    if ! launch "sig$sig"; then
        echo "not ok $n - SIG$sig: the run did not start: $(tail -3 "$tmp/sig$sig.err")"
        kill -9 $lpid 2>/dev/null
    pkill -9 -f "worker $tmp/"
        continue
    fi
    t0=$(date +%s)
    kill -$sig $lpid
    finish $lpid 60
    took=$(($(date +%s) - t0))
    stopped=$(grep -o "stopped after step [0-9]*" "$tmp/sig$sig.err" | sort | uniq -c)
    if [ $rc -ne 1 ]; then
        echo "not ok $n - SIG$sig: pippin run exited $rc, wanted 1: $(tail -3 "$tmp/sig$sig.err")"
    elif [ $took -gt 10 ]; then
        echo "not ok $n - SIG$sig: pippin run took $took s to stop"
    elif ! gone "$tmp/sig$sig.yaml" 1; then
        echo "not ok $n - SIG$sig: workers left behind: $(workers "$tmp/sig$sig.yaml")"
    elif [ "$(echo "$stopped" | wc -l)" -ne 1 ] || [ "$(echo "$stopped" | awk '{print $1}')" != 4 ]; then
        echo "not ok $n - SIG$sig: the 4 workers did not stop after one step: $stopped"
    elif ! grep -q "stopped by SIG$sig" "$tmp/sig$sig.err"; then
        echo "not ok $n - SIG$sig: no 'stopped by SIG$sig': $(tail -3 "$tmp/sig$sig.err")"
    else
        echo "ok $n - SIG$sig to pippin run: exit 1 in $took s, all 4 workers$(echo "$stopped" | sed 's/^ *4//'), none left"
    fi
done

# 3. A second signal kills the workers at once.
n=$((n + 1))
cfg twice 100000
if ! launch twice; then
    echo "not ok $n - second signal: the run did not start: $(tail -3 "$tmp/twice.err")"
    kill -9 $lpid 2>/dev/null
    pkill -9 -f "worker $tmp/"
else
    kill -TERM $lpid
    kill -INT $lpid
    finish $lpid 60
    if [ $rc -ne 1 ]; then
        echo "not ok $n - second signal: pippin run exited $rc: $(tail -3 "$tmp/twice.err")"
    elif ! gone "$tmp/twice.yaml" 1; then
        echo "not ok $n - second signal: workers left behind: $(workers "$tmp/twice.yaml")"
    else
        echo "ok $n - SIGTERM then SIGINT: pippin run exits 1 and no worker is left"
    fi
fi

# 4. `timeout` signals pippin run and then its process group: one request,
# not two, so the workers still stop together after one step.
n=$((n + 1))
cfg timeout 100000
timeout -s TERM 8 "$PIPPIN" run "$tmp/timeout.yaml" >"$tmp/timeout.out" 2>"$tmp/timeout.err"
rc=$?
stopped=$(grep -o "stopped after step [0-9]*" "$tmp/timeout.err" | sort | uniq -c)
if [ $rc -ne 124 ] || ! grep -q "^step" "$tmp/timeout.out"; then
    echo "not ok $n - timeout 8 pippin run (4 workers must start and run a step; slow under a sanitizer): exit $rc: $(tail -3 "$tmp/timeout.err")"
elif [ "$(echo "$stopped" | wc -l)" -ne 1 ] || [ "$(echo "$stopped" | awk '{print $1}')" != 4 ]; then
    echo "not ok $n - timeout's SIGTERM to pippin run and its group: not one stop: $stopped $(grep killing "$tmp/timeout.err")"
elif ! gone "$tmp/timeout.yaml" 1; then
    echo "not ok $n - timeout: workers left behind"
else
    echo "ok $n - timeout -s TERM: the signal to pippin run and to its group counts once; the 4 workers stop together"
fi

# 5. SIGKILL to the launcher: its workers get SIGTERM from the kernel and
# stop by themselves.
n=$((n + 1))
cfg orphan 100000
if ! launch orphan; then
    echo "not ok $n - SIGKILL: the run did not start: $(tail -3 "$tmp/orphan.err")"
    kill -9 $lpid 2>/dev/null
    pkill -9 -f "worker $tmp/"
else
    before=$(workers "$tmp/orphan.yaml")
    kill -KILL $lpid
    wait $lpid 2>/dev/null
    if [ "$(echo $before | wc -w)" -ne 4 ]; then
        echo "not ok $n - SIGKILL: expected 4 workers before the kill, found '$before'"
    elif ! gone "$tmp/orphan.yaml" 10; then
        echo "not ok $n - SIGKILL to pippin run: workers still running after 10 s: $(workers "$tmp/orphan.yaml")"
        pkill -9 -f "worker $tmp/orphan.yaml"
    else
        echo "ok $n - SIGKILL to pippin run: its 4 workers stop by themselves"
    fi
fi

# 6. --restart: a worker killed in the middle of the run; pippin run starts
# it again alone, the three others wait for it (they are started once), all
# roll back to the newest committed checkpoint (or the start when there is
# none), pippin run exits 0, and every step's loss is the uninterrupted
# run's.
n=$((n + 1))
cfg ref 40
cfg restart 40 "checkpoint: {dir: $tmp/restart-ck, every: 1}"
timeout 120 "$PIPPIN" run "$tmp/ref.yaml" >"$tmp/ref.out" 2>"$tmp/ref.err"
if ! launch restart --restart 2; then
    echo "not ok $n - --restart: the run did not start: $(tail -3 "$tmp/restart.err")"
    kill -9 $lpid 2>/dev/null
    pkill -9 -f "worker $tmp/"
else
    # by its pid, stopped first and killed only while the run is on
    # (test/fault/kill.sh): a fast machine must not see the run end first
    STEPS=40
    . "$(dirname "$0")/../fault/kill.sh"
    kill_rank "$tmp/restart.out" "worker $tmp/restart.yaml --rank 1" 1
    killed=$?
    finish $lpid 120
    if [ $killed -ne 0 ]; then
        echo "not ok $n - --restart: rank 1 not killed while the run was on ($kill_desc)"
    elif [ $rc -ne 0 ]; then
        echo "not ok $n - --restart 2: pippin run exited $rc: $(tail -5 "$tmp/restart.err")"
    elif ! grep -q "restarted rank 1 (1 restart left)" "$tmp/restart.err"; then
        echo "not ok $n - --restart 2: no restart: $(tail -5 "$tmp/restart.err")"
    elif [ "$(grep -c "pippin worker: rank 1 of 4" "$tmp/restart.err")" -ne 2 ] ||
        [ "$(grep -c "pippin worker: rank [023] of 4" "$tmp/restart.err")" -ne 3 ]; then
        echo "not ok $n - --restart 2: not only rank 1 was started again: $(grep "pippin worker: rank" "$tmp/restart.err")"
    elif [ "$(losses "$tmp/restart.out" | sort -u)" != "$(losses "$tmp/ref.out" | sort -u)" ] ||
        [ "$(losses "$tmp/ref.out" | wc -l)" -ne 40 ]; then
        echo "not ok $n - --restart: losses differ from the uninterrupted run's"
    elif ! gone "$tmp/restart.yaml" 1; then
        echo "not ok $n - --restart: workers left behind"
    else
        echo "ok $n - --restart 2 after a SIGKILLed worker: $(grep -o "restarted rank 1 .*" "$tmp/restart.err"); the others waited; losses as uninterrupted"
    fi
fi

# 7. Without --restart the first failure ends the job: exit 1, naming the rank.
n=$((n + 1))
cfg norestart 100000
if ! launch norestart; then
    echo "not ok $n - failure: the run did not start: $(tail -3 "$tmp/norestart.err")"
    kill -9 $lpid 2>/dev/null
    pkill -9 -f "worker $tmp/"
else
    pkill -9 -f "worker $tmp/norestart.yaml --rank 2"
    finish $lpid 60
    if [ $rc -ne 1 ] || ! grep -q "rank 2 killed by signal 9" "$tmp/norestart.err"; then
        echo "not ok $n - a killed worker: pippin run exited $rc: $(tail -3 "$tmp/norestart.err")"
    elif ! gone "$tmp/norestart.yaml" 1; then
        echo "not ok $n - a killed worker: the others were left running"
    else
        echo "ok $n - a killed worker without --restart: exit 1, rank 2 named, no worker left"
    fi
fi

# 8-10. Usage.
n=$((n + 1))
"$PIPPIN" run "$tmp/ref.yaml" --resume >/dev/null 2>"$tmp/u.err"
rc=$?
if [ $rc -eq 2 ] && grep -q "checkpoint" "$tmp/u.err"; then
    echo "ok $n - --resume without checkpoint: in the config: exit 2, $(head -c 120 "$tmp/u.err")"
else
    echo "not ok $n - --resume without checkpoint: exit $rc: $(cat "$tmp/u.err")"
fi
n=$((n + 1))
"$PIPPIN" run "$tmp/ref.yaml" --restart many >/dev/null 2>"$tmp/u.err"
rc=$?
if [ $rc -eq 2 ]; then echo "ok $n - --restart many: exit 2"; else echo "not ok $n - --restart many: exit $rc"; fi
n=$((n + 1))
"$PIPPIN" run >/dev/null 2>&1
rc=$?
if [ $rc -eq 2 ]; then echo "ok $n - no config: exit 2"; else echo "not ok $n - no config: exit $rc"; fi
# a checkpoint directory that already holds a committed step of an earlier
# run: without --resume, pippin run refuses at once (and never "restarts"
# into resuming it)
n=$((n + 1))
cfg stale 5 "checkpoint: {dir: $tmp/restart-ck, every: 1}"
timeout 60 "$PIPPIN" run "$tmp/stale.yaml" --restart 3 >"$tmp/stale.out" 2>"$tmp/stale.err"
rc=$?
if [ $rc -eq 1 ] && grep -q "of an earlier run" "$tmp/stale.err" && ! grep -q "restart 1" "$tmp/stale.err" &&
    ! grep -q "^step" "$tmp/stale.out"; then
    echo "ok $n - another run's committed checkpoints: refused, no restart resumes them"
else
    echo "not ok $n - stale checkpoint dir: exit $rc: $(tail -3 "$tmp/stale.err")"
fi
echo "1..$n"
