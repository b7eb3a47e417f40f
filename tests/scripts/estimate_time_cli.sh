#!/usr/bin/env bash
# shardlm estimate-time from the command line (docs/memory.md, "Step time"): the JSON records and the
# table agree with the model's own rules. With --memory-bandwidth the bytes the dry run's memory-bound
# ops move take bytes / bandwidth on top of the FLOPs' time, and nothing else changes; a hybrid rank
# (twice FULL_SHARD's shard) moves more of them at the same FLOPs. (The model's replay itself:
# tests/test_step_time.cpp; against measured steps: bench/slow_links.sh.)
# Usage: estimate_time_cli.sh SHARDLM PYTHON
set -euo pipefail
shardlm=$1 python=$2
fail() { echo "FAIL: $*"; exit 1; }
common=(--model tiny --micro-batch-size 2 --seq-len 64 --world-size 8 --nproc-per-node 4 --tflops 2
        --intra-node-bandwidth 10GB/s --inter-node-bandwidth 1GB/s)
folded=$("$shardlm" estimate-time "${common[@]}" --json)
split=$("$shardlm" estimate-time "${common[@]}" --memory-bandwidth 4GB/s --json)
"$python" - "$folded" "$split" <<'PY' || fail "the JSON records disagree with the model (above)"
import json, sys
folded, split = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert [(r["world_size"], r["strategy"]) for r in folded] == [(r["world_size"], r["strategy"]) for r in split]
strategies = {r["strategy"] for r in folded if r["world_size"] == 8}
assert {"FULL_SHARD", "HYBRID_SHARD"} <= strategies, strategies
for f, s in zip(folded, split):
    name = f"{s['strategy']} at {s['world_size']}"
    assert f["memory_s"] == 0 and f["memory_bytes_per_step"] > 0, (name, f)
    assert s["memory_bytes_per_step"] == f["memory_bytes_per_step"], name
    assert abs(s["memory_s"] - s["memory_bytes_per_step"] / 4e9) <= 1e-5 * s["memory_s"], (name, s)
    assert abs(s["compute_s"] - f["compute_s"] - s["memory_s"]) <= 1e-5 * s["compute_s"], (name, f, s)
    assert s["flops_per_step"] == f["flops_per_step"] and s["comm_s"] == f["comm_s"], name
    assert s["step_s"] >= f["step_s"], name
by = {r["strategy"]: r for r in split if r["world_size"] == 8}
full, hybrid = by["FULL_SHARD"], by["HYBRID_SHARD"]
assert hybrid["flops_per_step"] == full["flops_per_step"]
assert hybrid["memory_bytes_per_step"] > full["memory_bytes_per_step"], (full, hybrid)
print(f"world 8: FULL_SHARD {full['memory_bytes_per_step'] / 2**20:.1f} MiB, HYBRID_SHARD "
      f"{hybrid['memory_bytes_per_step'] / 2**20:.1f} MiB of memory-bound traffic per step; "
      f"at 4 GB/s {full['memory_s'] * 1e3:.2f} and {hybrid['memory_s'] * 1e3:.2f} ms")
PY
table=$("$shardlm" estimate-time "${common[@]}" --memory-bandwidth 4GB/s)
grep -q "memory-bound ops at 3.73 GiB/s" <<<"$table" || fail "the table's hardware line lacks the memory bandwidth: $table"
grep -q "fastest: " <<<"$table" || fail "the table names no fastest strategy: $table"
echo "estimate_time_cli: ok"
