#!/bin/sh
# CLI tests for `pippin schedule` and `pippin simulate` (TAP output).
# Usage: test_schedule_cli.sh PATH/TO/pippin
PIPPIN=${1:?usage: $0 PATH/TO/pippin}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pippin_cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
# check NAME COMMAND...: passes when the command succeeds.
check() {
    name=$1
    shift
    if "$@"; then ok "$name"; else not_ok "$name"; fi
}
# run EXPECTED_RC ARGS...: runs pippin, output in $TMP/out and $TMP/err.
run() {
    want=$1
    shift
    "$PIPPIN" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "# pippin $*: exit $rc, expected $want" >&2
        sed 's/^/# /' "$TMP/err" >&2
        return 1
    fi
    return 0
}
has() { grep -qF -- "$1" "$2"; }

run 0 schedule --kind 1f1b --ranks 2 --microbatches 2
check "1f1b table" has "Step 2: 0B0    1F1" "$TMP/out"

run 0 schedule --kind 1f1b --ranks 2 --microbatches 2 --format json
check "1f1b json" has '{"orders":[["0F0","0F1","0B0","0B1"],["1F0","1B0","1F1","1B1"]]}' "$TMP/out"

run 0 schedule --kind=zbv --ranks=2 --microbatches=4 --format json
check "zbv json (--flag=value form)" has '"0F0","0F1","0F2","3F0","3I0","3W0"' "$TMP/out"

run 0 schedule --kind dualpipev --ranks 2 --microbatches 4 --format json
check "dualpipev compound in json" has '"(0F3;3B1)OVERLAP_F_B"' "$TMP/out"

run 0 schedule --kind 1f1b --ranks 2 --microbatches 2 --comms --format json
check "lowered json" has '["1RECV_F0","1F0","1B0","1SEND_B0","1RECV_F1","1F1","1B1","1SEND_B1","1REDUCE_GRAD"]' "$TMP/out"

run 0 schedule --kind interleaved-1f1b --ranks 4 --microbatches 8 --format csv
cp "$TMP/out" "$TMP/a.csv"
check "csv has one row per rank" test "$(wc -l <"$TMP/a.csv")" -eq 4
run 0 schedule --kind "csv:$TMP/a.csv" --format csv
check "csv round trip" cmp -s "$TMP/a.csv" "$TMP/out"

run 0 simulate --kind 1f1b --ranks 4 --microbatches 8 --json
check "simulate json makespan" has '"makespan":33.0' "$TMP/out"
check "simulate json peaks" has '"peak_activations":[4,3,2,1]' "$TMP/out"

run 0 simulate --kind zb-h1 --ranks 4 --microbatches 8 --cost F=1,I=1,W=1,c=0
check "simulate text" has "makespan 27" "$TMP/out"

run 0 simulate --kind gpipe --ranks 4 --microbatches 4 --cost F=1:2:1:1,I=1,W=1 --json
check "per-stage costs" has '"makespan":' "$TMP/out"

run 0 simulate --kind zbv --ranks 2 --microbatches 4 --cost F=1,I=1,W=1,c=0.5 --comms \
    --trace "$TMP/t.json" --svg "$TMP/t.svg"
check "trace written" has '"traceEvents"' "$TMP/t.json"
check "svg written" has '</svg>' "$TMP/t.svg"

run 0 simulate --kind auto --ranks 4 --microbatches 8 --cost F=1,I=1,W=1 --mem-cap 4 --json
check "auto respects --mem-cap" sh -c "grep -q '\"peak_activations\":\[[0-4],[0-4],[0-4],[0-4]\]' '$TMP/out'"

run 0 simulate --kind 1f1b --ranks 4 --microbatches 8 --recompute --json
check "simulate --recompute: B runs F again" has '"makespan":44.0' "$TMP/out"
check "simulate --recompute json" has '"recompute_stages":[0,1,2,3]' "$TMP/out"
run 0 simulate --kind 1f1b --ranks 4 --microbatches 8 --recompute-stages 1,2 \
    --cost F=1,I=1,W=1,mem=10,bytes=2
check "simulate --recompute-stages text" has "recompute: stage 1 2" "$TMP/out"
check "recompute peak bytes" sh -c "grep -q '^1 .* 14\$' '$TMP/out'"
run 0 simulate --kind 1f1b --ranks 4 --microbatches 8 --cost F=1,I=1,W=1,rc=0:1:1:0 --json
cp "$TMP/out" "$TMP/rc_key.json"
run 0 simulate --kind 1f1b --ranks 4 --microbatches 8 --cost F=1,I=1,W=1 \
    --recompute-stages 2,1 --json
