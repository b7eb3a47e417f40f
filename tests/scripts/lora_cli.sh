#!/usr/bin/env bash
# LoRA training through the command line (issue 12), on CPU ranks (mpirun --oversubscribe). A tiny
# random Llama (f32, initializer_range 0.1) with Llama 2's tokenizer is the frozen base; the Alpaca
# sample is the data; `lora: {rank: 16, alpha: 32, target_modules: all-linear}`, constant lr 1e-2.
#  A. `launch --nproc-per-node 2 -- train` under FULL_SHARD: the log prints PEFT's trainable-parameters
#     line with the right counts, the held-out loss falls, output_dir/adapter is a PEFT directory
#     (adapter_config.json; exactly PEFT's 28 tensor names and shapes; B trained away from zero).
#     (The frozen random head and norm cap what any adapter can gain here: about 0.6 nats.)
#  B. the PEFT formula reproduces shardlm: peft_reference.py's logits of the base with the adapter
#     applied unmerged (y = W x + scale B(A(x))) equal shardlm's logits of `shardlm merge --dtype f32`'s
#     output; check-merged on it; `generate --model BASE --adapter` prints the continuation that
#     `generate` on the merged directory prints (and not the base's).
#  C. merge_on_save: true: output_dir/merged is byte for byte what `shardlm merge` writes from
#     output_dir/adapter in the same dtype.
#  D. checkpoints (save_every) hold only the adapters' state: far below the base's size;
#     `shardlm convert` of the last one writes output_dir/adapter's files; a run stopped at step 10
#     of 20 (max_steps=10) and resumed by 1 process (resume_from=auto, max_steps=20) ends with the
#     uninterrupted 2-rank run's adapter (to 1e-6: the reduction order differs) and its losses
#     (the resumed run saves no checkpoint: its adapter is written from the engine, the other way).
#  F. QLoRA (lora.quantize_base=nf4) on 2 ranks: trains, says so, lowers the held-out loss;
#  G. QDoRA (lora.use_dora=true on the NF4 base), 10 steps on 2 ranks: says so; its adapter has
#     use_dora and PEFT's 14 magnitude vectors; merge_on_save equals `shardlm merge`, and the PEFT
#     reference's DoRA on the base reproduces the merged model's logits;
#  E. bad input, each one line naming the culprit, non-zero exit: resuming a LoRA checkpoint with a
#     config without lora:, or with another alpha than the checkpoint's, or with use_dora; an unknown lora: key
#     (the file and the key).
# Usage: lora_cli.sh SHARDLM PEFT_TOOL PYTHON SOURCE_DIR DATA_DIR WORKDIR
set -euo pipefail
shardlm=$1
tool=$2
py=$3
src=$4
data=$(cd "$5" && pwd)  # the YAML names files by absolute paths
work=$6
ref="$src/tests/torch_ref/peft_reference.py"
rm -rf "$work" && mkdir -p "$work"
# One thread per process (launch gives each rank one of the 2 cores): OpenMP threads on a busy
# machine made the 1-process resume 5 times slower.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
start=$SECONDS

base="$work/base"
"$shardlm" init --preset tiny --out "$base" --set vocab_size=32000 --set max_position_embeddings=512 \
  --set initializer_range=0.1 --dtype f32 >/dev/null
cp "$data/llama2_tokenizer.model" "$base/tokenizer.model"
cat > "$work/run.yaml" <<YAML
model: $base
output_dir: $work/full
seed: 1234
compute_dtype: f32
data: {type: alpaca, train: $data/alpaca_en_demo.json, eval_fraction: 0.05, packing: true}
seq_len: 256
micro_batch_size: 2
gradient_accumulation_steps: 1
max_steps: 20
optimizer: {lr: 1e-2, weight_decay: 0.0}
lr_scheduler: {type: constant}   # so that a run cut short by max_steps=10 is the first half of this one
eval_every: 0
eval_batches: 4
progress: lines
save_dtype: f32
save_every: 10
sharding_strategy: FULL_SHARD
lora:
  rank: 16
  alpha: 32
  target_modules: all-linear
  merge_on_save: true
