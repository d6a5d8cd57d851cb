#!/bin/sh
# The replicas' gradient sum against Open MPI's MPI_Allreduce (prints the
# ratios): 2 processes on this host, through shared memory
# (runtime/grad_shm.c; MPI with its shared-memory transport), then the ring
# over pippin's transport with its shared-memory rings (--ring: the path
# before grad_shm), then over sockets alone (what crosses hosts; MPI over
# tcp too): pippin over its direct TCP links (runtime/grad_tcp.c), then
# through its transport (--no-links, the path before them), then ZeRO-1's reduce-scatter + all-gather (--shard) through
# shared memory.
#   bench/bench_allreduce.sh [BUILD_DIR] [--json]
# Needs Open MPI: PIPPIN_WITH_MPI=1 scripts/install-deps, then rebuild.
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
exe="$build/bench/pippin-bench-allreduce"
if [ ! -x "$exe" ]; then
    echo "bench_allreduce: $exe not built (Open MPI missing? PIPPIN_WITH_MPI=1 scripts/install-deps; meson setup --reconfigure $build)" >&2
    exit 1
fi
np=${NP:-2}
mpi="mpirun -np $np --oversubscribe --bind-to none"
[ "$(id -u)" -eq 0 ] && mpi="$mpi --allow-run-as-root"
$mpi "$exe" "$@"
$mpi "$exe" --ring "$@"
$mpi --mca btl tcp,self "$exe" --noshm "$@"
$mpi --mca btl tcp,self "$exe" --noshm --no-links "$@"
$mpi "$exe" --shard "$@"
