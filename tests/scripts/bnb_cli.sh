#!/usr/bin/env bash
# Training from a directory saved by transformers with bitsandbytes 4-bit (issue 12), through the
# command line on 2 CPU ranks (FULL_SHARD, so each rank holds one chunk of every NF4 weight). A
# tiny random Llama with Llama 2's tokenizer is converted to bitsandbytes' layout by
# tests/torch_ref/nf4_reference.py's quantizer (plain, and double-quantized); the data is the
# Alpaca sample.
#  A. QLoRA on the plain directory with lora.double_quant left at true: the run follows the file
#     (one log line says so), keeps its NF4 states as stored and trains.
#  B. QLoRA on the double-quantized directory keeps it as stored, LoRA reads it dequantized: both
#     train on the same base bit for bit, so their loss lines are identical.
#  C. full fine-tuning from the double-quantized directory starts from its dequantization, trains,
#     and saves a plain model.
#  D. a bitsandbytes directory as the base of `merge`, `generate` and merge_on_save: read as
#     bitsandbytes dequantizes it, against a dense directory holding that dequantization (f32):
#     merge (default dtype: the quant_state's bf16) passes check-merged, merge_on_save writes the
#     same plain model, and `generate` (with and without --adapter) prints what it prints from the
#     dense directory and from the merged f32 model, one prompt or a batch; `generate --load-in-4bit`
#     on the bf16 base generates what the bitsandbytes directory does; all of it with --dtype bf16 too.
# Usage: bnb_cli.sh SHARDLM PYTHON SOURCE_DIR DATA_DIR WORKDIR
set -euo pipefail
shardlm=$1
py=$2
src=$3
data=$(cd "$4" && pwd)
work=$5
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }

"$shardlm" init --preset tiny --out "$work/base" --set vocab_size=32000 --set max_position_embeddings=512 \
  --set initializer_range=0.1 --dtype f32 >/dev/null
cp "$data/llama2_tokenizer.model" "$work/base/tokenizer.model"
# What transformers' save_pretrained writes for the model loaded with BitsAndBytesConfig(
# load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=NESTED) from bf16; with
# DENSE, also a plain directory of its dequantization (NF4 weights in f32 as bitsandbytes computes
# them before its final rounding, the rest as stored).
to_bnb() {
  "$py" - "$src/tests/torch_ref" "$work/base" "$1" "$2" "${3:-}" <<'PY'
import json, os, shutil, sys
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
import nf4_reference as R
from safetensors_check import load, save
base, out, nested, dense = sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
os.makedirs(out)
tensors, deq = {}, {}
for name, w in load(os.path.join(base, "model.safetensors")).items():
    w = torch.as_tensor(np.asarray(w)).to(torch.bfloat16)
    if name.split(".")[-2].endswith("_proj"):
        packed, absmax = R.quantize_nf4(w.float().numpy().reshape(-1))
        t, deq_absmax = R._quant_state_tensors(name, list(w.shape), "bfloat16", packed, absmax, nested)
        tensors.update(t)
        deq[name] = torch.from_numpy(R.dequantize_nf4(packed, deq_absmax, w.numel()).reshape(w.shape))
    else:
        tensors[name] = deq[name] = w
save(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
config = json.load(open(os.path.join(base, "config.json")))
if dense:
    os.makedirs(dense)
    save(os.path.join(dense, "model.safetensors"), deq, {"format": "pt"})
    json.dump(config, open(os.path.join(dense, "config.json"), "w"), indent=2)
    shutil.copy(os.path.join(base, "tokenizer.model"), dense)
config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                 "bnb_4bit_use_double_quant": nested, "bnb_4bit_compute_dtype": "bfloat16"}
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
shutil.copy(os.path.join(base, "tokenizer.model"), out)
PY
}
to_bnb "$work/bnb_plain" 0
to_bnb "$work/bnb_dq" 1 "$work/dense_dq"

