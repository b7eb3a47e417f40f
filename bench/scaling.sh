#!/usr/bin/env bash
# One training config at 1, 2 and 4 ranks under FULL_SHARD, SHARD_GRAD_OP and NO_SHARD (via
# `shardlm launch --nproc-per-node N`), on a small model, and a self-contained page of the results:
# per-rank peak memory, epoch time and step time against ranks, one line per strategy.
#
#   bench/scaling.sh [WORKDIR]          (default runs/scaling; writes WORKDIR/scaling.html and .json)
#
# Strong scaling: the global batch is fixed (GLOBAL_ROWS rows per step; micro_batch_size =
# GLOBAL_ROWS / ranks), so every run takes the same number of steps per epoch, and each trains
# exactly one epoch. Figures come from each run's metrics.jsonl (rank 0): epoch time is the last
# step's elapsed_s (training steps only: loading, evaluation and the final save excluded); step time
# the median of the step-to-step differences after the first two steps; peak memory the tracked
# bytes' peak over the run's steps (rank 0; ranks hold equal shards) and the process's peak RSS.
# THREADS_PER_RANK sets OpenMP threads per rank (launch's default: cores / ranks).
# The page comes from `shardlm report --charts`, the same writer as every run's report.html.
# On CPU ranks the ranks share this machine's cores (OpenMP threads = cores / ranks), so time per
# step measures the engine's overheads on shared cores, not a cluster's speed-up.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(realpath -m "${1:-runs/scaling}")
shardlm=${SHARDLM:-build/shardlm}
global_rows=${GLOBAL_ROWS:-32}
examples=${TRAIN_EXAMPLES:-1200}
strategies=(${STRATEGIES:-FULL_SHARD SHARD_GRAD_OP NO_SHARD})
world_sizes=(${WORLD_SIZES:-1 2 4})
threads=${THREADS_PER_RANK:+--threads-per-rank $THREADS_PER_RANK}  # default: launch's, cores / ranks
[[ -x "$shardlm" ]] || { echo "error: $shardlm not built (scripts/build.sh)" >&2; exit 1; }
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# A small Llama: 4 layers, hidden 128 (the tiny preset made wider and deeper).
"$shardlm" init --preset tiny --set num_hidden_layers=4 --set hidden_size=128 --set intermediate_size=352 \
  --seed 1 --out "$work/model" --force > /dev/null
cat > "$work/run.yaml" <<YAML
model: $work/model
output_dir: $work/out
data: {train: builtin:addition, digits: 3, train_examples: $examples, eval_examples: 64}
seq_len: 16
micro_batch_size: $global_rows
max_steps: 1
optimizer: {lr: 1e-3}
eval_every: 0
eval_batches: 1
accuracy_examples: 0
progress: lines
log_every: 1000000
YAML
# Steps in one epoch at this global batch (the same at every world size).
"$shardlm" train --config "$work/run.yaml" output_dir="$work/probe" > "$work/probe.log" 2>&1 \
  || { cat "$work/probe.log"; exit 1; }
steps=$(grep -oE '[0-9]+ steps per epoch' "$work/probe.log" | head -1 | cut -d' ' -f1 || true)
[[ -n "$steps" ]] || { cat "$work/probe.log"; echo "error: no 'steps per epoch' in the log" >&2; exit 1; }
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u +%F)"
echo "model: $(grep -oE '\([0-9]+ layers, hidden [0-9]+, [0-9.]+M parameters\)' "$work/probe.log"); one epoch = $steps steps of $global_rows rows"

for strategy in "${strategies[@]}"; do
  for np in "${world_sizes[@]}"; do
    (( global_rows % np == 0 )) || { echo "error: GLOBAL_ROWS $global_rows does not divide by $np ranks" >&2; exit 1; }
    out=$work/${strategy}_np$np
    "$shardlm" launch --nproc-per-node "$np" $threads -- train --config "$work/run.yaml" output_dir="$out" \
      sharding_strategy="$strategy" micro_batch_size=$(( global_rows / np )) max_steps="$steps" > "$out.log" 2>&1 \
      || { tail -5 "$out.log"; echo "error: $strategy on $np ranks failed (log: $out.log)" >&2; exit 1; }
    echo "$strategy np=$np: $(grep -E '^done:' "$out.log" | head -1)"
  done
done

# Collect the figures and describe the page's charts; then the page.
python3 - "$work" "$steps" "$global_rows" "${strategies[*]}" "${world_sizes[*]}" <<'PY'
import json, statistics, sys
work, steps, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
strategies, sizes = sys.argv[4].split(), [int(n) for n in sys.argv[5].split()]
figures = []
for s in strategies:
    for n in sizes:
        recs = [json.loads(l) for l in open(f"{work}/{s}_np{n}/metrics.jsonl")]
        st = [r for r in recs if "lr" in r]
        assert len(st) == steps, (s, n, len(st))
        diffs = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(st[1:], st[2:])]
        figures.append({"strategy": s, "ranks": n, "epoch_s": st[-1]["elapsed_s"],
                        "step_s": statistics.median(diffs) if diffs else st[-1]["elapsed_s"] / steps,
                        "peak_tracked_bytes": st[-1]["mem_peak_bytes"], "peak_rss_bytes": st[-1]["rss_peak_bytes"],
                        "final_loss": st[-1]["loss"]})
def chart(cid, title, key, ylabel, fmt="number"):
    return {"id": cid, "title": title, "x_label": "ranks", "y_label": ylabel, "y_format": fmt,
            "series": [{"name": s, "points": [[f["ranks"], f[key]] for f in figures if f["strategy"] == s]}
                       for s in strategies]}
page = {"title": "shardlm scaling: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD at " + ", ".join(map(str, sizes)) + " ranks",
        "notes": [f"one epoch of {steps} steps, {rows} rows of 16 tokens per step at every world size "
                  "(micro_batch_size = rows / ranks); figures of rank 0 from each run's metrics.jsonl",
                  "CPU ranks on one machine share its cores: time per step shows the engine's overheads, "
                  "not a cluster's speed-up"],
        "charts": [chart("peak_memory", "Per-rank peak memory (tracked buffers, rank 0)", "peak_tracked_bytes",
                         "bytes", "bytes"),
                   chart("epoch_time", "Epoch time (training steps)", "epoch_s", "seconds"),
                   chart("step_time", "Step time (median)", "step_s", "seconds"),
                   chart("peak_rss", "Per-rank peak RSS (rank 0)", "peak_rss_bytes", "bytes", "bytes")],
        "figures": figures}
json.dump(page, open(f"{work}/scaling.json", "w"), indent=1)
print(f"{'strategy':<14} {'ranks':>5} {'epoch s':>8} {'step s':>8} {'peak tracked':>13} {'peak RSS':>10} {'loss':>7}")
for f in figures:
    print(f"{f['strategy']:<14} {f['ranks']:>5} {f['epoch_s']:>8.2f} {f['step_s']:>8.4f} "
          f"{f['peak_tracked_bytes'] / 1e6:>10.2f} MB {f['peak_rss_bytes'] / 1e6:>7.0f} MB {f['final_loss']:>7.4f}")
PY
"$shardlm" report --charts "$work/scaling.json" --out "$work/scaling.html"
