#!/usr/bin/env bash
# `shardlm generate/serve --tensor-parallel N` (docs/generation.md): every layer split over ranks.
#  1. generate on 2 ranks (shardlm launch) gives the single process's tokens, greedy and sampled,
#     for one streamed prompt and a --prompts batch of different lengths (continuous batching), on a
#     GQA model (4 query heads, 2 key-value heads: one kv head per rank), a tied-embedding model,
#     with --adapter and --load-in-4bit (merged / rounded whole, then sliced), a bitsandbytes NF4
#     directory (double-quantized; each rank dequantizes its slices), and on 4 ranks (an MHA
#     model: 4 kv heads); with --dtype bf16 and --dtype q8_0;
#  2. serve on 2 ranks: a completion with logprobs equals the single-process server's (the text,
#     and every logprob within 1e-5: the logits, all-reduced in another order), streamed too; a
#     request of 4 prompts into a KV cache of 12 blocks preempts on both and gives the same texts
#     (rank 0 tells the followers which blocks were given back); SIGTERM ends every rank (exit 0);
#  3. impossible splits are one-line errors naming the flag or the config key, non-zero, no hang.
# Usage: tensor_parallel_cli.sh SHARDLM PEFT_TOOL PYTHON WORKDIR TORCH_REF_DIR
set -euo pipefail
shardlm=$1
tool=$2
py=$3
work=$4
torch_ref=$5
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One thread everywhere, so the single process and every rank run the same BLAS blocking.
export OMP_NUM_THREADS=1
source "$(dirname "$0")/serve_common.sh"

# tiny: hidden 64, 4 heads, 2 kv heads, intermediate 172, vocab 512, 2 layers.
# (seed 3: greedy decoding of these random weights neither stops at once nor repeats one byte.)
"$shardlm" init --preset tiny --seed 3 --out "$work/m" >/dev/null
"$shardlm" init --preset tiny --set tie_word_embeddings=true --set initializer_range=0.2 --seed 3 --out "$work/tied" >/dev/null
"$shardlm" init --preset tiny --set num_key_value_heads=4 --seed 3 --out "$work/mha" >/dev/null

gen() {  # gen NAME MODEL ARGS...: one process
  local name=$1 model=$2
  shift 2
  "$shardlm" generate --model "$work/$model" --max-new-tokens 12 "$@" > "$work/$name.out" 2> "$work/$name.err" ||
    fail "$name: $(cat "$work/$name.err")"
}
tp() {  # tp NAME RANKS MODEL ARGS...: --tensor-parallel RANKS through shardlm launch
  local name=$1 ranks=$2 model=$3
  shift 3
  timeout 60 "$shardlm" launch --nproc-per-node "$ranks" --threads-per-rank 1 -- generate --model "$work/$model" \
    --max-new-tokens 12 --tensor-parallel "$ranks" "$@" > "$work/$name.out" 2> "$work/$name.err" ||
    fail "$name: $(cat "$work/$name.err")"
}
strip() {  # the JSON lines of a --prompts run without their timings
  "$py" -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); r.pop("prefill_seconds", None); r.pop("decode_seconds", None); print(json.dumps(r))' "$work/$1.out" > "$work/$1.cmp"
}
same() {  # same A B: identical stdout (JSON lines: but for the timings)
  if [[ $(head -c 1 "$work/$1.out") == "{" ]]; then
    strip "$1"; strip "$2"
    cmp -s "$work/$1.cmp" "$work/$2.cmp" || fail "$2 differs from $1: $(cat "$work/$2.cmp") vs $(cat "$work/$1.cmp")"
  else
    cmp -s "$work/$1.out" "$work/$2.out" || fail "$2 differs from $1: $(cat "$work/$2.out") vs $(cat "$work/$1.out")"
  fi
  echo "$2 = $1: $(head -c 100 "$work/$2.out" | tr '\n' ' ')"
}

# ---- 1. generate ----
gen one m --prompt "hello" --temperature 0
[[ $(wc -c < "$work/one.out") -gt 10 ]] || fail "nothing generated (vacuous test): $(cat "$work/one.out")"
tp tp2 2 m --prompt "hello" --temperature 0
same one tp2
grep -q "tensor parallel over 2 ranks: 2 of 4 attention heads, 1 of 2 key-value heads" "$work/tp2.err" ||
  fail "no split line: $(cat "$work/tp2.err")"
gen sampled m --prompt "hello" --temperature 0.9 --top-k 50 --seed 11
tp sampled2 2 m --prompt "hello" --temperature 0.9 --top-k 50 --seed 11
same sampled sampled2

