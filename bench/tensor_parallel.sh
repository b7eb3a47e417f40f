#!/usr/bin/env bash
# Decode speed of `generate --tensor-parallel 2` (every layer split over 2 ranks, all computing at
# once) against one process, the same threads per rank (default 1), batch 1 and batch 8, greedy.
#   bench/tensor_parallel.sh [NEW_TOKENS=16] [WORKDIR=/tmp/shardlm_generate_speed] [THREADS_PER_RANK=1] [DTYPE=f32]
# DTYPE is generate's --dtype (f32 or bf16: weights and KV cache in bf16).
# Model: generate_speed.sh's (Llama 3.2 1B's shape cut to 4 layers, 506M parameters, vocab 128256,
# tied, f32, random weights, the Llama 3 tokenizer), made in WORKDIR if not there yet; the same
# prompts (~130 tokens each). Decode tokens/s = B x (NEW_TOKENS - 1) over the decode steps' time.
# Each figure is printed with the load average before it: on a shared machine, rerun when idle.
set -euo pipefail
cd "$(dirname "$0")/.."
new=${1:-16}
work=${2:-/tmp/shardlm_generate_speed}
threads=${3:-1}
dtype=${4:-f32}
shardlm=build/shardlm
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$work"
model=$work/model
[[ -f "$model/config.json" ]] || "$shardlm" init --preset llama3.2-1b --out "$model" --set num_hidden_layers=4 >/dev/null
cp ../shared/data/llama3_tokenizer.model "$model/tokenizer.model"
line="The committee met on a grey morning in early spring to settle, at last, the question of where the new"
line="$line library should stand: by the river, where the old mill had burned, or on the hill above the"
line="$line market, where the children of the town could reach it on foot. Each member had come with maps,"
line="$line letters from neighbours, and a list of costs that did not agree with anyone else's list."
echo "tensor_parallel: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc --all) cores;" \
  "$(date -u '+%Y-%m-%d %H:%M UTC'); $new new tokens, greedy, $dtype, $threads thread(s) per rank"
decode() {  # decode OUT BATCH: decode tokens/s of a results file
  /usr/bin/python3 - "$1" "$2" "$new" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
batch, new = int(sys.argv[2]), int(sys.argv[3])
assert len(rows) == batch and all(r["completion_tokens"] == new for r in rows), "a request stopped early"
print(f"{batch * (new - 1) / max(r['decode_seconds'] for r in rows):.2f}")
PY
}
for batch in 1 8; do
  : > "$work/prompts_$batch.txt"
  for _ in $(seq "$batch"); do echo "$line" >> "$work/prompts_$batch.txt"; done
  args=(--model "$model" --prompts "$work/prompts_$batch.txt" --batch-size "$batch" --max-new-tokens "$new"
        --dtype "$dtype" --temperature 0 --prefill-chunk 0)  # prompts prefilled in the first step; the rest is decode
  load1=$(cut -d' ' -f1 /proc/loadavg)
  OMP_NUM_THREADS=$threads "$shardlm" generate "${args[@]}" --output "$work/tp1_$batch.jsonl" 2>"$work/tp1_$batch.log"
  one=$(decode "$work/tp1_$batch.jsonl" "$batch")
  load2=$(cut -d' ' -f1 /proc/loadavg)
  "$shardlm" launch --nproc-per-node 2 --threads-per-rank "$threads" -- generate "${args[@]}" --tensor-parallel 2 \
    --output "$work/tp2_$batch.jsonl" 2>"$work/tp2_$batch.log"
  two=$(decode "$work/tp2_$batch.jsonl" "$batch")
  # The same greedy tokens, or the comparison is void.
  /usr/bin/python3 - "$work/tp1_$batch.jsonl" "$work/tp2_$batch.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["text"] for l in open(p)] for p in sys.argv[1:3])
assert a == b, "--tensor-parallel 2 generated other text than one process"
PY
  echo "batch $batch: decode 1 rank $one tok/s (load $load1), 2 ranks --tensor-parallel 2 $two tok/s (load $load2):" \
    "$(/usr/bin/python3 -c "print(f'{$two / $one:.2f}')")x"
done
