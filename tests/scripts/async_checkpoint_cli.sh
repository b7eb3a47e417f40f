#!/usr/bin/env bash
# async_checkpoint: true on 2 FULL_SHARD ranks with a checkpoint every 10 steps:
#  1. every checkpoint (every rank's file, metadata.json, COMPLETE) and the final weights equal a
#     synchronous run's byte for byte, and the log says the files were written in the background;
#  2. kill -9 of every rank in the middle of writing the step-30 files in the background (the test
#     hook SHARDLM_TEST_KILL_DURING_SAVE) leaves step 30 without COMPLETE and step 20 complete;
#     resume_from: auto skips step 30 with a warning, resumes from step 20 and ends with the
#     synchronous run's final weights, byte for byte.
# Usage: async_checkpoint_cli.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# shellcheck source=tests/scripts/common.sh
source "$(dirname "$0")/common.sh"
tiny_run "$shardlm" "$work" 9 50 "save_every: 10"
run() { "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" "$@"; }

run output_dir="$work/sync" >"$work/sync.log" 2>&1 || { tail -20 "$work/sync.log"; exit 1; }
run output_dir="$work/async" async_checkpoint=true >"$work/async.log" 2>&1 || { tail -20 "$work/async.log"; exit 1; }
[[ $(grep -c "^checkpoint step .*(written in the background); training waited" "$work/async.log") == 5 ]] ||
  { echo "FAIL: the async run did not report 5 background checkpoints"; grep checkpoint "$work/async.log"; exit 1; }
grep -q "(written in the background)" "$work/sync.log" && { echo "FAIL: the sync run wrote in the background"; exit 1; }
for step in 10 20 30 40 50; do
  d=$(printf "step_%08d" $step)
  for f in rank_00000.safetensors rank_00001.safetensors metadata.json COMPLETE; do
    cmp "$work/sync/checkpoints/$d/$f" "$work/async/checkpoints/$d/$f" ||
      { echo "FAIL: $d/$f differs between the sync and the async run"; exit 1; }
  done
done
cmp "$work/sync/model.safetensors" "$work/async/model.safetensors" ||
  { echo "FAIL: final weights differ between the sync and the async run"; exit 1; }
echo "async checkpoints at steps 10..50 and the final weights equal the synchronous run's byte for byte"

# kill -9 of every rank halfway through its step-30 file, written by the background thread.
status=0
SHARDLM_TEST_KILL_DURING_SAVE=30 run output_dir="$work/killed" async_checkpoint=true >"$work/killed.log" 2>&1 || status=$?
(( status != 0 )) || { echo "FAIL: the run with the kill hook exited 0"; exit 1; }
ck=$work/killed/checkpoints
test -f "$ck/step_00000020/COMPLETE" || { echo "FAIL: step 20 is not complete"; exit 1; }
test ! -e "$ck/step_00000030/COMPLETE" || { echo "FAIL: the killed step 30 has COMPLETE"; exit 1; }
test ! -e "$ck/step_00000030/metadata.json" || { echo "FAIL: the killed step 30 has metadata.json"; exit 1; }
run output_dir="$work/killed" async_checkpoint=true resume_from=auto >"$work/resume.log" 2>&1 ||
  { tail -20 "$work/resume.log"; exit 1; }
grep -q "skipping $ck/step_00000030: no COMPLETE marker" "$work/resume.log" ||
  { echo "FAIL: no warning about the interrupted step 30"; grep -i -e warn -e resum "$work/resume.log"; exit 1; }
grep -q "resumed from $ck/step_00000020 " "$work/resume.log" || { echo "FAIL: did not resume from step 20"; exit 1; }
cmp "$work/sync/model.safetensors" "$work/killed/model.safetensors" ||
  { echo "FAIL: resumed after the kill, the final weights differ from the uninterrupted run's"; exit 1; }
echo "kill -9 during the background write of step 30: step 20 intact, resumed from it to identical final weights"
echo "async checkpoint checks passed"
