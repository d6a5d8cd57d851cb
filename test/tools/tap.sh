# Shared by the command-line tests (sourced): the pippin binary ($1), the
# source tree, a temporary directory, and TAP helpers.
PIPPIN=$1
SRC=${PIPPIN_SOURCE_ROOT:-.}
FX=$SRC/test/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fails=0

# ok STATUS DESCRIPTION: one TAP line (STATUS 0 is a pass).
ok() {
    n=$((n + 1))
    if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fails=$((fails + 1)); fi
}

# expect CODE NEEDLE DESCRIPTION -- ARGS...: runs pippin ARGS; passes when it
# exits with CODE and (if NEEDLE is not empty) prints NEEDLE.
expect() {
    code=$1 needle=$2 desc=$3
    shift 4
    "$PIPPIN" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne "$code" ]; then
        ok 1 "$desc: exit $rc, wanted $code: $(head -c 300 "$tmp/err")"
    elif [ -n "$needle" ] && ! grep -qF -- "$needle" "$tmp/err" "$tmp/out"; then
        ok 1 "$desc: output lacks '$needle': $(head -c 300 "$tmp/err")"
    else
        ok 0 "$desc"
    fi
}
