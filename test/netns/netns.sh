#!/bin/sh
# netns suite: pippin between hosts, for real. Four network namespaces (one
# per rank) joined by veth pairs and a Linux bridge (itself in a fifth
# namespace, so the host's own network is never touched), with netem delay
# and loss on every link where sch_netem exists. One `pippin worker` per
# namespace trains the example GPT (4 stages on 4 ranks, tcp, `insecure:
# true`); the losses and the trained parameters must be byte for byte those
# of the same run over loopback in this namespace.
#
# Shared memory must be used only where it is truly shared. The cases:
#   netns    network namespaces only: the ranks still share /dev/shm, the
#            user and the kernel, so the rings may be (and are) used
#   mountns  each rank also in a mount namespace of its own with a private
#            tmpfs on /dev/shm: no ring, every byte on the socket
#   userns   ranks 1 and 3 also in user namespaces whose root is uid 100000
#            outside: they see the same /dev/shm and the same euid (0) as
#            ranks 0 and 2, but cannot open their 0600 rings (the run timed
#            out before the host id carried the user namespace)
# Which path a link took is read from each worker's debug log (the
# transport's "is on this/another host" line and its closing byte counts).
#
# Skipped (TAP "1..0 # SKIP") where namespaces cannot be made: not root, no
# ip(8) or unshare(1), or the kernel refuses. Names carry this script's PID;
# a trap deletes every namespace it made (and with it the veths, the bridge
# and the private mounts) on any exit, and stale namespaces of runs that
# were SIGKILLed are swept at start. Every wait is bounded.
# PIPPIN_NETNS_STEPS (default 4) sets the training steps.
. "$(dirname "$0")/../tools/tap.sh"
STEPS=${PIPPIN_NETNS_STEPS:-4}
WAIT=120 # seconds any one worker may take
HERE=$(cd "$(dirname "$0")" && pwd)
PFX=pippin-netns-$$
HUB=$PFX-hub
NET=10.77.0 # inside the namespaces only
made=""
pids=""

