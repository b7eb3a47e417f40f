#!/usr/bin/env bash
# `shardlm export --format gguf` (issue 32; src/model/gguf_export.h) checked by an independent GGUF
# reader written from ggml's spec (tests/torch_ref/gguf_check.py): header, every key-value, tensor
# infos, alignment and offsets, every tensor dequantized against the safetensors weights (after
# undoing llama's q/k permutation), and the tokenizer against the tokenizer files.
#  A. Llama-3-style: Llama 3's tiktoken tokenizer (../shared/data), GQA 2:1, llama3 rope scaling
#     (rope_freqs), tied embeddings, stored bf16: --outtype bf16 (exact);
#  B. Llama-2-style: Llama 2's SentencePiece tokenizer, attention_bias (q/k biases permuted too),
#     GQA 4:2, stored f32: --outtype f32 (exact) and q8_0 (ffn_down's rows of 172 are
#     not a multiple of 32: F16, as llama.cpp's converter falls back); a Mistral config with a
#     sliding window: llama, --outtype f16 (f16 rounding), the window noted;
#  C. Qwen2-style: q/k/v biases, no permutation, a small byte-level BPE tokenizer.json with Qwen2's
#     pre-tokenizer, special tokens and a chat template, vocab padded to the model's: q8_0 and bf16
#     (the nearest bf16 of f32 weights);
#  D. refusals, one line and exit 1 naming the file or tensor, nothing written: no config.json, an
#     unsupported architecture, a tensor missing, a tensor mis-shaped, the output over an input
#     (a weights file, the directory), a model without tokenizer files, a BPE pre-tokenizer llama.cpp
#     does not know (Qwen2's regex with digits in pairs), a bitsandbytes 4-bit config, a bad --outtype
#     or --format;
#     a failed export leaves an existing output untouched.
# llama.cpp itself is not available here; the reader and this script are the check.
# Usage: gguf_export_cli.sh SHARDLM PYTHON SHARED_DATA WORKDIR
set -euo pipefail
shardlm=$1
py=$2
shared=$3
work=$4
check="$(cd "$(dirname "$0")/.." && pwd)/torch_ref/gguf_check.py"
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
[[ -f $shared/llama3_tokenizer.model && -f $shared/llama2_tokenizer.model ]] || { echo "SKIPPED: no $shared"; exit 77; }
# must_fail NAME PATTERN CMD...: CMD exits non-zero with one line on stderr matching PATTERN
must_fail() {
  local name=$1 pattern=$2 rc=0
  shift 2
  "$@" > "$work/$name.out" 2> "$work/$name.err" || rc=$?
  [[ $rc != 0 ]] || fail "$name: exit 0: $(cat "$work/$name.out")"
  [[ $(wc -l < "$work/$name.err") == 1 ]] || fail "$name: not one line: $(cat "$work/$name.err")"
  grep -qE -- "$pattern" "$work/$name.err" || fail "$name: expected /$pattern/: $(cat "$work/$name.err")"
}
x=("$shardlm" export --format gguf)

# ---- the models ----
"$shardlm" init --preset tiny --seed 1 --dtype bf16 --out "$work/l3" --set vocab_size=128256 --set rope_theta=500000 \
  --set hidden_size=32 --set num_attention_heads=2 --set num_key_value_heads=1 \
  --set tie_word_embeddings=true --set max_position_embeddings=131072 --set bos_token_id=128000 --set eos_token_id=128001 \
  --set 'rope_scaling={"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}' \
  >/dev/null
cp "$shared/llama3_tokenizer.model" "$work/l3/tokenizer.model"
"$shardlm" init --preset tiny --seed 2 --dtype f32 --out "$work/l2" --set vocab_size=32000 --set attention_bias=true >/dev/null
cp "$shared/llama2_tokenizer.model" "$work/l2/tokenizer.model"
"$shardlm" init --preset tiny --seed 3 --dtype f32 --out "$work/q2" --set model_type=qwen2 \
  --set 'architectures=["Qwen2ForCausalLM"]' --set tie_word_embeddings=true --set bos_token_id=456 --set eos_token_id=458 \
  >/dev/null
"$shardlm" init --preset tiny --seed 4 --dtype f32 --out "$work/ms" --set vocab_size=32000 --set model_type=mistral \
  --set hidden_size=32 --set num_attention_heads=2 --set num_key_value_heads=1 --set num_hidden_layers=1 \
  --set 'architectures=["MistralForCausalLM"]' --set sliding_window=128 >/dev/null
cp "$shared/llama2_tokenizer.model" "$work/ms/tokenizer.model"
"$py" "$check" prepare "$work" "$shared/gpt2_vocab.json" "$shared/gpt2_merges.txt"

# ---- A: Llama 3 ----
"${x[@]}" --outtype bf16 --name tiny-llama3 "$work/l3" "$work/l3-bf16.gguf" > "$work/l3-bf16.txt"
grep -q "^exported $work/l3 (llama, .*GGUF bf16, 21 tensors (15 BF16, 6 F32) with rope_freqs (Llama 3 rope scaling), q/k rows permuted for llama.cpp's RoPE; tokenizer gpt2 (llama-bpe): 128256 tokens, 280147 merges" \
  "$work/l3-bf16.txt" || fail "l3 bf16: $(cat "$work/l3-bf16.txt")"