YAML
launch2() { "$shardlm" launch --nproc-per-node 2 -- train --config "$work/run.yaml" "$@"; }

# ---- A. the 2-rank FULL_SHARD LoRA run ----
launch2 > "$work/full.log" 2>&1 || { cat "$work/full.log"; fail "the LoRA run failed"; }
line=$(grep "trainable params: " "$work/full.log") || { cat "$work/full.log"; fail "no trainable-parameters line"; }
echo "$line"
# all-linear, rank 16, hidden 64, 4 heads + 2 KV heads of 16, intermediate 172, 2 layers:
# 2 x 16 x (128 + 96 + 96 + 128 + 3 x 236) = 36992 trainable; the base has 4186944.
echo "$line" | grep -q "trainable params: 36992 || all params: 4223936 || trainable%: 0.8758" ||
  fail "the trainable-parameters line has the wrong counts"
grep "held-out loss" "$work/full.log"
[[ -f "$work/full/adapter/adapter_config.json" && -f "$work/full/adapter/adapter_model.safetensors" ]] ||
  fail "no PEFT adapter in output_dir/adapter: $(ls -R "$work/full")"
[[ ! -e "$work/full/model.safetensors" ]] || fail "a LoRA run wrote a full model into output_dir"
[[ -f "$work/full/merged/model.safetensors" ]] || fail "merge_on_save: true wrote no output_dir/merged"

# ---- B. the PEFT formula on the base against shardlm's merged model ----
"$py" -c "import numpy as np; np.save('$work/ids.npy', np.random.default_rng(0).integers(0, 32000, (2, 32)).astype(np.int32))"
"$shardlm" merge --base "$base" --adapter "$work/full/adapter" --out "$work/merged_f32" --dtype f32 | tee "$work/merge.txt"
grep -q "merged 14 weights (7 per layer: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj) .* rank 16, lora_alpha 32, scale 2 (alpha / r)" \
  "$work/merge.txt" || fail "merge did not say it merged the 14 all-linear weights at scale 2"
"$py" "$ref" check-merged "$base" "$work/full/adapter" "$work/merged_f32"
"$tool" logits "$work/merged_f32" "$work/ids.npy" "$work/logits.npy"
"$py" "$ref" logits "$base" "$work/full/adapter" "$work/ids.npy" "$work/logits.npy"
gen() { "$shardlm" generate --prompt "Below is an instruction" --max-new-tokens 12 --temperature 0 "$@"; }
gen --model "$base" --adapter "$work/full/adapter" > "$work/gen_adapter.txt" 2> "$work/gen_adapter.err"
gen --model "$work/merged_f32" > "$work/gen_merged.txt" 2>/dev/null
gen --model "$base" > "$work/gen_base.txt" 2>/dev/null
grep -q "merged in memory (14 weights, rank 16, scale 2)" "$work/gen_adapter.err" ||
  fail "generate --adapter did not say it merged in memory: $(cat "$work/gen_adapter.err")"
cmp -s "$work/gen_adapter.txt" "$work/gen_merged.txt" || fail "generate --adapter and generate on the merged model differ"
cmp -s "$work/gen_adapter.txt" "$work/gen_base.txt" && fail "the adapter does not change generation (vacuous test)"
echo "generate --adapter == generate on the merged model: $(tr '\n' ' ' < "$work/gen_adapter.txt")"
# Batched: --prompts with the adapter gives each prompt the merged model's text (docs/generation.md).
printf 'Below is an instruction\nGive three tips\n' > "$work/prompts.txt"
"$shardlm" generate --model "$base" --adapter "$work/full/adapter" --prompts "$work/prompts.txt" --batch-size 2 \
  --max-new-tokens 12 --temperature 0 > "$work/gen_batch.jsonl" 2>/dev/null
"$shardlm" generate --model "$work/merged_f32" --prompt "Give three tips" --max-new-tokens 12 --temperature 0 \
  > "$work/gen_merged2.txt" 2>/dev/null
