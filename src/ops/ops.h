// The op interface: forward and backward of every computation the model and optimizer need.
//
// Each op takes Tensor views (core/tensor.h), validates shapes, dtypes and devices here, once,
// and dispatches on the tensors' device to a backend: ops/cpu/ is the reference (OpenMP +
// OpenBLAS), ops/cuda/ the fast path. Ops never allocate their outputs: the caller passes
// them, so all large memory stays in the caller's tracked Buffers. Scratch an op needs for its
// own duration is a Workspace allocation freed before it returns.
//
// Conventions
//  - Tensors are contiguous row-major; "[N, D]" means N rows of D elements. A leading batch of
//    rows may be folded into N (e.g. [B, T, D] is passed as [B*T, D]).
//  - Float inputs may be f32 or bf16 where noted; arithmetic is always f32, and reductions
//    accumulate in f32 or double.
//  - "written" outputs are overwritten; "accumulated" outputs get += (gradients of parameters
//    are accumulated so micro-batches and tied weights add up without extra buffers).
//  - Token ids, positions, segment ids and targets are i32.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace shardlm::ops {

constexpr int32_t kIgnoreIndex = -100;  // a target that contributes no loss (PyTorch's default)

// ---- Matrix multiply -------------------------------------------------------------------------
// C = alpha * op(A) @ op(B) + beta * C, with op(X) = X^T when the flag is set.
// A: [M, K] ([K, M] if trans_a), B: [K, N] ([N, K] if trans_b), C: [M, N].
// A and B: f32 or bf16 (independently); C: f32 or bf16. Accumulation is f32. With any bf16
// operand the bf16 policy applies on CUDA (bf16 tensor cores) and on a CPU with bf16 hardware
// (oneDNN, ops/cpu_bf16.h): bf16 products, an f32 operand beside a bf16 one rounded to bf16 (one
// rounding, <= 2^-8 relative). Elsewhere, or with SHARDLM_CPU_BF16=0, the CPU widens bf16
// operands and multiplies in exact f32. A Linear layer y = x W^T is
// matmul(y, x, W, false, true); its backward is matmul(dx, dy, W) and matmul(dW, dy, x, true,
// false, 1, 1) to accumulate.
void matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a = false,
            bool trans_b = false, float alpha = 1.0f, float beta = 0.0f);
// A Linear layer on a q8_0 weight (core/q8_0.h; generation's `--dtype q8_0`):
// C = alpha * A W^T + beta * C, A [M, K] f32, W [N, K] as N rows of K / 32 q8_0 blocks (u8
// [N, K / 32 * 34]; K a multiple of 32), C [M, N] f32. CPU only. A decode step (M <= 8) reads the
// blocks in place and is bit for bit matmul on the dequantized f32 weight (ops/cpu/matmul.cpp).
void matmul_q8_0(const Tensor& C, const Tensor& A, const Tensor& W, float alpha = 1.0f, float beta = 0.0f);

// ---- Embedding -------------------------------------------------------------------------------
// out[i, :] = weight[ids[i], :].  weight [V, D] f32|bf16, ids [N] i32, out [N, D] f32|bf16.
void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& ids);
// dweight[ids[i], :] += dout[i, :] (accumulated; repeated ids add up).  dweight [V, D] f32.
void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& ids);

// ---- RMSNorm (Hugging Face LlamaRMSNorm) ---------------------------------------------------
// y = x / sqrt(mean(x^2) + eps) * w, computed in f32.  x, y [N, D] f32|bf16; w [D] f32|bf16;
// rstd [N] f32 receives 1/sqrt(mean(x^2) + eps) for the backward.
void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps);
// dx written; dw [D] f32 accumulated, or undefined for a frozen weight (LoRA): then not computed
// (dx is the same either way).
void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                      const Tensor& w, const Tensor& rstd);