cleanup() {
    for p in $pids; do kill -TERM "$p" 2>/dev/null; done
    for p in $pids; do wait "$p" 2>/dev/null; done
    for ns in $made; do ip netns del "$ns" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

skip() {
    echo "1..0 # SKIP $1"
    exit 0
}
[ "$(id -u)" = 0 ] || skip "network namespaces need root (this is uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "no ip(8) (iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no unshare(1) (util-linux)"

# namespaces of earlier runs that were killed before their trap ran
for ns in $(ip netns list 2>/dev/null | sed -n 's/^\(pippin-netns-[0-9]*-[a-z0-9]*\).*/\1/p'); do
    owner=${ns#pippin-netns-}
    owner=${owner%%-*}
    kill -0 "$owner" 2>/dev/null || ip netns del "$ns" 2>/dev/null
done

ip netns add "$HUB" 2>"$tmp/ns.err" || skip "cannot make a network namespace: $(head -c 200 "$tmp/ns.err")"
made=$HUB
unshare -m true 2>"$tmp/ns.err" || skip "cannot make a mount namespace: $(head -c 200 "$tmp/ns.err")"

# ---- the network: rank r at $NET.(r+1) in namespace $PFX-r ----
netem=""
setup_net() {
    ip -n "$HUB" link set lo up &&
        ip -n "$HUB" link add br0 type bridge &&
        ip -n "$HUB" link set br0 up || return 1
    for r in 0 1 2 3; do
        ns=$PFX-$r
        ip netns add "$ns" || return 1
        made="$made $ns"
        ip -n "$HUB" link add "p$r" type veth peer name eth0 netns "$ns" &&
            ip -n "$HUB" link set "p$r" master br0 &&
            ip -n "$HUB" link set "p$r" up &&
            ip -n "$ns" link set lo up &&
            ip -n "$ns" addr add "$NET.$((r + 1))/24" dev eth0 &&
            ip -n "$ns" link set eth0 up || return 1
    done
}
setup_net 2>"$tmp/net.err" || skip "cannot build the veth/bridge network: $(head -c 200 "$tmp/net.err")"
# netem on each rank's side of its link (2 ms each way, 1% loss)
if tc -n "$PFX-0" qdisc add dev eth0 root netem delay 2ms loss 1% 2>"$tmp/netem.err"; then
    for r in 1 2 3; do tc -n "$PFX-$r" qdisc add dev eth0 root netem delay 2ms loss 1%; done
    netem="netem 2ms, 1% loss"
    ok 0 "4 namespaces on a bridge"
    ok 0 "netem delay 2ms loss 1% on every link"
else
    echo "# sch_netem is not available ($(head -c 120 "$tmp/netem.err")): links without delay or loss"
    netem="no netem"
    ok 0 "4 namespaces on a bridge"
    ok 0 "netem on the links # SKIP sch_netem is not available: no delay or loss"
fi

# ---- configs ----
# cfg NAME RANKS OUTDIR EXTRA: the run; EXTRA is more config lines
cfg() {
    cat >"$tmp/$1.yaml" <<YAML
model: $SRC/examples/gpt/model.onnx
schedule: 1f1b
microbatches: 2
batch_size: 8
steps: $STEPS
optimizer: {kind: adamw, lr: 0.002}
text: {file: $SRC/examples/data/tiny.txt, vocab: $SRC/examples/gpt/vocab.json, seq: 64}
ranks: [$2]
timeout_ms: 10000
output_dir: $3
insecure: true
threads: 1
$4
YAML
}
loop_ranks() {
    base=$((20000 + $(od -An -N2 -tu2 /dev/urandom) % 12000)) # below the ephemeral ports
    echo "tcp://127.0.0.1:$base, tcp://127.0.0.1:$((base + 1)), tcp://127.0.0.1:$((base + 2)), tcp://127.0.0.1:$((base + 3))"
}
ns_ranks() { echo "tcp://$NET.1:5555, tcp://$NET.2:5555, tcp://$NET.3:5555, tcp://$NET.4:5555"; }

# ---- workers ----
# launch TAG RANK WRAP: one worker of TAG.yaml, its output in TAG-RANK.out/.err.
# WRAP: loop (this namespace), netns, mountns (netns + a private /dev/shm),
# userns (netns + a user namespace mapping root to uid 100000)
launch() {
    tag=$1 r=$2 wrap=$3
    set -- "$PIPPIN" worker "$tmp/$tag.yaml" --rank "$r"
    case $wrap in
    loop) ;;
    netns) set -- ip netns exec "$PFX-$r" "$@" ;;
    mountns)
        set -- ip netns exec "$PFX-$r" unshare -m sh -c \
            'mount -t tmpfs -o size=256m,mode=1777 pippin-private-shm /dev/shm && exec "$@"' sh "$@"
        ;;
    userns) set -- ip netns exec "$PFX-$r" /usr/bin/python3 "$HERE/userns.py" 100000 "$@" ;;
    esac
    PIPPIN_LOG=debug timeout -k 5 "$WAIT" "$@" >"$tmp/$tag-$r.out" 2>"$tmp/$tag-$r.err" &
    pids="$pids $!"
}
# run TAG WRAP...: the 4 ranks (one WRAP per rank), waits for all; $run_ms, $run_rc
run() {
    tag=$1
    shift
    pids=""
    start=$(date +%s%N)
    r=0
    for w in "$@"; do
        launch "$tag" $r "$w"
        r=$((r + 1))
    done
    run_rc=0
    for p in $pids; do wait "$p" || run_rc=1; done
    pids=""
    run_ms=$((($(date +%s%N) - start) / 1000000))
}
# losses TAG: every loss line of the run (from whichever ranks print them)
losses() { cat "$tmp/$1"-?.out | grep -o "^step [0-9]*: loss [0-9.]*" | sort; }
errors() { grep -h "pippin worker:\|pippin error:" "$@" | head -3; }
# shm_bytes TAG: bytes sent through shared memory by all ranks (from the
# transports' closing debug lines)
shm_bytes() {
    cat "$tmp/$1"-?.err | sed -n 's/.*transport rank [0-9]*: closing: .*shm_sent=\([0-9]*\).*/\1/p' |
        awk '{s += $1} END {print s + 0}'
}
closings() { grep -c "transport rank [0-9]*: closing:" "$tmp/$1"-?.err | awk -F: '{s += $2} END {print s + 0}'; }
same_host_links() { cat "$tmp/$1"-?.err | grep -c "is on this host"; }
other_host_links() { cat "$tmp/$1"-?.err | grep -c "is on another host"; }