# run NAME MODEL [lora: lines...]
run() {
  local name=$1 model=$2
  shift 2
  {
    cat <<YAML
model: $model
output_dir: $work/out_$name
seed: 1
compute_dtype: f32
data: {type: alpaca, train: $data/alpaca_en_demo.json, eval_fraction: 0.05, packing: true}
seq_len: 128
micro_batch_size: 2
max_steps: 3
optimizer: {lr: 1e-2}
eval_every: 0
eval_batches: 1
progress: lines
save_dtype: f32
sharding_strategy: FULL_SHARD
YAML
    for line in "$@"; do echo "$line"; done
  } > "$work/$name.yaml"
  "$shardlm" launch --nproc-per-node 2 -- train --config "$work/$name.yaml" > "$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; fail "the $name run failed"; }
  grep -E "^base: |^done: " "$work/$name.log"
}
lora=("lora:" "  rank: 4" "  alpha: 8" "  target_modules: all-linear")

# ---- A ----
run qlora_plain "$work/bnb_plain" "${lora[@]}" "  quantize_base: nf4"
grep -q "bnb_plain's NF4 weights (bitsandbytes 4-bit) kept as stored, not re-quantized; lora.double_quant: true overridden: the file is not double-quantized" \
  "$work/qlora_plain.log" || fail "QLoRA on a plain bitsandbytes directory did not say it follows the file"
grep -q "^base: Linear weights in NF4 (bitsandbytes' layout)," "$work/qlora_plain.log" ||
  fail "QLoRA on a plain bitsandbytes directory did not use the plain layout"

# ---- B ----
run qlora_dq "$work/bnb_dq" "${lora[@]}" "  quantize_base: nf4"
grep -q "bnb_dq's NF4 weights (bitsandbytes 4-bit) kept as stored, not re-quantized$" "$work/qlora_dq.log" ||
  fail "QLoRA on a double-quantized bitsandbytes directory did not keep it as stored"
run lora_dq "$work/bnb_dq" "${lora[@]}" "  merge_on_save: true"
grep -q "bnb_dq's NF4 weights (bitsandbytes 4-bit) dequantized as bitsandbytes does" "$work/lora_dq.log" ||
  fail "LoRA on a bitsandbytes directory did not say it dequantizes"
losses() { grep -o "loss [0-9.]* -> [0-9.]*; held-out loss [0-9.]* -> [0-9.]*" "$1"; }
[[ -n "$(losses "$work/qlora_dq.log")" && "$(losses "$work/qlora_dq.log")" == "$(losses "$work/lora_dq.log")" ]] ||
  fail "QLoRA on the stored states and LoRA on their dequantization differ"

# ---- C ----
run full_dq "$work/bnb_dq"
grep -q "dequantized as bitsandbytes does$" "$work/full_dq.log" || fail "full fine-tuning did not say it dequantizes"
[[ -f "$work/out_full_dq/model.safetensors" ]] && ! grep -q quantization_config "$work/out_full_dq/config.json" ||
  fail "full fine-tuning did not save a plain model"
# ---- D ----
adapter=$work/out_lora_dq/adapter
grep -q "merge_on_save: merged [0-9]* weights .*(merged into the dequantized NF4 weights of the bitsandbytes 4-bit base" \
  "$work/lora_dq.log" || fail "merge_on_save from a bitsandbytes directory did not say it merged into its dequantization"
