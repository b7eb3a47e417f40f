#!/usr/bin/env bash
# Per-token overhead of decoding a very small model (issue 36, item 6): a 260K-parameter Llama the
# shape of llama2.c's stories260K (dim 64, 5 layers, 8 heads, 4 kv heads, vocab 512, context 512),
# random weights, greedy, one thread. At this size a decode step is ~0.5 MFLOP, so tokens/s
# measures the fixed cost per step, not arithmetic.
#   bench/decode_small.sh [ROUNDS=3] [NEW_TOKENS=400] [WORKDIR=/tmp/shardlm_decode_small]
# BASELINE=path/to/shardlm (a build of another commit) runs in every round beside build/shardlm,
# alternating, for before/after comparisons in the same run. Decode tokens/s = (NEW_TOKENS - 1)
# over generate's decode_seconds (the first new token comes from the prefill).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
new=${2:-400}
work=${3:-/tmp/shardlm_decode_small}
export OMP_NUM_THREADS=1
mkdir -p "$work"
[[ -f "$work/model/config.json" ]] ||
  build/shardlm init --preset tiny --out "$work/model" --seed 1 --set num_hidden_layers=5 --set num_attention_heads=8 \
    --set num_key_value_heads=4 --set head_dim=8 --set max_position_embeddings=512 >/dev/null
echo '{"prompt": "Once upon a time"}' > "$work/prompt.jsonl"
echo "decode_small: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), 1 thread;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC'); $new new tokens, greedy, f32"
declare -A bins=([current]=build/shardlm)
[[ -n "${BASELINE:-}" ]] && bins[baseline]=$BASELINE
for r in $(seq "$rounds"); do
  for name in current baseline; do
    [[ -n "${bins[$name]:-}" ]] || continue
    "${bins[$name]}" generate --model "$work/model" --prompts "$work/prompt.jsonl" --max-new-tokens "$new" \
      --temperature 0 --output "$work/out_$name.jsonl" 2>/dev/null
    /usr/bin/python3 - "$work/out_$name.jsonl" "$new" "$r" "$name" <<'PY'
import json, sys
row = json.loads(open(sys.argv[1]).read())
new = int(sys.argv[2])
assert row["completion_tokens"] == new, f"stopped after {row['completion_tokens']} tokens"
print(f"round {sys.argv[3]}: {sys.argv[4]:8s} {(new - 1) / row['decode_seconds']:8.1f} tok/s decode "
      f"({1e6 * row['decode_seconds'] / (new - 1):.1f} us/token)")
PY
  done
done
