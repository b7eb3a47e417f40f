// CUDA kernels of the NF4 ops (ops/nf4.h), written to give the CPU reference's bits
// (ops/cpu/nf4.cpp): the same f32 operations, spelled __fmul_rn/__fadd_rn/__fsub_rn/__fdiv_rn so
// nvcc contracts nothing into an FMA, and the same code decisions. The tables travel as kernel
// arguments (copied from ops/nf4.cpp's arrays) and are staged in shared memory.
#include <cstring>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/nf4_codes.h"

namespace shardlm::ops::gpu {

namespace {

struct Nf4Tables {
  float code[16];
  float thresholds[15];
};
struct DynamicMap {
  float v[256];
};

Nf4Tables nf4_tables() {
  Nf4Tables t;
  std::memcpy(t.code, kNf4Code.data(), sizeof(t.code));
  std::memcpy(t.thresholds, kNf4Thresholds.data(), sizeof(t.thresholds));
  return t;
}
DynamicMap dynamic_map() {
  DynamicMap m;
  std::memcpy(m.v, kDynamicMapSigned.data(), sizeof(m.v));
  return m;
}

// One warp per block of 64 elements: lane l owns elements 2l and 2l+1 (byte l of the block).
__global__ void quantize_kernel(uint8_t* packed, float* absmax, const void* x, DType xt, int64_t n, int64_t blocks,
                                Nf4Tables tab) {
  __shared__ float thresholds[15];
  if (threadIdx.x < 15) thresholds[threadIdx.x] = tab.thresholds[threadIdx.x];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t b = warp; b < blocks; b += warps) {  // uniform within a warp
    const int64_t i = b * kNf4BlockSize + 2 * lane;
    const float v0 = i < n ? load(x, xt, i) : 0.0f;  // zero padding past n, as bitsandbytes
    const float v1 = i + 1 < n ? load(x, xt, i + 1) : 0.0f;
    float m = fmaxf(fabsf(v0), fabsf(v1));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float inv = __fdiv_rn(1.0f, m);
    if (lane == 0) absmax[b] = m;
    if (i < n)
      packed[i / 2] = uint8_t(nf4_code(__fmul_rn(v0, inv), thresholds) << 4 | nf4_code(__fmul_rn(v1, inv), thresholds));
  }
}

// One CUDA block (256 threads) per group of 256 absmax values.
__global__ void quantize_absmax_kernel(uint8_t* q, float* nested, const float* absmax, const float* offset, int64_t m,
                                       int64_t groups, DynamicMap map) {
  __shared__ float code[256];
  __shared__ float warp_max[8];
  code[threadIdx.x] = map.v[threadIdx.x];
  const float off = *offset;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t i = g * kNf4NestedBlockSize + threadIdx.x;
    const float c = i < m ? __fsub_rn(absmax[i], off) : 0.0f;
    float mx = fabsf(c);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    __syncthreads();  // code[] staged; warp_max free from the previous group
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = warp_max[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) mx = fmaxf(mx, warp_max[w]);
    const float inv = __fdiv_rn(1.0f, mx);
    if (threadIdx.x == 0) nested[g] = mx;
    if (i < m) q[i] = uint8_t(dynamic_code(__fmul_rn(c, inv), code));
  }
}

__global__ void dequantize_absmax_kernel(float* absmax, const uint8_t* q, const float* nested, const float* offset,
                                         int64_t m, DynamicMap map) {
  __shared__ float code[256];
  code[threadIdx.x] = map.v[threadIdx.x];
  __syncthreads();
  const float off = *offset;
  SHARDLM_GRID_STRIDE(i, m) {
    absmax[i] = __fadd_rn(__fmul_rn(code[q[i]], nested[i / kNf4NestedBlockSize]), off);
  }
}

