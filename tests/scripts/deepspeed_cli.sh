#!/usr/bin/env bash
# A DeepSpeed config trains what the same run configured with shardlm's own keys trains
# (docs/deepspeed.md): on 2 MPI ranks, a ZeRO stage-3 JSON (HF Trainer's form: "auto" values, tuning
# keys, train_batch_size, an AdamW block and WarmupDecayLR) gives the same per-step losses as
# `sharding_strategy: FULL_SHARD` with the equivalent keys; and accelerate's deepspeed_config
# section does too. Also: the one warning line, and a conflict error naming both files.
# Usage: deepspeed_cli.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

"$shardlm" init --preset tiny --out "$work/init" --seed 5 >/dev/null
cat > "$work/common.yaml" <<YAML
model: $work/init
data: {train: builtin:addition, digits: 2, train_examples: 2000, eval_examples: 32}
seq_len: 16
max_steps: 12
eval_every: 0
accuracy_examples: 0
progress: none
YAML
# shardlm's own keys.
cat > "$work/fsdp.yaml" <<YAML
$(cat "$work/common.yaml")
output_dir: $work/fsdp
sharding_strategy: FULL_SHARD
micro_batch_size: 4
gradient_accumulation_steps: 2
max_grad_norm: 0.5
optimizer: {lr: 2e-3, betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0.01}
lr_scheduler: {type: linear, warmup_steps: 3, total_steps: 12}
YAML
# The same run as a DeepSpeed ZeRO-3 JSON.
cat > "$work/ds.json" <<'JSON'
{
  "bf16": {"enabled": "auto"},
  "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"total_num_steps": "auto", "warmup_min_lr": 0, "warmup_max_lr": "auto",
                           "warmup_num_steps": 3, "warmup_type": "linear"}},
  "zero_optimization": {
    "stage": 3,
    "overlap_comm": true,
    "contiguous_gradients": true,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto",
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "gradient_accumulation_steps": 2,
  "gradient_clipping": 0.5,
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 4,
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
JSON
cat > "$work/ds.yaml" <<YAML
$(cat "$work/common.yaml")
output_dir: $work/ds
deepspeed_config: $work/ds.json
YAML
# accelerate's deepspeed_config section, as \`accelerate config\` writes it.
cat > "$work/acc.yaml" <<YAML
$(cat "$work/common.yaml")
output_dir: $work/acc
micro_batch_size: 4
optimizer: {lr: 2e-3, betas: [0.9, 0.999], eps: 1e-8, weight_decay: 0.01}
lr_scheduler: {type: linear, warmup_steps: 3, total_steps: 12}
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
deepspeed_config:
  gradient_accumulation_steps: 2
  gradient_clipping: 0.5
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero_stage: 3
mixed_precision: 'no'
num_processes: 2
YAML

"$shardlm" launch --nproc-per-node 2 -- train --config "$work/fsdp.yaml" 2>/dev/null
"$shardlm" launch --nproc-per-node 2 -- train --config "$work/ds.yaml" 2> "$work/ds.err"
"$shardlm" launch --nproc-per-node 2 -- train --config "$work/acc.yaml" 2>/dev/null

# One warning line, from rank 0 only, listing the keys without effect.
[[ $(grep -c "warning: $work/ds.json: DeepSpeed keys with no effect in shardlm, ignored: fp16.loss_scale, fp16.initial_scale_power, zero_optimization.overlap_comm" "$work/ds.err") == 1 ]] \
  || { echo "expected one warning line:"; cat "$work/ds.err"; exit 1; }

/usr/bin/python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def losses(run):
    return [r["loss"] for r in map(json.loads, open(f"{work}/{run}/metrics.jsonl")) if "loss" in r]
ref = losses("fsdp")
assert len(ref) == 12, ref
for run in ("ds", "acc"):
    got = losses(run)
    assert got == ref, f"{run}: losses differ from FULL_SHARD's: {got} vs {ref}"
    print(f"{run}: 12 losses identical to sharding_strategy: FULL_SHARD's (last {got[-1]:.6f})")
PY

# train_batch_size must match the world: 16 = 4 x 2 x 2 ranks, not 1 rank.
if "$shardlm" train --config "$work/ds.yaml" output_dir="$work/one" 2> "$work/tbs.err"; then
  echo "train_batch_size 16 on 1 rank was accepted"; exit 1
fi
grep -q "ds.json:19: key 'train_batch_size': 16 is not micro_batch_size 4 x gradient_accumulation_steps 2 x 1 rank = 8" "$work/tbs.err" \
  || { echo "unexpected error:"; cat "$work/tbs.err"; exit 1; }
# A DeepSpeed value against a YAML key: an error naming both.
printf 'micro_batch_size: 2\n' >> "$work/ds.yaml"
if "$shardlm" train --config "$work/ds.yaml" 2> "$work/conflict.err"; then echo "conflict accepted"; exit 1; fi
grep -q "ds.json:20: key 'train_micro_batch_size_per_gpu': 4 (micro_batch_size: 4) disagrees with micro_batch_size: 2 at $work/ds.yaml:" "$work/conflict.err" \
  || { echo "unexpected error:"; cat "$work/conflict.err"; exit 1; }
echo "deepspeed CLI checks passed"
