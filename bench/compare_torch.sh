#!/usr/bin/env bash
# Training throughput of shardlm against PyTorch (Debian's python3-torch, eager, CPU) on the same
# Llama shape, batch, sequence length and thread count, in one run, alternating the two.
#   bench/compare_torch.sh [THREADS] [ROUNDS]
# BASELINE=path/to/bench_train (a build of another commit) adds that binary to every round, for
# before/after comparisons in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
rounds=${2:-2}
shape=(--dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 688 --vocab 32000 --seq 256 --batch 8 --steps 10 --warmup 2)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; threads $threads; $(date -u +%F)"
echo "model: ${shape[*]}"
for r in $(seq "$rounds"); do
  OMP_NUM_THREADS=$threads build/bench/bench_train "${shape[@]}"
  if [[ -n "${BASELINE:-}" ]]; then
    OMP_NUM_THREADS=$threads "$BASELINE" "${shape[@]}" | sed 's/"impl": "shardlm"/"impl": "shardlm (baseline)"/'
  fi
  /usr/bin/python3 bench/torch_train_bench.py "${shape[@]}" --threads "$threads"
done
