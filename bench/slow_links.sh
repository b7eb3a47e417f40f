#!/usr/bin/env bash
# Slow links between emulated nodes (issue 28 parts 4 and 5): FULL_SHARD, HYBRID_SHARD and
# _HYBRID_SHARD_ZERO2 on 2 nodes x 2 ranks, with f32 and with bf16 on the wire (mixed_precision
# param_dtype bf16: all-gathers in bf16; reduce_dtype bf16: reductions in bf16), over links limited
# with tc tbf to each RATE; and beside every measurement, `shardlm estimate-time`'s prediction from
# figures this script measures first:
#   - compute, two rates per dtype: the FLOP/s of a rank's matmuls and attention, and the bytes/s
#     of its memory-bound ops (elementwise, norms, casts, AdamW: what the dry run counts they read
#     and write). Both from 2 runs on one node of 4 ranks (no emulated nodes, no link limit):
#     FULL_SHARD, and HYBRID_SHARD with shard groups of 2. Their FLOPs are equal and their shards
#     differ by 2x, so the two step times give the two rates (the model's own replay of each run
#     supplies its host copies and exposed communication; 3 rounds of the solve);
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
# TFLOPS_F32, MEMBW_F32, TFLOPS_BF16, MEMBW_BF16 (bytes/s) give the compute rates instead of measuring them.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
work=$(realpath -m "${1:-runs/slow_links}")
shardlm=$(realpath "${SHARDLM:-build/shardlm}")
bench_comm=$(realpath "${BENCH_COMM:-build/bench/bench_comm}")
rates=(${RATES:-1gbit 10gbit})
steps=${STEPS:-16}
rounds=${ROUNDS:-2}
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

# ---- compute: one node of 4 ranks, FULL_SHARD and HYBRID_SHARD in shard groups of 2 ----
host_intra=$(comm_rate mpirun --bind-to none)
echo "host: intra-node $((host_intra / 1000000)) MB/s per rank (bench_comm all-gather, 64 MiB, outside the emulated nodes)"
declare -A tflops=([f32]=${TFLOPS_F32:-} [bf16]=${TFLOPS_BF16:-}) membw=([f32]=${MEMBW_F32:-} [bf16]=${MEMBW_BF16:-})
given() { [[ -n ${tflops[$1]} && -n ${membw[$1]} ]]; }
for round in $(seq "$rounds"); do
  for dt in f32 bf16; do
    given $dt && continue
    for strategy in FULL_SHARD HYBRID_SHARD; do
      run=calib_${dt}_${strategy}_r$round
      "$shardlm" launch --nproc-per-node 4 -- train --config "$work/run.yaml" output_dir="$work/$run" \
        sharding_strategy=$strategy shard_group_size=2 $(precision $dt) > "$work/$run.log" 2>&1 \
        || { cat "$work/$run.log"; exit 1; }
    done
  done
done
for dt in f32 bf16; do
  given $dt && { echo "compute $dt: ${tflops[$dt]} TFLOP/s, ${membw[$dt]} B/s per rank (given)"; continue; }
  calib=()
  for strategy in FULL_SHARD HYBRID_SHARD; do
    calib+=("$strategy" "$(step_s "$work"/calib_${dt}_${strategy}_r*/)")
  done
  # Solve F/R + B_i/M = t_i - copies_i - exposed_i for R and M; the exposed communication is the
  # model's own at the previous round's rates (none in the first).
  read -r tf mb < <(/usr/bin/python3 - "$shardlm" "$work" "$dt" "$host_intra" "$B" "$T" "${calib[@]}" <<'PY'
import json, subprocess, sys
shardlm, work, dt, intra, B, T = sys.argv[1:7]
runs = dict(zip(sys.argv[7::2], map(float, sys.argv[8::2])))
def replay(strategy, tflops, membw):
    out = subprocess.run([shardlm, "estimate-time", "--model", f"{work}/model", "--micro-batch-size", B, "--seq-len", T,
        "--param-dtype", dt, "--reduce-dtype", dt, "--sharding-strategy", strategy, "--world-sizes", "4",
        "--nproc-per-node", "4", "--shard-group-size", "2", "--tflops", f"{tflops:.6g}", "--memory-bandwidth", f"{membw:.6g}",
        "--intra-node-bandwidth", intra, "--host-copy-bandwidth", intra, "--overlap", "true", "--json"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]
tflops, membw, exposed = 1.0, 1e12, {s: 0.0 for s in runs}
for _ in range(3):
    p = {s: replay(s, tflops, membw) for s in runs}
    rest = {s: runs[s] - p[s]["host_copy_s"] - exposed[s] for s in runs}
    F = p["FULL_SHARD"]["flops_per_step"]
    dB = p["HYBRID_SHARD"]["memory_bytes_per_step"] - p["FULL_SHARD"]["memory_bytes_per_step"]
    per_byte = (rest["HYBRID_SHARD"] - rest["FULL_SHARD"]) / dB
    per_flop = (rest["FULL_SHARD"] - p["FULL_SHARD"]["memory_bytes_per_step"] * per_byte) / F
    if per_byte <= 0 or per_flop <= 0:
        sys.exit(f"error: the calibration runs do not separate the two rates ({runs}): rerun on an idle machine")
    tflops, membw = 1 / per_flop / 1e12, 1 / per_byte
    p = {s: replay(s, tflops, membw) for s in runs}
    exposed = {s: p[s]["exposed_comm_s"] for s in runs}
print(f"{tflops:.5f} {membw:.0f}")
PY
  ) || exit 1
  tflops[$dt]=$tf membw[$dt]=$mb
  echo "compute $dt: one node, 4 ranks: FULL_SHARD ${calib[1]} s, HYBRID_SHARD (groups of 2) ${calib[3]} s a step -> ${tf} TFLOP/s, $((mb / 1000000)) MB/s per rank"
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
        --memory-bandwidth "${membw[$dt]}" --intra-node-bandwidth "$intra" --inter-node-bandwidth "$inter" \
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
