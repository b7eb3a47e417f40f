#!/usr/bin/env bash
# Slow links between emulated nodes (issue 28 parts 4 and 5): FULL_SHARD, HYBRID_SHARD and
# _HYBRID_SHARD_ZERO2 on 2 nodes x 2 ranks, with f32 and with bf16 on the wire (mixed_precision
# param_dtype bf16: all-gathers in bf16; reduce_dtype bf16: reductions in bf16), over links limited
# with tc tbf to each RATE; and beside every measurement, `shardlm estimate-time`'s prediction from
# figures this script measures first:
#   - the memory-bound ops' rate: 4 concurrent `bench_ops --memory-bound` (one rank's FULL_SHARD
#     shard of AdamW, casts, sums of squares, zeroing; bytes as the dry run counts them), the median
#     of the 4 rates (--memory-bandwidth);
#   - the FLOP rate of a rank's matmuls and attention, per dtype: a run on one node of 4 ranks (no
#     emulated nodes, no link limit), FULL_SHARD, less the model's own replay of that run's
#     memory-bound ops, host copies and exposed communication (--tflops);
#   - links: bench_comm's all-gather between 2 ranks, one per node (the node's inter-node rate)
#     and within one node (a rank's intra-node rate), at each RATE, and on the host (the rate of
#     the calibration runs' copies).
# Every configuration runs twice: with the ring collectives that groups spanning nodes take
# (src/comm/ring_collectives.h; "step s", which the prediction is compared with) and with Open MPI's
# own non-blocking algorithms (SHARDLM_RING=0; "mpi s").
# Needs root (network namespaces; scripts/cluster/). Takes about 25 minutes on 2 cores (COMPARE_MPI=0: 15).
#   bench/slow_links.sh [WORKDIR]        RATES="1gbit 10gbit" STEPS=16 ROUNDS=2 by default
# Every configuration, the calibration runs included, runs ROUNDS times, the rounds interleaved;
# each is reported by the fastest round's median step.
# The prediction models CPU ranks: communication runs behind compute (OVERLAP=true, the progress
# thread's), and every byte a rank communicates takes its cores' time at the intra-node rate
# (--host-copy-bandwidth; HOST_COPY=0 leaves it out). COMPARE_MPI=0 skips the runs on MPI's collectives.
# TFLOPS_F32, TFLOPS_BF16 and MEMBW (bytes/s) give the compute rates instead of measuring them.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(realpath -m "${1:-runs/slow_links}")
shardlm=$(realpath "${SHARDLM:-build/shardlm}")
bench_comm=$(realpath "${BENCH_COMM:-build/bench/bench_comm}")
bench_ops=$(realpath "${BENCH_OPS:-build/bench/bench_ops}")
rates=(${RATES:-1gbit 10gbit})
steps=${STEPS:-16}
rounds=${ROUNDS:-2}
[[ -x $shardlm && -x $bench_comm && -x $bench_ops ]] || { echo "error: build shardlm, bench_comm and bench_ops first" >&2; exit 1; }
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
# step_s DIR...: per run the median step-to-step time after the first two steps, from rank 0's
# metrics; of the runs (the rounds of one configuration) the fastest. Other tenants of this
# machine only ever slow a run down, and in phases of many seconds, so the best of interleaved
# rounds is the undisturbed speed, as bench_ops' best-of-N is for an op.
step_s() {
  /usr/bin/python3 - "${@/%//metrics.jsonl}" <<'PY'
import json, statistics, sys
def median_step(path):
    e = [json.loads(l)["elapsed_s"] for l in open(path) if '"step"' in l and '"loss"' in l]
    return statistics.median(b - a for a, b in zip(e[2:], e[3:]))
print(f"{min(map(median_step, sys.argv[1:])):.4f}")
PY
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u +%F)"
echo "model: 8 layers, hidden 512, vocab 8192 (34M parameters); micro-batch $B x $T tokens per rank; 2 nodes x 2 ranks"

