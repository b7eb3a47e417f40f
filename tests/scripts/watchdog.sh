#!/usr/bin/env bash
# The collective watchdog: one of 4 ranks of a FULL_SHARD run is stopped with SIGSTOP (as a hung or
# frozen process would be); with collective_timeout: 10 every rank ends within 20 s, the stopped
# rank is named, and the job exits non-zero. Without the watchdog the job would hang forever.
# Usage: watchdog.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

"$shardlm" init --preset tiny --out "$work/init" --seed 3 >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/init
output_dir: $work/out
data: {train: builtin:addition, digits: 2, train_examples: 4000, eval_examples: 32}
seq_len: 16
micro_batch_size: 4
max_steps: 1000000
eval_every: 0
accuracy_examples: 0
progress: lines
log_every: 100
sharding_strategy: FULL_SHARD
collective_timeout: 10
YAML

"$shardlm" launch --nproc-per-node 4 -- train --config "$work/run.yaml" >"$work/out.log" 2>&1 &
job=$!
cleanup() {  # never leave a stopped rank behind
  pkill -CONT -f "train --config $work/run.yaml" 2>/dev/null || true
  pkill -KILL -f "train --config $work/run.yaml" 2>/dev/null || true
}
trap cleanup EXIT

# Wait until the ranks train, then stop world rank 2.
for _ in $(seq 1200); do
  grep -q "^step 100/" "$work/out.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "^step 100/" "$work/out.log" || { echo "FAIL: training did not start"; cat "$work/out.log"; exit 1; }
victim=""
for pid in $(pgrep -f "train --config $work/run.yaml"); do
  if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=2"; then victim=$pid; fi
done
[[ -n "$victim" ]] || { echo "FAIL: no rank 2 process found"; exit 1; }
kill -STOP "$victim"
t0=$(date +%s%N)

set +e
for _ in $(seq 400); do
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$job" 2>/dev/null && { echo "FAIL: the job still runs 40 s after rank 2 was stopped"; exit 1; }
wait "$job"
rc=$?
set -e
elapsed_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "job ended $elapsed_ms ms after SIGSTOP of rank 2 (pid $victim), exit $rc"
grep "did not complete within collective_timeout" "$work/out.log" | head -3
[[ $rc -ne 0 ]] || { echo "FAIL: exit 0"; exit 1; }
(( elapsed_ms < 20000 )) || { echo "FAIL: took $elapsed_ms ms"; exit 1; }
# The live ranks wait in the same collective and time out together, each naming the hang (seen: all
# 3); the first one's MPI_Abort, a second later, may cut a slow one short.
echo "$(grep -c "is stopped; ending the job" "$work/out.log") of the 3 live ranks named rank 2"
# The stopped rank, continued by mpirun to be killed, must not blame the others.
if grep "rank 2: " "$work/out.log" | grep -q "did not complete"; then echo "FAIL: rank 2 blamed another rank"; exit 1; fi
grep -q "did not complete within collective_timeout 10 s: rank 2 (pid $victim) is stopped" "$work/out.log" ||
  { echo "FAIL: the stopped rank is not named"; cat "$work/out.log" | tail -20; exit 1; }
grep -q "(step [0-9]*, " "$work/out.log" || { echo "FAIL: the step is not named"; exit 1; }
echo "watchdog check passed"
