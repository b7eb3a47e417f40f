#!/usr/bin/env bash
# Elastic restart (shardlm launch --max-restarts, as torchrun's): a 2-rank FULL_SHARD run with a
# checkpoint every 10 steps loses rank 1 to SIGKILL once, after step 25 (the test hook
# SHARDLM_TEST_KILL_RANK_AT_STEP=1:25:MARKER; the marker makes it fire once). launch runs the job
# again with resume_from=auto, which continues from step 20: the job exits 0 and its final weights
# equal an uninterrupted run's byte for byte. A rank that fails every time exhausts the restarts:
# launch then exits non-zero, saying so.
# Usage: restart_cli.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# shellcheck source=tests/scripts/common.sh
source "$(dirname "$0")/common.sh"
tiny_run "$shardlm" "$work" 7 60 "save_every: 10"
run() { "$shardlm" launch --nproc-per-node 2 "$@"; }

# The uninterrupted run.
run -- train --config "$work/run.yaml" output_dir="$work/full" >"$work/full.log" 2>&1

# Rank 1 killed after step 25, once; one restart allowed.
SHARDLM_TEST_KILL_RANK_AT_STEP="1:25:$work/killed" run --max-restarts 1 -- train --config "$work/run.yaml" \
  output_dir="$work/cut" >"$work/cut.log" 2>&1 || { echo "FAIL: exit $? after one restart"; tail -20 "$work/cut.log"; exit 1; }
test -f "$work/killed" || { echo "FAIL: the kill hook did not fire"; exit 1; }
grep -q "exited on signal 9" "$work/cut.log" || { echo "FAIL: no rank was killed"; tail -20 "$work/cut.log"; exit 1; }
line=$(grep "^shardlm launch: rank failure" "$work/cut.log") ||
  { echo "FAIL: launch did not say it restarts"; tail -20 "$work/cut.log"; exit 1; }
echo "$line"
[[ "$line" == "shardlm launch: rank failure (exit 137); restart 1 of 1 from the latest checkpoint" ]] ||
  { echo "FAIL: unexpected restart line"; exit 1; }
[[ $(grep -c "^shardlm launch: mpirun " "$work/cut.log") == 2 ]] || { echo "FAIL: mpirun did not run twice"; exit 1; }
grep "^shardlm launch: mpirun " "$work/cut.log" | tail -1 | grep -q " resume_from=auto$" ||
  { echo "FAIL: the restarted command has no resume_from=auto"; exit 1; }
grep -q "resumed from $work/cut/checkpoints/step_00000020 " "$work/cut.log" ||
  { echo "FAIL: the restart did not resume from step 20"; grep -i resum "$work/cut.log"; exit 1; }
cmp "$work/full/model.safetensors" "$work/cut/model.safetensors" ||
  { echo "FAIL: the restarted run's weights differ from the uninterrupted run's"; exit 1; }
echo "rank 1 killed after step 25: restarted from step 20, exit 0, final weights identical to the uninterrupted run"

# A rank that fails every time (no marker): one restart, then launch gives up with the job's status.
status=0
SHARDLM_TEST_KILL_RANK_AT_STEP="1:5" run --max-restarts 1 -- train --config "$work/run.yaml" \
  output_dir="$work/always" >"$work/always.log" 2>&1 || status=$?
(( status == 137 )) || { echo "FAIL: exit $status, not 137, when every run fails"; tail -20 "$work/always.log"; exit 1; }
grep -q "^shardlm launch: rank failure (exit 137); restart 1 of 1 from the latest checkpoint$" "$work/always.log"
grep -q "^shardlm launch: rank failure (exit 137); no restarts left (--max-restarts 1)$" "$work/always.log" ||
  { echo "FAIL: no 'no restarts left' line"; tail -20 "$work/always.log"; exit 1; }
echo "a rank failing every time: one restart, then exit 137"
echo "restart checks passed"