// ---- Rotary position embedding (Hugging Face "rotate_half" convention) -----------------------
struct RopeScaling {
  enum class Kind { None, Llama3 } kind = Kind::None;
  float factor = 1.0f;            // llama3: 8 for Llama 3.1, 32 for Llama 3.2
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position_embeddings = 8192;
};
// inv_freq[i] = 1 / theta^(2i / head_dim) for i < head_dim/2, then rescaled as Llama 3 does.
// Computed in f32 exactly as transformers computes it.
std::vector<float> rope_inv_freq(int64_t head_dim, float theta, const RopeScaling& scaling);
// x, out [B, T, H, Dh] f32|bf16 (out may alias x); positions [B, T] i32; inv_freq [Dh/2] f32.
// For i < Dh/2 and angle a = positions[b,t] * inv_freq[i]:
//   out[i] = x[i] cos a - x[i + Dh/2] sin a;   out[i + Dh/2] = x[i + Dh/2] cos a + x[i] sin a.
void rope_forward(const Tensor& out, const Tensor& x, const Tensor& positions, const Tensor& inv_freq);
// The rotation is orthogonal, so the backward is the rotation by -a.  dx may alias dout.
void rope_backward(const Tensor& dx, const Tensor& dout, const Tensor& positions, const Tensor& inv_freq);

// ---- Causal self-attention with grouped-query heads ------------------------------------------
// q [B, Tq, H, Dh]; k, v [B, Tk, Hkv, Dh] with H % Hkv == 0 (query head h reads kv head
// h / (H / Hkv)); Tq <= Tk, and query i sits at position i + Tk - Tq (so a KV cache works).
// Query i attends to key j iff j <= i + Tk - Tq and, when segment_ids is defined ([B, Tk] i32,
// the segments of packed examples), segment_ids[b, j] == segment_ids[b, i + Tk - Tq].
// Computed in blocks with an online softmax: memory is O(T * Dh), never T x T.
// out [B, Tq, H, Dh] written; lse [B, H, Tq] f32 receives the log-sum-exp of each query's
// scaled scores (kept for the backward).  q, k, v, out: f32 or bf16. On the CPU, bf16 q, k and v
// on the bf16 path (ops/cpu_bf16.h) multiply bf16 blocks with f32 accumulation, the probabilities
// rounded to bf16 before their products (ops/cpu/attention.cpp); otherwise the math is f32.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& segment_ids, float scale);
// The same attention for one sequence whose keys and values lie in blocks of a paged KV cache
// (infer/kv_cache.h): k_blocks[i], v_blocks[i] [block, Hkv, Dh] (f32|bf16, one dtype) hold its
// positions [i block, (i+1) block) in order, and its first Tk positions are its keys, Tq <= Tk <=
// blocks x block. q, out [1, Tq, H, Dh]; lse [1, H, Tq]. No segments. Computed by the same kernel as
// attention_forward over the keys gathered into one tensor, with the same result bit for bit.
// Forward only (generation). On the CPU and on CUDA (the blocks on q's device; the CUDA kernel reads
// them through a table of their addresses, the same kernel as attention_forward's).
void attention_forward_paged(const Tensor& out, const Tensor& lse, const Tensor& q, const std::vector<Tensor>& k_blocks,
                             const std::vector<Tensor>& v_blocks, int64_t Tk, float scale);
// dq [B, Tq, H, Dh], dk, dv [B, Tk, Hkv, Dh] written (f32).  Uses out and lse from the forward.
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& segment_ids, float scale);

// ---- SwiGLU ----------------------------------------------------------------------------------
// out = silu(gate) * up, silu(x) = x * sigmoid(x).  All [N, F], f32|bf16.
void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up);
// dgate, dup written.
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up);