# ---- B: Llama 2 ----
for t in f32 q8_0; do "${x[@]}" --outtype $t "$work/l2" "$work/l2-$t.gguf" > "$work/l2-$t.txt"; done
grep -q "^note: 2 weights have rows not a multiple of 32, which Q8_0 cannot store: written F16 (blk.0.ffn_down.weight blk.1.ffn_down.weight)" \
  "$work/l2-q8_0.txt" || fail "l2 q8_0 fallback note: $(cat "$work/l2-q8_0.txt")"
grep -q "tokenizer llama (SentencePiece): 32000 tokens" "$work/l2-f32.txt" || fail "l2: $(cat "$work/l2-f32.txt")"

# Mistral is llama too; its sliding window is not in the file, and the export says so.
"${x[@]}" --outtype f16 "$work/ms" "$work/ms-f16.gguf" > "$work/ms-f16.txt"
grep -q "^note: sliding_window 128 is not in the file" "$work/ms-f16.txt" || fail "mistral: $(cat "$work/ms-f16.txt")"

# ---- C: Qwen2 ----
"${x[@]}" --outtype q8_0 "$work/q2" "$work/q2-q8.gguf" > "$work/q2-q8.txt"
grep -q "(qwen2, .*q/k as stored (NEOX RoPE); tokenizer gpt2 (qwen2): 512 tokens, 200 merges" "$work/q2-q8.txt" \
  || fail "q2: $(cat "$work/q2-q8.txt")"
"${x[@]}" --outtype bf16 "$work/q2" "$work/q2-bf16.gguf" > /dev/null

# Every file read back and compared; and the reader must be able to fail: a copy of l2-f32 whose
# blk.1.attn_q rows were left as Hugging Face has them is caught on exactly that tensor.
"$py" "$check" check "$work/l3" "$work/l3-bf16.gguf" bf16 \
  "$work/l2" "$work/l2-f32.gguf" f32 "$work/l2" "$work/l2-q8_0.gguf" q8_0 \
  "$work/ms" "$work/ms-f16.gguf" f16 "$work/q2" "$work/q2-q8.gguf" q8_0 "$work/q2" "$work/q2-bf16.gguf" bf16 \
  --tamper "$work/l2" "$work/l2-f32.gguf" blk.1.attn_q.weight 4 > "$work/check.txt" \
  || fail "gguf_check: $(cat "$work/check.txt")"
[[ $(grep -c "^OK /" "$work/check.txt") == 6 ]] || fail "gguf_check: $(cat "$work/check.txt")"
grep -q "^OK caught: blk.1.attn_q.weight: values differ" "$work/check.txt" || fail "tamper: $(cat "$work/check.txt")"

# ---- D: refusals (on the small q2, and copies of it) ----
before=$(md5sum < "$work/q2-q8.gguf")
q2="$work/q2-q8.gguf"
mkdir -p "$work/empty"
must_fail noconfig "config.json" "${x[@]}" "$work/empty" "$q2"
cp -r "$work/q2" "$work/gpt2" && sed -i 's/"Qwen2ForCausalLM"/"GPT2LMHeadModel"/; s/"model_type": *"qwen2"/"model_type": "gpt2"/' "$work/gpt2/config.json"
must_fail arch "config.json.*(architecture|GPT2)" "${x[@]}" "$work/gpt2" "$q2"
must_fail drop "tensor 'model.layers.1.mlp.up_proj.weight'.*missing" "${x[@]}" "$work/drop" "$q2"
must_fail shape "model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight': shape \[2047\] in the file, but config.json implies \[32, 64\]" \
  "${x[@]}" "$work/shape" "$q2"
weights=$(md5sum < "$work/q2/model.safetensors")
must_fail overweights "the output is the weights file" "${x[@]}" "$work/q2" "$work/q2/model.safetensors"
must_fail overdir "is a directory" "${x[@]}" "$work/q2" "$work/q2"
must_fail overconfig "the output is the config.json" "${x[@]}" "$work/q2" "$work/q2/./config.json"
must_fail overtok "the output is the tokenizer.json" "${x[@]}" "$work/q2" "$work/q2/tokenizer.json"
[[ $(md5sum < "$work/q2/model.safetensors") == "$weights" ]] || fail "the weights file was touched"
cp -r "$work/q2" "$work/notok" && rm "$work/notok/tokenizer.json"
must_fail notok "no tokenizer" "${x[@]}" "$work/notok" "$q2"
cp -r "$work/q2" "$work/pre" && sed -i 's/p{N}| ?/p{N}{1,2}| ?/' "$work/pre/tokenizer.json"
must_fail pre "pre-tokenizer .*p\{N\}\{1,2\}.* is none llama.cpp knows by name" "${x[@]}" "$work/pre" "$q2"
cp -r "$work/q2" "$work/bnb" && "$py" -c '
import json, sys
p = sys.argv[1] + "/config.json"
c = json.load(open(p))
c["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
json.dump(c, open(p, "w"))' "$work/bnb"
must_fail bnb "bnb/config.json: key 'quantization_config': a bitsandbytes-quantized model" "${x[@]}" "$work/bnb" "$q2"
must_fail outtype "--outtype.*q4_0.*expected f32, f16, bf16 or q8_0" "${x[@]}" --outtype q4_0 "$work/q2" "$q2"
must_fail format "--format.*only export format is gguf" "$shardlm" export --format onnx "$work/q2" "$q2"
[[ $(md5sum < "$q2") == "$before" ]] || fail "a failed export changed the existing output"
ls "$work"/*.tmp.* 2>/dev/null && fail "a temporary file was left behind"
"$shardlm" export --help | grep -q "shardlm merge" || fail "export --help does not say to merge a LoRA first"
echo "gguf_export_cli: OK ($(grep -c '^OK /' "$work/check.txt") files checked)"
