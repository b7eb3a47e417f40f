#!/usr/bin/env bash
# Full fine-tuning vs LoRA (r 8 and r 64, every Linear layer) vs QLoRA (r 8, NF4 base with double
# quantization), side by side: tokens/s and tracked peak memory per category of bench_train, in
# alternating rounds, on the 19.3M-parameter CPU benchmark model and on a ~106M one.
# Usage: bench/lora.sh [THREADS] [ROUNDS]   (from the repository root, after scripts/build.sh
#        -DSHARDLM_BUILD_BENCH=ON); prints one JSON line per run.
set -euo pipefail
threads=${1:-2}
rounds=${2:-2}
bin=build/bench/bench_train
export OMP_NUM_THREADS=$threads
small=(--dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 688 --vocab 32000 --seq 256 --batch 8 --steps 6 --warmup 2)
large=(--dim 768 --layers 8 --heads 12 --kv-heads 4 --ffn 2048 --vocab 32000 --seq 256 --batch 4 --steps 3 --warmup 1)
for shape in small large; do
  declare -n args=$shape
  for r in $(seq "$rounds"); do
    for mode in "" "--lora-rank 8" "--lora-rank 64" "--lora-rank 8 --qlora 1"; do
      # shellcheck disable=SC2086
      echo "{\"shape\": \"$shape\", \"round\": $r, \"run\": $("$bin" "${args[@]}" $mode)}"
    done
  done
done
