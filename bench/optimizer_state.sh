#!/usr/bin/env bash
# What the optimizer-state levers cost (issue 34): the demo (configs/demo-addition.yaml, a 0.16M-
# parameter Llama learning 3-digit addition) trained with AdamW's moments in f32, in bf16
# (optimizer_state_dtype: bf16) and in 8 bits (optim: adamw_8bit), the same seed and data, one
# after another: held-out accuracy and loss at the end, tokens/s, and the optimizer's tracked
# peak bytes (master excluded: it stays f32).
#   bench/optimizer_state.sh [STEPS=3000] [WORKDIR=/tmp/shardlm_optimizer_state]
# SHARDLM names the binary (default build/shardlm). tests/scripts/optimizer_state_accuracy.sh runs
# this script and checks the accuracy margins it prints.
set -euo pipefail
shardlm=$(realpath "${SHARDLM:-$(dirname "$0")/../build/shardlm}")
cd "$(dirname "$0")/.."
steps=${1:-3000}
work=${2:-/tmp/shardlm_optimizer_state}
rm -rf "$work" && mkdir -p "$work"
"$shardlm" init --preset tiny --out "$work/init" --seed 0 >/dev/null
echo "optimizer_state: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC'); demo-addition, $steps steps"
for variant in "f32" "bf16 optimizer_state_dtype=bf16" "8bit optim=adamw_8bit"; do
  read -r name overrides <<<"$variant"
  "$shardlm" train --config configs/demo-addition.yaml model="$work/init" output_dir="$work/$name" \
    max_steps="$steps" eval_every="$steps" progress=none $overrides >/dev/null
  /usr/bin/python3 - "$work/$name/metrics.jsonl" "$name" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ev = [r for r in rows if "eval_loss" in r][-1]
steps = [r for r in rows if "loss" in r and "tokens_per_s" in r]
acc = next((v for k, v in ev.items() if "accuracy" in k), float("nan"))
tps = sum(r["tokens_per_s"] for r in steps[len(steps) // 2:]) / max(1, len(steps) - len(steps) // 2)
peak_opt = max(r.get("mem_peak_optimizer", 0) for r in rows)
print(f"{sys.argv[2]:5s} accuracy {acc:.3f}  eval loss {ev['eval_loss']:.4f}  {tps:8.0f} tok/s (2nd half)  "
      f"optimizer peak {peak_opt / 1024:.0f} KiB")
PY
done
