// CUDA kernels of the embedding, RoPE and RMSNorm, forward and backward.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace shardlm::ops::gpu {

namespace {

// ---- embedding ---------------------------------------------------------------------------------
// One thread per output element. The front end has checked every id against the vocabulary; the
// kernel still skips an id outside [0, V) rather than read out of bounds.
__global__ void embedding_forward_kernel(void* out, DType ot, const void* w, DType wt, const int32_t* ids, int64_t N,
                                         int64_t D, int64_t V) {
  SHARDLM_GRID_STRIDE(e, N * D) {
    const int64_t i = e / D, d = e % D;
    const int64_t id = ids[i];
    if (id < 0 || id >= V) continue;
    store(out, ot, e, load(w, wt, id * D + d));
  }
}

// Deterministic and atomic-free, as the CPU: one thread per column d walks all tokens in order
// and adds dout[i, d] into dweight[ids[i], d]. Threads own disjoint columns, so repeated ids
// cannot race, and each element's additions happen in token order: the result is the CPU's
// bits. The price is parallelism limited to D threads, each walking N tokens (coalesced).
__global__ void embedding_backward_kernel(float* dw, const void* dout, DType t, const int32_t* ids, int64_t N,
                                          int64_t D, int64_t V) {
  SHARDLM_GRID_STRIDE(d, D) {
    for (int64_t i = 0; i < N; ++i) {
      const int64_t id = ids[i];
      if (id < 0 || id >= V) continue;
      dw[id * D + d] += load(dout, t, i * D + d);
    }
  }
}

// ---- RoPE --------------------------------------------------------------------------------------
// One thread per rotated pair (b, t, h, i < Dh/2). The thread reads both elements before writing
// them, so out may alias x. The f32 operations are spelled out (no fused multiply-add) to match
// ops/cpu/rope.cpp; cosf/sinf are CUDA's full-precision versions (a few ulp from glibc at most).
__global__ void rope_kernel(void* out, DType ot, const void* x, DType xt, const int32_t* pos, const float* freq,
                            int64_t BT, int64_t H, int64_t half, float sign) {
  SHARDLM_GRID_STRIDE(e, BT * H * half) {
    const int64_t i = e % half, bth = e / half, bt = bth / H;
    const float angle = __fmul_rn(float(pos[bt]), freq[i]);
    const float c = cosf(angle), s = __fmul_rn(sign, sinf(angle));
    const int64_t base = bth * 2 * half;
    const float x1 = load(x, xt, base + i);
    const float x2 = load(x, xt, base + half + i);
    store(out, ot, base + i, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    store(out, ot, base + half + i, __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
  }
}

// ---- RMSNorm -----------------------------------------------------------------------------------
// One block per row, f32 math as ops/cpu/rmsnorm.cpp: the sum of squares in double, the mean an
// f32 division, rstd = 1 / sqrt(var + eps); a bf16 x has h = x * rstd rounded to bf16 before the
// multiplication by w (Hugging Face's h.to(dtype)).
__global__ void rmsnorm_forward_kernel(void* y, DType yt, float* rstd, const void* x, DType xt, const void* w,
                                       DType wt, int64_t D, float eps) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * D;
  double ss = 0.0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const double v = load(x, xt, base + j);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float var = __fdiv_rn(float(ss), float(D));
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
  if (threadIdx.x == 0) rstd[row] = r;
  const bool x_bf16 = xt == DType::BF16;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    float h = __fmul_rn(load(x, xt, base + j), r);
    if (x_bf16) h = round_to_bf16(h);
    store(y, yt, base + j, __fmul_rn(load(w, wt, j), h));
  }
}

// dw[j] += sum_n dy[n, j] * h[n, j]: one thread per column, rows in order, in double, as the CPU
// does (deterministic, no atomics). Launched before the dx kernel: dx may alias dy.
__global__ void rmsnorm_dw_kernel(float* dw, const void* dy, DType dyt, const void* x, DType xt, const float* rstd,
                                  int64_t N, int64_t D) {
  const bool x_bf16 = xt == DType::BF16;
  SHARDLM_GRID_STRIDE(j, D) {
    double acc = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      float h = __fmul_rn(load(x, xt, n * D + j), rstd[n]);
      if (x_bf16) h = round_to_bf16(h);
      acc += double(load(dy, dyt, n * D + j)) * double(h);
    }
    dw[j] += float(acc);
  }
}

