#!/usr/bin/env bash
# DPO through the command line (issue 31; docs/preference.md), on a tiny random Llama whose model
# directory has no tokenizer (vocab 259: the byte-level fallback, which the PyTorch reference
# reproduces in a line), with preference pairs made here in TRL's standard format.
#  A. Full fine-tunes against tests/torch_ref/dpo_reference.py (the paper's and TRL's formulas, a
#     frozen copy as reference): sigmoid with label smoothing, ipo and hinge, 5 steps over 6 pairs:
#     each step's loss, gradient norm and rewards/margins, the final weights, the final eval record.
#  B. LoRA: the reference is the base with the adapters off; the final eval record equals the
#     reference's DPO of base + the written adapter against the base.
#  C. 1 process (accumulation 2), 2 ranks (FULL_SHARD, activation checkpointing) and 4 ranks
#     (HYBRID_SHARD) give the same step losses and rewards (1e-6 relative); so do QLoRA with DoRA
#     (QDoRA) in 1 process and on 2 SHARD_GRAD_OP ranks.
#  D. End to end: on held-out pairs (chosen answers end with "!", rejected with "."), the reward
#     margin and the preference accuracy rise.
#  E. Refusals, one line each and a non-zero exit: dpo: on SFT data; preference data without dpo:;
#     packing: true; dpo.reference_model under LoRA; an unknown dpo: key.
# Usage: dpo_cli.sh SHARDLM PYTHON SOURCE_DIR WORKDIR
set -euo pipefail
shardlm=$1
py=$2
src=$3
work=$4
ref="$src/tests/torch_ref/dpo_reference.py"
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
start=$SECONDS

base="$work/base"
"$shardlm" init --preset tiny --out "$base" --set vocab_size=259 --set initializer_range=0.1 --dtype f32 >/dev/null
"$py" - "$work" <<'EOF'
import json, random, sys
work = sys.argv[1]
words = "apple river stone cloud green music paper light horse table window dream silver forest candle".split()
r = random.Random(3)
with open(f"{work}/pairs.jsonl", "w") as f:  # A-C: six pairs, every step sees them all
    for i in range(6):
        body = " ".join(r.sample(words, 2))
        f.write(json.dumps({"prompt": f"Say {r.choice(words)}:", "chosen": f" {body}!", "rejected": f" {r.choice(words)}."}) + "\n")
with open(f"{work}/bang.jsonl", "w") as f:  # D: the same words either way; chosen ends with "!"
    for i in range(240):
        body = " ".join(r.sample(words, 3))
        f.write(json.dumps({"prompt": f"Describe {r.choice(words)}:", "chosen": f" {body}!", "rejected": f" {body}."}) + "\n")
with open(f"{work}/sft.jsonl", "w") as f:
    f.write(json.dumps({"instruction": "Say hi", "output": "hi"}) + "\n")
EOF
cat > "$work/run.yaml" <<YAML
model: $base
output_dir: $work/full
seed: 1
data: {train: $work/pairs.jsonl, eval: $work/pairs.jsonl}
seq_len: 64
micro_batch_size: 6
max_steps: 5
optimizer: {lr: 1e-3}
lr_scheduler: {type: constant}
eval_every: 0
progress: none
save_dtype: f32
dpo: {beta: 0.1}
YAML

echo "== A: full fine-tunes against the PyTorch reference"
for case in "sigmoid 0.1" "ipo 0" "hinge 0"; do
  set -- $case
  rm -rf "$work/full"
  "$shardlm" train --config "$work/run.yaml" dpo.loss_type=$1 dpo.label_smoothing=$2 >/dev/null 2>"$work/a.log" ||
    { cat "$work/a.log"; fail "A: $1 did not train"; }
  "$py" "$ref" full "$base" "$work/pairs.jsonl" "$work/full" --loss $1 --label-smoothing $2 --beta 0.1 --lr 1e-3 \
    --steps 5 > "$work/a_$1.txt" || { cat "$work/a_$1.txt"; fail "A: $1 differs from the reference"; }
  tail -1 "$work/a_$1.txt"
done

echo "== B: LoRA, the reference being the base with the adapters off"
"$shardlm" train --config "$work/run.yaml" output_dir="$work/lora" optimizer.lr=1e-2 lora.rank=4 lora.alpha=8 \
  >/dev/null 2>"$work/b.log" || { cat "$work/b.log"; fail "B: LoRA did not train"; }
"$py" "$ref" lora "$base" "$work/pairs.jsonl" "$work/lora" --beta 0.1 > "$work/b.txt" ||
  { cat "$work/b.txt"; fail "B: the LoRA run's DPO differs from the reference's"; }
tail -1 "$work/b.txt"

echo "== C: 1, 2 and 4 ranks"
common=(--config "$work/run.yaml" data.train="$work/bang.jsonl" data.eval= data.eval_fraction=0.1 max_steps=4)
"$shardlm" train "${common[@]}" output_dir="$work/r1" micro_batch_size=4 gradient_accumulation_steps=2 >/dev/null 2>&1 ||
  fail "C: 1 process"
