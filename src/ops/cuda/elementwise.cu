// CUDA kernels of the elementwise ops, SwiGLU, bias, AdamW and the sum of squares.
//
// All are grid-stride loops over flat arrays with f32 arithmetic, one element per thread per
// iteration. Where the CPU reference is written to round like torch (AdamW), the same f32
// operations are spelled with __fmul_rn/__fadd_rn/__fdiv_rn/__fsqrt_rn so nvcc cannot contract
// them into fused multiply-adds: the GPU result is then the CPU's bit for bit, not just close.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "ops/cuda/common.cuh"
#include "ops/cpu/cpu_ops.h"
#include "ops/dynamic_map.h"
#include "ops/cuda/cuda_ops.h"

namespace shardlm::ops::gpu {

namespace {

__global__ void cast_kernel(void* dst, DType dt, const void* src, DType st, int64_t n) {
  // Through f32, which holds bf16 and f16 exactly: a single rounding, as on the CPU.
  SHARDLM_GRID_STRIDE(i, n) store(dst, dt, i, load(src, st, i));
}

__global__ void add_kernel(void* dst, DType dt, const void* src, DType st, int64_t n) {
  SHARDLM_GRID_STRIDE(i, n) store(dst, dt, i, load(dst, dt, i) + load(src, st, i));
}

__global__ void scale_kernel(void* x, DType t, float s, int64_t n) {
  SHARDLM_GRID_STRIDE(i, n) store(x, t, i, load(x, t, i) * s);
}

__global__ void add_bias_kernel(void* y, DType yt, const void* b, DType bt, int64_t n, int64_t M) {
  SHARDLM_GRID_STRIDE(i, n) store(y, yt, i, load(y, yt, i) + load(b, bt, i % M));
}

// One thread per column summing its rows in order (as the CPU does): deterministic, and
// neighbouring threads read neighbouring addresses of each row.
__global__ void bias_backward_kernel(float* db, const void* dy, DType t, int64_t N, int64_t M) {
  SHARDLM_GRID_STRIDE(j, M) {
    float s = 0.0f;
    for (int64_t i = 0; i < N; ++i) s += load(dy, t, i * M + j);
    db[j] += s;
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void swiglu_forward_kernel(void* out, DType ot, const void* gate, DType gt, const void* up, DType ut,
                                      int64_t n) {
  SHARDLM_GRID_STRIDE(i, n) {
    const float g = load(gate, gt, i);
    store(out, ot, i, g * sigmoid(g) * load(up, ut, i));
  }
}

__global__ void swiglu_backward_kernel(void* dgate, DType dgt, void* dup, DType dut, const void* dout, DType dt,
                                       const void* gate, DType gt, const void* up, DType ut, int64_t n) {
  SHARDLM_GRID_STRIDE(i, n) {
    // All reads before the writes: dgate or dup may alias dout (same element index only).
    const float g = load(gate, gt, i);
    const float u = load(up, ut, i);
    const float d = load(dout, dt, i);
    const float s = sigmoid(g);
    store(dgate, dgt, i, d * u * (s * (1.0f + g * (1.0f - s))));  // d silu(g)/dg = s + g s (1 - s)
    store(dup, dut, i, d * g * s);
  }
}

struct AdamScalars {
  float decay, step_size, bias2_sqrt, w1, b2, w2, eps, grad_scale;
};

// The CPU's loop body (ops/cpu/optim.cpp), operation for operation, without contraction. Moments
// are float (f32) or uint16_t (bf16 bits, stored with stochastic rounding from the same draws as
// the CPU's: rng_detail::draw(step, stream, j / 4), word j % 4, for tensor element j = first + i).
__device__ __forceinline__ float moment_load(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float moment_load(const uint16_t* x, int64_t i) {
  return bf16_bits_to_f32(x[i]);
}
template <class M>
__global__ void adamw_kernel(float* p, const float* g, M* m, M* v, AdamScalars s, uint64_t step, StatePosition pos,
                             int64_t n) {
  SHARDLM_GRID_STRIDE(i, n) {
    const float gi = __fmul_rn(g[i], s.grad_scale);
    const float pi = __fmul_rn(p[i], s.decay);
    const float m0 = moment_load(m, i), v0 = moment_load(v, i);
    const float mi = __fadd_rn(m0, __fmul_rn(s.w1, __fsub_rn(gi, m0)));
    const float vi = __fadd_rn(__fmul_rn(v0, s.b2), __fmul_rn(__fmul_rn(s.w2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bias2_sqrt), s.eps);
    p[i] = __fadd_rn(pi, __fmul_rn(-s.step_size, __fdiv_rn(mi, denom)));
    if constexpr (std::is_same_v<M, float>) {
      m[i] = mi;
      v[i] = vi;
    } else {
      const uint64_t j = uint64_t(pos.first + i);
      uint32_t r[4];
      rng_detail::draw(r, step, pos.stream, j / 4);
      const uint32_t word = r[j % 4];
      m[i] = bits::f32_to_bf16_stochastic(__float_as_uint(mi), word);
      v[i] = bits::f32_to_bf16_stochastic(__float_as_uint(vi), word >> 16);
    }
  }
}

// Pass 1 of the sum of squares: each block sums a grid-stride share in double and writes one
// partial. Pass 2 (one block) adds the partials in index order. The grid size is fixed for a
// given n, so the result is the same bits on every run.
constexpr int kSumBlocks = 1024;

__global__ void sum_squares_partial_kernel(const void* x, DType t, int64_t n, double* partial) {
  __shared__ double scratch[32];
  double s = 0.0;
  SHARDLM_GRID_STRIDE(i, n) {
    const double e = load(x, t, i);
    s += e * e;
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(const double* partial, int count, double* out) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void cast(const Tensor& dst, const Tensor& src) {
  const int64_t n = src.numel();
  if (n == 0) return;
  const cudaStream_t stream = cuda::compute_stream();
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data)
      SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  cast_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst.data, dst.dtype, src.data, src.dtype, n);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void add_inplace(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(dst.data, dst.dtype, src.data, src.dtype, n);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void scale_inplace(const Tensor& x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(x.data, x.dtype, s, n);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void zero(const Tensor& x) {
  // All-zero bits are 0 in every dtype shardlm has.
  if (x.nbytes()) SHARDLM_CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.nbytes(), cuda::compute_stream()));
}

void add_bias(const Tensor& y, const Tensor& b) {
  const int64_t n = y.numel(), M = y.size(-1);
  if (n == 0) return;
  add_bias_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(y.data, y.dtype, b.data, b.dtype, n, M);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void bias_backward(const Tensor& db, const Tensor& dy) {
  const int64_t M = dy.size(-1);
  if (M == 0) return;
  const int64_t N = dy.numel() / M;
  bias_backward_kernel<<<grid_for(M), kThreads, 0, cuda::compute_stream()>>>(db.f32(), dy.data, dy.dtype, N, M);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel();
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(out.data, out.dtype, gate.data,
                                                                               gate.dtype, up.data, up.dtype, n);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const int64_t n = dout.numel();
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(
      dgate.data, dgate.dtype, dup.data, dup.dtype, dout.data, dout.dtype, gate.data, gate.dtype, up.data, up.dtype,
      n);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWConfig& cfg,
                int64_t step, float grad_scale, StatePosition pos) {
  const int64_t n = param.numel();
  if (n == 0) return;
  // The scalars exactly as ops/cpu/optim.cpp derives them (doubles first, as torch does).
  const double bias1 = 1.0 - std::pow(cfg.beta1, double(step));
  const double bias2 = 1.0 - std::pow(cfg.beta2, double(step));
  AdamScalars s;
  s.decay = float(1.0 - cfg.lr * cfg.weight_decay);
  s.step_size = float(cfg.lr / bias1);
  s.bias2_sqrt = float(std::sqrt(bias2));
  s.w1 = float(1.0 - cfg.beta1);
  s.b2 = float(cfg.beta2);
  s.w2 = float(1.0 - cfg.beta2);
  s.eps = float(cfg.eps);
  s.grad_scale = grad_scale;
  if (m.dtype == DType::BF16)
    adamw_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(
        param.f32(), grad.f32(), static_cast<uint16_t*>(m.data), static_cast<uint16_t*>(v.data), s, uint64_t(step), pos, n);
  else
    adamw_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(param.f32(), grad.f32(), m.f32(), v.f32(), s,
                                                                        uint64_t(step), pos, n);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

double sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const cudaStream_t stream = cuda::compute_stream();
  const int blocks = int(std::min<int64_t>(kSumBlocks, (n + kThreads - 1) / kThreads));
  Buffer partial(size_t(blocks + 1) * sizeof(double), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  double* p = static_cast<double*>(partial.data());
  sum_squares_partial_kernel<<<unsigned(blocks), kThreads, 0, stream>>>(x.data, x.dtype, n, p);
  SHARDLM_CUDA_LAUNCH_CHECK();
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(p, blocks, p + blocks);
  SHARDLM_CUDA_LAUNCH_CHECK();
  // Returning a host double means waiting for the compute stream here (copy_bytes synchronizes).
  double total = 0.0;
  device::copy_bytes(&total, Device::CPU, p + blocks, Device::CUDA, sizeof(double));
  return total;
}

}  // namespace shardlm::ops::gpu

// ---- 8-bit blockwise state: the CPU's arithmetic (ops/cpu/optim.cpp), the map passed by value ----
namespace shardlm::ops::gpu {
namespace {
struct Map256 {
  float v[256];
};
Map256 map_of(bool is_signed) {
  Map256 m;
  std::memcpy(m.v, dynamic_map(is_signed), sizeof(m.v));
  return m;
}
// One thread block of kQuant8Block threads per quantization block.
__global__ void quantize8_kernel(uint8_t* codes, float* absmax, const float* x, int64_t n, Map256 map, uint8_t zero) {
  __shared__ float scratch[32];
  const int64_t i = int64_t(blockIdx.x) * kQuant8Block + threadIdx.x;
  const float v = i < n ? x[i] : 0.0f;
  const float m = block_max(fabsf(v), scratch);
  if (threadIdx.x == 0) absmax[blockIdx.x] = m;
  const float inv = __fdiv_rn(1.0f, m);  // bitsandbytes scales by the reciprocal, as the CPU does
  if (i < n) codes[i] = m == 0.0f ? zero : uint8_t(dynamic_code(__fmul_rn(v, inv), map.v));
}
__global__ void dequantize8_kernel(float* x, const uint8_t* codes, const float* absmax, int64_t n, Map256 map) {
  SHARDLM_GRID_STRIDE(i, n) { x[i] = __fmul_rn(map.v[codes[i]], absmax[i / kQuant8Block]); }
}
}  // namespace

void quantize_blockwise8(const Tensor& codes, const Tensor& absmax, const Tensor& x, bool is_signed) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const Map256 map = map_of(is_signed);
  const uint8_t zero = uint8_t(std::lower_bound(map.v, map.v + 256, 0.0f) - map.v);
  quantize8_kernel<<<checked_blocks(absmax.numel(), "quantize_blockwise8"), kQuant8Block, 0, cuda::compute_stream()>>>(
      static_cast<uint8_t*>(codes.data), absmax.f32(), x.f32(), n, map, zero);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void dequantize_blockwise8(const Tensor& x, const Tensor& codes, const Tensor& absmax, bool is_signed) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dequantize8_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(
      x.f32(), static_cast<const uint8_t*>(codes.data), absmax.f32(), n, map_of(is_signed));
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::ops::gpu
