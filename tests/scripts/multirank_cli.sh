#!/usr/bin/env bash
# End to end through the command line on several CPU ranks (mpirun --oversubscribe):
#  1. the same global batch trained by 1 process, by 2 ranks (FULL_SHARD, via shardlm launch), by
#     4 ranks in a 2x2 HYBRID_SHARD mesh, and by 2 ranks configured with an accelerate FSDP YAML,
#     gives the same losses for 20 steps (to 1e-4 relative);
#     the 2-rank run prints the pre-flight line (ranks, hosts, all-reduce bandwidth);
#  2. kill -9 of one rank ends the whole job within 30 s, and mpirun names the rank.
# Usage: multirank_cli.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

"$shardlm" init --preset tiny --out "$work/init" --seed 3 >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/init
output_dir: $work/out
data: {train: builtin:addition, digits: 2, train_examples: 4000, eval_examples: 64}
seq_len: 16
micro_batch_size: 16
max_steps: 20
optimizer: {lr: 1e-3}
eval_every: 0
accuracy_examples: 0
progress: none
YAML
# accelerate's FSDP config, as `accelerate config` writes it, plus shardlm's run keys.
cat > "$work/accelerate.yaml" <<YAML
$(cat "$work/run.yaml")
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 2
machine_rank: 0
num_machines: 1
main_training_function: main
rdzv_backend: static
same_network: true
use_cpu: false
downcast_bf16: 'no'
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_forward_prefetch: true
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_use_orig_params: true
mixed_precision: 'no'
YAML

# Global batch 16 rows: 1 x 16, 2 x 8, 4 x 4.
"$shardlm" train --config "$work/run.yaml" output_dir="$work/np1"
"$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" output_dir="$work/np2" micro_batch_size=8 \
  progress=lines log_every=1000 2>"$work/np2.log"
# The pre-flight check's line, before the model is loaded (train/preflight.h).
grep -E "^pre-flight: 2 ranks on 1 host \([^:]+: 0,1\); all-reduce 8 MB in [0-9.]+ ms \([0-9.]+ GB/s\)$" "$work/np2.log" ||
  { echo "FAIL: no pre-flight line"; cat "$work/np2.log"; exit 1; }
"$shardlm" launch --nproc-per-node 4 -- train --config "$work/run.yaml" output_dir="$work/np4" micro_batch_size=4 \
  sharding_strategy=HYBRID_SHARD shard_group_size=2 2>/dev/null
"$shardlm" launch --nproc-per-node 2 -- train --config "$work/accelerate.yaml" output_dir="$work/acc" micro_batch_size=8 \
  2>/dev/null

/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(run):
    return [r["loss"] for r in map(json.loads, open(f"{work}/{run}/metrics.jsonl")) if "loss" in r]
ref = losses("np1")
assert len(ref) == 20, ref
for run in ("np2", "np4", "acc"):
    got = losses(run)
    bad = [(i + 1, a, b) for i, (a, b) in enumerate(zip(got, ref)) if abs(a - b) > 1e-4 * abs(b)]
    assert len(got) == 20 and not bad, f"{run}: losses differ from one process at (step, got, want) {bad[:3]}"
    print(f"{run}: 20 losses equal to one process (last {got[-1]:.6f} vs {ref[-1]:.6f})")
PY

# kill -9 of one rank: the job must end promptly and name the rank.
"$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" output_dir="$work/kill" max_steps=1000000 \
  progress=lines log_every=1000000 > "$work/kill.log" 2>&1 &
launcher=$!
for _ in $(seq 100); do [[ -s "$work/kill/metrics.jsonl" ]] && break; sleep 0.2; done
victim=$(pgrep -f "shardlm train --config $work/run.yaml output_dir=$work/kill" | tail -n 1)
[[ -n "$victim" ]] || { echo "no rank to kill"; exit 1; }
start=$(date +%s)
kill -9 "$victim"
for _ in $(seq 300); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
elapsed=$(( $(date +%s) - start ))
if kill -0 "$launcher" 2>/dev/null; then echo "the job still runs 30 s after kill -9 of one rank"; kill -9 "$launcher"; exit 1; fi
grep -q "process rank [0-9]* .*exited on signal 9" "$work/kill.log" || { echo "the failing rank is not named:"; cat "$work/kill.log"; exit 1; }
echo "kill -9 of one rank ended the job in ${elapsed}s: $(grep -o 'process rank [0-9]* .*exited on signal 9' "$work/kill.log" | head -1)"
echo "multirank CLI checks passed"
