#!/usr/bin/env bash
# bf16 training on the CPU (ops/cpu_bf16.h: bf16 matmuls through oneDNN) against f32, against
# the bf16 dtype on the f32 fallback (SHARDLM_CPU_BF16=0: bf16 operands widened for OpenBLAS), and
# against PyTorch's CPU bf16 autocast and f32, on the same model, batch, sequence and threads, in
# one run, alternating them. First the matmul rates at training shapes (bench_ops --bf16).
#   bench/cpu_bf16.sh [THREADS] [ROUNDS]        the 19M model of bench/compare_torch.sh
#   MODEL=506m bench/cpu_bf16.sh [THREADS] [ROUNDS]   Llama 3.2 1B's shape cut to 4 layers (506M,
#                                                     tied; bench/rank_scaling.sh), seq 256, batch 1
# Needs build/bench/bench_train and build/bench/bench_ops. Prints one JSON line per run, then a table:
# tokens/s per side and round, and bf16's ratios against f32 and against PyTorch's bf16 autocast.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
rounds=${2:-1}
case "${MODEL:-19m}" in
  19m)
    shape=(--dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 688 --vocab 32000 --seq 256 --batch 8 --steps 10 --warmup 2)
    torch_shape=("${shape[@]}");;
  506m)
    shape=(--preset llama3.2-1b --layers 4 --seq 256 --batch 1 --steps 4 --warmup 1)
    torch_shape=(--dim 2048 --layers 4 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --tie --seq 256 --batch 1
                 --steps 4 --warmup 1);;
  *) echo "cpu_bf16.sh: MODEL must be 19m or 506m, got '${MODEL}'" >&2; exit 2;;
esac
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; threads $threads; $(date -u +%F)"
echo "cpu bf16: $(build/shardlm env | sed -n 's/^cpu bf16: //p')"
echo "model: ${MODEL:-19m}: ${shape[*]}"
OMP_NUM_THREADS=$threads build/bench/bench_ops --bf16
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for r in $(seq "$rounds"); do
  {
    OMP_NUM_THREADS=$threads build/bench/bench_train "${shape[@]}" --dtype f32 | sed 's/"impl": "shardlm"/"impl": "shardlm f32"/'
    OMP_NUM_THREADS=$threads build/bench/bench_train "${shape[@]}" --dtype bf16 | sed 's/"impl": "shardlm"/"impl": "shardlm bf16"/'
    SHARDLM_CPU_BF16=0 OMP_NUM_THREADS=$threads build/bench/bench_train "${shape[@]}" --dtype bf16 |
      sed 's/"impl": "shardlm"/"impl": "shardlm bf16 (fallback)"/'
    /usr/bin/python3 bench/torch_train_bench.py "${torch_shape[@]}" --threads "$threads" |
      sed 's/^{/{"impl": "pytorch f32", /'
    /usr/bin/python3 bench/torch_train_bench.py "${torch_shape[@]}" --threads "$threads" --autocast bf16 |
      sed 's/^{/{"impl": "pytorch bf16 autocast", /'
  } | sed "s/^{/{\"round\": $r, /" | tee -a "$log"
done
/usr/bin/python3 - "$log" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in sorted({x["round"] for x in rows}):
    tps = {x["impl"]: x["tokens_per_s"] for x in rows if x["round"] == r}
    for impl, v in tps.items():
        print(f"round {r}: {impl:<26} {v:9.1f} tokens/s")
    bf = tps["shardlm bf16"]
    print(f"round {r}: shardlm bf16 / shardlm f32 = {bf / tps['shardlm f32']:.2f}x, "
          f"/ its f32 fallback = {bf / tps['shardlm bf16 (fallback)']:.2f}x, "
          f"/ pytorch bf16 autocast = {bf / tps['pytorch bf16 autocast']:.2f}x, "
          f"/ pytorch f32 = {bf / tps['pytorch f32']:.2f}x")
PY