"$py" - "$work" <<'PY'
import json, sys
w = sys.argv[1]
rows = [json.loads(l) for l in open(f"{w}/gen_batch.jsonl")]
for r, f in zip(rows, ["gen_merged.txt", "gen_merged2.txt"]):
    alone = open(f"{w}/{f}", "rb").read().decode("utf-8", "replace")
    assert r["text"] == alone[len(r["prompt"]):-1], (r, alone)
print("generate --adapter --prompts (batch of 2) == generate on the merged model, prompt by prompt")
PY

# ---- C. merge_on_save against shardlm merge (save_dtype f32, so --dtype f32) ----
for f in model.safetensors config.json generation_config.json tokenizer.model; do
  cmp "$work/full/merged/$f" "$work/merged_f32/$f" || fail "merge_on_save's $f differs from shardlm merge's"
done
echo "merge_on_save: output_dir/merged is byte for byte shardlm merge's output"

# ---- D. checkpoints: small, convertible, resumable on another world size ----
last="$work/full/checkpoints/step_00000020"
[[ -f "$work/full/checkpoints/step_00000010/COMPLETE" && -f "$last/COMPLETE" ]] ||
  fail "expected complete checkpoints at steps 10 and 20: $(ls "$work/full/checkpoints")"
"$shardlm" convert "$last" --out "$work/converted" --dtype f32 > "$work/convert.txt"
cat "$work/convert.txt"
for f in adapter_config.json adapter_model.safetensors; do
  cmp "$work/converted/$f" "$work/full/adapter/$f" || fail "convert of the last checkpoint: $f differs from output_dir/adapter"
done
[[ ! -e "$work/converted/model.safetensors" ]] || fail "convert of a LoRA checkpoint wrote a full model"
# Stopped at step 10 (checkpointed there), then resumed by one process with the full max_steps and
# no more checkpoints (save_every=0: its adapter is gathered from the engine, not converted).
launch2 output_dir="$work/cut" max_steps=10 > "$work/cut.log" 2>&1 || { cat "$work/cut.log"; fail "the cut run failed"; }
mv "$work/cut/metrics.jsonl" "$work/cut/metrics_1-10.jsonl"  # the resumed run writes steps 11-20 anew
"$shardlm" train --config "$work/run.yaml" output_dir="$work/cut" resume_from=auto micro_batch_size=4 save_every=0 \
  > "$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "resuming the LoRA checkpoint on 1 process failed"; }
grep -q "resumed from $work/cut/checkpoints/step_00000010" "$work/resume.log" ||
  { cat "$work/resume.log"; fail "did not resume from the step-10 checkpoint"; }
cmp "$work/cut/adapter/adapter_config.json" "$work/full/adapter/adapter_config.json"

# ---- F. QLoRA: the same run with the base's Linear weights in NF4 (double quantization) ----
launch2 output_dir="$work/qlora" lora.quantize_base=nf4 save_every=0 lora.merge_on_save=false \
  > "$work/qlora.log" 2>&1 || { cat "$work/qlora.log"; fail "the QLoRA run failed"; }
grep -q "QLoRA: rank 16" "$work/qlora.log" && grep -q "base: Linear weights in NF4" "$work/qlora.log" ||
  { cat "$work/qlora.log"; fail "the QLoRA run did not say it quantized the base"; }
[[ -f "$work/qlora/adapter/adapter_model.safetensors" ]] || fail "no adapter from the QLoRA run"
"$py" - "$work/qlora/metrics.jsonl" <<'PY'
import json, sys
evals = [r["eval_loss"] for r in map(json.loads, open(sys.argv[1])) if "eval_loss" in r]
assert len(evals) == 2 and evals[1] < evals[0] - 0.3, f"QLoRA held-out loss {evals} did not fall by 0.3"
print(f"QLoRA held-out loss {evals[0]:.4f} -> {evals[1]:.4f}")
PY

