// CPU kernel of the fused output projection + cross-entropy (ops.h: linear_cross_entropy).
//
// Rows are processed chunk_rows at a time so that only one [chunk_rows, V] f32 block of logits
// exists at once. For each chunk:
//   logits = x_chunk @ w^T                                  (ops::matmul, outside any OpenMP region)
//   per row, in parallel: loss = logsumexp(logits) - logits[target]; for the backward the row
//     becomes dlogits = grad_scale * (softmax - onehot(target)) in place (zero if ignored)
//   dw += dlogits^T @ x_chunk (unless dw is undefined: a frozen head);  dx_chunk = dlogits @ w  (ops::matmul)
// The matmuls' operands are prepared here, once per call or chunk, so that ops::matmul allocates
// nothing (its scratch would be made once per chunk): on the f32 path (ops/cpu_bf16.h) a bf16 w and
// x are widened to f32; on the bf16 path (a bf16 head, on a CPU with bf16 hardware) they stay bf16
// (an f32 one is rounded) and dlogits is rounded to bf16 for the backward's two matmuls, as the
// CUDA kernel does.
#include <algorithm>
#include <cmath>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vec_math.h"
#include "ops/cpu_bf16.h"

namespace shardlm::ops::cpu {

namespace {

// The bf16 path: a bf16 operand, and bf16 hardware.
bool bf16_head(const Tensor& x, const Tensor& w) {
  return (x.dtype == DType::BF16 || w.dtype == DType::BF16) && cpu_bf16_enabled();
}

// `t` in dtype `to`: `t` itself, or its converted copy in `scratch`. Converting w here, once,
// keeps ops::matmul from converting the same operand again in every matmul of every chunk (w is
// the largest tensor involved: V x D).
Tensor converted(const Tensor& t, DType to, const Buffer& scratch) {
  if (t.dtype == to) return t;
  Tensor out = Tensor::view(scratch.data(), to, t.shape.data(), t.ndim);
  if (to == DType::F32)
    convert_bf16_to_f32(static_cast<const bf16_t*>(t.data), out.f32(), size_t(t.numel()));
  else
    convert_f32_to_bf16(t.f32(), static_cast<bf16_t*>(out.data), size_t(t.numel()));
  return out;
}

}  // namespace

CrossEntropyScratch cross_entropy_scratch(const Tensor& x, const Tensor& w, int64_t chunk_rows, bool backward,
                                          Device device) {
  const int64_t N = x.shape[0], D = x.shape[1], V = w.shape[0];
  if (N == 0) return {};
  const int64_t C = std::min(chunk_rows, N);
  const MemCategory ws = MemCategory::Workspace;
  const MemTag tag = mem_tag::kLossScratch;
  // The matmuls' operand dtype, and the bytes of a converted element.
  const DType mm = bf16_head(x, w) ? DType::BF16 : DType::F32;
  const size_t esize = mm == DType::BF16 ? 2 : 4;
  CrossEntropyScratch s;
  s.logits = Buffer(size_t(C * V) * sizeof(float), ws, /*zero=*/false, device, tag);
  if (w.dtype != mm) s.w = Buffer(size_t(w.numel()) * esize, ws, false, device, tag);
  if (x.dtype != mm) s.x = Buffer(size_t(C * D) * esize, ws, false, device, tag);
  if (mm == DType::BF16 && backward) s.dlogits = Buffer(size_t(C * V) * 2, ws, false, device, tag);
  return s;
}

CrossEntropyResult linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& dx,
                                        const Tensor& dw, float grad_scale, int64_t chunk_rows) {
  const int64_t N = x.shape[0], D = x.shape[1], V = w.shape[0];
  const bool backward = dx.defined();
  const int32_t* ids = targets.i32();
  if (N == 0) return {};

  const int64_t C = std::min(chunk_rows, N);
  // All scratch is allocated once per call: the logits block and the converted operands.
  const CrossEntropyScratch scratch = cross_entropy_scratch(x, w, chunk_rows, backward, Device::CPU);
  const DType mm = bf16_head(x, w) ? DType::BF16 : DType::F32;
  const Buffer &logits_buf = scratch.logits, &x_buf = scratch.x;
  const Tensor wm = converted(w, mm, scratch.w);

  double loss_sum = 0.0;
  int64_t count = 0;
  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t r1 = std::min(N, r0 + C), rows = r1 - r0;
    const Tensor xc = x.dtype == mm ? x.slice(r0, r1) : converted(x.slice(r0, r1), mm, x_buf);
    const Tensor logits = Tensor::of(logits_buf, DType::F32, {rows, V});
    ops::matmul(logits, xc, wm, /*trans_a=*/false, /*trans_b=*/true);

    float* L = logits.f32();
    // On the bf16 path the backward's dlogits are written as bf16 straight from the softmax (the
    // same rounding of the same f32 values as converting the f32 block after, one pass fewer).
    const bool bf16_dlogits = backward && mm == DType::BF16;
    const Tensor dl = bf16_dlogits ? Tensor::of(scratch.dlogits, DType::BF16, {rows, V}) : logits;
    bf16_t* DL = bf16_dlogits ? static_cast<bf16_t*>(dl.data) : nullptr;
    const int32_t* chunk_ids = ids + r0;
    double chunk_loss = 0.0;
    int64_t chunk_count = 0;
    // Threads only when there is enough work: waking the OpenMP team leaves it spinning for a
    // while afterwards, which slows the BLAS threads of the next matmul on a small problem.
#pragma omp parallel for schedule(static) reduction(+ : chunk_loss, chunk_count) if (rows * V >= (1 << 15))
    for (int64_t i = 0; i < rows; ++i) {
      float* row = L + i * V;
      const int32_t t = chunk_ids[i];
      if (t == kIgnoreIndex) {  // no loss, so no gradient
        if (bf16_dlogits)
          std::fill(DL + i * V, DL + (i + 1) * V, bf16_t{0});
        else if (backward)
          std::fill(row, row + V, 0.0f);
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
        if (bf16_dlogits) {
          const float target = row[t] * k - grad_scale;
          bf16_t* dl_row = DL + i * V;
#pragma omp simd
          for (int64_t j = 0; j < V; ++j) dl_row[j] = f32_to_bf16(row[j] * k);
          dl_row[t] = f32_to_bf16(target);
        } else {
#pragma omp simd
          for (int64_t j = 0; j < V; ++j) row[j] *= k;
          row[t] -= grad_scale;
        }
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
    if (dw.defined()) ops::matmul(dw, dl, xc, /*trans_a=*/true, /*trans_b=*/false, 1.0f, /*beta=*/1.0f);
    ops::matmul(dxc, dl, wm, /*trans_a=*/false, /*trans_b=*/false);
  }
  return {loss_sum, count};
}

}  // namespace shardlm::ops::cpu
