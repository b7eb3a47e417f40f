#!/usr/bin/env bash
# Full fine-tuning throughput on one GPU: shardlm (`shardlm train`, device: cuda) against Hugging
# Face LlamaForCausalLM (bench/hf_llama_bench.py: PyTorch eager, sdpa attention), same shape, same
# batch, side by side.
#   bench/gpu_train.sh [MICRO_BATCH] [STEPS] [WARMUP]      (defaults 4, 20, 3)
# Shape: Llama 3.2 1B (preset llama3.2-1b), seq 2048, random weights, one process (FULL_SHARD on a
# world of 1). No activation checkpointing on either side.
#
# Precision policy, as each side really runs it (both: bf16 GEMMs with f32 accumulation, f32
# master weights and AdamW state; they differ in where copies live and in the loss):
#   shardlm, mixed_precision {param_dtype: bf16, reduce_dtype: f32}:
#     - f32 master weights, gradient shard and AdamW state in the optimizer shard; the gathered
#       full parameters are bf16, activations (the residual stream included) bf16;
#     - every Linear forward: cuBLASLt bf16 x bf16 on tensor cores, f32 accumulation, bf16 out;
#       backward dX and dW: the f32 backward gradient buffers are rounded to bf16 as the GEMM
#       operand, bf16 weights/activations are used as they are (never widened), f32 accumulation,
#       dX written f32, dW accumulated (beta = 1) into the f32 gradient buffer;
#     - RMSNorm, RoPE, SwiGLU: f32 math on bf16 storage; attention: shardlm's own kernel, bf16
#       q/k/v, f32 math on CUDA cores (no tensor cores yet), f32 dq/dk/dv;
#     - lm_head + cross-entropy fused, 256 rows at a time: bf16 GEMM into f32 logits (never N x V),
#       softmax/loss in f32/double, dlogits rounded to bf16, dX and dW by bf16 GEMMs, the f32
#       lm_head gradient updated once per 4 chunks;
#     - gradients reduce-scattered in f32 (a no-op at world 1).
#   Hugging Face (bench/hf_llama_bench.py): f32 weights, grads and AdamW state; torch.autocast(bf16):
#     every nn.Linear casts weight and input to bf16 (bf16 GEMM, f32 accumulation, bf16 output),
#     RMSNorm in f32, f32 residual stream, SDPA attention on bf16, and the loss upcasts all B x T
#     bf16 logits to an f32 N x V tensor.
#
# Reported: tokens/s over the steps after WARMUP, MFU by the PaLM formula (6N + 12 L H Q T FLOPs per
# token, N counting the tied embedding once; 989 TFLOP/s peak, H100 SXM bf16 dense; PEAK_TFLOPS=...
# to change), and peak GPU memory measured the same way on both sides: the peak over the whole
# process (loading/construction, warm-up and timed steps), as allocated (bytes handed out by the
# caching allocator: shardlm's allocator `allocated_peak`, torch.cuda.max_memory_allocated) and as
# reserved from the driver (shardlm's `reserved_peak`, torch.cuda.max_memory_reserved). shardlm's
# trainer does not reset its peak after warm-up, so the whole-run figures are the comparable ones;
# shardlm's peak as of the end of warm-up and HF's timed-steps-only peak are printed beside them.
#
# Environment: SHARDLM=path/to/shardlm (default build/shardlm), PYTHON (default python3), WORK (a
# directory for the model, data and logs; default a new one under /tmp), PEAK_TFLOPS.
# Needs: a CUDA build of shardlm, a GPU, python3 with torch and transformers (4.4x or 5.x).
# NOT YET RUN ON A GPU: written and syntax-checked (bash -n, py_compile) on a machine without one.
set -euo pipefail
cd "$(dirname "$0")/.."
mb=${1:-4}
steps=${2:-20}
warmup=${3:-3}
seq=2048
peak=${PEAK_TFLOPS:-989}
py=${PYTHON:-python3}
work=${WORK:-$(mktemp -d /tmp/shardlm_gpu_train.XXXXXX)}
shardlm=${SHARDLM:-build/shardlm}
[[ -x $shardlm ]] || { echo "gpu_train.sh: $shardlm not found or not executable: build first (ninja -C build) or set SHARDLM=..." >&2; exit 1; }
total=$((warmup + steps))

