#!/usr/bin/env bash
# Communication overlap on CPU ranks, side by side in one run: a FULL_SHARD training run with the
# MPI progress thread (collectives move while the next unit computes) and without it
# (SHARDLM_PROGRESS_THREAD=0: they move only inside the waits), alternating, ROUNDS rounds. Prints
# each run's final tokens/s and the trainer's "communication: ... hidden behind compute" line; the
# runs write Chrome traces of steps 3-4 (WORKDIR/out_t1/trace/rank*.json with the thread, out_t0 without).
#   bench/overlap.sh [NP=2] [ROUNDS=2] [WORKDIR=/tmp/shardlm_overlap]
# Model: Llama 3.2 1B's shape cut to 4 layers of hidden 1024 (MLP 4096, 16 heads, 4 KV heads),
# vocab 32000, untied: 126M parameters; seq 256, 2 rows per rank, 1 OpenMP thread per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
rounds=${2:-2}
work=${3:-/tmp/shardlm_overlap}
shardlm=build/shardlm
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
rm -rf "$work" && mkdir -p "$work"
"$shardlm" init --preset llama3.2-1b --out "$work/model" --set num_hidden_layers=4 --set hidden_size=1024 \
  --set intermediate_size=4096 --set num_attention_heads=16 --set num_key_value_heads=4 \
  --set tie_word_embeddings=false --set bos_token_id=1 --set eos_token_id=2 --set vocab_size=32000 >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/model
data: {train: builtin:addition, digits: 3, train_examples: 4000, eval_examples: 32}
seq_len: 256
micro_batch_size: 2
max_steps: 4
eval_every: 0
accuracy_examples: 0
progress: lines
log_every: 1
sharding_strategy: FULL_SHARD
profile_steps: [3, 4]
YAML
echo "overlap: $np ranks x 1 thread, FULL_SHARD, $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
for round in $(seq "$rounds"); do
  for thread in 1 0; do
    log="$work/r${round}_t${thread}.log"
    SHARDLM_PROGRESS_THREAD=$thread "$shardlm" launch --nproc-per-node "$np" -- train --config "$work/run.yaml" \
      output_dir="$work/out_t$thread" >"$log" 2>&1
    tps=$(grep -E "^step 4/4" "$log" | sed -E 's/.*\| ([0-9.]+) tok\/s.*/\1/')
    echo "round $round, progress thread $([[ $thread == 1 ]] && echo on || echo off): $tps tokens/s; $(grep '^communication:' "$log")"
  done
done