// ---- Output projection fused with cross-entropy ----------------------------------------------
// logits = x @ w^T never exists for all tokens at once: rows are processed `chunk_rows` at a
// time, each chunk's logits live in an f32 workspace of chunk_rows x V.
// x [N, D] f32|bf16; w [V, D] f32|bf16; targets [N] i32 (kIgnoreIndex = no loss).
// On CUDA with a bf16 w (the bf16 policy), the GEMMs run on bf16 tensor cores with w as it is,
// and dlogits are rounded to bf16 for the dx and dw GEMMs (the CPU keeps them in f32).
// Returns the sum of -log softmax(logits)[target] over non-ignored rows and their count.
// When dx is defined: dx [N, D] f32 is written with grad_scale * dLoss/dx and dw [V, D] f32 is
// accumulated with grad_scale * dLoss/dw (dw may be undefined with dx defined: a frozen head, whose
// gradient is not computed; the loss and dx do not depend on it; dw without dx is an error).
// For a mean over the global batch, pass
// grad_scale = 1 / (non-ignored tokens in the whole batch).
struct CrossEntropyResult {
  double loss_sum = 0.0;
  int64_t count = 0;
};
CrossEntropyResult linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets,
                                        const Tensor& dx, const Tensor& dw, float grad_scale,
                                        int64_t chunk_rows = 256);

// The chunk_rows the model passes (and the memory estimator counts). CUDA: 256, the chunk its
// grouped dW updates are built around. CPU: as many rows, in steps of 256 from 256 to 1024, as
// keep the f32 logits block within 128 MiB; OpenBLAS packs the whole [V, D] head again for each
// chunk's GEMMs, which costs a small hidden size most (V 32000, D 256: 1024-row chunks make the
// head's GEMMs ~20% faster than 256-row ones, for 96 MiB more workspace).
int64_t cross_entropy_chunk_rows(Device device, int64_t vocab);

// ---- Dropout (LoRA's, on an adapter's input) ------------------------------------------------
// out[i] = x[i] / (1 - p) if rng_uniform(key, stream, i) >= p, else 0 (core/rng.h; i is the flat
// element index). The mask is a function of (key, stream, i) alone, so the backward applies the
// same call to the gradient, and a recomputed forward (activation checkpointing) gets the same
// mask: nothing is stored. x, out [N, D] f32|bf16 (out may alias x; dtypes may differ); 0 <= p < 1.
// In f32 exactly as torch's dropout: out[i] = x[i] * m with m = dropout_scale(p) or 0 (so a
// dropped element is +-0, and NaN where x is NaN or infinite); a bf16 out is rounded once. p == 0
// is a copy (a cast when the dtypes differ). CPU and CUDA draw the same mask, bit for bit.
void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key, uint64_t stream);
// The multiplier of a kept element: 1 / (1 - p), with 1 - p rounded to f32 and an f32 division
// (torch's bernoulli(1 - p).div_(1 - p) on an f32 tensor).
inline float dropout_scale(float p) { return 1.0f / float(1.0 - double(p)); }

// ---- Optimizer -------------------------------------------------------------------------------
// Hyperparameters are doubles, as in Python: torch derives scalars such as 1 - beta2 in double
// before they meet f32 tensors, and doing the same keeps results within an ulp of torch's.
struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};
// Where the elements of one adamw_step call sit in their tensor: element i of the call is element
// first + i of the tensor whose name gives `stream` (rng's stream_id). Only moments stored in bf16
// use it (their rounding draws), so that a tensor's result does not depend on how it is split
// between calls or ranks.
struct StatePosition {
  uint64_t stream = 0;
  int64_t first = 0;
};
// One AdamW step over flat buffers of equal length, exactly as torch.optim.AdamW:
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with g = grad_scale * grad (grad_scale carries gradient clipping) and t = step (1-based).
// param and grad are f32. m and v are f32, or both bf16 (optimizer_state_dtype: bf16): then each is
// read to f32, the step computed in f32 as above, and the new m and v stored with stochastic
// rounding (core/float_bits.h). Round to nearest would stall v, whose per-step change (1 - b2 =
// 1e-3 of it) is below half a bf16 ulp (2^-9). The random bits of tensor element j come from
// rng_detail::draw(step, pos.stream, j / 4), word j % 4: its low 16 bits round m, its high 16 v.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWConfig& cfg, int64_t step, float grad_scale = 1.0f, StatePosition pos = {});