echo "machine: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1); $(date -u +%F)"
echo "shape: llama3.2-1b, seq $seq, micro-batch $mb, $steps timed steps after $warmup warm-up; bf16 compute, f32 master + AdamW"

# The model (random init) and a token file: ids of the byte-level tokenizer that a model directory
# without tokenizer files gets; the values do not change the work per token.
"$shardlm" init --preset llama3.2-1b --out "$work/model" --seed 1 --dtype f32 >/dev/null
"$py" - "$work/tokens.bin" $(( (total + 2) * mb * (seq + 1) )) <<'EOF'
import array, random, sys
random.seed(0)
a = array.array("I", (random.randrange(3, 259) for _ in range(int(sys.argv[2]))))
assert a.itemsize == 4
with open(sys.argv[1], "wb") as f:
    a.tofile(f)
EOF
cat > "$work/train.yaml" <<EOF
model: $work/model
output_dir: $work/out
device: cuda
sharding_strategy: FULL_SHARD
mixed_precision: {param_dtype: bf16, reduce_dtype: f32}
data: {type: tokens, train: $work/tokens.bin, token_bytes: 4, eval_fraction: 0.01}
seq_len: $seq
micro_batch_size: $mb
gradient_accumulation_steps: 1
max_steps: $total
optimizer: {lr: 1.0e-5, betas: [0.9, 0.95], weight_decay: 0.0}
max_grad_norm: 1.0
eval_every: 0
eval_batches: 1
log_every: 1
progress: lines
save_dtype: bf16
EOF
"$shardlm" train --config "$work/train.yaml" | tee "$work/shardlm.log"

# Steady-state figures from the per-step metrics: tokens between the end of warm-up and the last
# step over the time between them (elapsed_s is cumulative from the first step).
"$py" - "$work/out/metrics.jsonl" "$warmup" "$total" "$mb" "$seq" "$peak" > "$work/shardlm.line" <<'EOF'
import json, sys
path, warmup, total, mb, seq, peak = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
recs = {r["step"]: r for r in map(json.loads, open(path)) if "loss" in r}
t0 = recs[warmup]["elapsed_s"] if warmup > 0 else 0.0
t1 = recs[total]["elapsed_s"]
tokens_per_s = (total - warmup) * mb * seq / (t1 - t0)
# Llama 3.2 1B: D 2048, F 8192, L 16, H 32, Hkv 8, Q 64, V 128256, tied embeddings.
D, F, L, H, Hkv, Q, V = 2048, 8192, 16, 32, 8, 64, 128256
N = V * D + D + L * (2 * D + D * H * Q + 2 * D * Hkv * Q + H * Q * D + 3 * D * F)
mfu = tokens_per_s * (6 * N + 12 * L * H * Q * seq) / (peak * 1e12)
last, warm = recs[total], recs[max(warmup, 1)]
gib = 2**30
# The allocator's peaks are cumulative from process start (loading, warm-up, timed steps).
print("shardlm: tokens/s {:.0f} MFU {:.1f}% peak_allocated {:.2f} GiB peak_reserved {:.2f} GiB (whole run; as of the "
      "end of warm-up: {:.2f} / {:.2f} GiB) ({} params)".format(
          tokens_per_s, 100 * mfu, last.get("gpu_allocated_peak_bytes", 0) / gib,
          last.get("gpu_reserved_peak_bytes", 0) / gib, warm.get("gpu_allocated_peak_bytes", 0) / gib,
          warm.get("gpu_reserved_peak_bytes", 0) / gib, N))
EOF

"$py" bench/hf_llama_bench.py --micro-batch "$mb" --seq "$seq" --steps "$steps" --warmup "$warmup" \
  --peak-tflops "$peak" --json "$work/hf.json" | tee "$work/hf.line"

echo
echo "side by side (llama3.2-1b, seq $seq, micro-batch $mb, bf16 compute; peaks over the whole run; $work):"
cat "$work/shardlm.line"
grep '^hf:' "$work/hf.line"
