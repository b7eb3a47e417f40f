#!/usr/bin/env bash
# `shardlm generate --device-map` (docs/generation.md): a model's layers split over ranks.
#  1. on 2 and 3 ranks (shardlm launch), balanced, sequential and balanced_low_0 with a
#     --max-memory-per-rank that forces a known split, the placement printed is the expected one and
#     the tokens equal the single-process run's, greedy and sampled; so do a --prompts batch, a
#     tied-embedding model (the head's rank loads its own copy of the matrix), --adapter (each rank
#     merges its own layers' adapters), --load-in-4bit with and without it, and more ranks than
#     layers (the extra rank holds nothing); and --dtype bf16, whose sizes are half (the same split
#     at half the --max-memory-per-rank), with 4-bit loading and an adapter merged before rounding;
#  2. --device-map in one process: everything on rank 0, the same tokens;
#  3. bad values: an unknown --device-map, a malformed or too small --max-memory-per-rank, and
#     --max-memory-per-rank without --device-map are each one line and a non-zero exit;
#  4. serve --device-map on 2 ranks: a completion with logprobs and echo (prompt logprobs) equals the
#     single-process server's (every logprob within 1e-5), and so do a streamed completion and one
#     request of 4 prompts decoded together; SIGTERM ends every rank.
# Usage: device_map_cli.sh SHARDLM PEFT_TOOL WORKDIR PYTHON
set -euo pipefail
shardlm=$1
tool=$2
work=$3
py=$4
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One thread everywhere, so the single process and every rank run the same BLAS blocking.
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }

# tiny with 8 layers: embedding 131072 bytes (f32), each layer 181760, head 131328.
# (seed 3: greedy decoding of these random weights neither stops at once nor repeats one byte.)
"$shardlm" init --preset tiny --set num_hidden_layers=8 --seed 3 --out "$work/m" >/dev/null

gen() {  # gen NAME ARGS...: one process
  local name=$1
  shift
  "$shardlm" generate --model "$work/m" --max-new-tokens 12 "$@" > "$work/$name.out" 2> "$work/$name.err" ||
    fail "$name: $(cat "$work/$name.err")"
}
split() {  # split NAME RANKS ARGS...: through shardlm launch
  local name=$1 ranks=$2
  shift 2
  "$shardlm" launch --nproc-per-node "$ranks" --threads-per-rank 1 -- generate --model "$work/m" --max-new-tokens 12 \
    "$@" > "$work/$name.out" 2> "$work/$name.err" || fail "$name: $(cat "$work/$name.err")"
}
same() {  # same A B: identical stdout
  cmp -s "$work/$1.out" "$work/$2.out" || fail "$2 differs from $1: $(cat "$work/$2.out") vs $(cat "$work/$1.out")"
  echo "$2 = $1: $(head -c 120 "$work/$2.out" | tr '\n' ' ')"
}
placed() {  # placed NAME LINE...: the placement lines printed, in order
  local name=$1
  shift
  local got
  got=$(grep -o 'generate:   rank [0-9]*: [^;(]*' "$work/$name.err" | sed 's/generate:   //' | paste -sd'|')
  local want
  want=$(printf '%s\n' "$@" | paste -sd'|')
  [[ "$got" == "$want" ]] || fail "$name: placement '$got', expected '$want'"
  echo "$name placement: $got"
}

# ---- 1. split over ranks equals one process ----
gen one --prompt "hello" --temperature 0
[[ $(wc -c < "$work/one.out") -gt 10 ]] || fail "nothing generated (vacuous test): $(cat "$work/one.out")"
split bal2 2 --prompt "hello" --temperature 0 --device-map balanced
same one bal2
# 8 layers: 1716480 bytes / 2 + 1.25 x 181760 = 1085440 on rank 0, less one layer kept for the
# largest part to come (as accelerate keeps it): the embedding and 4 layers.
placed bal2 "rank 0: embedding, layers 0-3" "rank 1: layers 4-7, head"
split auto2 2 --prompt "hello" --temperature 0 --device-map auto
same one auto2
placed auto2 "rank 0: embedding, layers 0-3" "rank 1: layers 4-7, head"
split bal3 3 --prompt "hello" --temperature 0 --device-map balanced
same one bal3
# 1716480 / 3 + 227200 = 799360 per rank; rank 0 keeps 181760 of it.
placed bal3 "rank 0: embedding, layers 0-1" "rank 1: layers 2-5" "rank 2: layers 6-7, head"
split seq2 2 --prompt "hello" --temperature 0 --device-map sequential --max-memory-per-rank 1100KB
same one seq2
placed seq2 "rank 0: embedding, layers 0-3" "rank 1: layers 4-7, head"
split seq3 3 --prompt "hello" --temperature 0 --device-map sequential --max-memory-per-rank 700KB
same one seq3
placed seq3 "rank 0: embedding, layers 0-1" "rank 1: layers 2-4" "rank 2: layers 5-7, head"
split low3 3 --prompt "hello" --temperature 0 --device-map balanced_low_0 --max-memory-per-rank 900KB
same one low3
placed low3 "rank 0: nothing" "rank 1: embedding, layers 0-3" "rank 2: layers 4-7, head"