// ---- 8-bit blockwise state (optim: adamw_8bit) -----------------------------------------------
// bitsandbytes' 8-bit optimizer state (its blockwise form): a moment as one byte per element, a
// code into a 256-value dynamic map, and one f32 absmax per block of 256 elements.
inline constexpr int64_t kQuant8Block = 256;
// The maps are ops/dynamic_map.h's: signed for exp_avg, unsigned for exp_avg_sq.
// codes [n] u8, absmax [ceil(n / 256)] f32 from x [n] f32, block b = elements [256 b, 256 b + 256):
// absmax[b] = max |x| over the block; each element's code is dynamic_code(x * (1 / absmax[b]))
// (bitsandbytes' search over the map, on the f32 product with the f32 reciprocal, as its kernels
// scale); a block of zeros has absmax 0 and the code of 0. n need not be a multiple of 256: the
// last block is shorter.
void quantize_blockwise8(const Tensor& codes, const Tensor& absmax, const Tensor& x, bool is_signed);
// x [n] f32 = map[code] * absmax of the element's block (an f32 product).
void dequantize_blockwise8(const Tensor& x, const Tensor& codes, const Tensor& absmax, bool is_signed);

// ---- Bias (Qwen2's q/k/v projections, Llama's optional attention_bias) ------------------------
// y[i, :] += b for every row.  y [N, M] f32|bf16; b [M] f32|bf16.
void add_bias(const Tensor& y, const Tensor& b);
// db += sum over rows of dy (accumulated).  db [M] f32; dy [N, M] f32|bf16.
void bias_backward(const Tensor& db, const Tensor& dy);

// ---- DoRA (weight-decomposed LoRA, PEFT's use_dora) -----------------------------------------
// The pieces of a DoRA layer's forward and backward that matmuls cannot do; model/llama.cpp
// composes them with matmuls. g = m / norm is the per-output-feature factor (norm = the row norm
// of W + scale B A, held constant: PEFT detaches it).
// norms[i] = sqrt(sum_k x[i, k]^2), accumulated in double on the CPU, f32 on a GPU.
// x [M, K] f32|bf16; norms [M] f32 (written).
void row_norms(const Tensor& norms, const Tensor& x);
// y[n, j] += (g_j - 1) z[n, j] + g_j l[n, j]: PEFT's DoRA term on top of the base output.
// y [N, M] f32|bf16 (accumulated); z, l [N, M] f32; m [M] f32|bf16; norm [M] f32.
void dora_forward(const Tensor& y, const Tensor& z, const Tensor& l, const Tensor& m, const Tensor& norm);
// Its backward for a given dy [N, M] f32: dm[j] += sum_n dy[n, j] (z + l)[n, j] / norm_j (f32,
// accumulated, rows summed in order), then dz = (g - 1) dy and dl = g dy (f32, written; dz may be
// z and dl may be l: every read of a column is done before it is written).
void dora_backward(const Tensor& dz, const Tensor& dl, const Tensor& dm, const Tensor& dy, const Tensor& z,
                   const Tensor& l, const Tensor& m, const Tensor& norm);

// ---- Reductions, casts, elementwise ----------------------------------------------------------
// Sum of squares of all elements (f32 or bf16), accumulated in double. The global L2 norm of
// many buffers (or of shards on many ranks) is sqrt of the sum of their sum_squares.
double sum_squares(const Tensor& x);
// The gradient-clipping multiplier torch.nn.utils.clip_grad_norm_ applies:
// min(1, max_norm / (total_norm + 1e-6)).
float clip_coefficient(double total_norm, float max_norm);

// dst = src converted (f32, bf16, f16 in any direction; same shape).
void cast(const Tensor& dst, const Tensor& src);
// dst += src (same shape; dst f32|bf16, src f32|bf16).
void add_inplace(const Tensor& dst, const Tensor& src);
// x *= s.
void scale_inplace(const Tensor& x, float s);
// x = 0.
void zero(const Tensor& x);

}  // namespace shardlm::ops
