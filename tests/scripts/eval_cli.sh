#!/usr/bin/env bash
# `shardlm eval` (issue 36, docs/training.md) and the training log's wording (issue 36 item 5):
#  1. a 1-step text run (every held-out row evaluated): its log says the rows are windows of
#     seq_len + 1 tokens every seq_len tokens, not "padded rows", and times the final save apart
#     from the run; `eval --config run.yaml` on the initial model equals the step-0 eval_loss of
#     metrics.jsonl and on the trained model the final one (1e-6 relative); --output's JSON fields;
#  2. 2 ranks (shardlm launch) give 1 rank's loss (1e-6 relative) with the same rows and tokens;
#  3. --data evaluates every window of a file (tokens = rows x seq_len); Alpaca data; --max-rows;
#  4. --adapter: a LoRA run's adapter on its base equals that run's final eval_loss;
#  5. a missing data file, an unknown flag, an adapter for another model, --output over an input:
#     one line naming the culprit, non-zero exit, nothing written.
# Usage: eval_cli.sh SHARDLM PYTHON SOURCE_DIR WORKDIR HAVE_MPI(0|1)
set -euo pipefail
shardlm=$1
py=$2
src=$3
work=$4
have_mpi=$5
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "FAIL: $*"; exit 1; }

"$shardlm" init --preset tiny --seed 2 --out "$work/init" >/dev/null
# ~24 KB of words: with the byte-level tokenizer, ~24k tokens; 10% held out = ~37 windows of 65.
"$py" - "$work/text.txt" <<'PY'
import random, sys
r = random.Random(7)
words = "the a cat dog sat ran on under big small red blue and then saw it was happy sad".split()
with open(sys.argv[1], "w") as f:
    for _ in range(500):
        f.write(" ".join(r.choice(words) for _ in range(10)) + ".\n")
PY
cat > "$work/run.yaml" <<YAML
model: $work/init
output_dir: $work/out
data: {train: $work/text.txt, eval_fraction: 0.1}
seq_len: 64
micro_batch_size: 4
max_steps: 1
optimizer: {lr: 1e-2}
eval_every: 0
eval_batches: 1000
progress: lines
YAML

# ---- 1. the trainer's held-out loss, and the log's wording ----
"$shardlm" train --config "$work/run.yaml" > "$work/train.log" 2>&1 || fail "train failed: $(tail -5 "$work/train.log")"
grep -E "rows: [0-9]+ windows of seq_len \+ 1 = 65 tokens, one every 64 tokens of the stream" "$work/train.log" ||
  fail "the rows line does not give the windows' stride: $(grep 'rows:' "$work/train.log")"
! grep -q "padded rows" "$work/train.log" || fail "a text run reports padded rows"
grep -E "saved the trained model to $work/out \(f32\) in [0-9.]+s; the run took [0-9.]+s$" "$work/train.log" ||
  fail "the save line does not time the save: $(grep 'saved the trained' "$work/train.log")"
"$shardlm" eval --config "$work/run.yaml" --model "$work/init" --output "$work/e0.json" > "$work/e0.txt" 2> "$work/e0.err" ||
  fail "eval of the initial model failed: $(cat "$work/e0.err")"
cat "$work/e0.txt"
"$shardlm" eval --config "$work/run.yaml" --model "$work/out" --output "$work/e1.json" --quiet > "$work/e1.txt" 2> "$work/e1.err" ||
  fail "eval of the trained model failed: $(cat "$work/e1.err")"
[[ ! -s "$work/e1.err" ]] || fail "--quiet left lines on stderr: $(cat "$work/e1.err")"
grep -qE "^eval: loss [0-9.]+, perplexity [0-9.]+, [0-9]+ tokens in [0-9]+ rows of seq_len 64 on 1 rank \([0-9.]+s\)$" \
  "$work/e0.txt" || fail "unexpected summary line: $(cat "$work/e0.txt")"
"$py" - "$work" <<'PY'
import json, math, sys
work = sys.argv[1]
evals = [r for r in map(json.loads, open(f"{work}/out/metrics.jsonl")) if "eval_loss" in r]
assert [r["step"] for r in evals] == [0, 1], evals
for rec, f in ((evals[0], "e0"), (evals[1], "e1")):
    j = json.load(open(f"{work}/{f}.json"))
    for k in ("loss", "perplexity", "tokens", "rows", "model", "data", "seq_len", "world_size", "split", "data_type"):
        assert k in j, (k, j)
    assert j["split"] == "held out" and j["data_type"] == "text" and j["seq_len"] == 64 and j["world_size"] == 1, j
    assert j["tokens"] == j["rows"] * 64, j
    assert abs(j["perplexity"] - math.exp(j["loss"])) <= 1e-9 * j["perplexity"], j
    rel = abs(j["loss"] - rec["eval_loss"]) / rec["eval_loss"]
    assert rel <= 1e-6, f"{f}: eval loss {j['loss']!r} vs the trainer's step-{rec['step']} eval_loss {rec['eval_loss']!r}"
    print(f"1. step {rec['step']}: shardlm eval {j['loss']:.9f} = trainer eval_loss {rec['eval_loss']:.9f} "
          f"(rel {rel:.1e}; {j['tokens']} tokens, {j['rows']} rows)")
assert evals[1]["eval_loss"] != evals[0]["eval_loss"]
PY