"$shardlm" launch --nproc-per-node 2 -- train "${common[@]}" output_dir="$work/r2" micro_batch_size=4 \
  sharding_strategy=FULL_SHARD activation_checkpointing=true >/dev/null 2>&1 || fail "C: 2 ranks"
"$shardlm" launch --nproc-per-node 4 -- train "${common[@]}" output_dir="$work/r4" micro_batch_size=2 \
  sharding_strategy=HYBRID_SHARD >/dev/null 2>&1 || fail "C: 4 ranks"
# QLoRA with DoRA's magnitudes (QDoRA): its reference is the NF4 base with the adapters off.
qdora=(lora.rank=4 lora.alpha=8 lora.quantize_base=nf4 lora.use_dora=true "optimizer={lr: 1e-2}")
"$shardlm" train "${common[@]}" output_dir="$work/q1" micro_batch_size=4 gradient_accumulation_steps=2 \
  "${qdora[@]}" >/dev/null 2>&1 || fail "C: QDoRA, 1 process"
"$shardlm" launch --nproc-per-node 2 -- train "${common[@]}" output_dir="$work/q2" micro_batch_size=4 \
  sharding_strategy=SHARD_GRAD_OP "${qdora[@]}" >/dev/null 2>&1 || fail "C: QDoRA, 2 ranks"
"$py" - "$work" <<'EOF' || fail "C: the ranks disagree"
import json, sys
def steps(d):
    return [r for r in map(json.loads, open(f"{sys.argv[1]}/{d}/metrics.jsonl")) if "grad_norm" in r]
for base, others in (("r1", ("r2", "r4")), ("q1", ("q2",))):
  one = steps(base)
  assert one[-1]["loss"] < one[0]["loss"], f"{base}: the loss did not fall"
  for d in others:
    for a, b in zip(one, steps(d)):
        for k in ("loss", "grad_norm", "rewards/margins", "rewards/chosen"):
            # A reward is beta (log-prob - reference log-prob): its rounding error follows beta x
            # the log-probs (about 12 here), not the reward (0.4), which the difference cancels.
            scale = max(abs(a[k]), 0.1 * abs(a["logps/chosen"])) if k.startswith("rewards/") else abs(a[k])
            if abs(a[k] - b[k]) > 1e-6 * max(scale, 1e-3):
                sys.exit(f"{d} step {a['step']} {k}: {b[k]} vs one process {a[k]}")
  print(f"ranks: {base} and {', '.join(others)}: 4 steps equal (loss {one[0]['loss']:.6f} -> {one[-1]['loss']:.6f})")
EOF

echo "== D: held-out reward margin and accuracy rise"
"$shardlm" train --config "$work/run.yaml" data.train="$work/bang.jsonl" data.eval= data.eval_fraction=0.1 \
  output_dir="$work/e2e" micro_batch_size=8 max_steps=12 eval_batches=8 >/dev/null 2>&1 || fail "D: did not train"
"$py" - "$work/e2e/metrics.jsonl" <<'EOF' || fail "D: held-out preference did not improve"
import json, sys
ev = [r for r in map(json.loads, open(sys.argv[1])) if "eval_loss" in r]
a, b = ev[0], ev[-1]
print(f"held-out: margin {a['eval_rewards/margins']:.4f} -> {b['eval_rewards/margins']:.4f}, accuracy "
      f"{a['eval_rewards/accuracies']:.3f} -> {b['eval_rewards/accuracies']:.3f}, loss {a['eval_loss']:.4f} -> {b['eval_loss']:.4f}")
assert b["eval_rewards/margins"] > a["eval_rewards/margins"] + 0.1
assert b["eval_rewards/accuracies"] >= 0.9 > a["eval_rewards/accuracies"]
assert b["eval_loss"] < a["eval_loss"]
EOF

echo "== E: refusals"
refuse() {  # refuse WHAT PATTERN ARGS...: one line naming PATTERN, non-zero exit
  local what=$1 pattern=$2
  shift 2
  if "$shardlm" train --config "$work/run.yaml" output_dir="$work/bad" "$@" >"$work/e.out" 2>&1; then fail "E: $what was accepted"; fi
  [ "$(wc -l <"$work/e.out")" -eq 1 ] || { cat "$work/e.out"; fail "E: $what: not one line"; }
  grep -q -- "$pattern" "$work/e.out" || { cat "$work/e.out"; fail "E: $what: no '$pattern'"; }
  echo "  $what: $(cat "$work/e.out")"
}
refuse "dpo on SFT data" "needs preference data" data.train="$work/sft.jsonl" data.eval= seq_len=256
refuse "pairs without dpo" "add a dpo: section" dpo=
refuse "packed pairs" "packing" data.packing=true
refuse "reference_model under LoRA" "dpo.reference_model" lora.rank=4 dpo.reference_model="$base"
refuse "an unknown dpo key" "dpo.betta" dpo.betta=0.2
echo "dpo_cli: all passed in $((SECONDS - start))s"