# ---- G. QDoRA: DoRA on the NF4 base, then its adapter against the PEFT reference ----
launch2 output_dir="$work/qdora" lora.quantize_base=nf4 lora.use_dora=true save_every=0 max_steps=10 \
  > "$work/qdora.log" 2>&1 || { cat "$work/qdora.log"; fail "the QDoRA run failed"; }
grep -q "QDoRA: rank 16" "$work/qdora.log" || { cat "$work/qdora.log"; fail "the QDoRA run did not say so"; }
grep -q '"use_dora": true' "$work/qdora/adapter/adapter_config.json" || fail "the QDoRA adapter does not say use_dora"
[[ $(grep -a -o 'lora_magnitude_vector' "$work/qdora/adapter/adapter_model.safetensors" | wc -l) -eq 14 ]] ||
  fail "the QDoRA adapter does not hold 14 magnitude vectors"
"$shardlm" merge --base "$base" --adapter "$work/qdora/adapter" --out "$work/qdora_merged" --dtype f32 >/dev/null
cmp "$work/qdora/merged/model.safetensors" "$work/qdora_merged/model.safetensors" ||
  fail "QDoRA merge_on_save differs from shardlm merge"
"$py" "$ref" check-merged "$base" "$work/qdora/adapter" "$work/qdora_merged"
"$tool" logits "$work/qdora_merged" "$work/ids.npy" "$work/qdora_logits.npy"
"$py" "$ref" logits "$base" "$work/qdora/adapter" "$work/ids.npy" "$work/qdora_logits.npy"

# ---- E. bad input ----
refuse() {  # refuse NAME PATTERN COMMAND...: the command fails with one line matching PATTERN
  local name=$1 pattern=$2
  shift 2
  if "$@" > "$work/$name.err" 2>&1; then fail "$name: accepted"; fi
  [[ $(wc -l < "$work/$name.err") -eq 1 ]] || { cat "$work/$name.err"; fail "$name: not a one-line error"; }
  grep -q -- "$pattern" "$work/$name.err" || { cat "$work/$name.err"; fail "$name: the error does not match '$pattern'"; }
  echo "$name: $(cat "$work/$name.err")"
}
sed '/^lora:/,$d' "$work/run.yaml" > "$work/nolora.yaml"
refuse resume_without_lora "step_00000010.*key 'lora'.*LoRA run's checkpoint" \
  "$shardlm" train --config "$work/nolora.yaml" output_dir="$work/e1" micro_batch_size=4 \
  resume_from="$work/full/checkpoints/step_00000010"
refuse resume_other_alpha "key 'lora.alpha'.*checkpoint" \
  "$shardlm" train --config "$work/run.yaml" output_dir="$work/e2" micro_batch_size=4 lora.alpha=8 \
  resume_from="$work/full/checkpoints/step_00000010"
refuse resume_with_dora "key 'lora.use_dora'.*trained without DoRA" \
  "$shardlm" train --config "$work/run.yaml" output_dir="$work/e4" micro_batch_size=4 lora.use_dora=true \
  resume_from="$work/full/checkpoints/step_00000010"
sed 's/^  alpha: 32/  alpah: 32/' "$work/run.yaml" > "$work/typo.yaml"
refuse unknown_key "typo.yaml:[0-9]*: key 'lora.alpah'" \
  "$shardlm" train --config "$work/typo.yaml" output_dir="$work/e3"

# ---- the numbers: names, shapes, losses, sizes, resume ----
"$py" - "$work" "$src/tests/torch_ref" <<'PY'
import json, os, sys
import numpy as np
import torch
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import safetensors_check

def tensors(path):  # {name: f32 numpy array}, read by the tests' strict safetensors reader
    out = {}
    for name, t in safetensors_check.load(path).items():
        assert t.dtype == torch.float32, (path, name, t.dtype)
        out[name] = t.numpy()
    return out

def records(run, file="metrics.jsonl"):
    return list(map(json.loads, open(f"{work}/{run}/{file}")))

