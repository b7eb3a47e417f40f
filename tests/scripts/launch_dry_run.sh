#!/usr/bin/env bash
# shardlm launch --dry-run for 2 nodes x 8 ranks (the line docs/slurm.md shows), and where OpenMPI
# itself would put those 16 ranks: mpirun --do-not-launch --display-map with the same placement
# flags maps ranks 0-7 to the hostfile's first node and 8-15 to its second, so HYBRID_SHARD's shard
# groups (consecutive ranks, 8 per node from OMPI_COMM_WORLD_LOCAL_SIZE) are the nodes.
# Usage: launch_dry_run.sh SHARDLM SOURCE_DIR mpi|nompi   (nompi: the line only; no mpirun to ask)
set -euo pipefail
shardlm=$1
hostfile=$2/examples/slurm/hostfile
fail() { echo "FAIL: $*"; exit 1; }
# The line below is exact: no SHARDLM_* or OMP_* setting of the caller's may add to it.
while IFS='=' read -r name _; do [[ $name == SHARDLM_* || $name == OMP_* ]] && unset "$name"; done < <(env)

line=$("$shardlm" launch --nproc-per-node 8 --nnodes 2 --hostfile "$hostfile" --threads-per-rank 4 --dry-run \
  -- train --config run.yaml sharding_strategy=HYBRID_SHARD)
echo "$line"
root=""
[[ $(id -u) -eq 0 ]] && root=" --allow-run-as-root"
want="mpirun -np 16 --bind-to none -x OMP_NUM_THREADS=4 --hostfile $hostfile --map-by ppr:8:node$root"
want+=" $(realpath "$shardlm") train --config run.yaml sharding_strategy=HYBRID_SHARD"
[[ $line == "$want" ]] || fail "expected: $want"

# Settings given to launch reach every node's ranks: each SHARDLM_* and OMP_* variable of launch's
# environment is named with -x (mpirun sets those on every node; its own environment reaches only
# its own node), sorted; OMP_NUM_THREADS is launch's own.
line=$(SHARDLM_SHM=0 SHARDLM_COMM_THREADS=2 OMP_PROC_BIND=close OMP_NUM_THREADS=7 "$shardlm" launch --nproc-per-node 8 \
  --nnodes 2 --hostfile "$hostfile" --threads-per-rank 4 --dry-run -- train --config run.yaml)
want="mpirun -np 16 --bind-to none -x OMP_NUM_THREADS=4 -x OMP_PROC_BIND -x SHARDLM_COMM_THREADS -x SHARDLM_SHM"
[[ $line == "$want "* ]] || fail "settings not forwarded: $line (expected it to start: $want)"
echo "settings forwarded: ${want#*OMP_NUM_THREADS=4 }"

# Without --hostfile, several nodes are refused in one line.
out=$("$shardlm" launch --nproc-per-node 8 --nnodes 2 --dry-run -- train --config run.yaml 2>&1) &&
  fail "--nnodes 2 without --hostfile was accepted"
grep -q "needs --hostfile" <<<"$out" || fail "no --hostfile error: $out"

[[ $3 == mpi ]] || { echo "no MPI in this build: the placement is not checked"; exit 0; }
# The line's mpirun arguments up to the executable, with `true` as the program: OpenMPI maps the
# job and prints the map, and launches nothing (it exits non-zero, having been told not to launch).
read -ra args <<<"${line%% $(realpath "$shardlm") *}"
map=$(timeout 30 "${args[@]}" --do-not-launch --display-map true 2>&1 || true)
for node in 1 2; do
  ranks=$(awk -v n="node00$node" '/Data for node:/ { on = ($4 == n) } on && match($0, /Process rank: [0-9]+/) { printf "%s ", substr($0, RSTART + 14, RLENGTH - 14) }' <<<"$map")
  want_ranks=$(seq -s " " $(( (node - 1) * 8 )) $(( node * 8 - 1 )))
  [[ $ranks == "$want_ranks " ]] || { echo "$map" | head -30; fail "node00$node has ranks '$ranks', expected $want_ranks"; }
  echo "node00$node: ranks $ranks(OpenMPI's map)"
done
echo "launch dry-run checks passed"
