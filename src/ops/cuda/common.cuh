// Shared pieces of the CUDA kernels: element loads and stores for f32/bf16/f16 whose rounding
// is bit-for-bit the CPU's (core/dtype.h), launch sizes, block reductions, and the launch check.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/float_bits.h"
#include "core/tensor.h"
#include "ops/cuda/runtime.h"

// After every kernel launch: reports a bad launch configuration (or an earlier asynchronous
// fault) as an Error at the launch site. It does not wait for the kernel.
#define SHARDLM_CUDA_LAUNCH_CHECK() SHARDLM_CUDA_CHECK(cudaGetLastError())

namespace shardlm::ops::gpu {

// ---- conversions: core/float_bits.h, the same functions the CPU uses ------------------------
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) { return __uint_as_float(bits::bf16_to_f32(b)); }
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) { return bits::f32_to_bf16(__float_as_uint(f)); }
__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) { return __uint_as_float(bits::f16_to_f32(h)); }
__device__ __forceinline__ uint16_t f32_to_f16_bits(float f) { return bits::f32_to_f16(__float_as_uint(f)); }

// Element i of an f32|bf16|f16 array as f32, and the store that rounds back. The dtype is a
// kernel argument, uniform over the whole grid, so the branch costs nothing measurable in these
// memory-bound kernels and saves a template instance per dtype combination.
__device__ __forceinline__ float load(const void* p, DType t, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(p)[i];
  if (t == DType::BF16) return bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
  return f16_bits_to_f32(static_cast<const uint16_t*>(p)[i]);
}

__device__ __forceinline__ void store(void* p, DType t, int64_t i, float v) {
  if (t == DType::F32)
    static_cast<float*>(p)[i] = v;
  else if (t == DType::BF16)
    static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v);
  else
    static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v);
}

__device__ __forceinline__ float round_to_bf16(float v) { return bf16_bits_to_f32(f32_to_bf16_bits(v)); }

// ---- launch sizes ----------------------------------------------------------------------------
constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the GPU, never zero.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(blocks, 1, int64_t(1) << 16));
}

#define SHARDLM_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);                \
       i += int64_t(gridDim.x) * blockDim.x)

// ---- block reductions ------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 values of T in shared memory. Contains __syncthreads: call from all threads.
template <class T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < warps; ++w) total += scratch[w];  // same order in every thread: same result
  return total;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// A kernel grid dimension must fit in 31 bits; shapes here always do, but say so if not.
inline unsigned checked_blocks(int64_t n, const char* op) {
  SHARDLM_CHECK(n >= 0 && n < (int64_t(1) << 31), "{}: {} thread blocks exceed the CUDA grid limit", op, n);
  return unsigned(n);
}

}  // namespace shardlm::ops::gpu