# bridge_bytes: bytes the bridge's ports have received from the ranks so far
bridge_bytes() {
    ip netns exec "$HUB" sh -c 'cat /sys/class/net/p[0-3]/statistics/rx_bytes' | awk '{s += $1} END {print s + 0}'
}
# sent_bytes TAG: tensor bytes the ranks sent (socket and shared memory)
sent_bytes() {
    cat "$tmp/$1"-?.err | sed -n 's/.*transport rank [0-9]*: closing: sent=\([0-9]*\).*/\1/p' |
        awk '{s += $1} END {print s + 0}'
}

# baseline KEY EXTRA: the loopback run of a config (once per KEY)
baseline() {
    [ -f "$tmp/base-$1.ok" ] && return 0
    cfg "base-$1" "$(loop_ranks)" "$tmp/base-$1-params" "$2"
    run "base-$1" loop loop loop loop
    got=$(losses "base-$1" | wc -l)
    if [ $run_rc -ne 0 ] || [ "$got" -lt "$STEPS" ]; then
        ok 1 "loopback run ($1): exit $run_rc, $got of $STEPS steps: $(errors "$tmp/base-$1"-?.err)"
        return 1
    fi
    ok 0 "loopback run ($1) in this namespace: $STEPS steps in $run_ms ms"
    touch "$tmp/base-$1.ok"
}

# check_case NAME KEY SHM: the namespaced run NAME against baseline KEY.
# SHM: yes (every rank used shared memory), no (no byte and no link), any
check_case() {
    name=$1 key=$2 shm=$3
    if [ $run_rc -ne 0 ] || [ -z "$(losses "$name")" ]; then
        ok 1 "$name: exit $run_rc: $(errors "$tmp/$name"-?.err)"
        return
    fi
    if [ "$(losses "$name")" = "$(losses "base-$key")" ]; then
        ok 0 "$name ($netem): $STEPS losses as on loopback, in $run_ms ms"
    else
        ok 1 "$name: losses differ from loopback: $(losses "$name" | tail -1) vs $(losses "base-$key" | tail -1)"
    fi
    if diff -r "$tmp/base-$key-params" "$tmp/$name-params" >"$tmp/$name.diff" 2>&1; then
        ok 0 "$name: trained parameters byte-identical to loopback's ($(ls "$tmp/$name-params" | wc -l) files)"
    else
        ok 1 "$name: trained parameters differ: $(head -c 200 "$tmp/$name.diff")"
    fi
    bytes=$(shm_bytes "$name") closed=$(closings "$name")
    same=$(same_host_links "$name") other=$(other_host_links "$name")
    case $shm in
    yes)
        [ "$closed" -ge 4 ] && [ "$bytes" -gt 0 ] && [ "$other" -eq 0 ] && [ "$same" -gt 0 ]
        ok $? "$name: same host: shared memory used ($bytes bytes; $same links on this host, $other on another)"
        ;;
    no)
        [ "$closed" -ge 4 ] && [ "$bytes" -eq 0 ] && [ "$same" -eq 0 ] && [ "$other" -gt 0 ]
        ok $? "$name: no shared memory ($bytes bytes through it over $closed transports; $other links on another host, $same on this one)"
        # every tensor byte crossed the bridge
        sent=$(sent_bytes "$name")
        [ "$sent" -gt 0 ] && [ "$wire" -ge "$sent" ]
        ok $? "$name: the bridge carried $wire bytes for the $sent tensor bytes sent"
        ;;
    esac
}
# netns_case NAME KEY EXTRA SHM WRAP0 WRAP1 WRAP2 WRAP3: one case
netns_case() {
    name=$1 key=$2 extra=$3 shm=$4
    shift 4
    baseline "$key" "$extra" || return
    mkdir -p "$tmp/$name-params"
    chmod 777 "$tmp/$name-params" # userns ranks write here as uid 100000
    cfg "$name" "$(ns_ranks)" "$tmp/$name-params" "$extra"
    wire0=$(bridge_bytes)
    run "$name" "$@"
    wire=$(($(bridge_bytes) - wire0))
    check_case "$name" "$key" "$shm"
}
chmod 755 "$tmp" # userns ranks read their config as uid 100000

