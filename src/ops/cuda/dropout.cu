// Dropout on the GPU: ops/cpu/dropout.cpp element for element. The mask comes from the same
// rng_uniform (core/rng.h, host and device), the scale from the same host function, and the
// product is one f32 multiplication (__fmul_rn) rounded by the same store: the CPU's bits.
#include "core/rng.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace shardlm::ops::gpu {

namespace {

// Each thread reads x[i] before writing out[i], so out may be x itself.
__global__ void dropout_kernel(void* out, DType ot, const void* x, DType xt, int64_t n, float p, float s,
                               uint64_t key, uint64_t stream) {
  SHARDLM_GRID_STRIDE(i, n) {
    const float m = rng_uniform(key, stream, uint64_t(i)) >= p ? s : 0.0f;
    store(out, ot, i, __fmul_rn(load(x, xt, i), m));
  }
}

}  // namespace

void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key, uint64_t stream) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dropout_kernel<<<grid_for(n), kThreads, 0, cuda::compute_stream()>>>(out.data, out.dtype, x.data, x.dtype, n, p,
                                                                        dropout_scale(p), key, stream);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::ops::gpu
