// CUDA kernels of the DoRA ops (ops.h), checked against ops/cpu/dora.cpp. The row norms sum in
// double like the CPU (a different order: equal within rounding, not bit for bit); the column
// loops sum rows in order, as the CPU does.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace shardlm::ops::gpu {

namespace {

// One block per row.
__global__ void row_norms_kernel(float* norms, const void* x, DType xt, int64_t K) {
  __shared__ double scratch[32];
  const int64_t base = int64_t(blockIdx.x) * K;
  double ss = 0.0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const double v = load(x, xt, base + k);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  if (threadIdx.x == 0) norms[blockIdx.x] = float(sqrt(ss));
}

__global__ void dora_forward_kernel(void* y, DType yt, const float* z, const float* l, const void* m, DType mt,
                                    const float* norm, int64_t n, int64_t M) {
  SHARDLM_GRID_STRIDE(i, n) {
    const int64_t j = i % M;
    const float g = load(m, mt, j) / norm[j];
    store(y, yt, i, load(y, yt, i) + ((g - 1.0f) * z[i] + g * l[i]));
  }
}

// One thread per column: its rows summed in order for dm, then overwritten (dz, dl may alias z, l).
__global__ void dora_backward_kernel(float* dz, float* dl, float* dm, const float* dy, const float* z, const float* l,
                                     const void* m, DType mt, const float* norm, int64_t N, int64_t M) {
  SHARDLM_GRID_STRIDE(j, M) {
    float s = 0.0f;
    for (int64_t i = 0; i < N; ++i) s += dy[i * M + j] * (z[i * M + j] + l[i * M + j]);
    dm[j] += s / norm[j];
    const float g = load(m, mt, j) / norm[j];
    for (int64_t i = 0; i < N; ++i) {
      const float d = dy[i * M + j];
      dz[i * M + j] = (g - 1.0f) * d;
      dl[i * M + j] = g * d;
    }
  }
}

unsigned threads_for_row(int64_t K) {
  int64_t t = 32;
  while (t < K && t < 1024) t *= 2;
  return unsigned(t);
}

}  // namespace

void row_norms(const Tensor& norms, const Tensor& x) {
  const int64_t M = x.shape[0], K = x.shape[1];
  if (M == 0) return;
  row_norms_kernel<<<checked_blocks(M, "row_norms"), threads_for_row(K), 0, cuda::compute_stream()>>>(
      norms.f32(), x.data, x.dtype, K);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void dora_forward(const Tensor& y, const Tensor& z, const Tensor& l, const Tensor& m, const Tensor& norm) {
  const int64_t n = y.numel(), M = y.shape[1];
  if (n == 0) return;
  dora_forward_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(y.data, y.dtype, z.f32(), l.f32(), m.data,
                                                                            m.dtype, norm.f32(), n, M);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void dora_backward(const Tensor& dz, const Tensor& dl, const Tensor& dm, const Tensor& dy, const Tensor& z,
                   const Tensor& l, const Tensor& m, const Tensor& norm) {
  const int64_t N = dy.shape[0], M = dy.shape[1];
  if (M == 0) return;
  dora_backward_kernel<<<grid_for(M), kThreads, 0, cuda::compute_stream()>>>(
      dz.f32(), dl.f32(), dm.f32(), dy.f32(), z.f32(), l.f32(), m.data, m.dtype, norm.f32(), N, M);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::ops::gpu
