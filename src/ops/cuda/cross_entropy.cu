// linear_cross_entropy on the GPU: the CPU algorithm (ops/cpu/cross_entropy.cpp) chunk for
// chunk, with cuBLASLt GEMMs and one softmax kernel per chunk.
//
// For each chunk of at most chunk_rows rows:
//   logits = x_chunk @ w^T             (gpu::matmul into an f32 [chunk_rows, V] Workspace block)
//   one block per row: loss_row = max + log(sum exp(z - max)) - z[target] (sum in double), and
//     for the backward the row becomes grad_scale * (softmax - onehot(target)) in place
//   dw += dlogits^T @ x_chunk;  dx_chunk = dlogits @ w       (gpu::matmul)
// Only one chunk of logits exists at a time, never N x V. Per-row losses go to a [N] double
// Workspace array that is copied to the host at the end and summed there in row order: the one
// synchronization of the op (its result is a host value).
//
// As on the CPU, bf16 x and w are widened to f32 (w once, x per chunk) and the GEMMs run in exact
// f32. That matches the reference closely but leaves bf16 tensor cores unused: a possible speedup.
#include <vector>

#include "core/device.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace shardlm::ops::gpu {

namespace {

// One block per row of the chunk. The target (uniform across the block) decides whether the
// whole block returns early, so no thread skips a barrier another thread reaches.
__global__ void softmax_loss_kernel(float* logits, int64_t V, const int32_t* targets, double* row_loss,
                                    bool backward, float grad_scale) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const int64_t row = blockIdx.x;
  float* z = logits + row * V;
  const int32_t t = targets[row];
  if (t == kIgnoreIndex || t < 0 || t >= V) {  // ignored (the front end refused other bad ids)
    if (backward)
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) z[j] = 0.0f;  // no loss, no gradient
    if (threadIdx.x == 0) row_loss[row] = 0.0;
    return;
  }
  // Every thread reads the target logit before the first barrier; writes come after it.
  const float target_logit = z[t];
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, z[j]);
  m = block_max(m, fscratch);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float e = expf(z[j] - m);
    if (backward) z[j] = e;  // kept for the softmax below, by this same thread
    sum += e;
  }
  sum = block_sum(sum, dscratch);
  if (threadIdx.x == 0) row_loss[row] = double(m) + log(sum) - double(target_logit);
  if (!backward) return;
  // dloss/dz = softmax(z) - onehot(target), pre-scaled so the GEMMs need no alpha.
  const float k = float(double(grad_scale) / sum);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) z[j] *= k;
  __syncthreads();  // z[t] was scaled by whichever thread owns column t
  if (threadIdx.x == 0) z[t] -= grad_scale;
}

unsigned row_threads(int64_t V) {
  int64_t t = 32;
  while (t < V && t < 1024) t *= 2;
  return unsigned(t);
}

}  // namespace

CrossEntropyResult linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& dx,
                                        const Tensor& dw, float grad_scale, int64_t chunk_rows) {
  const int64_t N = x.shape[0], D = x.shape[1], V = w.shape[0];
  const bool backward = dx.defined();
  if (N == 0) return {};
  const int64_t C = std::min(chunk_rows, N);
  const cudaStream_t stream = cuda::compute_stream();

  Buffer logits_buf(size_t(C * V) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  Buffer loss_buf(size_t(N) * sizeof(double), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  Buffer w_buf, x_buf;
  Tensor wf = w;
  if (w.dtype == DType::BF16) {
    w_buf = Buffer(size_t(V * D) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
    wf = Tensor::of(w_buf, DType::F32, {V, D});
    cast(wf, w);
  }
  if (x.dtype == DType::BF16)
    x_buf = Buffer(size_t(C * D) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  double* row_loss = static_cast<double*>(loss_buf.data());

  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t r1 = std::min(N, r0 + C), rows = r1 - r0;
    Tensor xc = x.slice(r0, r1);
    if (x.dtype == DType::BF16) {
      const Tensor xf = Tensor::of(x_buf, DType::F32, {rows, D});
      cast(xf, xc);
      xc = xf;
    }
    const Tensor logits = Tensor::of(logits_buf, DType::F32, {rows, V});
    matmul(logits, xc, wf, /*trans_a=*/false, /*trans_b=*/true, 1.0f, 0.0f);
    softmax_loss_kernel<<<checked_blocks(rows, "linear_cross_entropy"), row_threads(V), 0, stream>>>(
        logits.f32(), V, targets.i32() + r0, row_loss + r0, backward, grad_scale);
    SHARDLM_CUDA_LAUNCH_CHECK();
    if (!backward) continue;
    // A chunk whose rows are all ignored has zero dlogits: dx gets zeros, dw += 0.
    // dw before dx: x_chunk's last use comes before dx_chunk is written, should they share memory.
    matmul(dw, logits, xc, /*trans_a=*/true, /*trans_b=*/false, 1.0f, /*beta=*/1.0f);
    matmul(dx.slice(r0, r1), logits, wf, /*trans_a=*/false, /*trans_b=*/false, 1.0f, 0.0f);
  }

  // The host needs the loss: copy_bytes waits for the compute stream.
  std::vector<double> losses(static_cast<size_t>(N));
  std::vector<int32_t> ids(static_cast<size_t>(N));
  device::copy_bytes(losses.data(), Device::CPU, row_loss, Device::CUDA, losses.size() * sizeof(double));
  device::copy_bytes(ids.data(), Device::CPU, targets.data, Device::CUDA, ids.size() * sizeof(int32_t));
  CrossEntropyResult r;
  for (int64_t i = 0; i < N; ++i) {
    if (ids[size_t(i)] == kIgnoreIndex) continue;
    r.loss_sum += losses[size_t(i)];
    ++r.count;
  }
  return r;
}

}  // namespace shardlm::ops::gpu
