#!/usr/bin/env bash
# Tokenizing every field of the 999 Alpaca records: shardlm's tokenizers and python3-sentencepiece,
# alternating in one run. Usage: bench/compare_tokenize.sh [DATA_DIR] [ROUNDS]   (DATA_DIR: ../shared/data)
set -euo pipefail
cd "$(dirname "$0")/.."
d=${1:-../shared/data}
rounds=${2:-2}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u +%F)"
for r in $(seq "$rounds"); do
  build/bench/bench_tokenize --sentencepiece "$d/llama2_tokenizer.model" --alpaca "$d/alpaca_en_demo.json" \
    --tiktoken "$d/llama3_tokenizer.model" --gpt2 "$d/gpt2_vocab.json" "$d/gpt2_merges.txt"
  /usr/bin/python3 bench/bench_tokenize_py.py --sentencepiece "$d/llama2_tokenizer.model" --alpaca "$d/alpaca_en_demo.json"
done