# Sampled: the same logits on every rank, so the same draws.
gen sampled --prompt "hello" --temperature 0.9 --top-k 50 --seed 11
split sampled2 2 --prompt "hello" --temperature 0.9 --top-k 50 --seed 11 --device-map balanced
same sampled sampled2

# A batch of prompts (continuous batching through the pipeline): results equal but for the timings.
printf '%s\n' '{"prompt": "one"}' '{"prompt": "two two", "temperature": 0.7, "seed": 3}' \
  '{"prompt": "three", "max_new_tokens": 5}' '{"prompt": "four four four"}' > "$work/p.jsonl"
strip() { /usr/bin/python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); r.pop("prefill_seconds"); r.pop("decode_seconds"); print(json.dumps(r))' "$work/$1.out" > "$work/$1.cmp"; }
gen batch1 --prompts "$work/p.jsonl" --batch-size 2 --temperature 0
split batch3 3 --prompts "$work/p.jsonl" --batch-size 2 --temperature 0 --device-map sequential --max-memory-per-rank 700KB
strip batch1
strip batch3
cmp -s "$work/batch1.cmp" "$work/batch3.cmp" || fail "--prompts on 3 ranks: $(cat "$work/batch3.cmp") vs $(cat "$work/batch1.cmp")"
[[ $(wc -l < "$work/batch3.cmp") -eq 4 ]] || fail "--prompts on 3 ranks: expected 4 results, got $(cat "$work/batch3.out")"
echo "--prompts on 3 ranks = one process (4 results)"

# --load-in-4bit: each rank quantizes its own layers.
gen q4 --prompt "hello" --temperature 0 --load-in-4bit
split q4split 2 --prompt "hello" --temperature 0 --load-in-4bit --device-map balanced
same q4 q4split
grep -q "generate: rank 1: --load-in-4bit: 28 Linear weights" "$work/q4split.err" ||
  fail "rank 1 did not quantize its 4 layers' 28 Linear weights: $(cat "$work/q4split.err")"

# --adapter: a PEFT LoRA on every Linear; each rank merges the adapters of its own layers.
"$tool" make-adapter "$work/m" "$work/lora" --rank 4 --alpha 8 --targets all-linear --seed 1 --std 0.2 >/dev/null
gen lora1 --prompt "hello" --temperature 0 --adapter "$work/lora"
cmp -s "$work/one.out" "$work/lora1.out" && fail "the adapter does not change generation (vacuous test)"
split lora2 2 --prompt "hello" --temperature 0 --adapter "$work/lora" --device-map balanced
same lora1 lora2
grep -q "generate: rank 1: LoRA adapter .* merged in memory (28 weights" "$work/lora2.err" ||
  fail "rank 1 did not merge its 4 layers' 28 adapters: $(cat "$work/lora2.err")"
gen qlora1 --prompt "hello" --temperature 0 --adapter "$work/lora" --load-in-4bit
split qlora3 3 --prompt "hello" --temperature 0 --adapter "$work/lora" --load-in-4bit --device-map balanced
same qlora1 qlora3

# Tied embeddings: the head's rank needs the matrix too, and counts it.
# (initializer_range 0.2: with the default 0.02 a tied random model only repeats its input.)
"$shardlm" init --preset tiny --set num_hidden_layers=8 --set tie_word_embeddings=true --set initializer_range=0.2 \
  --seed 3 --out "$work/tied" >/dev/null
"$shardlm" generate --model "$work/tied" --prompt "hello" --max-new-tokens 12 --temperature 0 > "$work/tied1.out" 2>/dev/null
[[ $(wc -c < "$work/tied1.out") -gt 10 ]] || fail "tied: nothing generated (vacuous test): $(cat "$work/tied1.out")"
"$shardlm" launch --nproc-per-node 2 --threads-per-rank 1 -- generate --model "$work/tied" --prompt "hello" --max-new-tokens 12 \
  --temperature 0 --device-map balanced > "$work/tied2.out" 2> "$work/tied2.err" || fail "tied: $(cat "$work/tied2.err")"
same tied1 tied2
# 1585408 / 2 + 227200 = 1019904 on rank 0, less a layer kept: embedding + 3 layers; rank 1:
# 5 layers + norm + the matrix again = 908800 + 256 + 131072 = 1040128 bytes.
placed tied2 "rank 0: embedding, layers 0-2" "rank 1: layers 3-7, head"
grep -q "rank 1: layers 3-7, head; .* (1040128 bytes)" "$work/tied2.err" || fail "tied: rank 1's bytes: $(cat "$work/tied2.err")"

