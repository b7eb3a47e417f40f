// CPU kernel of the fused output projection + cross-entropy (ops.h: linear_cross_entropy).
//
// Rows are processed chunk_rows at a time so that only one [chunk_rows, V] f32 block of logits
// exists at once. For each chunk:
//   logits = x_chunk @ w^T                                  (BLAS, outside any OpenMP region)
//   per row, in parallel: loss = logsumexp(logits) - logits[target]; for the backward the row
//     becomes dlogits = grad_scale * (softmax - onehot(target)) in place (zero if ignored)
//   dw += dlogits^T @ x_chunk (unless dw is undefined: a frozen head);  dx_chunk = dlogits @ w  (BLAS)
#include <algorithm>
#include <cmath>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec_math.h"

namespace shardlm::ops::cpu {

namespace {

// An f32 view of `t`: `t` itself, or its widened copy in `scratch` when it is bf16. Widening here,
// once, keeps ops::matmul from widening the same bf16 operand again in every matmul of every chunk
// (w is the largest tensor involved: V x D).
Tensor widened(const Tensor& t, const Buffer& scratch) {
  if (t.dtype == DType::F32) return t;
  Tensor out = Tensor::view(scratch.data(), DType::F32, t.shape.data(), t.ndim);
  convert_bf16_to_f32(static_cast<const bf16_t*>(t.data), out.f32(), size_t(t.numel()));
  return out;
}

}  // namespace

CrossEntropyScratch cross_entropy_scratch(const Tensor& x, const Tensor& w, int64_t chunk_rows, Device device) {
  const int64_t N = x.shape[0], D = x.shape[1], V = w.shape[0];
  if (N == 0) return {};
  const int64_t C = std::min(chunk_rows, N);
  const MemCategory ws = MemCategory::Workspace;
  const MemTag tag = mem_tag::kLossScratch;
  CrossEntropyScratch s;
  s.logits = Buffer(size_t(C * V) * sizeof(float), ws, /*zero=*/false, device, tag);
  if (w.dtype == DType::BF16) s.w = Buffer(size_t(w.numel()) * sizeof(float), ws, false, device, tag);
  if (x.dtype == DType::BF16) s.x = Buffer(size_t(C * D) * sizeof(float), ws, false, device, tag);
  return s;
}

CrossEntropyResult linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& dx,
                                        const Tensor& dw, float grad_scale, int64_t chunk_rows) {
  const int64_t N = x.shape[0], D = x.shape[1], V = w.shape[0];
  const bool backward = dx.defined();
  const int32_t* ids = targets.i32();
  if (N == 0) return {};

  const int64_t C = std::min(chunk_rows, N);
  // All scratch is allocated once per call: the logits block and, for bf16 inputs, f32 copies.
  const CrossEntropyScratch scratch = cross_entropy_scratch(x, w, chunk_rows, Device::CPU);
  const Buffer &logits_buf = scratch.logits, &x_buf = scratch.x;
  const Tensor wf = widened(w, scratch.w);

  double loss_sum = 0.0;
  int64_t count = 0;
  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t r1 = std::min(N, r0 + C), rows = r1 - r0;
    Tensor xc = x.slice(r0, r1);
    if (x.dtype == DType::BF16) {
      Tensor xf = Tensor::of(x_buf, DType::F32, {rows, D});
      convert_bf16_to_f32(static_cast<const bf16_t*>(xc.data), xf.f32(), size_t(rows * D));
      xc = xf;
    }
    const Tensor logits = Tensor::of(logits_buf, DType::F32, {rows, V});
    ops::matmul(logits, xc, wf, /*trans_a=*/false, /*trans_b=*/true);

    float* L = logits.f32();
    const int32_t* chunk_ids = ids + r0;
    double chunk_loss = 0.0;
    int64_t chunk_count = 0;
    // Threads only when there is enough work: waking the OpenMP team leaves it spinning for a
    // while afterwards, which slows the BLAS threads of the next matmul on a small problem.
#pragma omp parallel for schedule(static) reduction(+ : chunk_loss, chunk_count) if (rows * V >= (1 << 15))
    for (int64_t i = 0; i < rows; ++i) {
      float* row = L + i * V;
      const int32_t t = chunk_ids[i];
      if (t == kIgnoreIndex) {
        if (backward) std::fill(row, row + V, 0.0f);  // no loss, so no gradient
        continue;
      }
      const float target_logit = row[t];  // read before the row is overwritten below
      // The simd reductions let the compiler vectorize these loops without -ffast-math.
      float m = row[0];
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < V; ++j) m = row[j] > m ? row[j] : m;
      // Subtracting the max keeps exp() in range; the row keeps exp(z - m) for the softmax.
      // Summed in f32 over blocks of 1024 and the blocks in f64: a double accumulator inside
      // the vector loop would keep GCC from vectorizing it.
      constexpr int64_t kSumBlock = 1024;
      double sum = 0.0;
      for (int64_t j0 = 0; j0 < V; j0 += kSumBlock) {
        const int64_t j1 = std::min(V, j0 + kSumBlock);
        float block = 0.0f;
#pragma omp simd reduction(+ : block)
        for (int64_t j = j0; j < j1; ++j) {
          const float e = exp_nonpositive(row[j] - m);
          row[j] = e;
          block += e;
        }
        sum += block;
      }
      chunk_loss += double(m) + std::log(sum) - double(target_logit);
      ++chunk_count;
      if (backward) {
        // dloss/dz = softmax(z) - onehot(target), scaled here so the matmuls below need no alpha.
        const float k = float(double(grad_scale) / sum);
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) row[j] *= k;
        row[t] -= grad_scale;
      }
    }
    loss_sum += chunk_loss;
    count += chunk_count;

    if (!backward) continue;
    const Tensor dxc = dx.slice(r0, r1);
    if (chunk_count == 0) {
      // Every row ignored: dlogits is all zero, so skip both matmuls; dx is written, dw unchanged.
      std::fill(dxc.f32(), dxc.f32() + rows * D, 0.0f);
      continue;
    }
    // dw before dx: x_chunk's last use comes before dx_chunk is written, should they share memory.
    if (dw.defined()) ops::matmul(dw, logits, xc, /*trans_a=*/true, /*trans_b=*/false, 1.0f, /*beta=*/1.0f);
    ops::matmul(dxc, logits, wf, /*trans_a=*/false, /*trans_b=*/false);
  }
  return {loss_sum, count};
}

}  // namespace shardlm::ops::cpu