# ---- 2. two ranks ----
if [[ "$have_mpi" == 1 ]]; then
  "$shardlm" launch --nproc-per-node 2 -- eval --config "$work/run.yaml" --model "$work/out" --micro-batch-size 3 \
    --output "$work/e1_np2.json" > "$work/np2.txt" 2> "$work/np2.err" || fail "eval on 2 ranks failed: $(cat "$work/np2.err")"
  cat "$work/np2.txt"
  grep -q " on 2 ranks " "$work/np2.txt" || fail "the 2-rank summary does not say 2 ranks"
  "$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
one, two = (json.load(open(f"{work}/{f}.json")) for f in ("e1", "e1_np2"))
assert two["world_size"] == 2 and (two["tokens"], two["rows"]) == (one["tokens"], one["rows"]), (one, two)
rel = abs(one["loss"] - two["loss"]) / one["loss"]
assert rel <= 1e-6, f"2 ranks: {two['loss']!r} vs 1 rank {one['loss']!r}"
print(f"2. 2 ranks (micro-batch 3): loss {two['loss']:.9f} = 1 rank's (rel {rel:.1e})")
PY
else
  echo "2. skipped: no MPI in this build"
fi

# ---- 3. --data: a whole file, Alpaca, --max-rows ----
"$shardlm" eval --model "$work/init" --data "$work/text.txt" --seq-len 64 --output "$work/whole.json" > /dev/null 2>&1 ||
  fail "eval --data failed"
"$shardlm" eval --model "$work/init" --data "$src/data/alpaca_en_demo_sample.json" --seq-len 256 --max-rows 3 \
  --output "$work/alpaca.json" > /dev/null 2> "$work/alpaca.err" || fail "eval of Alpaca data failed: $(cat "$work/alpaca.err")"
"$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
whole, held, alp = (json.load(open(f"{work}/{f}.json")) for f in ("whole", "e0", "alpaca"))
n = len(open(f"{work}/text.txt", "rb").read()) + 2  # the byte-level tokenizer: BOS, the bytes, EOS
assert whole["split"] == "whole file" and whole["rows"] == (n - 1) // 64 and whole["tokens"] == whole["rows"] * 64, (n, whole)
assert whole["rows"] > held["rows"], (whole, held)
assert alp["data_type"] == "alpaca" and alp["rows"] == 3 and alp["max_rows"] == 3 and 0 < alp["tokens"] < 3 * 256, alp
print(f"3. whole file: {whole['rows']} windows, {whole['tokens']} tokens, loss {whole['loss']:.4f}; "
      f"alpaca: 3 rows, {alp['tokens']} answer tokens, loss {alp['loss']:.4f}")
PY

# ---- 4. --adapter: a LoRA run's final eval_loss ----
cat > "$work/lora.yaml" <<YAML
$(sed "s|output_dir: .*|output_dir: $work/lora_out|; s|max_steps: 1|max_steps: 2|" "$work/run.yaml")
lora: {rank: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj]}
YAML
"$shardlm" train --config "$work/lora.yaml" > "$work/lora.log" 2>&1 || fail "LoRA training failed: $(tail -3 "$work/lora.log")"
"$shardlm" eval --config "$work/lora.yaml" --adapter "$work/lora_out/adapter" --output "$work/lora.json" > /dev/null \
  2> "$work/lora.err" || fail "eval --adapter failed: $(cat "$work/lora.err")"
grep -q "^adapter: $work/lora_out/adapter" "$work/lora.err" || fail "eval did not say it read the adapter"
"$py" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
final = [r for r in map(json.loads, open(f"{work}/lora_out/metrics.jsonl")) if "eval_loss" in r][-1]
base = json.load(open(f"{work}/e0.json"))
j = json.load(open(f"{work}/lora.json"))
rel = abs(j["loss"] - final["eval_loss"]) / final["eval_loss"]
assert rel <= 1e-6, f"--adapter: {j['loss']!r} vs the LoRA run's final eval_loss {final['eval_loss']!r}"
assert abs(j["loss"] - base["loss"]) > 1e-4, "the adapter changed nothing"
print(f"4. --adapter: {j['loss']:.9f} = the LoRA run's final eval_loss {final['eval_loss']:.9f} (rel {rel:.1e}); "
      f"base alone {base['loss']:.6f}")
PY

# ---- 5. refusals ----
"$shardlm" init --preset tiny --set hidden_size=96 --set num_attention_heads=3 --set num_key_value_heads=1 \
  --out "$work/other" > /dev/null
cp "$work/text.txt" "$work/text.before"
refuse() {  # refuse NAME EXPECTED-TEXT ARGS...
  local name=$1 want=$2
  shift 2
  if "$shardlm" eval "$@" > "$work/bad.out" 2> "$work/bad.err"; then fail "$name: accepted"; fi
  [[ $(wc -l < "$work/bad.err") -eq 1 ]] || fail "$name: expected one line, got: $(cat "$work/bad.err")"
  grep -qF -- "$want" "$work/bad.err" || fail "$name: the error does not name '$want': $(cat "$work/bad.err")"
  echo "5. $name: $(cat "$work/bad.err")"
}
refuse "missing data file" "$work/nope.txt" --model "$work/init" --data "$work/nope.txt" --seq-len 64
refuse "unknown flag" "--bogus" --model "$work/init" --data "$work/text.txt" --bogus 3
refuse "adapter for another model" "adapter_model.safetensors" --model "$work/other" --data "$work/text.txt" --seq-len 64 \
  --adapter "$work/lora_out/adapter"
refuse "output over the data" "--output" --model "$work/init" --data "$work/text.txt" --seq-len 64 --output "$work/text.txt"
refuse "no data" "--data" --model "$work/init"
cmp -s "$work/text.txt" "$work/text.before" || fail "a refused eval changed its data file"
echo "eval_cli: ok"
