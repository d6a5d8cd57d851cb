# Shared by the fault suite's multi-process tests (sourced after
# tools/tap.sh, with STEPS set to the run's steps): killing a worker while
# its run is on.
rand() { echo $(( $(od -An -N2 -tu2 /dev/urandom) % $1 )); }
msleep() { sleep "$(printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)))"; }
# worker_pid PATTERN: the pid of the worker (not timeout(1)) matching
# PATTERN (pgrep -f), empty if none.
worker_pid() {
    for p in $(pgrep -f "$1"); do
        c=$(cat "/proc/$p/comm" 2>/dev/null) && [ "$c" != timeout ] && { echo "$p"; return 0; }
    done
    return 1
}
# started PATTERN: waits until a worker matches PATTERN and sets $vpid to
# its pid (0), at most 60 s (1). pippin run forks its workers a moment
# after it starts.
started() {
    s0=$(date +%s)
    until vpid=$(worker_pid "$1"); do
        [ $(($(date +%s) - s0)) -lt 60 ] || return 1
        sleep 0.01
    done
}
# wait_step OUT STEP PATTERN: until OUT reports STEP (0), or the worker
# matching PATTERN never starts or ends first, or 120 s (1). Each poll is
# one grep and kill(1), a shell builtin: the victim's pid is looked up
# once, as pgrep reads all of /proc and a loaded machine runs many steps
# of this small model meanwhile.
wait_step() {
    started "$3" || return 1
    w0=$(date +%s)
    until grep -q "^step $2:" "$1" 2>/dev/null; do
        kill -0 "$vpid" 2>/dev/null && [ $(($(date +%s) - w0)) -lt 120 ] || return 1
        sleep 0.01
    done
}
# kill_rank OUT PATTERN [STEP]: SIGKILLs the worker matching PATTERN at a
# random moment while the run is on: at startup (a quarter of the time),
# else 0-30 ms after OUT (the output of the rank(s) reporting the loss)
# reports step STEP (default: a random one of the first half; with
# $early set, of the first 3). Describes the moment in $kill_desc;
# returns 0 once killed, 1 if it was too late (the victim goes on), 2 if
# the victim ended first.
#
# The kill must land before the run's last stop vote: once every rank has
# voted on step STEPS-1 they agree that the run is over, write their
# parameters and exit 0 each on its own, and a rank killed after sending
# its vote has no one left to rejoin (the restarted one waits
# rejoin_timeout_ms for ranks that exited, its stage's parameters maybe
# never written; a failed run, rightly). So the victim is stopped
# (SIGSTOP) and then OUT read: without step STEPS-2 reported, the loss
# rank has not sent its vote of step STEPS-2, so no rank has begun step
# STEPS-1 or voted on it, and none can without the victim: every other
# rank sees the failure and waits for it. Too late means the trial never
# touched the run (CI once saw step 38 before the stop of a kill aimed
# after step 12, when each poll still ran pgrep): the caller runs it again.
kill_rank() {
    started "$2" || { kill_desc="never started"; return 2; }
    if [ -z "$3" ] && [ -z "${early:-}" ] && [ "$(rand 4)" -eq 0 ]; then
        msleep "$(rand 400)"
        kill_desc="at startup"
    else
        if [ -n "$3" ]; then kstep=$3; elif [ -n "${early:-}" ]; then kstep=$(rand 3); else kstep=$(rand $((STEPS / 2))); fi
        wait_step "$1" "$kstep" "$2" || { kill_desc="it ended before step $kstep"; return 2; }
        msleep "$(rand 30)"
        kill_desc="after step $kstep"
    fi
    kill -STOP "$vpid" 2>/dev/null || { kill_desc="$kill_desc: it ended first"; return 2; }
    if grep -q "^step $((STEPS - 2)):" "$1"; then
        kill -CONT "$vpid"
        kill_desc="$kill_desc: too late (step $((STEPS - 2)) reported before it stopped)"
        return 1
    fi
    kill -9 "$vpid"
    return 0
}
