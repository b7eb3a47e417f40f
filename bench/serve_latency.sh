#!/usr/bin/env bash
# What a long prompt arriving mid-stream costs the running streams of `shardlm serve`, with and
# without chunked prefill (issue 32 item 2; bench/serve_latency.py runs the clients), side by side
# in one run. Model: a 93M-parameter Llama (8 layers, hidden 1024, vocab 512), random weights, f32;
# STREAMS=3 streams of 24-token prompts, then one prompt of LONG=1024 tokens; greedy, no stop token.
# Beside each chunked row: "chunk est", the whole prompt's stall (the --prefill-chunk 0 row, less
# one decode step) scaled to one chunk, i.e. what one chunk's compute should cost.
#   bench/serve_latency.sh [CHUNKS="0 256 64"] [WORKDIR=/tmp/shardlm_serve_latency]
set -euo pipefail
cd "$(dirname "$0")/.."
chunks=(${1:-0 256 64})
work=${2:-/tmp/shardlm_serve_latency}
streams=${STREAMS:-3}
long=${LONG:-1024}
source bench/serve_common.sh
serve_bench_model
bench_header serve_latency "$streams streams + one $long-token prompt"
whole_stall=
for chunk in "${chunks[@]}"; do
  log=$work/serve_$chunk.log
  start_serve "$log" --max-batch $((streams + 1)) --max-len 1200 --prefill-chunk "$chunk" --stop-token-ids none
  line=$(/usr/bin/python3 bench/serve_latency.py "$port" "$streams" "$long")
  kill $pid && wait $pid 2>/dev/null || true
  est=
  if [[ $chunk == 0 ]]; then
    whole_stall=$(awk '{for (i = 1; i <= NF; ++i) if ($i == "stall") s = $(i + 1); print s}' <<<"$line")
    itl=$(awk '{print $2}' <<<"$line")
  elif [[ -n $whole_stall ]]; then
    est=$(awk -v s="$whole_stall" -v d="$itl" -v c="$chunk" -v p="$long" \
      'BEGIN {printf "  chunk est %8.1f ms", d + (s - d) * c / p}')
  fi
  printf -- '--prefill-chunk %-5s %s%s\n' "$chunk" "$line" "$est"
done
