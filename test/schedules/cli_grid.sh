#!/bin/sh
# Prints one line per case of a small grid of `pippin schedule` runs: the
# arguments, the exit code and the start of the sha256 of stdout. The
# committed fixtures/cli_grid.txt was made by the snprintf, json-c and
# whole-string formatters; test_schedule_cli.sh compares today's output
# against it. Usage: cli_grid.sh PATH/TO/pippin
PIPPIN=${1:?usage: $0 PATH/TO/pippin}
out=$(mktemp "${TMPDIR:-/tmp}/pippin_grid.XXXXXX")
trap 'rm -f "$out"' EXIT
for kind in gpipe 1f1b interleaved-1f1b looped-bfs interleaved-zb zbv dualpipev zb-h1 zb-h2 auto; do
    for pm in "1 1" "1 3" "2 1" "2 2" "2 4" "2 5" "3 3" "3 6" "4 4" "4 8" "4 9" "8 16"; do
        set -- $pm
        for fmt in table csv json; do
            for flags in plain --comms --merge-bw; do
                f=$flags
                [ "$f" = plain ] && f=
                # shellcheck disable=SC2086
                "$PIPPIN" schedule --kind "$kind" --ranks "$1" --microbatches "$2" \
                    --format "$fmt" $f >"$out" 2>/dev/null
                rc=$?
                echo "$kind $1 $2 $fmt $flags $rc $(sha256sum <"$out" | cut -c1-16)"
            done
        done
    done
done
