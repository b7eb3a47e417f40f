#!/usr/bin/env bash
# Slurm across nodes, for real: a Slurm cluster of 2 emulated nodes (scripts/slurm/start-cluster.sh
# --nodes 2: a network and UTS namespace per node from scripts/cluster/, slurmctld on node 1, one
# slurmd per node), and examples/slurm/finetune.sbatch submitted with `sbatch -N 2` from node 1:
#   1. srun --mpi=pmix: 4 ranks, 2 per node, identity from Slurm; the first 50 losses equal one
#      process's (1e-5 relative; rounding that differs with the rank count grows past that later);
#   2. LAUNCHER=launch (shardlm launch, mpirun over the allocation): the same final weights, bit for bit;
#   3. srun, `scancel --signal=TERM` past step 20: checkpoint, exit code 0; `scontrol requeue`
#      resumes on both nodes to the same final weights, bit for bit, as the uninterrupted run 1;
#   4. LAUNCHER=launch, `scancel --batch --signal=TERM` (what reaches mpirun's ranks, docs/slurm.md),
#      then requeue: the same.
# Everything it uses is made here and removed on exit, failures included. Needs root, Slurm (installed
# from Debian's packages when missing) and namespaces; exits 77 (reported skipped) with the reason
# where it cannot run. It takes 2 to 4 minutes on 2 shared cores, too long for CI's budget: it runs
# only when SHARDLM_LONG_TESTS=1 is set, and is reported skipped otherwise.
# Usage: [SHARDLM_LONG_TESTS=1] slurm_multinode.sh SHARDLM SOURCE_DIR WORKDIR
set -euo pipefail
shardlm=$(realpath "$1")
src=$(realpath "$2")
work=$3
# shellcheck source=tests/scripts/common.sh
source "$src/tests/scripts/common.sh"
[[ ${SHARDLM_LONG_TESTS:-0} == 1 ]] ||
  skip "2 to 4 minutes, not part of CI's suite: run it with SHARDLM_LONG_TESTS=1 ctest -R slurm_multinode (docs/slurm.md)"
[[ $(id -u) -eq 0 ]] || skip "emulated nodes (namespaces) and Slurm's daemons need root; this test runs as $(id -un)"
command -v mpirun >/dev/null || skip "needs mpirun (openmpi-bin)"
t_start=$(date +%s)

name=sn$$
rc=0
"$src/scripts/slurm/start-cluster.sh" --nodes 2 --name "$name" || rc=$?
((rc != 2)) || skip "scripts/slurm/start-cluster.sh: Slurm on emulated nodes cannot run here (its message above)"
trap '"$src/scripts/slurm/stop-cluster.sh" --name "$name" >/dev/null || echo "cleanup: stop-cluster.sh --name $name failed"' EXIT
((rc == 0)) || fail "scripts/slurm/start-cluster.sh --nodes 2 exited $rc"
cluster=/run/shardlm-cluster/$name
host1=$name-node1 host2=$name-node2
# Clients on node 1, as a user logged in to the cluster's head node.
slurm_client=("$src/scripts/cluster/run.sh" "$name" 1 env SLURM_CONF="$cluster/slurm/slurm.conf")

rm -rf "$work" && mkdir -p "$work"
tiny_run "$shardlm" "$work"
sed -i 's/^max_steps: .*/max_steps: 800/' "$work/run.yaml"
# One process with the global batch of 4 ranks x 4 rows.
"$shardlm" train --config "$work/run.yaml" output_dir="$work/single" micro_batch_size=16 progress=none >/dev/null

# submit NAME LAUNCHER key=value...: `sbatch -N 2` of the example on node 1; prints the job id.
submit() {
  local name=$1 launcher=$2
  shift 2
  slurm env CONFIG="$work/run.yaml" SHARDLM="$shardlm" LAUNCHER="$launcher" OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 sbatch -N 2 --parsable --chdir "$work" --job-name "shardlm-test-$name" \
    --output "$work/$name.out" "$src/examples/slurm/finetune.sbatch" "$@"
}
# Each job takes both nodes' CPUs, so Slurm runs them one after another.
full=$(submit full srun output_dir="$work/full")
viamp=$(submit launch launch output_dir="$work/launch")
cut=$(submit cut srun output_dir="$work/cut" save_every=1000)
echo "submitted sbatch -N 2 jobs $full (srun), $viamp (launch), $cut (srun, to stop)"

# on_both LOG LAUNCHED_BY: 4 ranks, 2 on each node, started as LAUNCHED_BY says.
on_both() {
  grep -qF "pre-flight: 4 ranks on 2 hosts ($host1: 0,1; $host2: 2,3)" "$1" ||
    { grep -E "^(pre-flight|ranks):" "$1"; fail "$1: the ranks are not 0,1 on $host1 and 2,3 on $host2"; }
  grep -qF "ranks: started by $2, 2 ranks per node" "$1" || { grep "^ranks:" "$1"; fail "$1: not started by $2"; }
}

echo "1. srun --mpi=pmix on 2 nodes (job $full):"
wait_done "$full" 120
on_both "$work/full.out" "srun (Slurm job $full, step 0, pmix)"
same_losses "$work/full" "$work/single" "srun, 2 nodes x 2 ranks vs one process, first 50 steps" 50

echo "2. LAUNCHER=launch on 2 nodes (job $viamp):"
wait_done "$viamp" 120
on_both "$work/launch.out" "mpirun inside Slurm job $viamp"
cmp "$work/full/model.safetensors" "$work/launch/model.safetensors" || fail "launch's final weights differ from srun's"
echo "  final weights identical to srun's"

# stop_requeue JOB NAME SCANCEL_ARGS...: past step 20, scancel; the job ends 0:0 with a checkpoint;
# requeued, it resumes from it and ends with run 1's weights.
stop_requeue() {
  local job=$1 out=$work/$2.out dir=$work/$2 step
  shift 2
  wait_step "$out" 20 120
  slurm scancel "$@" "$job"
  wait_done "$job" 60
  step=$(stopped_at "$out" "$dir")
  slurm scontrol requeue "$job"
  wait_done "$job" 120
  [[ $(job_field "$job" Restarts) == 1 ]] || fail "job $job: Restarts=$(job_field "$job" Restarts), expected 1"
  grep -q "resumed from $(printf "%s/checkpoints/step_%08d" "$dir" "$step")" "$out" || fail "job $job did not resume from step $step"
  [[ $(grep -c "pre-flight: 4 ranks on 2 hosts" "$out") == 2 ]] || fail "$out: the rerun was not on both nodes"
  cmp "$work/full/model.safetensors" "$dir/model.safetensors" || fail "job $job's final weights differ from the uninterrupted run's"
  echo "  scancel $* at step $step: checkpoint, exit code 0:0; requeued on both nodes, resumed, final weights identical to run 1"
}
echo "3. srun job $cut:"
stop_requeue "$cut" cut --signal=TERM
# Submitted now: queued earlier, it would run (to its end) while job $cut waits to be requeued.
lcut=$(submit launch_cut launch output_dir="$work/launch_cut" save_every=1000)
echo "4. LAUNCHER=launch job $lcut:"
stop_requeue "$lcut" launch_cut --batch --signal=TERM
echo "slurm multinode checks passed in $(($(date +%s) - t_start)) s"
