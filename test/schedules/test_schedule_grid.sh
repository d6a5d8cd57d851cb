#!/bin/sh
# `pippin schedule` on a grid of kinds, sizes, formats and lowerings must
# print what the former printers (snprintf cells, json-c, one string per
# table) printed: fixtures/cli_grid.txt holds their exit codes and output
# hashes (TAP output). Usage: test_schedule_grid.sh PATH/TO/pippin
PIPPIN=${1:?usage: $0 PATH/TO/pippin}
here=$(dirname "$0")
got=$(mktemp "${TMPDIR:-/tmp}/pippin_grid_got.XXXXXX")
trap 'rm -f "$got"' EXIT
echo "1..1"
"$here/cli_grid.sh" "$PIPPIN" >"$got"
if diff "$here/fixtures/cli_grid.txt" "$got" >&2; then
    echo "ok 1 - $(wc -l <"$got") schedule outputs as before"
else
    echo "not ok 1 - schedule outputs differ from fixtures/cli_grid.txt (diff above)"
fi