// dx = r * (w * dy) - x * r^3 * mean(w * dy * x), one block per row. Every thread finishes its
// reads of the row (the reduction) before any thread writes dx, so dx may alias dy.
__global__ void rmsnorm_dx_kernel(void* dx, DType dxt, const void* dy, DType dyt, const void* x, DType xt,
                                  const void* w, DType wt, const float* rstd, int64_t D) {
  __shared__ double scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * D;
  double dot = 0.0;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    dot += double(__fmul_rn(load(w, wt, j), load(dy, dyt, base + j))) * double(load(x, xt, base + j));
  dot = block_sum(dot, scratch);
  const float rn = rstd[row];
  const float c = __fmul_rn(__fmul_rn(__fmul_rn(float(dot / double(D)), rn), rn), rn);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    // Element j is read and written by the same thread, so aliasing dy is still safe here.
    const float wdy = __fmul_rn(load(w, wt, j), load(dy, dyt, base + j));
    store(dx, dxt, base + j, __fsub_rn(__fmul_rn(rn, wdy), __fmul_rn(load(x, xt, base + j), c)));
  }
}

// Threads per row block: a multiple of 32, no more than the row needs (rows are often short in
// tests and up to 8192 wide in models).
unsigned row_threads(int64_t D) {
  int64_t t = 32;
  while (t < D && t < 1024) t *= 2;
  return unsigned(t);
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& ids) {
  const int64_t N = out.shape[0], D = out.shape[1], V = weight.shape[0];
  if (N * D == 0) return;
  embedding_forward_kernel<<<grid_for(N * D), kThreads, 0, cuda::compute_stream()>>>(
      out.data, out.dtype, weight.data, weight.dtype, ids.i32(), N, D, V);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& ids) {
  const int64_t N = dout.shape[0], D = dout.shape[1], V = dweight.shape[0];
  if (N * D == 0) return;
  embedding_backward_kernel<<<grid_for(D), kThreads, 0, cuda::compute_stream()>>>(dweight.f32(), dout.data,
                                                                                  dout.dtype, ids.i32(), N, D, V);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void rope_apply(const Tensor& out, const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float sign) {
  const int64_t BT = x.shape[0] * x.shape[1], H = x.shape[2], half = x.shape[3] / 2;
  if (BT * H * half == 0) return;
  rope_kernel<<<grid_for(BT * H * half), kThreads, 0, cuda::compute_stream()>>>(
      out.data, out.dtype, x.data, x.dtype, positions.i32(), inv_freq.f32(), BT, H, half, sign);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t N = x.shape[0], D = x.shape[1];
  if (N == 0) return;
  rmsnorm_forward_kernel<<<checked_blocks(N, "rmsnorm_forward"), row_threads(D), 0, cuda::compute_stream()>>>(
      y.data, y.dtype, rstd.f32(), x.data, x.dtype, w.data, w.dtype, D, eps);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  const int64_t N = x.shape[0], D = x.shape[1];
  if (N == 0) return;
  const cudaStream_t stream = cuda::compute_stream();
  rmsnorm_dw_kernel<<<grid_for(D), kThreads, 0, stream>>>(dw.f32(), dy.data, dy.dtype, x.data, x.dtype, rstd.f32(),
                                                          N, D);
  SHARDLM_CUDA_LAUNCH_CHECK();
  rmsnorm_dx_kernel<<<checked_blocks(N, "rmsnorm_backward"), row_threads(D), 0, stream>>>(
      dx.data, dx.dtype, dy.data, dy.dtype, x.data, x.dtype, w.data, w.dtype, rstd.f32(), D);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::ops::gpu