printf '%s\n' '{"prompt": "one"}' '{"prompt": "two two two two two two", "temperature": 0.7, "seed": 3}' \
  '{"prompt": "three", "max_new_tokens": 5}' '{"prompt": "four four four four four four four four four four"}' \
  '{"prompt": "5"}' > "$work/p.jsonl"
gen batch1 m --prompts "$work/p.jsonl" --batch-size 3 --temperature 0
tp batch2 2 m --prompts "$work/p.jsonl" --batch-size 3 --temperature 0
same batch1 batch2
[[ $(wc -l < "$work/batch2.cmp") -eq 5 ]] || fail "--prompts on 2 ranks: expected 5 results, got $(cat "$work/batch2.out")"

gen tied1 tied --prompt "hello" --temperature 0
[[ $(wc -c < "$work/tied1.out") -gt 10 ]] || fail "tied: nothing generated (vacuous test): $(cat "$work/tied1.out")"
tp tied2 2 tied --prompt "hello" --temperature 0
same tied1 tied2

"$tool" make-adapter "$work/m" "$work/lora" --rank 4 --alpha 8 --targets all-linear --seed 1 --std 0.2 >/dev/null
gen lora1 m --prompt "hello" --temperature 0 --adapter "$work/lora" --load-in-4bit
cmp -s "$work/one.out" "$work/lora1.out" && fail "the adapter does not change generation (vacuous test)"
tp lora2 2 m --prompt "hello" --temperature 0 --adapter "$work/lora" --load-in-4bit
same lora1 lora2
# bf16 weights and KV cache (--dtype bf16), with chunked prefill mixing the batch's decode rows and
# prompt chunks in one step (--prefill-chunk 4), and the adapter merged in f32 before the split.
gen bf16one m --prompts "$work/p.jsonl" --batch-size 3 --temperature 0 --dtype bf16 --prefill-chunk 4 --adapter "$work/lora"
tp bf16two 2 m --prompts "$work/p.jsonl" --batch-size 3 --temperature 0 --dtype bf16 --prefill-chunk 4 --adapter "$work/lora"
same bf16one bf16two
# q8_0 Linear weights (--dtype q8_0): each rank quantizes its slices, whose blocks are the whole
# weight's (o_proj's 32 columns per rank are one block; down_proj's 86 are not whole blocks and stay
# bf16 on both, as its 172 do in one process).
gen q8one m --prompts "$work/p.jsonl" --batch-size 3 --temperature 0 --dtype q8_0 --prefill-chunk 4
tp q8two 2 m --prompts "$work/p.jsonl" --batch-size 3 --temperature 0 --dtype q8_0 --prefill-chunk 4
same q8one q8two
grep -q "12 Linear weights quantized to q8_0" "$work/q8one.err" || fail "q8one: no q8_0 weights: $(cat "$work/q8one.err")"
grep -q "12 Linear weights quantized to q8_0" "$work/q8two.err" || fail "q8two: no q8_0 weights: $(cat "$work/q8two.err")"

# A bitsandbytes NF4 directory (double quantization) as transformers saves it, made from m by
# tests/torch_ref/nf4_reference.py's quantizer (as bnb_cli.sh does).
"$py" - "$torch_ref" "$work/m" "$work/nf4" <<'PY'
import json, os, shutil, sys
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
import nf4_reference as R
from safetensors_check import load, save
base, out = sys.argv[2], sys.argv[3]
os.makedirs(out)
tensors = {}
for name, w in load(os.path.join(base, "model.safetensors")).items():
    w = torch.as_tensor(np.asarray(w)).to(torch.bfloat16)
    if name.split(".")[-2].endswith("_proj"):
        packed, absmax = R.quantize_nf4(w.float().numpy().reshape(-1))
        tensors.update(R._quant_state_tensors(name, list(w.shape), "bfloat16", packed, absmax, True)[0])
    else:
        tensors[name] = w
