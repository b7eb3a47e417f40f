# shellcheck shell=bash disable=SC2154,SC2034  # `work` is the caller's; `cluster` is for it
# Helpers shared by the script tests that run jobs the way a scheduler does (slurm_cli.sh,
# slurm_multinode.sh, kubernetes_entry.sh, multinode.sh). Sourced, not run; the caller sets
# `set -euo pipefail` and the variable `work` (its work directory).

# skip REASON: reported skipped by ctest (SKIP_RETURN_CODE 77), never passed. fail REASON: on
# stderr, so that it is seen from inside $(...) too.
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# tiny_run SHARDLM DIR [SEED [MAX_STEPS [YAML]]]: a tiny model (DIR/init, seed SEED, default 5) and
# DIR/run.yaml, a FULL_SHARD fine-tune of it for MAX_STEPS (default 400) steps on 2-digit additions
# that logs every 10 steps (`step N/400 ... loss L`), with the lines YAML added (e.g. "save_every: 10").
tiny_run() {
  "$1" init --preset tiny --out "$2/init" --seed "${3:-5}" >/dev/null
  cat >"$2/run.yaml" <<YAML
model: $2/init
data: {train: builtin:addition, digits: 2, train_examples: 4000, eval_examples: 32}
seq_len: 16
micro_batch_size: 4
max_steps: ${4:-400}
${5:-}
optimizer: {lr: 1e-3}
eval_every: 0
accuracy_examples: 0
progress: lines
log_every: 10
sharding_strategy: FULL_SHARD
YAML
}

# wait_step FILE STEP SECONDS: until FILE has logged step STEP; fails naming FILE if not in time.
wait_step() {
  for _ in $(seq $(($3 * 20))); do grep -qE "^step +$2/" "$1" 2>/dev/null && return 0; sleep 0.05; done
  tail -n 5 "$1" >&2 2>/dev/null || true
  fail "$1 did not reach step $2 in $3 s"
}

# stopped_at LOG DIR: the step after which the run logging to LOG was stopped by a signal, checked:
# the stop line says how to resume, DIR/checkpoints holds a complete checkpoint of that step, and
# no final model was written. Prints the step.
stopped_at() {
  local line step
  line=$(grep "stopped by a signal after step" "$1") || { tail -n 5 "$1" >&2; fail "$1: no 'stopped by a signal' line"; }
  [[ $line == *resume_from=auto* ]] || fail "$1: the stop line does not say how to resume: $line"
  step=$(sed -E 's/.*after step ([0-9]+).*/\1/' <<<"$line")
  [[ -f $(printf "%s/checkpoints/step_%08d/COMPLETE" "$2" "$step") ]] || fail "$1: no complete checkpoint of step $step in $2"
  [[ ! -e $2/model.safetensors ]] || fail "$1: a stopped run wrote a final model in $2"
  echo "$step"
}

# same_losses GOT REF LABEL [STEPS] [TOLERANCE]: the losses in metrics.jsonl of run directory GOT
# equal those of REF, step by step, to TOLERANCE relative (default 1e-5): all of them (as many in
# both), or the first STEPS (float rounding that differs with the number of ranks grows over a long run).
same_losses() {
  /usr/bin/python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" "${4:-0}" "${5:-1e-5}" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r]
got, ref, label, steps = losses(sys.argv[1]), losses(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tol = float(sys.argv[5])
if steps:
    got, ref = got[:steps], ref[:steps]
assert ref and len(got) == len(ref), f"{label}: {len(got)} losses, the reference has {len(ref)}"
rel = [abs(a - b) / abs(b) for a, b in zip(got, ref)]
bad = [i for i, r in enumerate(rel) if r > tol]
assert not bad, f"{label}: loss {bad[0] + 1} is {got[bad[0]]}, the reference's {ref[bad[0]]}"
print(f"  {label}: {len(got)} losses equal to the reference's (largest relative difference {max(rel):.1e})")
PY
}

# emulated_cluster NAME START_ARGS...: skipped (77) with the reason unless emulated nodes can be
# made here (root, the tools, network and UTS namespaces); else starts scripts/cluster/start.sh
# --name NAME START_ARGS... (the caller's `src` is the source tree), sets `cluster` to its state
# directory, and on exit kills the processes in `bg` and removes the cluster, failures included.
bg=()
emulated_cluster() {
  [[ $(id -u) -eq 0 ]] || skip "emulated nodes are network and UTS namespaces, which need root; this runs as $(id -un)"
  for tool in ip nsenter unshare mpirun; do command -v $tool >/dev/null || skip "needs $tool (iproute2, util-linux, openmpi-bin)"; done
  unshare --net --uts true 2>/dev/null || skip "cannot create namespaces here (unshare --net --uts: no CAP_SYS_ADMIN?)"
  cluster_name=$1
  shift
  cluster=/run/shardlm-cluster/$cluster_name
  trap remove_cluster EXIT
  "$src/scripts/cluster/start.sh" --name "$cluster_name" "$@" >/dev/null
}
remove_cluster() {
  for p in "${bg[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  "$src/scripts/cluster/stop.sh" "$cluster_name" >/dev/null || echo "cleanup: stop.sh $cluster_name failed"
}

# Slurm's clients (scontrol, ...) run through this command prefix: empty for a cluster of this
# machine; the emulated cluster's node 1 with its SLURM_CONF otherwise.
slurm_client=()
slurm() { "${slurm_client[@]}" "$@"; }
# job_field JOB FIELD: a field of `scontrol show job` (no accounting daemon here, so no sacct).
job_field() { slurm scontrol show job -o "$1" | grep -oE "(^| )$2=[^ ]*" | cut -d= -f2; }
# wait_done JOB SECONDS: until the job has ended; fails naming its state if it did not end well.
# A requeued job may start only cred_expire + 1 s (121 s by default) after the requeue, so that the
# first run's credentials have expired; on one machine there is nothing to wait for, and a job held
# for that (Reason=BeginTime) is released at once.
wait_done() {
  local state=""
  for _ in $(seq $(($2 * 5))); do
    state=$(job_field "$1" JobState)
    case $state in
      COMPLETED) break ;;
      PENDING) [[ $(job_field "$1" Reason) == BeginTime ]] && slurm scontrol update JobId="$1" StartTime=now ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        tail -n 5 "$work"/*.out; fail "job $1 ended $state, exit code $(job_field "$1" ExitCode)" ;;
    esac
    sleep 0.2
  done
  [[ $state == COMPLETED ]] || fail "job $1 is still $state after $2 s (reason $(job_field "$1" Reason))"
  [[ $(job_field "$1" ExitCode) == 0:0 ]] || fail "job $1 completed with exit code $(job_field "$1" ExitCode)"
}
