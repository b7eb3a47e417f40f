// linear_cross_entropy on the GPU: the CPU algorithm (ops/cpu/cross_entropy.cpp) chunk for
// chunk, with cuBLASLt GEMMs and one softmax kernel per chunk. Only one chunk of logits
// ([chunk_rows, V] f32) exists at a time, never N x V.
//
// bf16 head (w bf16; the precision policy of a bf16 run, as ops/cuda/matmul.cu):
//   logits = x_chunk @ w^T        bf16 tensor cores, f32 accumulation, f32 logits (w is never
//                                 widened; an f32 x is rounded to bf16 a group at a time)
//   one block per row: loss_row = max + log(sum exp(z - max)) - z[target] (sum in double), and
//     for the backward dlogits = grad_scale * (softmax - onehot(target)), rounded to bf16 into a
//     group buffer
//   dx_chunk = dlogits @ w        bf16 tensor cores into f32 dx
//   dw += dlogits_group^T @ x_group  once per group of chunks (up to 8 chunks and kGroupBytes of
//                                 bf16 dlogits),
//                                 bf16 tensor cores into the f32 accumulator: the [V, D] f32 dw is
//                                 read and written once per group instead of once per chunk.
// The CPU reference keeps dlogits in f32; the CUDA results differ from it by the bf16 rounding
// of dlogits (relative 2^-8 per element; backend_ops states the tolerance). The loss is computed
// from f32 logits of exact bf16 products, so it agrees with the CPU's to f32 summation order.
//
// f32 head (w f32): exact f32 as on the CPU (a bf16 x is widened a chunk at a time), dlogits in
// f32 in place, dw += dlogits^T x_chunk and dx_chunk = dlogits w per chunk.
//
// A frozen head (dx defined, dw undefined) skips the dw GEMMs; a bf16 head then needs no group
// buffer beyond one chunk (groups exist only to batch the dw update).
//
// Per-row losses go to a [N] double Workspace array; a one-block kernel sums them (and counts
// the rows that are not ignored) in a fixed order, and the two numbers are copied to the host:
// the one synchronization of the op (its result is a host value).
#include <cstring>

#include "core/device.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace shardlm::ops::gpu {

namespace {

// One block per row of the chunk. The target (uniform across the block) decides whether the
// whole block returns early, so no thread skips a barrier another thread reaches. For the
// backward the row's gradient goes to `dl16` (bf16, when given) or over the logits in place.
__global__ void softmax_loss_kernel(float* logits, int64_t V, const int32_t* targets, double* row_loss,
                                    bool backward, float grad_scale, uint16_t* dl16) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  const int64_t row = blockIdx.x;
  float* z = logits + row * V;
  uint16_t* g16 = dl16 ? dl16 + row * V : nullptr;
  const int32_t t = targets[row];
  if (t == kIgnoreIndex || t < 0 || t >= V) {  // ignored (the front end refused other bad ids)
    if (backward)
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {  // no loss, no gradient
        if (g16)
          g16[j] = 0;
        else
          z[j] = 0.0f;
      }
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
  // dloss/dz = softmax(z) - onehot(target), pre-scaled so the GEMMs need no alpha. The same two
  // f32 operations as the CPU (times k, then minus grad_scale at the target).
  const float k = float(double(grad_scale) / sum);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    float g = z[j] * k;
    if (j == t) g -= grad_scale;
    if (g16)
      g16[j] = f32_to_bf16_bits(g);
    else
      z[j] = g;
  }
}

// loss_sum and count over rows whose target is not ignored: one block, thread i takes rows i,
// i + blockDim, ... in order, then a fixed-order block reduction (deterministic).
__global__ void loss_total_kernel(const double* row_loss, const int32_t* targets, int64_t N, double* sum_out,
                                  long long* count_out) {
  __shared__ double dscratch[32];
  __shared__ long long cscratch[32];
  double s = 0.0;
  long long c = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    if (targets[i] == kIgnoreIndex) continue;
    s += row_loss[i];
    ++c;
  }
  s = block_sum(s, dscratch);
  c = block_sum(c, cscratch);
  if (threadIdx.x == 0) {
    *sum_out = s;
    *count_out = c;
  }
}

