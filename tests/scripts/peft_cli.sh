#!/usr/bin/env bash
# PEFT LoRA adapters through the command line (docs/lora.md):
#  A. a GQA Llama (Llama 3 RoPE), f32: an all-linear adapter (r 4, alpha 8) written by shardlm with
#     random non-zero A and B; `shardlm merge --dtype f32`; every merged tensor is base + scale B A
#     (peft_reference.py check-merged), and shardlm's logits of the merged model equal the logits of
#     the PEFT reference that applies the adapter unmerged (y = W x + scale B(A(x))) on the base;
#  B. a Qwen2 (q/k/v biases) stored in bf16, an rsLoRA adapter on q_proj v_proj down_proj stored in
#     bf16: merged in the base's dtype (bf16, within one unit in the last place of base + scale B A)
#     and in f32, in shards (logits against the reference);
#  C. the tiny preset: `generate --adapter` (merged in memory) prints the same greedy continuation
#     as `generate` on the merged directory, and a different one from the base alone;
#  D. an adapter of another model is refused in one line naming the file and the tensor.
#  E. DoRA (use_dora): an adapter written by shardlm (GQA Llama, q/v/o/down) merges to the
#     reference's m / ||W + s B A|| (W + s B A) and the merged model's logits equal the reference's
#     unmerged DoRA; one written by the reference (PEFT's files) is read and merged by shardlm the
#     same way; `generate --adapter` with a DoRA adapter equals generating from its merge, and
#     `eval --adapter` (DoRA applied unmerged, as in training) gives the merged model's loss.
# Usage: peft_cli.sh SHARDLM PEFT_TOOL PYTHON SOURCE_DIR WORKDIR
set -euo pipefail
shardlm=$1
tool=$2
py=$3
src=$4
work=$5
ref="$src/tests/torch_ref/peft_reference.py"
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

"$py" -c "import numpy as np; np.save('$work/ids.npy', np.random.default_rng(0).integers(0, 83, (2, 24)).astype(np.int32))"

# ---- A. GQA Llama, f32, all-linear ----
"$shardlm" init --config "$src/tests/golden/gqa_llama3_rope.json" --out "$work/gqa" --seed 7 --dtype f32 >/dev/null
"$tool" make-adapter "$work/gqa" "$work/gqa_lora" --rank 4 --alpha 8 --targets all-linear --seed 1
"$shardlm" merge --base "$work/gqa" --adapter "$work/gqa_lora" --out "$work/gqa_merged" --dtype f32 | tee "$work/merge_a.txt"
grep -q "merged 14 weights (7 per layer: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj) of .* with rank 4, lora_alpha 8, scale 2 (alpha / r) -> .* (21 tensors in f32)" \
  "$work/merge_a.txt" || fail "merge did not say what it merged"
"$py" "$ref" check-merged "$work/gqa" "$work/gqa_lora" "$work/gqa_merged"
"$tool" logits "$work/gqa_merged" "$work/ids.npy" "$work/gqa_logits.npy"
"$py" "$ref" logits "$work/gqa" "$work/gqa_lora" "$work/ids.npy" "$work/gqa_logits.npy"

# ---- B. Qwen2 in bf16, rsLoRA stored in bf16 ----
"$shardlm" init --config "$src/tests/golden/qwen2_bias_packed.json" --out "$work/qwen" --seed 3 --dtype bf16 >/dev/null
"$tool" make-adapter "$work/qwen" "$work/qwen_lora" --rank 3 --alpha 5 --targets q_proj,v_proj,down_proj --rslora \
  --dtype bf16 --seed 2
"$shardlm" merge --base "$work/qwen" --adapter "$work/qwen_lora" --out "$work/qwen_merged_bf16" | tee "$work/merge_b.txt"
grep -q "rank 3, lora_alpha 5, scale 2.88675 (rsLoRA: alpha / sqrt(r)) .* in bf16)" "$work/merge_b.txt" ||
  fail "merge did not keep the base's bf16 or misreported rsLoRA"
"$py" "$ref" check-merged "$work/qwen" "$work/qwen_lora" "$work/qwen_merged_bf16"
"$shardlm" merge --base "$work/qwen" --adapter "$work/qwen_lora" --out "$work/qwen_merged" --dtype f32 \
  --max-shard-size 40KB >/dev/null
[[ -f "$work/qwen_merged/model.safetensors.index.json" ]] || fail "--max-shard-size 40KB did not shard the merged model"
"$py" "$ref" check-merged "$work/qwen" "$work/qwen_lora" "$work/qwen_merged"
"$tool" logits "$work/qwen_merged" "$work/ids.npy" "$work/qwen_logits.npy"
"$py" "$ref" logits "$work/qwen" "$work/qwen_lora" "$work/ids.npy" "$work/qwen_logits.npy"