comm_rate() {  # comm_rate MPIRUN_ARGS...: bytes/s one rank sends in a 2-rank all-gather of 64 MiB
  "$@" -x OMP_NUM_THREADS=1 -np 2 "$bench_comm" --sizes 64 --dtype f32 --iters 3 --warmup 1 > "$work/comm.log" 2>&1 ||
    { cat "$work/comm.log"; exit 1; }
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
# predict OUT STRATEGY DT WORLD_ARGS... : estimate-time's JSON record for one configuration.
predict() {
  local out=$1 strategy=$2 dt=$3; shift 3
  "$shardlm" estimate-time --model "$work/model" --micro-batch-size $B --seq-len $T --param-dtype $dt \
    --reduce-dtype $dt --sharding-strategy "$strategy" --overlap "${OVERLAP:-true}" --json "$@" > "$out"
}

# ---- compute: the memory-bound ops' rate, then the FLOP rate of each dtype from one node ----
host_intra=$(comm_rate mpirun --bind-to none)
echo "host: intra-node $((host_intra / 1000000)) MB/s per rank (bench_comm all-gather, 64 MiB, outside the emulated nodes)"
membw=${MEMBW:-}
if [[ -z $membw ]]; then
  # a FULL_SHARD rank's quarter of the parameters, as the engine counts them
  shard=$("$shardlm" estimate-time --model "$work/model" --world-sizes 1 --tflops 1 --json |
    /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["parameters"] // 4)')
  for i in 1 2 3 4; do OMP_NUM_THREADS=1 "$bench_ops" --memory-bound "$shard" > "$work/membw_$i.json" & done
  wait
  membw=$(cat "$work"/membw_*.json | /usr/bin/python3 -c \
    'import json, statistics, sys; print(round(statistics.median(json.loads(l)["bytes_per_s"] for l in sys.stdin)))')
  echo "memory-bound ops: 4 concurrent bench_ops --memory-bound $shard: $((membw / 1000000)) MB/s per rank (median)"
fi
declare -A tflops=([f32]=${TFLOPS_F32:-} [bf16]=${TFLOPS_BF16:-})
for round in $(seq "$rounds"); do
  for dt in f32 bf16; do
    [[ -n ${tflops[$dt]} ]] && continue
    run=calib_${dt}_r$round
    "$shardlm" launch --nproc-per-node 4 -- train --config "$work/run.yaml" output_dir="$work/$run" \
      sharding_strategy=FULL_SHARD $(precision $dt) > "$work/$run.log" 2>&1 || { cat "$work/$run.log"; exit 1; }
  done
done
for dt in f32 bf16; do
  [[ -n ${tflops[$dt]} ]] && { echo "compute $dt: ${tflops[$dt]} TFLOP/s per rank (given)"; continue; }
  t=$(step_s "$work"/calib_${dt}_r*/)
  # F / R = t - memory-bound ops - host copies - exposed communication, all from the model's own
  # replay of this run; the exposed part depends on R, so a few rounds.
  tf=0.1
  for _ in 1 2 3 4; do
    predict "$work/calib.json" FULL_SHARD $dt --world-sizes 4 --nproc-per-node 4 --tflops $tf --memory-bandwidth "$membw" \
      --intra-node-bandwidth "$host_intra" --host-copy-bandwidth "$host_intra"
    tf=$(/usr/bin/python3 - "$work/calib.json" "$t" <<'PY'
import json, sys
p, t = json.load(open(sys.argv[1]))[0], float(sys.argv[2])
rest = t - p["memory_s"] - p["host_copy_s"] - p["exposed_comm_s"]
if rest <= 0:
    sys.exit(f"error: the one-node run ({t} s a step) is not longer than its memory-bound ops and copies: rerun on an idle machine")
print(f"{p['flops_per_step'] / rest / 1e12:.5f}")
PY
    ) || exit 1
  done
  tflops[$dt]=$tf
  echo "compute $dt: one node, 4 ranks, FULL_SHARD ${t} s a step -> ${tflops[$dt]} TFLOP/s per rank"
done

printf '\n%-8s %-20s %-5s %10s %10s %10s %8s %12s %12s\n' rate strategy wire "step s" "mpi s" predicted error "comm/step" "inter/step"
for rate in "${rates[@]}"; do
  scripts/cluster/start.sh --name "$name" --nodes 2 --slots 2 --rate "$rate" >/dev/null
  inter=$(comm_rate on1 mpirun --hostfile "$cluster/hostfile" --bind-to none --map-by node)
  intra=$(comm_rate on1 mpirun --hostfile "$cluster/hostfile" --bind-to none --map-by ppr:2:node --host "$name-node1:2")
  echo "links at $rate: inter-node $((inter / 1000000)) MB/s per node, intra-node $((intra / 1000000)) MB/s per rank (bench_comm all-gather, 64 MiB)"
  for round in $(seq "$rounds"); do
    for strategy in FULL_SHARD HYBRID_SHARD _HYBRID_SHARD_ZERO2; do
      for dt in f32 bf16; do
        for ring in 1 $([[ ${COMPARE_MPI:-1} == 1 ]] && echo 0); do
          run=${rate}_${strategy}_${dt}_ring${ring}_r$round
          SHARDLM_RING=$([[ $ring == 1 ]] && echo auto || echo 0) on1 "$shardlm" launch --nproc-per-node 2 --nnodes 2 \
            --hostfile "$cluster/hostfile" -- train --config "$work/run.yaml" output_dir="$work/$run" \
            sharding_strategy=$strategy $(precision $dt) > "$work/$run.log" 2>&1 || { cat "$work/$run.log"; exit 1; }
        done
      done
    done
  done
  for strategy in FULL_SHARD HYBRID_SHARD _HYBRID_SHARD_ZERO2; do
    for dt in f32 bf16; do
      tag=${rate}_${strategy}_$dt
      measured=$(step_s "$work/${tag}"_ring1_r*/)
      mpi=$([[ ${COMPARE_MPI:-1} == 1 ]] && step_s "$work/${tag}"_ring0_r*/ || echo nan)
      predict "$work/$tag.pred.json" "$strategy" "$dt" --world-sizes 4 --nproc-per-node 2 --tflops "${tflops[$dt]}" \
        --memory-bandwidth "$membw" --intra-node-bandwidth "$intra" --inter-node-bandwidth "$inter" \
        $([[ ${HOST_COPY:-1} == 1 ]] && echo "--host-copy-bandwidth $intra")
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
