#!/usr/bin/env bash
# How long a checkpoint holds training up, synchronous against async_checkpoint, in one run.
#
#   bench/checkpoint_stall.sh [SHARDLM] [WORKDIR]
#   env: NP (2), HIDDEN LAYERS FFN (384 6 1024: 32.3M parameters, a 388 MB checkpoint), STEPS (16),
#        SAVE_EVERY (4), SEQ_LEN (128), MICRO_BATCH (2), ROUNDS (2: sync and async alternate)
#
# Each run trains STEPS steps on NP FULL_SHARD ranks with a checkpoint every SAVE_EVERY steps
# (keep_last_n 1). The stall per save is the trainer's own checkpoint_blocked_seconds: the time the
# training loop was held — for a sync save the whole save; for an async one the staging copy plus,
# at the next save or the end, the wait for the background write and the completion (metadata.json,
# COMPLETE). Also: the time from the start of the loop to the end of the last step (every save's
# stall but the last one's completion; metrics.jsonl's elapsed_s) and the rank's write time per save.
set -euo pipefail
shardlm=$(realpath "${1:-build/shardlm}")
work=${2:-/tmp/shardlm-bench-ckpt-stall}
np=${NP:-2} hidden=${HIDDEN:-384} layers=${LAYERS:-6} ffn=${FFN:-1024} steps=${STEPS:-16} every=${SAVE_EVERY:-4}
seq=${SEQ_LEN:-128} mb=${MICRO_BATCH:-2} rounds=${ROUNDS:-2}
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

model="$work/model"
"$shardlm" init --preset tiny --out "$model" --set hidden_size="$hidden" --set num_hidden_layers="$layers" \
  --set intermediate_size="$ffn" --set num_attention_heads=$((hidden / 64)) --set num_key_value_heads=$((hidden / 128)) \
  --set vocab_size=32000 > /dev/null
cat > "$work/run.yaml" <<YAML
model: $model
data: {train: builtin:addition, digits: 2, train_examples: 4000, eval_examples: 16}
seq_len: $seq
micro_batch_size: $mb
max_steps: $steps
save_every: $every
keep_last_n: 1
eval_every: 0
eval_batches: 1
accuracy_examples: 0
progress: lines
log_every: 1
sharding_strategy: FULL_SHARD
YAML

printf '| round | mode | saves | stall per save (s) | mean stall (s) | write per rank (s) | steps 1..last (s) |\n'
printf '|---|---|---|---|---|---|---|\n'
for round in $(seq "$rounds"); do
  for mode in sync async; do
    out="$work/$mode-$round"
    "$shardlm" launch --nproc-per-node "$np" -- train --config "$work/run.yaml" output_dir="$out" \
      async_checkpoint=$([[ $mode == async ]] && echo true || echo false) > "$out.log" 2>&1
    /usr/bin/python3 - "$out" "$round" "$mode" <<'PY'
import json, re, sys
out, rnd, mode = sys.argv[1:]
allrecs = list(map(json.loads, open(f"{out}/metrics.jsonl")))
recs = [r for r in allrecs if "checkpoint" in r]
elapsed = [r["elapsed_s"] for r in allrecs if "elapsed_s" in r][-1]
log = open(f"{out}.log").read()
writes = [float(x) for x in re.findall(r"MB from each rank in ([0-9.]+)s", log)]
stalls = [r["checkpoint_blocked_seconds"] for r in recs]
print(f"| {rnd} | {mode} | {len(recs)} | {', '.join(f'{s:.2f}' for s in stalls)} | {sum(stalls) / len(stalls):.2f} | "
      f"{', '.join(f'{w:.2f}' for w in writes)} | {elapsed:.1f} |")
PY
  done
done
du -sh "$work/sync-1/checkpoints/"step_* | tail -1
