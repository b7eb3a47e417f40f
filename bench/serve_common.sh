# What the serving benchmarks (serve_latency.sh, serve_memory.sh) share; sourced from the repository
# root with $work set. Sets $shardlm (SHARDLM, default build/shardlm) and OMP_NUM_THREADS (default:
# every core), and makes $work.
shardlm=$(realpath "${SHARDLM:-build/shardlm}")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
mkdir -p "$work"

# bench_header NAME WHAT: the first line of a result: the CPU, threads, load, time and WHAT.
bench_header() {
  echo "$1: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $OMP_NUM_THREADS threads;" \
    "load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC'); $2"
}

# The benchmark model in $work/model, made once: a 93M-parameter Llama (8 layers, hidden 1024, 16
# heads, 8 kv heads, vocab 512), random weights.
serve_bench_model() {
  [[ -f "$work/model/config.json" ]] ||
    "$shardlm" init --preset tiny --out "$work/model" --seed 1 --set num_hidden_layers=8 --set hidden_size=1024 \
      --set intermediate_size=2816 --set num_attention_heads=16 --set num_key_value_heads=8 \
      --set max_position_embeddings=2048 >/dev/null
}

# start_serve LOG FLAGS...: serves $work/model on a free port with FLAGS, its output in LOG; sets
# $pid and $port (killed on exit). Exits 1, showing LOG, if it does not start listening.
start_serve() {
  local log=$1
  shift
  "$shardlm" serve --model "$work/model" --port 0 "$@" > "$log" 2>&1 &
  pid=$!
  trap 'kill $pid 2>/dev/null || true' EXIT
  port=
  for _ in $(seq 300); do
    port=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$log")
    [[ -n $port ]] && return 0
    kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.1
  done
  echo "serve did not start" >&2
  cat "$log"
  exit 1
}