# 4 stages on 4 ranks
netns_case netns p4 "" yes netns netns netns netns
netns_case mountns p4 "" no mountns mountns mountns mountns
if [ -x /usr/bin/python3 ]; then
    netns_case userns p4 "" any netns userns netns userns
    # root (ranks 0, 2) and uid 100000 (ranks 1, 3, each in a user namespace
    # of its own) never take shared memory to each other; only 0-2 may
    crossed=$(cat "$tmp"/userns-[13].err | grep -c "is on this host")
    crossed=$((crossed + $(cat "$tmp"/userns-[02].err | grep "is on this host" | grep -c ": rank [13] (")))
    [ "$crossed" -eq 0 ]
    ok $? "userns: no link to a rank in a user namespace takes shared memory ($(same_host_links userns) links on this host, all 0-2)"
else
    ok 0 "userns # SKIP no /usr/bin/python3 (test/netns/userns.py makes the user namespaces)"
fi

# ---- 2 stages x 2 replicas ----
# the same 4 ranks as 2 balanced stages x 2 data-parallel replicas (replica
# k's ranks are 2k, 2k+1). In network namespaces that share /dev/shm the
# replicas sum their gradients through shared memory (runtime/grad_shm.c);
# with a private /dev/shm each (mount namespaces) they must not, and the
# gradient ring crosses the bridge
shm_sums() { cat "$tmp/$1"-?.err | grep -c "replicas sum gradients through shared memory"; }
ring_sums() { cat "$tmp/$1"-?.err | grep -c "gradients summed over the network"; }
# ... and of those, the groups that went over direct TCP links (runtime/grad_tcp.c)
link_sums() { cat "$tmp/$1"-?.err | grep -c "replicas sum gradients over direct links"; }
netns_case replicas r2 "split: {auto: 2}
replicas: 2" yes netns netns netns netns
[ "$(shm_sums replicas)" -ge 4 ] && [ "$(ring_sums replicas)" -eq 0 ]
ok $? "replicas: every rank summed its stage's gradients through shared memory ($(shm_sums replicas) groups)"
netns_case replicas-mountns r2 "split: {auto: 2}
replicas: 2" no mountns mountns mountns mountns
[ "$(shm_sums replicas-mountns)" -eq 0 ] && [ "$(ring_sums replicas-mountns)" -ge 4 ] && [ "$(link_sums replicas-mountns)" -ge 4 ]
ok $? "replicas-mountns: private /dev/shm: gradients summed over the network ($(ring_sums replicas-mountns) groups, $(link_sums replicas-mountns) over direct links)"
# ZeRO-1 (shard_optimizer): the reduce-scatter and the parameters'
# all-gather through shared memory where it is shared, over the bridge where
# it is not; either way the unsharded loopback run's losses and parameters
netns_case replicas-zero r2 "split: {auto: 2}
replicas: 2
shard_optimizer: true" yes netns netns netns netns
[ "$(shm_sums replicas-zero)" -ge 4 ] && [ "$(ring_sums replicas-zero)" -eq 0 ]
ok $? "replicas-zero: sharded, every rank's reduce-scatter and all-gather through shared memory ($(shm_sums replicas-zero) groups)"
netns_case replicas-zero-mountns r2 "split: {auto: 2}
replicas: 2
shard_optimizer: true" no mountns mountns mountns mountns
[ "$(shm_sums replicas-zero-mountns)" -eq 0 ] && [ "$(ring_sums replicas-zero-mountns)" -ge 4 ] && [ "$(link_sums replicas-zero-mountns)" -ge 4 ]
ok $? "replicas-zero-mountns: sharded, private /dev/shm: over the network ($(ring_sums replicas-zero-mountns) groups, $(link_sums replicas-zero-mountns) over direct links)"

echo "1..$n"
