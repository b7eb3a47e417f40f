#!/usr/bin/env bash
# Slurm, for real: a one-machine cluster (scripts/slurm/start-cluster.sh, which installs Debian's
# Slurm when missing) runs examples/slurm/finetune.sbatch:
#   1. through srun: 2 ranks, FULL_SHARD, world size, rank and local rank from Slurm (PMIx);
#   2. through `shardlm launch` (mpirun) inside the allocation: the same final weights, bit for bit;
#   3. preemption: `scancel --signal=TERM` once past step 20 checkpoints and ends the job with exit
#      code 0 and the resume line; `scontrol requeue` reruns the job, which resumes (resume_from=auto)
#      and ends with the same final weights, bit for bit, as the uninterrupted run 1; under
#      `shardlm launch`, `scancel --batch --signal=TERM` checkpoints and ends the job with exit code 0;
#   4. srun without PMIx is refused in one line.
# Jobs are watched through `scontrol show job` and their output files (no accounting daemon, no sacct).
# Exit 77 (reported skipped) only when Slurm cannot run on this machine (not root, packages not
# installable); a cluster that was not running before is stopped again at the end.
# Usage: slurm_cli.sh SHARDLM SOURCE_DIR WORKDIR
set -euo pipefail
shardlm=$(realpath "$1")  # jobs run in WORKDIR
src=$(realpath "$2")
work=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=tests/scripts/common.sh
source "$src/tests/scripts/common.sh"
[[ $(id -u) -eq 0 ]] || skip "Slurm's daemons are installed and started as root; this test runs as $(id -un)"

was_running=0
command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q UP && was_running=1
rc=0
"$src/scripts/slurm/start-cluster.sh" || rc=$?
((rc != 2)) || skip "scripts/slurm/start-cluster.sh: Slurm cannot run on this machine (its message above)"
((rc == 0)) || fail "scripts/slurm/start-cluster.sh exited $rc"