check "rc key and --recompute-stages agree" cmp -s "$TMP/rc_key.json" "$TMP/out"
run 0 schedule --kind auto --ranks 2 --microbatches 4 --cost F=1,I=1,W=1 --recompute \
    --format json
check "schedule --recompute (auto)" has '"orders"' "$TMP/out"

run 0 schedule --help
check "schedule --help" has "usage: pippin schedule" "$TMP/out"
run 0 simulate --help
check "simulate --help" has "--cost keys" "$TMP/out"

# Usage errors: exit 2, the flag named.
run 2 schedule --kind 1f1b --ranks 0 --microbatches 4
check "bad --ranks" has "--ranks: '0' is not an integer" "$TMP/err"
run 2 schedule --kind 1f1b --ranks 4
check "missing --microbatches" has "--microbatches is required" "$TMP/err"
run 2 schedule --ranks 4 --microbatches 4
check "missing --kind" has "--kind is required" "$TMP/err"
run 2 schedule --kind warp --ranks 4 --microbatches 4
check "unknown kind" has "--kind: unknown schedule kind 'warp'" "$TMP/err"
run 2 schedule --kind 1f1b --ranks 4 --microbatches 4 --format xml
check "bad --format" has "--format: 'xml'" "$TMP/err"
run 2 schedule --kind 1f1b --ranks 4 --microbatches 4 --frobnicate
check "unknown option" has "unknown option '--frobnicate'" "$TMP/err"
run 2 schedule --kind 1f1b --ranks
check "option without value" has "--ranks needs a value" "$TMP/err"
run 2 simulate --kind 1f1b --ranks 4 --microbatches 4 --cost F=1:2
check "bad --cost" has "--cost: cost 'F': 2 values for 4 stages" "$TMP/err"
run 2 schedule --kind zbv --ranks 4 --microbatches 8 --stages-per-rank 3
check "zbv stages per rank" has "zbv requires exactly 2 stages per rank" "$TMP/err"
run 2 schedule --kind dualpipev --ranks 4 --microbatches 6
check "dualpipev microbatches" has "at least as many microbatches as stages" "$TMP/err"
run 2 simulate --kind 1f1b --ranks 2 --microbatches 2 --format csv
check "--format on simulate" has "--format is for 'pippin schedule'" "$TMP/err"
run 2 schedule --kind "csv:$TMP/a.csv" --ranks 3
check "csv --ranks mismatch" has "--ranks 3, but the CSV file has 4 rows" "$TMP/err"

run 2 simulate --kind 1f1b --ranks 4 --microbatches 4 --recompute-stages 0,9
check "--recompute-stages past the stages" has "--recompute-stages '0,9': stage 9, but the schedule has 4 stages" "$TMP/err"
run 2 simulate --kind 1f1b --ranks 4 --microbatches 4 --recompute-stages 1,1
check "--recompute-stages twice" has "stage 1 is listed twice" "$TMP/err"
run 2 simulate --kind 1f1b --ranks 4 --microbatches 4 --recompute-stages 1,x
check "--recompute-stages junk" has "--recompute-stages '1,x': expected stage indices" "$TMP/err"
run 2 simulate --kind 1f1b --ranks 4 --microbatches 4 --recompute --recompute-stages 1
check "--recompute and --recompute-stages" has "exclude each other" "$TMP/err"
run 2 simulate --kind 1f1b --ranks 4 --microbatches 4 --cost rc=3
check "bad rc key" has "cost 'rc': stage 0: 3 is not 0 or 1" "$TMP/err"

# Failures: exit 1.
run 1 schedule --kind "csv:$TMP/missing.csv"
check "missing csv" has "missing.csv" "$TMP/err"
printf '0F0,0B1,0F1,0B0\n1F0,1B0,1F1,1B1\n' >"$TMP/bad.csv"
run 1 simulate --kind "csv:$TMP/bad.csv"
check "invalid csv schedule" has "rank 0 step 1 action 0B1" "$TMP/err"
check "error table" has "Step 1: 0B1    1B0 <-- ERROR HERE" "$TMP/err"
printf '0F0,0Q1\n' >"$TMP/junk.csv"
run 1 schedule --kind "csv:$TMP/junk.csv"
check "csv parse error names file, line, cell" has "junk.csv:1: cell 2: invalid action '0Q1'" "$TMP/err"

echo "1..$n"
[ "$failed" -eq 0 ]
