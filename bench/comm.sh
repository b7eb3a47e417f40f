#!/usr/bin/env bash
# Raw MPI all-gather, reduce-scatter and all-reduce beside shardlm's Communicator, at unit-sized
# messages and a sweep of sizes, on NP ranks of this machine (default 2). Builds nothing: build
# bench_comm first (cmake --build build --target bench_comm). OpenMP threads per rank = cores / NP.
# Usage: bench/comm.sh [NP] [extra bench_comm args, e.g. --iters 10 --dtype f32]
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
(( $# > 0 )) && shift
cores=$(nproc)
threads=$(( cores / np )); (( threads >= 1 )) || threads=1
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F)"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun -np "$np" --oversubscribe --bind-to none -x OMP_NUM_THREADS="$threads" build/bench/bench_comm "$@"
