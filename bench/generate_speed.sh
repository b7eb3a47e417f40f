#!/usr/bin/env bash
# Generation speed, shardlm against PyTorch eager with a KV cache (bench/torch_generate_bench.py),
# on the same model and machine, side by side in one run: prefill and decode tokens/s at batch 1
# and batch 8, greedy, one process, every core, for each dtype of DTYPES: shardlm
# `generate --dtype D` (bf16: weights and KV cache in bf16, f32 math) beside PyTorch with the model
# in D (bf16: transformers' torch_dtype=torch.bfloat16), then shardlm's bf16 speed over its f32 one.
# DTYPES may name q8_0 (the decoder's Linear weights in ggml's Q8_0): shardlm alone, over its bf16.
#   [BASELINE=OTHER_BUILD/shardlm] bench/generate_speed.sh [NEW_TOKENS=16] [WORKDIR=/tmp/shardlm_generate_speed] [MODEL_DIR] [DTYPES="f32 bf16"]
# BASELINE: another build's binary, run right after this one on each batch and dtype (shardlm alone; f32
# and bf16, not q8_0), and this build's decode over the baseline's.
# Model (default): Llama 3.2 1B's shape cut to 4 layers (506M parameters, vocab 128256, tied), f32,
# random weights, with the Llama 3 tokenizer from ../shared/data (the prompts are text for shardlm;
# PyTorch gets random ids of the same count). Prompts: one English line of ~130 tokens, B times.
# Decode tokens/s = B x (NEW_TOKENS - 1) over the decode steps' time (the first new token comes from
# the prefill), on both sides. Each line carries the 1-minute load average when it was measured.
# SHARDLM_CPU_BF16=0 in the environment sends shardlm's bf16 prefill through the f32 fallback
# instead of oneDNN (ops/cpu_bf16.h); decode steps take the skinny kernel either way.
set -euo pipefail
cd "$(dirname "$0")/.."
new=${1:-16}
work=${2:-/tmp/shardlm_generate_speed}
model=${3:-}
dtypes=${4:-f32 bf16}
shardlm=build/shardlm
threads=$(nproc --all)
export OMP_NUM_THREADS=$threads
mkdir -p "$work"
if [[ -z "$model" ]]; then
  model=$work/model
  [[ -f "$model/config.json" ]] ||
    "$shardlm" init --preset llama3.2-1b --out "$model" --set num_hidden_layers=4 >/dev/null
  cp ../shared/data/llama3_tokenizer.model "$model/tokenizer.model"
fi
line="The committee met on a grey morning in early spring to settle, at last, the question of where the new"
line="$line library should stand: by the river, where the old mill had burned, or on the hill above the"
line="$line market, where the children of the town could reach it on foot. Each member had come with maps,"
line="$line letters from neighbours, and a list of costs that did not agree with anyone else's list."
load() { cut -d' ' -f1 /proc/loadavg; }
ratio() { /usr/bin/python3 -c "print(f'{$1 / $2:.2f}')"; }
echo "generate_speed: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $threads cores;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC'); $new new tokens, greedy; $model"
# run_shardlm BINARY BATCH DTYPE TAG: one generation; prints prompt tokens, prefill and decode tok/s.
run_shardlm() {
  local out=$work/out_$2_$3_$4.jsonl
  "$1" generate --model "$model" --prompts "$work/prompts_$2.txt" --batch-size "$2" --dtype "$3" \
    --max-new-tokens "$new" --temperature 0 --prefill-chunk 0 --output "$out" 2>"$work/generate_$2_$3_$4.log"
  /usr/bin/python3 - "$out" "$2" "$new" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
batch, new = int(sys.argv[2]), int(sys.argv[3])
assert all(r["completion_tokens"] == new for r in rows), "a request stopped early"
p = rows[0]["prompt_tokens"]
# --prefill-chunk 0: the B prompts are prefilled together in the first step (each request's
# prefill_seconds is that step), and every later step is decode only.
prefill = sum(r["prompt_tokens"] for r in rows) / max(r["prefill_seconds"] for r in rows)
decode = batch * (new - 1) / max(r["decode_seconds"] for r in rows)
print(p, f"{prefill:.1f}", f"{decode:.2f}")
PY
}
declare -A decode_of
for batch in 1 8; do
  : > "$work/prompts_$batch.txt"
  for _ in $(seq "$batch"); do echo "$line" >> "$work/prompts_$batch.txt"; done
  for dtype in $dtypes; do
    read -r prompt_tokens prefill decode < <(run_shardlm "$shardlm" "$batch" "$dtype" new)
    shardlm_load=$(load)
    decode_of[$batch,$dtype]=$decode
    if [[ $dtype == q8_0 ]]; then  # PyTorch eager has no q8_0 Linear of its own: shardlm alone
      echo "batch $batch, $dtype, $prompt_tokens prompt tokens: prefill shardlm $prefill tok/s; decode shardlm" \
        "$decode tok/s; load $shardlm_load"
      continue
    fi
    torch_json=$(/usr/bin/python3 bench/torch_generate_bench.py "$model" --batch "$batch" --dtype "$dtype" \
      --prompt-tokens "$prompt_tokens" --new-tokens "$new" --threads "$threads")
    read -r tprefill tdecode < <(echo "$torch_json" | /usr/bin/python3 -c \
      "import json,sys; r=json.load(sys.stdin); print(r['prefill_tokens_per_s'], r['decode_tokens_per_s'])")
    echo "batch $batch, $dtype, $prompt_tokens prompt tokens: prefill shardlm $prefill tok/s, PyTorch $tprefill tok/s" \
      "($(ratio "$prefill" "$tprefill")x); decode shardlm $decode tok/s, PyTorch $tdecode tok/s" \
      "($(ratio "$decode" "$tdecode")x); load $shardlm_load / $(load)"
    if [[ -n "${BASELINE:-}" ]]; then  # the same generation by another build, right after
      read -r _ bprefill bdecode < <(run_shardlm "$BASELINE" "$batch" "$dtype" baseline)
      echo "batch $batch, $dtype: baseline $BASELINE: prefill $bprefill tok/s, decode $bdecode tok/s;" \
        "this build's decode / the baseline's = $(ratio "$decode" "$bdecode")x; load $(load)"
    fi
  done
  if [[ -n "${decode_of[$batch,f32]:-}" && -n "${decode_of[$batch,bf16]:-}" ]]; then
    echo "batch $batch: shardlm decode bf16 / f32 = $(ratio "${decode_of[$batch,bf16]}" "${decode_of[$batch,f32]}")x"
  fi
  if [[ -n "${decode_of[$batch,q8_0]:-}" && -n "${decode_of[$batch,bf16]:-}" ]]; then
    echo "batch $batch: shardlm decode q8_0 / bf16 = $(ratio "${decode_of[$batch,q8_0]}" "${decode_of[$batch,bf16]}")x"
  fi
done
