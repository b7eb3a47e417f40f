#!/usr/bin/env bash
# Every sharding strategy at 1, 2 and 4 CPU ranks on this machine (ranks share the cores:
# OpenMP threads per rank = cores / ranks). Usage: bench/sharding.sh [extra bench_sharding args]
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores; $(date -u +%F)"
for np in 1 2 4; do
  threads=$(( cores / np )); (( threads >= 1 )) || threads=1
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np "$np" --oversubscribe --bind-to none -x OMP_NUM_THREADS="$threads" build/bench/bench_sharding "$@"
done
