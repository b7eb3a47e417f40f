#!/usr/bin/env bash
# The collective watchdog: one of 4 ranks of a FULL_SHARD run is stopped with SIGSTOP (as a hung or
# frozen process would be); with collective_timeout: 10 every rank ends within 20 s, the stopped
# rank is named, and the job exits non-zero. Without the watchdog the job would hang forever.
# A rank frozen before the pre-flight check (the hook SHARDLM_TEST_STOP_BEFORE_PREFLIGHT) is named by
# it, before any model is loaded. Then the same with mpirun stopped too, as when its teardown cannot reach a node: the live ranks,
# having printed their error, end themselves within 20 s all the same.
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

mpirun_pid=""
cleanup() {  # never leave a stopped rank or mpirun behind
  [[ -z $mpirun_pid ]] || kill -CONT "$mpirun_pid" 2>/dev/null || true
  pkill -CONT -f "train --config $work/run.yaml" 2>/dev/null || true
  pkill -KILL -f "train --config $work/run.yaml" 2>/dev/null || true
}
trap cleanup EXIT

# start LOG: a 4-rank job that trains until stopped (job=launch's pid); waits until it trains and
# sets victim to world rank 2's pid and live to the others'.
start() {
  "$shardlm" launch --nproc-per-node 4 -- train --config "$work/run.yaml" >"$1" 2>&1 &
  job=$!
  for _ in $(seq 1200); do
    grep -q "^step 100/" "$1" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "^step 100/" "$1" || { echo "FAIL: training did not start"; cat "$1"; exit 1; }
  victim="" live=()
  for pid in $(pgrep -f "train --config $work/run.yaml"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=2"; then victim=$pid
    elif tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK="; then live+=("$pid"); fi
  done
  [[ -n "$victim" && ${#live[@]} -eq 3 ]] || { echo "FAIL: ranks not found (rank 2: '$victim', others: ${live[*]})"; exit 1; }
}

start "$work/out.log"
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

# A rank frozen before the pre-flight check: the check's first all-reduce names it, nothing is loaded.
set +e
SHARDLM_TEST_STOP_BEFORE_PREFLIGHT=1 timeout 60 "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" \
  collective_timeout=3 output_dir="$work/preflight" >"$work/preflight.log" 2>&1
rc=$?
set -e
[[ $rc -ne 0 && $rc -ne 124 ]] || { echo "FAIL: pre-flight with a stopped rank: exit $rc"; tail -5 "$work/preflight.log"; exit 1; }
grep -q "^shardlm: error: rank 0: all-reduce of a scalar (pre-flight check) did not complete within collective_timeout 3 s: rank 1 (pid [0-9]*) is stopped" \
  "$work/preflight.log" || { echo "FAIL: the pre-flight check did not name the stopped rank"; cat "$work/preflight.log"; exit 1; }
grep -q "^shardlm train:" "$work/preflight.log" && { echo "FAIL: the model was loaded after a failed pre-flight"; exit 1; }
echo "pre-flight named the rank stopped before it (exit $rc): $(grep -o 'rank 1 (pid [0-9]*) is stopped' "$work/preflight.log")"

# mpirun stopped too: MPI_Abort cannot reach it, and the ranks that reported the hang must end
# themselves (a few seconds after their error line) rather than wait for a teardown that never comes.
start "$work/frozen.log"
mpirun_pid=$(pgrep -P "$job" mpirun)
kill -STOP "$mpirun_pid" "$victim"
t0=$(date +%s%N)
for _ in $(seq 300); do
  alive=0
  for pid in "${live[@]}"; do [[ -d /proc/$pid && $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) != Z ]] && alive=1; done
  ((alive)) || break
  sleep 0.1
done
elapsed_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
((alive == 0)) || { echo "FAIL: with mpirun stopped, live ranks still run 30 s after rank 2 was stopped"; exit 1; }
echo "mpirun stopped: the 3 live ranks ended themselves $elapsed_ms ms after rank 2 was stopped"
(( elapsed_ms < 20000 )) || { echo "FAIL: took $elapsed_ms ms"; exit 1; }
kill -CONT "$mpirun_pid" "$victim"
set +e
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
kill -0 "$job" 2>/dev/null && { echo "FAIL: launch still runs 30 s after mpirun was continued"; exit 1; }
wait "$job"
rc=$?
set -e
[[ $rc -ne 0 ]] || { echo "FAIL: exit 0"; exit 1; }
# The ranks' lines travel through mpirun, so they show once it runs again.
grep -q "did not complete within collective_timeout 10 s" "$work/frozen.log" || { echo "FAIL: no error line"; cat "$work/frozen.log"; exit 1; }
echo "watchdog check passed"
