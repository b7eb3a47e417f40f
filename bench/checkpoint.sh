#!/usr/bin/env bash
# Checkpoint I/O: save and load throughput per rank, and convert's peak memory against model size.
#
#   bench/checkpoint.sh [SHARDLM] [WORKDIR]
#
# For each model size: one training step that writes a checkpoint (save MB/s per rank, from the
# trainer's own report), a resume from it on the same ranks (load MB/s per rank), then
# `shardlm convert` of it to f32, its peak RSS measured from outside (getrusage of the child).
# Ranks run on this machine (mpirun --oversubscribe); the page cache is warm after the save, so load
# figures are memory-speed reads of mapped files, not disk reads.
set -euo pipefail
shardlm=${1:-build/shardlm}
work=${2:-/tmp/shardlm-bench-checkpoint}
shardlm=$(realpath "$shardlm")
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cat > "$work/run.yaml" <<YAML
output_dir: $work/out
data: {train: builtin:addition, digits: 2, train_examples: 2000, eval_examples: 16}
seq_len: 16
micro_batch_size: 2
max_steps: 1
eval_every: 0
eval_batches: 1
accuracy_examples: 0
progress: lines
save_every: 1
YAML

printf '| model | params | f32 weights | ranks | strategy | checkpoint | save MB/s per rank | load MB/s per rank | convert peak RSS |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for spec in "384 6 1024" "768 8 2048" "1024 12 2816"; do
  read -r hidden layers ffn <<< "$spec"
  model="$work/m$hidden"
  "$shardlm" init --preset tiny --out "$model" --set hidden_size="$hidden" --set num_hidden_layers="$layers" \
    --set intermediate_size="$ffn" --set num_attention_heads=$((hidden / 64)) --set num_key_value_heads=$((hidden / 128)) \
    --set vocab_size=32000 > /dev/null
  params=$(/usr/bin/python3 -c "import json,struct,sys; f=open('$model/model.safetensors','rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n)); h.pop('__metadata__',None); import math; print(sum(math.prod(t['shape']) for t in h.values()))")
  for setup in "1 FULL_SHARD" "2 FULL_SHARD" "2 NO_SHARD"; do
    read -r np strategy <<< "$setup"
    out="$work/run-$hidden-$np-$strategy"
    "$shardlm" launch --nproc-per-node "$np" -- train --config "$work/run.yaml" model="$model" output_dir="$out" \
      sharding_strategy="$strategy" micro_batch_size=$((2 / np)) > "$out.save.log" 2>&1
    save=$(grep -o '([0-9]* MB/s per rank)' "$out.save.log" | head -1 | tr -dc '0-9')
    ckpt_mb=$(du -sm "$out/checkpoints/step_00000001" | cut -f1)
    "$shardlm" launch --nproc-per-node "$np" -- train --config "$work/run.yaml" model="$model" output_dir="$out" \
      sharding_strategy="$strategy" micro_batch_size=$((2 / np)) resume_from="$out/checkpoints/step_00000001" \
      max_steps=2 save_every=0 > "$out.load.log" 2>&1
    load=$(grep -o '([0-9]* MB/s per rank)' "$out.load.log" | head -1 | tr -dc '0-9')
    rss=$(/usr/bin/python3 - "$shardlm" "$out/checkpoints/step_00000001" "$out/conv" <<'PY'
import resource, subprocess, sys
subprocess.run([sys.argv[1], "convert", sys.argv[2], "--out", sys.argv[3], "--dtype", "f32"], check=True,
               stdout=subprocess.DEVNULL)
print(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.1f} MiB")
PY
)
    printf '| h%s L%s | %.1fM | %.0f MB | %s | %s | %s MB | %s | %s | %s |\n' "$hidden" "$layers" \
      "$(echo "$params / 1000000" | bc -l)" "$(echo "$params * 4 / 1000000" | bc -l)" "$np" "$strategy" "$ckpt_mb" \
      "$save" "$load" "$rss"
  done
done