// Bytes of bf16 dlogits collected before each dw update (the group buffer): 256 MiB is 1046
// rows at V = 128256, so with 256-row chunks the [V, D] f32 dw is updated every 4 chunks.
constexpr int64_t kGroupBytes = int64_t(256) << 20;
constexpr int64_t kMaxGroupChunks = 8;

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
  const bool with_dw = backward && dw.defined();
  if (N == 0) return {};
  const int64_t C = std::min(chunk_rows, N);
  const cudaStream_t stream = cuda::compute_stream();

  Buffer logits_buf(size_t(C * V) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  // Per-row losses, then (at the end) the total and the count.
  Buffer loss_buf(size_t(N + 2) * sizeof(double), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  double* row_loss = static_cast<double*>(loss_buf.data());

  if (w.dtype == DType::BF16) {
    // Rows per group: a multiple of C, at least C, at most kMaxGroupChunks chunks and what
    // kGroupBytes of dlogits holds.
    const int64_t chunks = std::clamp<int64_t>(kGroupBytes / (2 * V * C), 1, kMaxGroupChunks);
    const int64_t G = with_dw ? std::min(N, chunks * C) : C;
    Buffer dl_buf, x_buf;
    if (backward) dl_buf = Buffer(size_t(G * V) * 2, MemCategory::Workspace, /*zero=*/false, Device::CUDA);
    if (x.dtype == DType::F32) x_buf = Buffer(size_t(G * D) * 2, MemCategory::Workspace, /*zero=*/false, Device::CUDA);
    for (int64_t g0 = 0; g0 < N; g0 += G) {
      const int64_t g1 = std::min(N, g0 + G), grows = g1 - g0;
      Tensor xg = x.slice(g0, g1);
      if (x.dtype == DType::F32) {
        const Tensor x16 = Tensor::of(x_buf, DType::BF16, {grows, D});
        cast(x16, xg);
        xg = x16;
      }
      for (int64_t r0 = g0; r0 < g1; r0 += C) {
        const int64_t r1 = std::min(g1, r0 + C), rows = r1 - r0;
        const Tensor xc = xg.slice(r0 - g0, r1 - g0);
        const Tensor logits = Tensor::of(logits_buf, DType::F32, {rows, V});
        matmul(logits, xc, w, /*trans_a=*/false, /*trans_b=*/true, 1.0f, 0.0f);
        uint16_t* dl = backward ? static_cast<uint16_t*>(dl_buf.data()) + (r0 - g0) * V : nullptr;
        softmax_loss_kernel<<<checked_blocks(rows, "linear_cross_entropy"), row_threads(V), 0, stream>>>(
            logits.f32(), V, targets.i32() + r0, row_loss + r0, backward, grad_scale, dl);
        SHARDLM_CUDA_LAUNCH_CHECK();
        if (!backward) continue;
        // An all-ignored chunk has zero dlogits: dx gets zeros.
        const Tensor dlc = Tensor::view(dl, DType::BF16, {rows, V}, Device::CUDA);
        matmul(dx.slice(r0, r1), dlc, w, /*trans_a=*/false, /*trans_b=*/false, 1.0f, 0.0f);
      }
      if (!with_dw) continue;
      // dw after the group's dx: xg is a bf16 tensor, never the f32 dx, so the order is free.
      const Tensor dlg = Tensor::of(dl_buf, DType::BF16, {grows, V});
      matmul(dw, dlg, xg, /*trans_a=*/true, /*trans_b=*/false, 1.0f, /*beta=*/1.0f);
    }
  } else {
    Buffer x_buf;
    if (x.dtype == DType::BF16)
      x_buf = Buffer(size_t(C * D) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
    for (int64_t r0 = 0; r0 < N; r0 += C) {
      const int64_t r1 = std::min(N, r0 + C), rows = r1 - r0;
      Tensor xc = x.slice(r0, r1);
      if (x.dtype == DType::BF16) {
        const Tensor xf = Tensor::of(x_buf, DType::F32, {rows, D});
        cast(xf, xc);
        xc = xf;
      }
      const Tensor logits = Tensor::of(logits_buf, DType::F32, {rows, V});
      matmul(logits, xc, w, /*trans_a=*/false, /*trans_b=*/true, 1.0f, 0.0f);
      softmax_loss_kernel<<<checked_blocks(rows, "linear_cross_entropy"), row_threads(V), 0, stream>>>(
          logits.f32(), V, targets.i32() + r0, row_loss + r0, backward, grad_scale, nullptr);
      SHARDLM_CUDA_LAUNCH_CHECK();
      if (!backward) continue;
      // A chunk whose rows are all ignored has zero dlogits: dx gets zeros, dw += 0.
      // dw before dx: x_chunk's last use comes before dx_chunk is written, should they share memory.
      if (with_dw) matmul(dw, logits, xc, /*trans_a=*/true, /*trans_b=*/false, 1.0f, /*beta=*/1.0f);
      matmul(dx.slice(r0, r1), logits, w, /*trans_a=*/false, /*trans_b=*/false, 1.0f, 0.0f);
    }
  }

  // The host needs the loss: sum on the device, then copy_bytes waits for the compute stream.
  double* total = row_loss + N;
  loss_total_kernel<<<1, 256, 0, stream>>>(row_loss, targets.i32(), N, total, reinterpret_cast<long long*>(total + 1));
  SHARDLM_CUDA_LAUNCH_CHECK();
  double host[2];
  device::copy_bytes(host, Device::CPU, total, Device::CUDA, sizeof(host));
  long long count;
  std::memcpy(&count, &host[1], sizeof(count));
  return {host[0], int64_t(count)};
}

}  // namespace shardlm::ops::gpu
