#!/usr/bin/env bash
# Fine-tuning through the command line on real data: a tiny Llama with Llama 2's SentencePiece
# tokenizer trains on the Alpaca sample (packed, prompt masked); the held-out loss must fall by a
# fifth, the saved directory must carry the tokenizer, and generate must continue a prompt. The
# config's own data (the sample in data/) must fill a global batch with this tokenizer.
# Usage: alpaca_llama2.sh SHARDLM DATA_DIR WORKDIR
set -euo pipefail
shardlm=$1
data=$2
work=$3
rm -rf "$work" && mkdir -p "$work"
"$shardlm" init --preset tiny --out "$work/init" --set vocab_size=32000 --set max_position_embeddings=512 >/dev/null
cp "$data/llama2_tokenizer.model" "$work/init/tokenizer.model"
"$shardlm" tokenize --model "$work/init" --text "I believe the meaning of life is" --bos 2>/dev/null \
  | grep -qx "1 306 4658 278 6593 310 2834 338" || { echo "the model directory's tokenizer is not Llama 2's"; exit 1; }
# The shipped config with its shipped sample (data/, read from the checkout's root) fills at least
# one global batch with Llama 2's tokenizer (the sampler refuses fewer rows).
root=$(cd "$(dirname "$0")/../.." && pwd)
(cd "$root" && "$shardlm" data-preview --config configs/alpaca-llama2.yaml -n 1 model="$work/init") > "$work/sample.txt" ||
  { cat "$work/sample.txt"; echo "configs/alpaca-llama2.yaml with its data/ sample fails with Llama 2's tokenizer"; exit 1; }
grep "^packing:" "$work/sample.txt"
"$shardlm" train --config "$(dirname "$0")/../../configs/alpaca-llama2.yaml" model="$work/init" output_dir="$work/out" \
  data.train="$data/alpaca_en_demo.json" compute_dtype=f32 seq_len=256 micro_batch_size=4 \
  gradient_accumulation_steps=1 max_steps=40 optimizer.lr=3e-3 eval_every=0 eval_batches=4 progress=none \
  save_dtype=f32
/usr/bin/python3 - "$work/out/metrics.jsonl" <<'PY'
import json, sys
evals = [r["eval_loss"] for r in map(json.loads, open(sys.argv[1])) if "eval_loss" in r]
assert len(evals) == 2 and evals[1] < 0.8 * evals[0], f"held-out loss {evals} did not fall by a fifth"
print(f"held-out loss {evals[0]:.3f} -> {evals[1]:.3f}")
PY
[[ -f "$work/out/tokenizer.model" ]] || { echo "the trained model lacks tokenizer.model"; exit 1; }
out=$("$shardlm" generate --model "$work/out" --prompt "Below is an instruction" --max-new-tokens 8 --temperature 0)
[[ ${#out} -gt 24 ]] || { echo "generate did not continue the prompt: '$out'"; exit 1; }
echo "generate: $out"
