#!/usr/bin/env bash
# Issue 34's accuracy margin: the demo (configs/demo-addition.yaml, cut to 1500 steps to keep CI
# short; its schedule follows max_steps) trained with
# AdamW's moments in f32, in bf16 (optimizer_state_dtype: bf16) and in 8 bits (optim: adamw_8bit),
# by bench/optimizer_state.sh. The stated margin: each low-precision run's held-out accuracy is at
# least f32's minus 0.05 (10 of the 200 problems) and its eval loss at most f32's plus 0.05.
# (Measured 2026-11-26, 2 cores, 1500 steps: f32 0.685 / 0.252, bf16 0.840 / 0.169, 8-bit 0.875 /
# 0.144; at 3000: 0.890 / 0.126, 0.915 / 0.078, 0.910 / 0.119. Before the embedding's 8-bit moments
# were kept f32 the 8-bit run reached 0.41, and 0.045 after the code-search change: bench/RESULTS.md.)
# Usage: optimizer_state_accuracy.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
out=$(SHARDLM="$shardlm" "$(dirname "$0")/../../bench/optimizer_state.sh" 1500 "$work")
echo "$out"
/usr/bin/python3 - "$out" <<'PY'
import re, sys
runs = {m[0]: (float(m[1]), float(m[2]))
        for m in re.findall(r"^(\w+)\s+accuracy ([\d.]+)\s+eval loss ([\d.]+)", sys.argv[1], re.M)}
assert set(runs) == {"f32", "bf16", "8bit"}, f"runs missing from the bench's output: {sorted(runs)}"
acc32, loss32 = runs["f32"]
bad = [f"{name}: accuracy {acc:.3f} (f32 {acc32:.3f}), eval loss {loss:.4f} (f32 {loss32:.4f})"
       for name, (acc, loss) in runs.items() if acc < acc32 - 0.05 or loss > loss32 + 0.05]
if bad:
    sys.exit("outside the margin: " + "; ".join(bad))
print("within the margin of f32: accuracy -0.05, eval loss +0.05")
PY
rm -rf "$work"
