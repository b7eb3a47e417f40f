#!/usr/bin/env bash
# Slow links between emulated nodes (issue 28 parts 4 and 5): FULL_SHARD, HYBRID_SHARD and
# _HYBRID_SHARD_ZERO2 on 2 nodes x 2 ranks, with f32 and with bf16 on the wire (mixed_precision
# param_dtype bf16: all-gathers in bf16; reduce_dtype bf16: reductions in bf16), over links limited
# with tc tbf to each RATE; and beside every measurement, `shardlm estimate-time`'s prediction from
# figures this script measures first:
#   - compute: the FLOP/s one rank achieves when 4 ranks share this machine's cores, from 4
#     concurrent one-process runs of one rank's micro-batch (per dtype; no communication at all);
#   - links: bench_comm's all-gather between 2 ranks, one per node (the node's inter-node rate)
#     and within one node (a rank's intra-node rate), at each RATE.
# Every configuration runs twice: with the ring collectives that groups spanning nodes take
# (src/comm/ring_collectives.h; "step s", which the prediction is compared with) and with Open MPI's
# own non-blocking algorithms (SHARDLM_RING=0; "mpi s").
# Needs root (network namespaces; scripts/cluster/). Takes about 10 minutes on 2 cores.
#   bench/slow_links.sh [WORKDIR]        RATES="1gbit 10gbit" STEPS=8 by default
# The prediction models CPU ranks: communication runs behind compute (OVERLAP=true, the progress
# thread's), and every byte a rank communicates takes its cores' time at the intra-node rate
# (--host-copy-bandwidth; HOST_COPY=0 leaves it out). COMPARE_MPI=0 skips the runs on MPI's collectives.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
work=$(realpath -m "${1:-runs/slow_links}")
shardlm=$(realpath "${SHARDLM:-build/shardlm}")
bench_comm=$(realpath "${BENCH_COMM:-build/bench/bench_comm}")
rates=(${RATES:-1gbit 10gbit})
steps=${STEPS:-8}
[[ -x $shardlm && -x $bench_comm ]] || { echo "error: build shardlm and bench_comm first" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "error: emulated nodes need root" >&2; exit 1; }
rm -rf "$work" && mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
name=sl$$
cluster=/run/shardlm-cluster/$name
trap 'scripts/cluster/stop.sh $name >/dev/null 2>&1 || true' EXIT
on1() { scripts/cluster/run.sh "$name" 1 bash -c "source $cluster/env && cd $work && exec \"\$@\"" on1 "$@"; }

# A model whose parameters are large beside one rank's compute: 8 layers, hidden 512 (34M parameters).
B=4 T=64
"$shardlm" init --preset tiny --set num_hidden_layers=8 --set hidden_size=512 --set intermediate_size=1408 \
  --set num_attention_heads=8 --set num_key_value_heads=8 --set vocab_size=8192 --seed 1 --out "$work/model" >/dev/null
cat > "$work/run.yaml" <<YAML
model: $work/model
output_dir: $work/out
data: {train: builtin:addition, digits: 8, train_examples: 4000, eval_examples: 16}
seq_len: $T
micro_batch_size: $B
max_steps: $steps
optimizer: {lr: 1e-4}
eval_every: 0
accuracy_examples: 0
progress: none
collective_timeout: 120
YAML
precision() { [[ $1 == bf16 ]] && echo "mixed_precision.param_dtype=bf16 mixed_precision.reduce_dtype=bf16" || true; }
# step_s DIR: median step-to-step time after the first two steps, from rank 0's metrics.
step_s() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
e = [json.loads(l)["elapsed_s"] for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l]
print(f"{statistics.median(b - a for a, b in zip(e[2:], e[3:])):.4f}")
PY
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u +%F)"
echo "model: 8 layers, hidden 512, vocab 8192 (34M parameters); micro-batch $B x $T tokens per rank; 2 nodes x 2 ranks"

# ---- compute: 4 concurrent one-rank runs (OMP 1 thread each), one rank's micro-batch ----
declare -A tflops=([f32]=${TFLOPS_F32:-} [bf16]=${TFLOPS_BF16:-})
for dt in f32 bf16; do
  [[ -n ${tflops[$dt]} ]] && { echo "compute $dt: ${tflops[$dt]} TFLOP/s per rank (given)"; continue; }
  pids=()
  for i in 1 2 3 4; do
    OMP_NUM_THREADS=1 "$shardlm" train --config "$work/run.yaml" output_dir="$work/c_${dt}_$i" $(precision $dt) \
      > "$work/c_${dt}_$i.log" 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  s=$(for i in 1 2 3 4; do step_s "$work/c_${dt}_$i"; done | sort -n | sed -n 2,3p | awk '{t+=$1} END {print t/2}')
  pd=$([[ $dt == bf16 ]] && echo bf16 || echo f32)
  flops=$("$shardlm" estimate-time --model "$work/model" --micro-batch-size $B --seq-len $T --param-dtype $pd \
    --world-sizes 1 --tflops 1 --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["flops_per_step"])')
  tflops[$dt]=$(/usr/bin/python3 -c "print(f'{$flops / $s / 1e12:.5f}')")
  echo "compute $dt: 4 concurrent one-rank runs, step ${s}s, $flops FLOP per rank per step -> ${tflops[$dt]} TFLOP/s per rank"
