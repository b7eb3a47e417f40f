#!/usr/bin/env bash
# `shardlm serve` under N concurrent clients with the paged KV cache against one block of --max-len
# per request (the layout before paging), side by side in one run (issue 32 item 3;
# bench/serve_clients.py runs the clients): requests/s, time to first token, inter-token latency
# p50 and p99, the KV cache's peak (the bytes of the blocks the server made, from /health) and the
# server's peak resident memory (VmHWM). A third row caps the cache with --kv-cache-memory below
# what the clients hold at once, so requests are preempted and recomputed.
# Model: a 93M-parameter Llama (8 layers, hidden 1024, 8 kv heads of 64: 32 KiB of f32 KV per
# position), random weights; CLIENTS=16 clients of REQUESTS=4 requests each (prompts 16 to 384
# tokens, 16 to 160 new), --max-batch CLIENTS, --max-len 1024.
#   bench/serve_memory.sh [WORKDIR=/tmp/shardlm_serve_memory]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/shardlm_serve_memory}
clients=${CLIENTS:-16}
requests=${REQUESTS:-4}
source bench/serve_common.sh
serve_bench_model
bench_header serve_memory "$clients clients x $requests requests"
for cfg in "paged:--kv-block-size 16" "unpaged:--kv-block-size 1024" "capped:--kv-block-size 16 --kv-cache-memory 96MiB"; do
  name=${cfg%%:*}
  log=$work/serve_$name.log
  # shellcheck disable=SC2086
  start_serve "$log" --max-batch "$clients" --max-len 1024 --stop-token-ids none ${cfg#*:}
  line=$(/usr/bin/python3 bench/serve_clients.py "$port" "$clients" "$requests")
  health=$(/usr/bin/python3 -c '
import json, sys, urllib.request
kv = json.load(urllib.request.urlopen("http://127.0.0.1:%s/health" % sys.argv[1]))["kv_cache"]
mib = 2.0 ** 20
print("kv made %7.1f MiB of %7.1f  preemptions %3d" % (kv["bytes_made"] / mib, kv["bytes_capacity"] / mib, kv["preemptions"]))' "$port")
  hwm=$(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status")
  kill $pid && wait $pid 2>/dev/null || true
  printf '%-8s %s  %s  rss peak %5s MiB\n' "$name" "$line" "$health" "$hwm"
done
