#!/usr/bin/env bash
# Preemption: SIGTERM to every rank of a 2-rank FULL_SHARD run (what Slurm's scancel and a
# preemption send) at a step chosen by timing, not by the test: the job finishes that step, writes a
# complete checkpoint, exits 0 naming it; resume_from=auto then ends with the same final weights,
# bit for bit, as an uninterrupted run. The same for SIGINT to `shardlm launch`'s process group, what
# Ctrl-C in a terminal sends (launch relays it to every rank through mpirun). A run without
# checkpointing exits 0 saying nothing was saved.
# Usage: preemption.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# shellcheck source=tests/scripts/common.sh
source "$(dirname "$0")/common.sh"
tiny_run "$shardlm" "$work"
run() { "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" "$@"; }
# The rank processes (as Slurm signals every task), not mpirun, which would take the job down itself.
ranks() {
  for pid in $(pgrep -f "train --config $work/run.yaml output_dir=$1"); do
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=" && echo "$pid"
  done
}
trap 'pkill -KILL -f "train --config $work/run.yaml" 2>/dev/null || true' EXIT

# The uninterrupted run.
run output_dir="$work/full" >/dev/null

# The same run, with checkpoints every 1000 steps (only the signal makes one), stopped by SIGTERM
# to both ranks once it is past step 50.
run output_dir="$work/cut" save_every=1000 >"$work/cut.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "^step 50/" "$work/cut.log" 2>/dev/null && break; sleep 0.05; done
kill -TERM $(ranks "$work/cut")
wait "$job"  # set -e: a non-zero exit fails the test
line=$(grep "stopped by a signal after step" "$work/cut.log")
echo "$line"
step=$(echo "$line" | sed -E 's/.*after step ([0-9]+).*/\1/')
(( step >= 50 && step < 400 )) || { echo "FAIL: stopped at step $step"; exit 1; }
ckpt=$(printf "%s/cut/checkpoints/step_%08d" "$work" "$step")
test -f "$ckpt/COMPLETE" || { echo "FAIL: no complete checkpoint at $ckpt"; exit 1; }
echo "$line" | grep -q "resume_from=auto"
[[ ! -e "$work/cut/model.safetensors" ]] || { echo "FAIL: a stopped run wrote a final model"; exit 1; }

# Resumed, it ends where the uninterrupted run ended.
run output_dir="$work/cut" save_every=1000 resume_from=auto >"$work/resume.log" 2>&1
grep -q "resumed from $ckpt" "$work/resume.log" || { echo "FAIL: did not resume from $ckpt"; exit 1; }
cmp "$work/full/model.safetensors" "$work/cut/model.safetensors" ||
  { echo "FAIL: the resumed run's weights differ from the uninterrupted run's"; exit 1; }
echo "resumed from step $step to step 400: final weights identical to the uninterrupted run"

# Ctrl-C: SIGINT to launch's process group, as a terminal sends it (mpirun and the ranks are in
# groups of their own). The job ends as above, and resumes to the same weights.
setsid "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" output_dir="$work/ctrlc" save_every=1000 \
  >"$work/ctrlc.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "^step 50/" "$work/ctrlc.log" 2>/dev/null && break; sleep 0.05; done
kill -INT -- "-$job"
wait "$job" || { echo "FAIL: Ctrl-C: exit $?"; tail -5 "$work/ctrlc.log"; exit 1; }
grep -q "^shardlm launch: SIGINT: every rank stops after its current step" "$work/ctrlc.log"
line=$(grep "stopped by a signal after step" "$work/ctrlc.log")
step=$(echo "$line" | sed -E 's/.*after step ([0-9]+).*/\1/')
test -f "$(printf "%s/ctrlc/checkpoints/step_%08d/COMPLETE" "$work" "$step")" ||
  { echo "FAIL: Ctrl-C at step $step left no complete checkpoint"; exit 1; }
run output_dir="$work/ctrlc" save_every=1000 resume_from=auto >"$work/ctrlc_resume.log" 2>&1
cmp "$work/full/model.safetensors" "$work/ctrlc/model.safetensors" ||
  { echo "FAIL: resumed after Ctrl-C, the weights differ from the uninterrupted run's"; exit 1; }
echo "Ctrl-C to launch at step $step: exit 0, checkpoint complete, resumed to identical final weights"

# Without checkpointing: a clean exit that says nothing was saved.
run output_dir="$work/nock" >"$work/nock.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "^step 20/" "$work/nock.log" 2>/dev/null && break; sleep 0.05; done
kill -TERM $(ranks "$work/nock")
wait "$job"
grep "stopped by a signal after step" "$work/nock.log" | grep -q "nothing was saved" ||
  { echo "FAIL: no 'nothing was saved' line"; cat "$work/nock.log" | tail -5; exit 1; }
echo "preemption checks passed"