done

comm_rate() {  # comm_rate MPIRUN_PLACEMENT...: bytes/s one rank sends in a 2-rank all-gather of 64 MiB
  on1 mpirun --hostfile "$cluster/hostfile" --bind-to none -x OMP_NUM_THREADS=1 -np 2 "$@" \
    "$bench_comm" --sizes 64 --dtype f32 --iters 3 --warmup 1 > "$work/comm.log" 2>&1 || { cat "$work/comm.log"; exit 1; }
  /usr/bin/python3 - "$work/comm.log" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    f = line.split()
    if f and f[0] == "all-gather" and "64.0 MiB" in line:
        # columns: op dtype message | raw MPI blocking | raw MPI I*+Wait | shardlm: "median / best" ms, GB/s
        ms = float(re.findall(r"([0-9.]+) /", line.split("|")[3])[0])
        print(f"{32 * 2**20 / (ms / 1e3):.0f}")  # each rank sends its 32 MiB half
        break
PY
}

printf '\n%-8s %-20s %-5s %10s %10s %10s %8s %12s %12s\n' rate strategy wire "step s" "mpi s" predicted error "comm/step" "inter/step"
for rate in "${rates[@]}"; do
  scripts/cluster/start.sh --name "$name" --nodes 2 --slots 2 --rate "$rate" >/dev/null
  inter=$(comm_rate --map-by node)
  intra=$(comm_rate --map-by ppr:2:node --host "$name-node1:2")
  echo "links at $rate: inter-node $((inter / 1000000)) MB/s per node, intra-node $((intra / 1000000)) MB/s per rank (bench_comm all-gather, 64 MiB)"
  for strategy in FULL_SHARD HYBRID_SHARD _HYBRID_SHARD_ZERO2; do
    for dt in f32 bf16; do
      tag=${rate}_${strategy}_$dt
      for ring in 1 $([[ ${COMPARE_MPI:-1} == 1 ]] && echo 0); do
        SHARDLM_RING=$([[ $ring == 1 ]] && echo auto || echo 0) on1 "$shardlm" launch --nproc-per-node 2 --nnodes 2 \
          --hostfile "$cluster/hostfile" -- train --config "$work/run.yaml" output_dir="$work/${tag}_ring$ring" \
          sharding_strategy=$strategy $(precision $dt) > "$work/${tag}_ring$ring.log" 2>&1 \
          || { cat "$work/${tag}_ring$ring.log"; exit 1; }
      done
      measured=$(step_s "$work/${tag}_ring1")
      mpi=$([[ ${COMPARE_MPI:-1} == 1 ]] && step_s "$work/${tag}_ring0" || echo nan)
      pd=$([[ $dt == bf16 ]] && echo bf16 || echo f32)
      "$shardlm" estimate-time --model "$work/model" --micro-batch-size $B --seq-len $T --param-dtype $pd \
        --reduce-dtype $pd --sharding-strategy "$strategy" --world-sizes 4 --nproc-per-node 2 \
        --tflops "${tflops[$dt]}" --intra-node-bandwidth "$intra" --inter-node-bandwidth "$inter" \
        --overlap "${OVERLAP:-true}" $([[ ${HOST_COPY:-1} == 1 ]] && echo "--host-copy-bandwidth $intra") \
        --json > "$work/$tag.pred.json"
      /usr/bin/python3 - "$work/$tag.pred.json" "$measured" "$rate" "$strategy" "$dt" "$mpi" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))[0]
m = float(sys.argv[2])
print(f"{sys.argv[3]:<8} {sys.argv[4]:<20} {sys.argv[5]:<5} {m:10.3f} {float(sys.argv[6]):10.3f} {p['step_s']:10.3f} "
      f"{100 * (p['step_s'] - m) / m:+7.1f}% "
      f"{p['comm_bytes_per_step'] / 2**20:9.1f} MiB {p['inter_node_bytes_per_step'] / 2**20:9.1f} MiB")
PY
    done
  done
  scripts/cluster/stop.sh "$name" >/dev/null
done
