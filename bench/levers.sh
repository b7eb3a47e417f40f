#!/usr/bin/env bash
# Issue 34's lever benchmark: full fine-tuning of the Llama-3.2-1B shape with each memory lever on
# its own, side by side, one run.
#  1. Measured (bench_train: the engine and model at world size 1, random tokens): tracked peak
#     bytes per category and tokens/s. The shape is Llama-3.2-1B's with LAYERS decoder layers
#     (default 4 of its 16), so that f32 training fits a 24 GiB machine and a step takes seconds.
#  2. Estimated (shardlm estimate-memory, the engine's dry run, which the memory tests hold equal
#     to the tracker): the whole 16-layer model, each lever, peak per rank, at torchtune's setting
#     for its published table (micro-batch 2 x 2048 tokens; EST_BATCH, EST_SEQ change it).
#   bench/levers.sh [LAYERS=4] [SEQ=512] [BATCH=1] [STEPS=2]   (MEASURE=0: the estimates only)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-4}
seq=${2:-512}
batch=${3:-1}
steps=${4:-2}
echo "levers: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
variants=(
  "f32|"
  "optimizer_state_dtype_bf16|--state-dtype bf16"
  "adamw_8bit|--state-dtype 8bit"
  "compute_dtype_bf16|--dtype bf16"
  "activation_checkpointing|--ckpt 1"
  "ckpt+offload_activations|--ckpt 1 --offload-activations 1"
)
[[ ${MEASURE:-1} == 0 ]] && variants=()
echo "measured: llama3.2-1b shape, $layers layers, micro-batch $batch x $seq tokens, $steps steps after 1 warm-up"
printf '  %-26s %9s %10s %10s %10s %10s %10s %10s %10s\n' lever tok/s parameters gradients optimizer activations act_offl workspace total
for v in "${variants[@]+"${variants[@]}"}"; do
  name=${v%%|*}
  flags=${v#*|}
  # shellcheck disable=SC2086
  json=$(build/bench/bench_train --preset llama3.2-1b --layers "$layers" --seq "$seq" --batch "$batch" \
    --steps "$steps" --warmup 1 $flags)
  /usr/bin/python3 - "$name" "$json" <<'PY'
import json, sys
r = json.loads(sys.argv[2])
p = r["peak_by_category"]
cells = [f"{p[k] / 2**30:.2f}G" for k in
         ("parameters", "gradients", "optimizer", "activations", "act_offloaded", "workspace")]
cells.append(f"{r['peak_tracked_bytes'] / 2**30:.2f}G")
print(f"  {sys.argv[1]:26s} {r['tokens_per_s']:9.1f} " + " ".join(f"{c:>10}" for c in cells))
PY
done
est_batch=${EST_BATCH:-2}
est_seq=${EST_SEQ:-2048}
echo "estimated: llama3.2-1b (16 layers), micro-batch $est_batch x $est_seq tokens, one rank, peak per rank"
for v in "f32|" "optimizer_state_dtype_bf16|--optimizer-state-dtype bf16" "adamw_8bit|--optimizer-state-dtype 8bit" \
         "compute_dtype_bf16|--param-dtype bf16" "activation_checkpointing|--activation-checkpointing true" \
         "ckpt+offload_activations|--activation-checkpointing true --offload-activations"; do
  name=${v%%|*}
  flags=${v#*|}
  # shellcheck disable=SC2086
  out=$(build/shardlm estimate-memory --model llama3.2-1b --micro-batch-size "$est_batch" --seq-len "$est_seq" $flags)
  row() { grep "$1" <<<"$out" | head -1 | awk '{print $(NF-1), $NF}'; }
  total=$(row 'total (peak of the sum)')
  device=$(row 'of which device memory' || true)
  host=$(row 'of which host memory' || true)
  printf '  %-26s device %12s   activations %12s%s\n' "$name" "${device:-$total}" \
    "$(grep -E '^  activations +[0-9]' <<<"$out" | awk '{print $2, $3}')" "${host:+   host $host}"
done