save(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"})
for f in os.listdir(base):
    if f != "model.safetensors":
        shutil.copy(os.path.join(base, f), out)
config = json.load(open(os.path.join(out, "config.json")))
config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                 "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
PY
gen nf4one nf4 --prompts "$work/p.jsonl" --batch-size 3 --temperature 0
grep -q "is bitsandbytes NF4" "$work/nf4one.err" || fail "nf4: not read as NF4: $(cat "$work/nf4one.err")"
tp nf4two 2 nf4 --prompts "$work/p.jsonl" --batch-size 3 --temperature 0
same nf4one nf4two

gen mha1 mha --prompts "$work/p.jsonl" --batch-size 4 --temperature 0
tp mha4 4 mha --prompts "$work/p.jsonl" --batch-size 4 --temperature 0
same mha1 mha4

# ---- 2. serve ----
ask() {  # ask NAME: ask_server's answers, the 4 prompts of up to 10 blocks each into a KV cache of
  # 12 blocks of 4 positions: the newest are preempted and recomputed (on every rank the same
  # blocks are given back); then /health
  ask_server "$1" 20
  curl -sf "http://127.0.0.1:$port/health" > "$work/$1.health" || fail "$1: /health failed"
}
# Per rank: a block of 4 positions holds K and V of 2 layers and (kv heads / ranks) x 16 values.
kv_limit() { echo $((12 * 2 * 2 * 4 * (2 / $1) * 16 * 4)); }
"$shardlm" serve --model "$work/m" --port 0 --max-batch 4 --max-len 40 --kv-block-size 4 \
  --kv-cache-memory "$(kv_limit 1)" 2> "$work/serve.err" &
pid=$!
wait_listening serve
ask serve1
kill -TERM "$pid"; wait "$pid" || fail "serve did not exit cleanly"; pid=
"$shardlm" launch --nproc-per-node 2 --threads-per-rank 1 -- serve --model "$work/m" --port 0 --max-batch 4 \
  --max-len 40 --kv-block-size 4 --kv-cache-memory "$(kv_limit 2)" --tensor-parallel 2 2> "$work/serve.err" &
pid=$!
wait_listening "serve --tensor-parallel 2"
ask serve2
kill -TERM "$pid"; wait "$pid" || fail "serve --tensor-parallel 2 did not exit cleanly (SIGTERM)"; pid=
"$py" "$(dirname "$0")/same_completions.py" "$work" serve1 serve2 "on 2 tensor-parallel ranks" ||
  fail "serve on 2 ranks differs from one process"
"$py" - "$work" <<'PY'
import json, sys
for k in (1, 2):
    kv = json.load(open(f"{sys.argv[1]}/serve{k}.health"))["kv_cache"]
    assert kv["blocks_capacity"] == 12 and kv["blocks_in_use"] == 0 and kv["blocks_made"] <= 12, kv
    assert kv["preemptions"] > 0, f"serve{k}: 4 prompts of up to 10 blocks in 12: expected preemptions, {kv}"
print(f"4 prompts at once into 12 KV blocks: the same texts, {kv['preemptions']} preemptions on 2 ranks")
PY

# ---- 3. impossible splits ----
bad() {  # bad WHAT EXPECTED COMMAND...: one line (besides launch's own), non-zero, in time
  local what=$1 expected=$2
  shift 2
  if timeout 60 "$shardlm" "$@" > "$work/bad.out" 2>&1; then fail "$what was accepted"; fi
  grep -v '^shardlm launch: mpirun ' "$work/bad.out" > "$work/bad.err" || true
  echo "$what: $(cat "$work/bad.err")"
  [[ $(wc -l < "$work/bad.err") -eq 1 ]] || fail "$what: not one line"
  grep -q -- "$expected" "$work/bad.err" || fail "$what: does not say '$expected'"
}
L=(launch --nproc-per-node 4 --threads-per-rank 1 --)
bad "kv heads over 4" "key 'num_key_value_heads'" "${L[@]}" generate --model "$work/m" --prompt x --tensor-parallel 4
bad "serve: kv heads over 4" "key 'num_key_value_heads'" "${L[@]}" serve --model "$work/m" --port 0 --tensor-parallel 4
bad "2 of 4 ranks" "key '--tensor-parallel': --tensor-parallel 2 needs 2 ranks" "${L[@]}" generate --model "$work/m" \
  --prompt x --tensor-parallel 2
bad "one process" "key '--tensor-parallel': --tensor-parallel 2 needs 2 ranks" generate --model "$work/m" --prompt x \
  --tensor-parallel 2
bad "with --device-map" "key '--tensor-parallel': cannot be combined with --device-map" generate --model "$work/m" \
  --prompt x --tensor-parallel 2 --device-map auto
"$shardlm" init --preset tiny --set intermediate_size=171 --seed 3 --out "$work/odd" >/dev/null
bad "intermediate over 2" "key 'intermediate_size'" launch --nproc-per-node 2 --threads-per-rank 1 -- generate \
  --model "$work/odd" --prompt x --tensor-parallel 2
echo "tensor_parallel_cli: all passed"