// One thread per packed byte (elements 2t and 2t+1). With q != nullptr the block's absmax is
// dequantized on the fly from the nested state, as dequantize_absmax_kernel computes it.
__global__ void dequantize_kernel(void* out, DType ot, const uint8_t* packed, const float* absmax, const uint8_t* q,
                                  const float* nested, const float* offset, int64_t n, Nf4Tables tab, DynamicMap map) {
  __shared__ float code4[16];
  __shared__ float code8[256];
  if (threadIdx.x < 16) code4[threadIdx.x] = tab.code[threadIdx.x];
  code8[threadIdx.x] = map.v[threadIdx.x];
  __syncthreads();
  const float off = q ? *offset : 0.0f;
  const int64_t bytes = (n + 1) / 2;
  SHARDLM_GRID_STRIDE(t, bytes) {
    const int64_t i = 2 * t;
    const int64_t b = i / kNf4BlockSize;
    const float scale = q ? __fadd_rn(__fmul_rn(code8[q[b]], nested[b / kNf4NestedBlockSize]), off) : absmax[b];
    const unsigned byte = packed[t];
    store(out, ot, i, __fmul_rn(code4[byte >> 4], scale));
    if (i + 1 < n) store(out, ot, i + 1, __fmul_rn(code4[byte & 15u], scale));
  }
}

}  // namespace

void nf4_quantize(const Tensor& packed, const Tensor& absmax, const Tensor& x) {
  const int64_t n = x.numel();
  const int64_t blocks = absmax.numel();
  const unsigned grid = grid_for(blocks * 32);
  quantize_kernel<<<grid, kThreads, 0, cuda::compute_stream()>>>(static_cast<uint8_t*>(packed.data),
                                                                  static_cast<float*>(absmax.data), x.data, x.dtype, n,
                                                                  blocks, nf4_tables());
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void nf4_quantize_absmax(const Tensor& qabsmax, const Tensor& nested_absmax, const Tensor& absmax,
                         const Tensor& offset) {
  static_assert(kNf4NestedBlockSize == 256 && kThreads == 256, "one thread per absmax value of a group");
  const int64_t groups = nested_absmax.numel();
  const unsigned grid = unsigned(std::min<int64_t>(groups, int64_t(1) << 16));
  quantize_absmax_kernel<<<grid, 256, 0, cuda::compute_stream()>>>(
      static_cast<uint8_t*>(qabsmax.data), static_cast<float*>(nested_absmax.data),
      static_cast<const float*>(absmax.data), static_cast<const float*>(offset.data), absmax.numel(), groups,
      dynamic_map());
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void nf4_dequantize_absmax(const Tensor& absmax, const Tensor& qabsmax, const Tensor& nested_absmax,
                           const Tensor& offset) {
  const int64_t m = absmax.numel();
  dequantize_absmax_kernel<<<grid_for(m, 256), 256, 0, cuda::compute_stream()>>>(
      static_cast<float*>(absmax.data), static_cast<const uint8_t*>(qabsmax.data),
      static_cast<const float*>(nested_absmax.data), static_cast<const float*>(offset.data), m, dynamic_map());
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void nf4_dequantize(const Tensor& out, const Tensor& packed, const Tensor& absmax) {
  const int64_t n = out.numel();
  dequantize_kernel<<<grid_for((n + 1) / 2, 256), 256, 0, cuda::compute_stream()>>>(
      out.data, out.dtype, static_cast<const uint8_t*>(packed.data), static_cast<const float*>(absmax.data), nullptr,
      nullptr, nullptr, n, nf4_tables(), dynamic_map());
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void nf4_dequantize_nested(const Tensor& out, const Tensor& packed, const Tensor& qabsmax,
                           const Tensor& nested_absmax, const Tensor& offset) {
  const int64_t n = out.numel();
  dequantize_kernel<<<grid_for((n + 1) / 2, 256), 256, 0, cuda::compute_stream()>>>(
      out.data, out.dtype, static_cast<const uint8_t*>(packed.data), nullptr,
      static_cast<const uint8_t*>(qabsmax.data), static_cast<const float*>(nested_absmax.data),
      static_cast<const float*>(offset.data), n, nf4_tables(), dynamic_map());
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::ops::gpu
