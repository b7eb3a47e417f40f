#!/usr/bin/env bash
# Dataset mixtures through the command line (docs/data.md "Mixtures"): `data:` as a list of an
# Alpaca source (weight 3) and a chat source (weight 1) on a tiny byte-level model.
#  1. data-preview prints each source's load line and the epoch's draws: 3 : 1 of all the examples.
#  2. A run of 8 steps, and one stopped after 4 (checkpoint) then resumed to 8, give the same losses
#     (the mixture's position is the sampler's state); the resume line prints each source's position.
#  3. A bad source is refused naming its list index.
# Usage: mixture_cli.sh SHARDLM PYTHON WORKDIR
set -euo pipefail
shardlm=$1
py=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
start=$SECONDS
"$shardlm" init --preset tiny --out "$work/base" --set vocab_size=259 >/dev/null
"$py" - "$work" <<'EOF'
import json, sys
w = sys.argv[1]
with open(f"{w}/a.jsonl", "w") as f:
    for i in range(40):
        f.write(json.dumps({"instruction": f"Add {i} and 1", "output": str(i + 1)}) + "\n")
with open(f"{w}/b.jsonl", "w") as f:
    for i in range(120):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"echo {i}"}, {"role": "assistant", "content": str(i)}]}) + "\n")
EOF
cat > "$work/run.yaml" <<YAML
model: $work/base
output_dir: $work/full
seed: 7
data:
  - {train: $work/a.jsonl, weight: 3, eval_fraction: 0}
  - {train: $work/b.jsonl, weight: 1, chat_format: llama2}
seq_len: 256
micro_batch_size: 2
max_steps: 8
optimizer: {lr: 1e-3}
lr_scheduler: {type: constant}
eval_every: 0
eval_batches: 1
progress: none
YAML

"$shardlm" data-preview --config "$work/run.yaml" -n 1 > "$work/preview.txt" || { cat "$work/preview.txt"; fail "data-preview"; }
grep -q "source 1 ($work/a.jsonl)" "$work/preview.txt" || fail "no load line of source 1"
grep -q "source 2 ($work/b.jsonl)" "$work/preview.txt" || fail "no load line of source 2"
line=$(grep "mixture: an epoch of" "$work/preview.txt") || { cat "$work/preview.txt"; fail "no mixture line"; }
echo "$line"
"$py" - "$line" <<'EOF' || fail "the draws are not 3 : 1"
import re, sys
m = re.search(r"an epoch of (\d+) examples: \S+ (\d+) \(.*?\), \S+ (\d+) ", sys.argv[1])
total, a, b = map(int, m.groups())
assert a + b == total and abs(a - 3 * b) <= 2, (a, b)
EOF
grep "mixture: the first" "$work/preview.txt"

"$shardlm" train --config "$work/run.yaml" >/dev/null 2>&1 || fail "the full run"
"$shardlm" train --config "$work/run.yaml" output_dir="$work/half" max_steps=4 save_every=4 >/dev/null 2>&1 || fail "4 steps"
"$shardlm" train --config "$work/run.yaml" output_dir="$work/half" save_every=4 resume_from=auto progress=lines >"$work/resume.log" 2>&1 ||
  { cat "$work/resume.log"; fail "the resumed run"; }
grep "mixture: the sources continue" "$work/resume.log" || fail "no source positions on resume"
"$py" - "$work/full/metrics.jsonl" "$work/half/metrics.jsonl" <<'EOF' || fail "the resumed run's losses differ"
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "grad_norm" in r}
full, half = losses(sys.argv[1]), losses(sys.argv[2])
for s in range(5, 9):
    assert abs(full[s] - half[s]) <= 1e-6 * abs(full[s]), (s, full[s], half[s])
print("steps 5-8 after resuming equal the uninterrupted run's")
EOF
if "$shardlm" train --config "$work/run.yaml" 'data=[{train: a.jsonl, weight: 1}, {train: b.jsonl}]' > "$work/bad.txt" 2>&1; then
  fail "a mixed weight/no-weight list was accepted"
fi
grep -q "key 'data.1.train': either every source has a weight" "$work/bad.txt" || { cat "$work/bad.txt"; fail "bad source message"; }
echo "mixture_cli: all passed in $((SECONDS - start))s"