"$shardlm" merge --base "$work/bnb_dq" --adapter "$adapter" --out "$work/merged" | tee "$work/merge.txt"
grep -q "(.* tensors in bf16)" "$work/merge.txt" || fail "merge did not default to the quant_state's dtype (bf16)"
grep -q "merged into the dequantized NF4 weights" "$work/merge.txt" || fail "merge did not say the base was NF4"
! grep -q quantization_config "$work/merged/config.json" || fail "the merged model kept quantization_config"
"$py" "$src/tests/torch_ref/peft_reference.py" check-merged "$work/dense_dq" "$adapter" "$work/merged"
"$shardlm" merge --base "$work/bnb_dq" --adapter "$adapter" --out "$work/merged_f32" --dtype f32 >/dev/null
"$py" "$src/tests/torch_ref/peft_reference.py" check-merged "$work/dense_dq" "$adapter" "$work/merged_f32"
"$py" "$src/tests/torch_ref/peft_reference.py" check-merged "$work/dense_dq" "$adapter" "$work/out_lora_dq/merged"
gen() { "$shardlm" generate --prompt "Give three tips" --max-new-tokens 24 --temperature 0 "$@" 2>/dev/null; }
gen --model "$work/bnb_dq" > "$work/gen_bnb.txt"
gen --model "$work/dense_dq" > "$work/gen_dense.txt"
cmp -s "$work/gen_bnb.txt" "$work/gen_dense.txt" || fail "generate on the bitsandbytes directory and on its dequantization differ"
gen --model "$work/bnb_dq" --adapter "$adapter" > "$work/gen_bnb_adapter.txt"
gen --model "$work/merged_f32" > "$work/gen_merged.txt"
cmp -s "$work/gen_bnb_adapter.txt" "$work/gen_merged.txt" || fail "generate --adapter on the bitsandbytes directory and the merged model differ"
# Batched, with the adapter: the bitsandbytes base gives what its dense dequantization gives.
printf 'Give three tips\nWhat is a llama?\n' > "$work/prompts.txt"
for b in bnb_dq dense_dq; do
  "$shardlm" generate --model "$work/$b" --adapter "$adapter" --prompts "$work/prompts.txt" --batch-size 2 \
    --max-new-tokens 12 --temperature 0 2>/dev/null | "$py" -c 'import json,sys; [print(json.dumps(json.loads(l)["text"])) for l in sys.stdin]' \
    > "$work/batch_$b.txt"
done
cmp -s "$work/batch_bnb_dq.txt" "$work/batch_dense_dq.txt" || fail "generate --prompts --adapter on the bitsandbytes directory and on its dequantization differ"
[[ $(wc -l < "$work/batch_bnb_dq.txt") -eq 2 ]] || fail "generate --prompts did not give 2 results"
# --load-in-4bit on the bf16 base (what bnb_dq was quantized from) quantizes as bitsandbytes did:
# it generates what the bitsandbytes directory generates, and not what the dense base does.
"$shardlm" init --preset tiny --out "$work/base_bf16" --set vocab_size=32000 --set max_position_embeddings=512 \
  --set initializer_range=0.1 --dtype bf16 >/dev/null
cp "$data/llama2_tokenizer.model" "$work/base_bf16/tokenizer.model"
gen --model "$work/base_bf16" --load-in-4bit > "$work/gen_4bit.txt"
gen --model "$work/base_bf16" > "$work/gen_bf16.txt"
cmp -s "$work/gen_4bit.txt" "$work/gen_bnb.txt" || fail "generate --load-in-4bit differs from generate on the bitsandbytes directory"
cmp -s "$work/gen_bf16.txt" "$work/gen_bnb.txt" && fail "the NF4 round trip does not change generation (vacuous test)"
echo "generate --load-in-4bit on the bf16 base == generate on the bitsandbytes directory"
# --dtype bf16 rounds the same dequantized (and merged) f32 values once: the same agreements hold.
gen --model "$work/bnb_dq" --dtype bf16 > "$work/gen_bnb_h.txt"
gen --model "$work/dense_dq" --dtype bf16 > "$work/gen_dense_h.txt"
gen --model "$work/base_bf16" --load-in-4bit --dtype bf16 > "$work/gen_4bit_h.txt"
gen --model "$work/bnb_dq" --adapter "$adapter" --dtype bf16 > "$work/gen_bnb_adapter_h.txt"
gen --model "$work/merged_f32" --dtype bf16 > "$work/gen_merged_h.txt"
cmp -s "$work/gen_bnb_h.txt" "$work/gen_dense_h.txt" || fail "--dtype bf16: the bitsandbytes directory and its dequantization differ"
cmp -s "$work/gen_4bit_h.txt" "$work/gen_bnb_h.txt" || fail "--dtype bf16: --load-in-4bit differs from the bitsandbytes directory"
cmp -s "$work/gen_bnb_adapter_h.txt" "$work/gen_merged_h.txt" || fail "--dtype bf16: --adapter on the bitsandbytes directory and the merged model differ"
echo "--dtype bf16: the bitsandbytes directory == its dequantization == --load-in-4bit; --adapter == merged"
echo "generate on bnb == dense: $(od -c "$work/gen_bnb.txt" | head -1 | tr -s ' ')"
echo "OK"
