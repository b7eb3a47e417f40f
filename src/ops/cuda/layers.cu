// CUDA kernels of the embedding, RoPE and RMSNorm, forward and backward.
#include "core/device.h"
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

// Deterministic and atomic-free, with the CPU's bits: every (id, column) element is owned by one
// thread, which adds dout[i, d] for the tokens i carrying that id in token order, as the CPU
// does. Blocks tile the columns (blockDim.x consecutive columns, coalesced) and split the
// vocabulary into gridDim.y classes (id % gridDim.y): each block walks all N ids (small, cached)
// and handles only the tokens of its class. Repeated ids cannot race, and the parallelism is
// D x classes instead of D.
__global__ void embedding_backward_kernel(float* dw, const void* dout, DType t, const int32_t* ids, int64_t N,
                                          int64_t D, int64_t V) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= D) return;  // no barriers below
  const int64_t classes = gridDim.y, cls = blockIdx.y;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t id = ids[i];
    if (id < 0 || id >= V || id % classes != cls) continue;
    dw[id * D + d] += load(dout, t, i * D + d);
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

// dw[j] += sum_n dy[n, j] * h[n, j] in double, deterministic and atomic-free. Blocks tile the
// columns (blockDim.x consecutive columns, coalesced) and the rows (gridDim.y parts of
// rows_per_part rows); each thread sums its column over its part's rows in order. With one part
// the thread adds its sum to dw; otherwise it writes a double partial [part, j] and
// rmsnorm_dw_finish adds the parts in order. Launched before the dx kernel: dx may alias dy.
__global__ void rmsnorm_dw_kernel(float* dw, double* partial, const void* dy, DType dyt, const void* x, DType xt,
                                  const float* rstd, int64_t N, int64_t D, int64_t rows_per_part) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= D) return;  // no barriers below
  const bool x_bf16 = xt == DType::BF16;
  const int64_t n0 = int64_t(blockIdx.y) * rows_per_part, n1 = min(N, n0 + rows_per_part);
  double acc = 0.0;
  for (int64_t n = n0; n < n1; ++n) {
    float h = __fmul_rn(load(x, xt, n * D + j), rstd[n]);
    if (x_bf16) h = round_to_bf16(h);
    acc += double(load(dy, dyt, n * D + j)) * double(h);
  }
  if (gridDim.y == 1)
    dw[j] += float(acc);
  else
    partial[int64_t(blockIdx.y) * D + j] = acc;
}

__global__ void rmsnorm_dw_finish(float* dw, const double* partial, int64_t parts, int64_t D) {
  SHARDLM_GRID_STRIDE(j, D) {
    double acc = 0.0;
    for (int64_t p = 0; p < parts; ++p) acc += partial[p * D + j];
    dw[j] += float(acc);
  }
}

// Column-tile width and the number of row parts (or id classes) for the two column reductions
// above: enough blocks to fill an H100 (132 SMs) several times over, each part at least
// kMinRowsPerPart rows so a partial is worth its round trip through memory.
constexpr int kColThreads = 128;
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kMinRowsPerPart = 32;

int64_t column_tiles(int64_t D) { return (D + kColThreads - 1) / kColThreads; }

int64_t parts_for(int64_t tiles, int64_t limit) {
  return std::clamp<int64_t>(kTargetBlocks / tiles, 1, std::max<int64_t>(1, std::min<int64_t>(limit, 65535)));
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
  const int64_t tiles = column_tiles(D);
  const dim3 grid(checked_blocks(tiles, "embedding_backward"), unsigned(parts_for(tiles, V)));
  embedding_backward_kernel<<<grid, kColThreads, 0, cuda::compute_stream()>>>(dweight.f32(), dout.data, dout.dtype,
                                                                              ids.i32(), N, D, V);
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
  // dw first (dx may alias dy); a frozen weight (dw undefined) launches neither dw kernel.
  if (dw.defined()) {
    const int64_t tiles = column_tiles(D);
    const int64_t parts = parts_for(tiles, (N + kMinRowsPerPart - 1) / kMinRowsPerPart);
    const int64_t rows_per_part = (N + parts - 1) / parts;
    const int64_t used = (N + rows_per_part - 1) / rows_per_part;  // every part non-empty
    Buffer partial;
    if (used > 1)
      partial = Buffer(size_t(used * D) * sizeof(double), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
    const dim3 grid(checked_blocks(tiles, "rmsnorm_backward"), unsigned(used));
    rmsnorm_dw_kernel<<<grid, kColThreads, 0, stream>>>(dw.f32(), static_cast<double*>(partial.data()), dy.data,
                                                        dy.dtype, x.data, x.dtype, rstd.f32(), N, D, rows_per_part);
    SHARDLM_CUDA_LAUNCH_CHECK();
    if (used > 1) {
      rmsnorm_dw_finish<<<grid_for(D), kThreads, 0, stream>>>(dw.f32(), static_cast<double*>(partial.data()), used,
                                                              D);
      SHARDLM_CUDA_LAUNCH_CHECK();
    }
  }
  rmsnorm_dx_kernel<<<checked_blocks(N, "rmsnorm_backward"), row_threads(D), 0, stream>>>(
      dx.data, dx.dtype, dy.data, dy.dtype, x.data, x.dtype, w.data, w.dtype, rstd.f32(), D);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

}  // namespace shardlm::ops::gpu