# A. held-out loss, PEFT names and shapes, a trained B.
evals = [r["eval_loss"] for r in records("full") if "eval_loss" in r]
assert len(evals) == 2 and evals[1] < evals[0] - 0.4, f"held-out loss {evals} did not fall by 0.4 nats"
print(f"A: held-out loss {evals[0]:.4f} -> {evals[1]:.4f}")
cfg = json.load(open(f"{work}/full/adapter/adapter_config.json"))
want_cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 16, "lora_alpha": 32, "use_rslora": False,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            "base_model_name_or_path": f"{work}/base"}
assert all(cfg.get(k) == v for k, v in want_cfg.items()), {k: cfg.get(k) for k in want_cfg}
ad = tensors(f"{work}/full/adapter/adapter_model.safetensors")
io = {"self_attn.q_proj": (64, 64), "self_attn.k_proj": (64, 32), "self_attn.v_proj": (64, 32),
      "self_attn.o_proj": (64, 64), "mlp.gate_proj": (64, 172), "mlp.up_proj": (64, 172), "mlp.down_proj": (172, 64)}
want = {}
for layer in range(2):
    for mod, (i, o) in io.items():
        p = f"base_model.model.model.layers.{layer}.{mod}"
        want[p + ".lora_A.weight"] = (16, i)
        want[p + ".lora_B.weight"] = (o, 16)
got = {k: v.shape for k, v in ad.items()}
assert got == want, f"adapter tensors differ from PEFT's: {sorted(set(got) ^ set(want))[:4]}"
b_max = min(float(np.abs(v).max()) for k, v in ad.items() if "lora_B" in k)
assert b_max > 0, "some lora_B is still zero: the adapter did not train"
print(f"A: adapter_model.safetensors holds PEFT's {len(ad)} tensors; every lora_B trained (smallest max |B| {b_max:.3g})")

# D. checkpoint sizes against the base: the rank files hold the adapters' f32 master weights and
# AdamW's two moments (3 x 36992 numbers), nothing of the base; the rest is metadata and a copy of
# the tokenizer (500 kB for Llama 2's).
base_bytes = os.path.getsize(f"{work}/base/model.safetensors")
for step in (10, 20):
    d = f"{work}/full/checkpoints/step_{step:08d}"
    ranks = [f for f in os.listdir(d) if f.startswith("rank_")]
    numel = sum(v.size for f in ranks for v in tensors(os.path.join(d, f)).values())
    assert len(ranks) == 2 and numel == 3 * 36992, (d, ranks, numel)
    state = sum(os.path.getsize(os.path.join(d, f)) for f in ranks)
    total = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    assert state < base_bytes / 20 and total < base_bytes / 10, (d, state, total, base_bytes)
print(f"D: a checkpoint holds {numel} numbers (adapters + AdamW moments): {state / 1e6:.2f} MB of state, "
      f"{total / 1e6:.2f} MB in all with the tokenizer, vs the base's {base_bytes / 1e6:.1f} MB")

# D. cut at 10 on 2 ranks + resumed on 1 process == uninterrupted on 2 ranks.
full = {r["step"]: r["loss"] for r in records("full") if "loss" in r}
cut = {r["step"]: r["loss"] for r in records("cut", "metrics_1-10.jsonl") + records("cut") if "loss" in r}
assert sorted(cut) == list(range(1, 21)), sorted(cut)
bad = [(s, cut[s], full[s]) for s in full if abs(cut[s] - full[s]) > 1e-5 * abs(full[s])]
assert not bad, f"losses of the cut + resumed run differ: {bad[:3]}"
res = tensors(f"{work}/cut/adapter/adapter_model.safetensors")
worst = max(float(np.abs(res[k] - ad[k]).max()) for k in ad)
assert set(res) == set(ad) and worst <= 1e-6, f"the resumed adapter differs from the uninterrupted one by {worst}"
print(f"D: stopped at step 10 of 20 on 2 ranks, resumed on 1: losses within 1e-5 relative (last {cut[20]:.6f} vs "
      f"{full[20]:.6f}), adapter within {worst:.2e} of the uninterrupted run")
PY
echo "lora_cli: ok in $((SECONDS - start)) s"
