#!/usr/bin/env bash
# Training throughput of shardlm against PyTorch (Debian's python3-torch, eager, CPU) on the same
# Llama shape, batch, sequence length and thread count, in one run, alternating the two, with the
# machine's raw sgemm rate (bench_ops --sgemm, 2048^3) measured in every round beside them.
#   bench/compare_torch.sh [THREADS] [ROUNDS]
# BASELINE=path/to/bench_train (a build of another commit) adds that binary to every round, for
# before/after comparisons in the same run.
#
# The last lines give each side's model FLOP rate as a share of that round's sgemm rate: 6 FLOPs
# per non-embedding parameter per token (the lm_head counts, the input embedding does not), the
# measure issue 19's "≥ 70% of the machine's sgemm rate" uses.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
rounds=${2:-2}
shape=(--dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 688 --vocab 32000 --seq 256 --batch 8 --steps 10 --warmup 2)
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; threads $threads; $(date -u +%F)"
echo "model: ${shape[*]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for r in $(seq "$rounds"); do
  {
    OMP_NUM_THREADS=$threads build/bench/bench_ops --sgemm
    OMP_NUM_THREADS=$threads build/bench/bench_train "${shape[@]}"
    if [[ -n "${BASELINE:-}" ]]; then
      OMP_NUM_THREADS=$threads "$BASELINE" "${shape[@]}" | sed 's/"impl": "shardlm"/"impl": "shardlm (baseline)"/'
    fi
    /usr/bin/python3 bench/torch_train_bench.py "${shape[@]}" --threads "$threads"
  } | sed "s/^{/{\"round\": $r, /" | tee -a "$log"
done
/usr/bin/python3 - "$log" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
# The same model on both sides: bench_train's count of its non-embedding parameters serves both.
nonembedding = next(x["nonembedding_params"] for x in rows if x.get("impl") == "shardlm")
print(f"non-embedding parameters: {nonembedding}; model FLOPs per token: {6 * nonembedding}")
for r in sorted({x["round"] for x in rows}):
    rnd = [x for x in rows if x["round"] == r]
    sgemm = next(x["gflops"] for x in rnd if x.get("impl") == "sgemm")
    for x in rnd:
        if "tokens_per_s" not in x:
            continue
        gf = 6 * nonembedding * x["tokens_per_s"] * 1e-9
        print(f"round {r}: {x.get('impl', 'pytorch'):<20} {x['tokens_per_s']:8.1f} tokens/s  {gf:6.1f} GFLOP/s"
              f"  = {100 * gf / sgemm:5.1f}% of sgemm ({sgemm:.1f} GFLOP/s)")
PY