# More ranks than layers: a 1-layer model on 4 ranks of 200 KB, sequential: rank 0 cannot hold the
# embedding beside the layer it keeps room for, so it holds nothing, and the embedding, the layer
# and the head each go to a rank of their own (the pipeline starts at rank 1).
"$shardlm" init --preset tiny --set num_hidden_layers=1 --seed 7 --out "$work/one" >/dev/null
"$shardlm" generate --model "$work/one" --prompt "x" --max-new-tokens 8 --temperature 0 > "$work/l1.out" 2>/dev/null
"$shardlm" launch --nproc-per-node 4 --threads-per-rank 1 -- generate --model "$work/one" --prompt "x" --max-new-tokens 8 \
  --temperature 0 --device-map sequential --max-memory-per-rank 200KB > "$work/l4.out" 2> "$work/l4.err" ||
  fail "1 layer on 4 ranks: $(cat "$work/l4.err")"
same l1 l4
placed l4 "rank 0: nothing" "rank 1: embedding" "rank 2: layer 0" "rank 3: head"

# --dtype bf16: every size halves, so half the memory per rank places the layers as seq3 did in f32;
# the tokens equal the single bf16 process's, with 4-bit loading and an adapter too.
gen b1 --prompt "hello" --temperature 0 --dtype bf16
split b3 3 --prompt "hello" --temperature 0 --dtype bf16 --device-map sequential --max-memory-per-rank 350KB
same b1 b3
placed b3 "rank 0: embedding, layers 0-1" "rank 1: layers 2-4" "rank 2: layers 5-7, head"
grep -q "rank 2: layers 5-7, head; .* (338304 bytes)" "$work/b3.err" || fail "bf16: rank 2's bytes: $(cat "$work/b3.err")"
gen bq1 --prompt "hello" --temperature 0 --dtype bf16 --adapter "$work/lora" --load-in-4bit
split bq2 2 --prompt "hello" --temperature 0 --dtype bf16 --adapter "$work/lora" --load-in-4bit --device-map balanced
same bq1 bq2
grep -q "generate: rank 1: weights rounded to bf16" "$work/bq2.err" || fail "bf16: rank 1 did not say: $(cat "$work/bq2.err")"

# ---- 2. one process ----
gen dm1 --prompt "hello" --temperature 0 --device-map balanced_low_0
same one dm1
placed dm1 "rank 0: embedding, layers 0-7, head"

# ---- 3. bad values: one line, non-zero ----
bad() {  # bad WHAT EXPECTED ARGS...
  local what=$1 expected=$2
  shift 2
  if "$shardlm" generate --model "$work/m" --prompt "x" "$@" > "$work/bad.out" 2> "$work/bad.err"; then
    fail "$what was accepted"
  fi
  echo "$what: $(cat "$work/bad.err")"
  [[ $(wc -l < "$work/bad.err") -eq 1 ]] || fail "$what: not one line"
  grep -q -- "$expected" "$work/bad.err" || fail "$what: does not say '$expected'"
}
bad "--device-map balance" "key '--device-map': unknown device map 'balance'" --device-map balance
bad "--max-memory-per-rank 20XB" "key '--max-memory-per-rank': invalid size '20XB'" --device-map auto --max-memory-per-rank 20XB
bad "--max-memory-per-rank 100KB" "key '--max-memory-per-rank': the embedding needs" --device-map sequential \
  --max-memory-per-rank 100KB
bad "--max-memory-per-rank 0" "key '--max-memory-per-rank': must be more than 0" --device-map auto --max-memory-per-rank 0
bad "--max-memory-per-rank alone" "applies only with --device-map" --max-memory-per-rank 1GB

# ---- 4. serve --device-map ----
source "$(dirname "$0")/serve_common.sh"
"$shardlm" serve --model "$work/m" --port 0 --max-len 64 2> "$work/serve.err" &
pid=$!
wait_listening serve
ask_server serve1
kill -TERM "$pid"; wait "$pid" || fail "serve did not exit cleanly"; pid=
"$shardlm" launch --nproc-per-node 2 --threads-per-rank 1 -- serve --model "$work/m" --port 0 --max-len 64 \
  --device-map balanced 2> "$work/serve.err" &
pid=$!
wait_listening "serve --device-map balanced"
ask_server serve2
kill -TERM "$pid"; wait "$pid" || fail "serve --device-map did not exit cleanly (SIGTERM)"; pid=
grep -a -q "serve: device map over 2 ranks (this one serves HTTP)" "$work/serve.err" &&
  grep -a -q "serve:   rank 1: layers 4-7, head" "$work/serve.err" || fail "serve --device-map did not say how it is split"
"$py" "$(dirname "$0")/same_completions.py" "$work" serve1 serve2 "--device-map on 2 ranks" ||
  fail "serve --device-map on 2 ranks differs from one process"
echo "device_map_cli: all passed"
