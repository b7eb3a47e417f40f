#!/usr/bin/env bash
# Issue 34's accuracy margin: the demo (configs/demo-addition.yaml, its own 3000 steps) trained with
# AdamW's moments in f32, in bf16 (optimizer_state_dtype: bf16) and in 8 bits (optim: adamw_8bit),
# by bench/optimizer_state.sh, on one OpenMP thread (as fast as two on this tiny model, and no
# spinning against the test running beside it). The stated margin: each low-precision run's
# held-out accuracy is at least f32's minus 0.05 (10 of the 200 problems) and its eval loss at most
# f32's plus 0.05. Measured 2026-11-26 (accuracy / eval loss):
#   one thread, 3000 steps:  f32 0.915 / 0.120, bf16 0.915 / 0.097, 8-bit 0.945 / 0.112
#   two threads, 3000 steps: f32 0.890 / 0.126, bf16 0.915 / 0.078, 8-bit 0.910 / 0.119
# Not 1500 steps: there the demo's sudden drop in loss comes late, and on one thread the 8-bit run
# had not reached it (0.000 / 1.075 against f32's 0.745 / 0.269). Before the embedding's 8-bit moments were
# kept f32, 8-bit reached 0.41 at 1500 steps on two threads (bench/RESULTS.md).
# About 3.5 minutes here (7 to 8 in CI), the suite's longest by far: it runs only when
# SHARDLM_LONG_TESTS=1 is set, and is reported skipped otherwise.
# Usage: [SHARDLM_LONG_TESTS=1] optimizer_state_accuracy.sh SHARDLM WORKDIR
set -euo pipefail
shardlm=$1
work=$2
if [[ ${SHARDLM_LONG_TESTS:-0} != 1 ]]; then
  echo "SKIP: 3000 demo steps three times (about 3.5 minutes), not part of CI's suite: run it with" \
    "SHARDLM_LONG_TESTS=1 ctest -R optimizer_state_accuracy"
  exit 77
fi
out=$(OMP_NUM_THREADS=1 SHARDLM="$shardlm" "$(dirname "$0")/../../bench/optimizer_state.sh" 3000 "$work")
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