# ---- C. generate --adapter against the merged directory ----
"$shardlm" init --preset tiny --out "$work/tiny" --seed 0 >/dev/null
"$tool" make-adapter "$work/tiny" "$work/tiny_lora" --rank 8 --alpha 16 --targets q_proj,k_proj,v_proj,o_proj --seed 5 --std 0.2
"$shardlm" merge --base "$work/tiny" --adapter "$work/tiny_lora" --out "$work/tiny_merged" >/dev/null
gen() { "$shardlm" generate --prompt "The adapter" --max-new-tokens 40 --temperature 0 "$@"; }
gen --model "$work/tiny" --adapter "$work/tiny_lora" > "$work/gen_adapter.txt" 2> "$work/gen_adapter.err"
gen --model "$work/tiny_merged" > "$work/gen_merged.txt"
gen --model "$work/tiny" > "$work/gen_base.txt"
grep -q "LoRA adapter .* merged in memory (8 weights, rank 8, scale 2)" "$work/gen_adapter.err" ||
  fail "generate --adapter did not say it merged in memory: $(cat "$work/gen_adapter.err")"
cmp -s "$work/gen_adapter.txt" "$work/gen_merged.txt" || fail "generate --adapter and the merged model differ"
cmp -s "$work/gen_adapter.txt" "$work/gen_base.txt" && fail "the adapter does not change generation (vacuous test)"
echo "generate --adapter == merged: $(od -c "$work/gen_adapter.txt" | head -2 | tr -s ' ' | tr '\n' ' ')"

# ---- D. an adapter of another model ----
if "$shardlm" merge --base "$work/tiny" --adapter "$work/gqa_lora" --out "$work/bad" > "$work/bad.txt" 2>&1; then
  fail "merging an adapter of another model was accepted"
fi
cat "$work/bad.txt"
[[ $(wc -l < "$work/bad.txt") -eq 1 ]] || fail "the refusal is not one line"
grep -q "adapter_model.safetensors: tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': shape \[4, 32\]" \
  "$work/bad.txt" || fail "the refusal does not name the file, the tensor and its shape"
[[ ! -e "$work/bad" ]] || fail "a refused merge left an output directory"
# ---- E. DoRA ----
"$tool" make-adapter "$work/gqa" "$work/gqa_dora" --rank 4 --alpha 8 --targets q_proj,v_proj,o_proj,down_proj --dora --seed 3
"$shardlm" merge --base "$work/gqa" --adapter "$work/gqa_dora" --out "$work/gqa_dora_merged" --dtype f32 | tee "$work/merge_e.txt"
grep -q "DoRA: rows scaled to their magnitudes" "$work/merge_e.txt" || fail "merge did not say it merged DoRA"
"$py" "$ref" check-merged "$work/gqa" "$work/gqa_dora" "$work/gqa_dora_merged"
"$tool" logits "$work/gqa_dora_merged" "$work/ids.npy" "$work/gqa_dora_logits.npy"
"$py" "$ref" logits "$work/gqa" "$work/gqa_dora" "$work/ids.npy" "$work/gqa_dora_logits.npy"
"$py" "$ref" make-dora-adapter "$work/gqa" "$work/gqa_dora_peft" --targets q_proj,k_proj,gate_proj,up_proj --rank 3 --alpha 6 --seed 4
"$shardlm" merge --base "$work/gqa" --adapter "$work/gqa_dora_peft" --out "$work/gqa_dora_peft_merged" --dtype f32 >/dev/null
"$py" "$ref" check-merged "$work/gqa" "$work/gqa_dora_peft" "$work/gqa_dora_peft_merged"
"$tool" logits "$work/gqa_dora_peft_merged" "$work/ids.npy" "$work/gqa_dora_peft_logits.npy"
"$py" "$ref" logits "$work/gqa" "$work/gqa_dora_peft" "$work/ids.npy" "$work/gqa_dora_peft_logits.npy"
"$tool" make-adapter "$work/tiny" "$work/tiny_dora" --rank 8 --alpha 16 --targets q_proj,v_proj,down_proj --dora --seed 6 --std 0.2
"$shardlm" merge --base "$work/tiny" --adapter "$work/tiny_dora" --out "$work/tiny_dora_merged" >/dev/null
gen --model "$work/tiny" --adapter "$work/tiny_dora" > "$work/gen_dora.txt" 2>/dev/null
gen --model "$work/tiny_dora_merged" > "$work/gen_dora_merged.txt"
cmp -s "$work/gen_dora.txt" "$work/gen_dora_merged.txt" || fail "generate --adapter (DoRA) and its merged model differ"
cmp -s "$work/gen_dora.txt" "$work/gen_base.txt" && fail "the DoRA adapter does not change generation (vacuous test)"
# eval --adapter applies it unmerged, as training does: the loss of the merged model.
"$py" -c "print('\n'.join(f'line {i}: the quick brown fox jumps over {i * 7 % 13} lazy dogs' for i in range(60)))" > "$work/eval.txt"
ev() { "$shardlm" eval --data "$work/eval.txt" --seq-len 64 --quiet "$@" 2>&1 | tail -1 | sed 's/ ([0-9.]*s)$//'; }
ev_adapter=$(ev --model "$work/tiny" --adapter "$work/tiny_dora")
ev_merged=$(ev --model "$work/tiny_dora_merged")
[[ "$ev_adapter" == "$ev_merged" && "$ev_adapter" == eval:* ]] ||
  fail "eval --adapter (DoRA, unmerged) and eval of the merged model differ: '$ev_adapter' vs '$ev_merged'"
[[ "$ev_adapter" != "$(ev --model "$work/tiny")" ]] || fail "the DoRA adapter does not change the eval loss (vacuous test)"
echo "DoRA: eval --adapter (unmerged) == eval of the merged model: $ev_adapter"
echo "peft_cli: ok"
