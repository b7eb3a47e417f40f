#!/usr/bin/env bash
# Ranks against threads on one machine, side by side in one run (issue 19's table): the same model
# trained by 1 rank x 1 thread, 1 rank x 2 threads and 2 ranks x 1 thread (FULL_SHARD, and the
# variants below), STEPS steps each. Prints each run's steady tokens/s (steps 2..STEPS, from
# metrics.jsonl: the first step's start-up is left out) and the trainer's communication line.
#   bench/rank_scaling.sh [STEPS=5] [WORKDIR=/tmp/shardlm_rank_scaling] [RUNS]
# RUNS (default all) is a comma list of: 1x1, 1x2, fsdp, fsdp-mpi (collectives through MPI:
# SHARDLM_SHM=0), fsdp-nocache (SHARDLM_HOST_CACHE=0), zero2 (SHARD_GRAD_OP), 4x1 (4 ranks x 1
# thread FULL_SHARD; meaningful only with 4 cores).
# Model: Llama 3.2 1B's shape cut to 4 layers (506M parameters, vocab 128256, tied), seq 256, one
# row of 256 tokens per rank per step, f32. Needs ~9 GB of memory (the 1-rank runs' Adam state).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-5}
work=${2:-/tmp/shardlm_rank_scaling}
runs=${3:-1x1,1x2,fsdp,fsdp-mpi,fsdp-nocache,zero2}
shardlm=build/shardlm
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"
[[ -f "$work/model/config.json" ]] ||
  "$shardlm" init --preset llama3.2-1b --out "$work/model" --set num_hidden_layers=4 >/dev/null
# Token ids (uint16, all below the vocabulary), cut into full windows of seq_len + 1: every row 256 tokens.
[[ -f "$work/tokens.bin" ]] ||
  /usr/bin/python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 65536, 1 << 20, dtype=np.uint16).tofile('$work/tokens.bin')"
cat > "$work/run.yaml" <<YAML
model: $work/model
data: {train: $work/tokens.bin, format: tokens, token_bytes: 2}
seq_len: 256
micro_batch_size: 1
max_steps: $steps
eval_every: 0
accuracy_examples: 0
progress: lines
log_every: 1
sharding_strategy: FULL_SHARD
YAML

# steady tokens/s of a finished run: tokens of steps 2..N over their elapsed time.
steady() {
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r and "elapsed_s" in r]
tokens_per_step = int(sys.argv[2])
a, b = recs[0], recs[-1]
print(f"{tokens_per_step * (b['step'] - a['step']) / (b['elapsed_s'] - a['elapsed_s']):.1f} tokens/s "
      f"({(b['elapsed_s'] - a['elapsed_s']) / (b['step'] - a['step']):.2f} s/step)")
PY
}

echo "rank_scaling: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc --all) cores;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC'); $steps steps"
IFS=, read -ra wanted <<<"$runs"
for run in "${wanted[@]}"; do
  out="$work/out_$run"
  rm -rf "$out"
  log="$work/$run.log"
  case $run in
    1x1) np=1; OMP_NUM_THREADS=1 "$shardlm" train --config "$work/run.yaml" output_dir="$out" >"$log" 2>&1 ;;
    1x2) np=1; OMP_NUM_THREADS=2 "$shardlm" train --config "$work/run.yaml" output_dir="$out" >"$log" 2>&1 ;;
    fsdp) np=2; OMP_NUM_THREADS=1 "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" \
      output_dir="$out" >"$log" 2>&1 ;;
    fsdp-mpi) np=2; SHARDLM_SHM=0 OMP_NUM_THREADS=1 "$shardlm" launch --nproc-per-node 2 -- train \
      --config "$work/run.yaml" output_dir="$out" >"$log" 2>&1 ;;
    fsdp-nocache) np=2; SHARDLM_HOST_CACHE=0 OMP_NUM_THREADS=1 "$shardlm" launch --nproc-per-node 2 -- train \
      --config "$work/run.yaml" output_dir="$out" >"$log" 2>&1 ;;
    zero2) np=2; OMP_NUM_THREADS=1 "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" \
      output_dir="$out" sharding_strategy=SHARD_GRAD_OP >"$log" 2>&1 ;;
    4x1) np=4; OMP_NUM_THREADS=1 "$shardlm" launch --nproc-per-node 4 -- train --config "$work/run.yaml" \
      output_dir="$out" >"$log" 2>&1 ;;
    *) echo "rank_scaling: unknown run '$run'" >&2; exit 2 ;;
  esac
  echo "$run ($np rank(s)): $(steady "$out/metrics.jsonl" $((256 * np))); $(grep '^communication:' "$log" || echo 'no communication')"
done