jobs=()
cleanup() {
  ((${#jobs[@]})) && scancel "${jobs[@]}" 2>/dev/null || true
  if ((!was_running)); then "$src/scripts/slurm/stop-cluster.sh" >/dev/null || true; fi
}
trap cleanup EXIT

rm -rf "$work" && mkdir -p "$work"
tiny_run "$shardlm" "$work"

# submit NAME LAUNCHER key=value...: the example sbatch with this test's config and binary; prints the job id.
submit() {
  local name=$1 launcher=$2
  shift 2
  CONFIG=$work/run.yaml SHARDLM=$shardlm LAUNCHER=$launcher \
    sbatch --parsable --chdir "$work" --job-name "shardlm-test-$name" --output "$work/$name.out" \
    "$src/examples/slurm/finetune.sbatch" "$@"
}
# Each job takes both CPUs, so Slurm runs them one after another.
full=$(submit full srun output_dir="$work/full")
jobs+=("$full")
viamp=$(submit launch launch output_dir="$work/launch")
jobs+=("$viamp")
cut=$(submit cut srun output_dir="$work/cut" save_every=1000)
jobs+=("$cut")
echo "submitted jobs $full (srun), $viamp (shardlm launch), $cut (srun, to be preempted)"

# 1. srun: 2 ranks whose identity came from Slurm, and a loss that fell.
wait_done "$full" 120
grep -q "^sharding: FULL_SHARD on 2 ranks" "$work/full.out" || fail "no 'FULL_SHARD on 2 ranks' line in full.out"
grep -qF "ranks: started by srun (Slurm job $full, step 0, pmix), 2 ranks per node, local rank from SLURM_LOCALID" \
  "$work/full.out" || { grep "ranks:" "$work/full.out"; fail "the ranks did not take their identity from srun"; }
first=$(grep -m1 -oE "^step +10/400 .*loss [0-9.]+" "$work/full.out" | grep -oE "[0-9.]+$" || true)
last=$(grep -oE "^step +400/400 .*loss [0-9.]+" "$work/full.out" | grep -oE "[0-9.]+$" || true)
[[ -n $first && -n $last ]] || fail "no loss at steps 10 and 400 in full.out"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss did not fall: step 10 $first, step 400 $last"
echo "srun: FULL_SHARD on 2 ranks from Slurm job $full (PMIx, SLURM_LOCALID); loss $first at step 10 -> $last at step 400"

# 2. shardlm launch in the allocation: mpirun's ranks, the same weights.
wait_done "$viamp" 120
grep -qF "ranks: started by mpirun inside Slurm job $viamp, 2 ranks per node" "$work/launch.out" ||
  { grep "ranks:" "$work/launch.out"; fail "shardlm launch's ranks did not run inside the allocation"; }
cmp "$work/full/model.safetensors" "$work/launch/model.safetensors" ||
  fail "shardlm launch's final weights differ from srun's"
echo "shardlm launch inside job $viamp: final weights identical to srun's"

# 3. Preemption: SIGTERM to the step's ranks (scancel --signal, without --batch/--full, spares the
# batch script) once past step 20, then requeue.
wait_step "$work/cut.out" 20 120
scancel --signal=TERM "$cut"
wait_done "$cut" 60
step=$(stopped_at "$work/cut.out" "$work/cut")
grep "stopped by a signal after step" "$work/cut.out"
((step >= 20 && step < 400)) || fail "stopped at step $step"
ckpt=$(printf "%s/cut/checkpoints/step_%08d" "$work" "$step")

scontrol requeue "$cut"
wait_done "$cut" 120
[[ $(job_field "$cut" Restarts) == 1 ]] || fail "job $cut: Restarts=$(job_field "$cut" Restarts), expected 1"
grep -q "resumed from $ckpt" "$work/cut.out" || fail "the requeued job did not resume from $ckpt"
cmp "$work/full/model.safetensors" "$work/cut/model.safetensors" ||
  fail "the requeued job's final weights differ from the uninterrupted run's"
echo "requeued job $cut resumed from step $step: final weights identical to the uninterrupted run"

# 3b. Requeue of the running job (what a preemption with PreemptMode=REQUEUE does): Slurm sends
# SIGTERM to the ranks (and the batch script), the ranks checkpoint within KillWait, and the job
# goes back to the queue and resumes. Submitted now, so that it does not run while job $cut waits.
live=$(submit live srun output_dir="$work/live" save_every=1000)
jobs+=("$live")
wait_step "$work/live.out" 20 120
scontrol requeue "$live"
wait_done "$live" 180
[[ $(job_field "$live" Restarts) == 1 ]] || fail "job $live: Restarts=$(job_field "$live" Restarts), expected 1"
step=$(sed -nE 's/.*stopped by a signal after step ([0-9]+).*/\1/p' "$work/live.out")
[[ -n $step ]] || fail "job $live: no 'stopped by a signal' line"
grep -q "resumed from $(printf "%s/live/checkpoints/step_%08d" "$work" "$step")" "$work/live.out" ||
  fail "job $live did not resume from its step-$step checkpoint"
cmp "$work/full/model.safetensors" "$work/live/model.safetensors" ||
  fail "job $live's final weights differ from the uninterrupted run's"
echo "running job $live requeued at step $step: checkpointed, resumed, final weights identical"

# 3c. Under shardlm launch the ranks are in the batch step: `scancel --batch --signal=TERM` signals
# the script, which passes it to launch, which relays it to every rank through mpirun.
lcut=$(submit launch_cut launch output_dir="$work/launch_cut" save_every=1000)
jobs+=("$lcut")
wait_step "$work/launch_cut.out" 20 120
scancel --batch --signal=TERM "$lcut"
wait_done "$lcut" 60
step=$(stopped_at "$work/launch_cut.out" "$work/launch_cut")
echo "shardlm launch job $lcut stopped by scancel --batch --signal=TERM: checkpoint at step $step, exit code 0:0"

# 4. srun without PMIx: one line saying what to do, not MPI_Init's abort.
out=$(timeout 60 srun -n 2 --mpi=none "$shardlm" train --config "$work/run.yaml" output_dir="$work/nopmix" 2>&1) &&
  fail "srun --mpi=none was accepted"
grep -q "without PMIx (--mpi=none).*srun --mpi=pmix" <<<"$out" || { echo "$out" | tail -5; fail "no PMIx error line"; }
echo "srun --mpi=none: $(grep -m1 "without PMIx" <<<"$out")"
echo "slurm checks passed"
