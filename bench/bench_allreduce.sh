#!/bin/sh
# The replicas' gradient ring against Open MPI's MPI_Allreduce (prints the
# ratios): 2 processes on this host, with pippin's shared-memory rings and
# without (its socket path, what crosses hosts).
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
# MPI with its defaults (shared memory between same-host processes) against
# pippin with its shared-memory rings; then both over tcp sockets only.
$mpi "$exe" "$@"
$mpi --mca btl tcp,self "$exe" --noshm "$@"
