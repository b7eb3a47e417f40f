// RMSNorm on the CPU, with the numerics of Hugging Face's LlamaRMSNorm:
//
//   h = x.float(); h = h * rsqrt(mean(h^2) + eps); y = w * h.to(x.dtype)
//
// Everything is computed in f32. The one place the input dtype shows is that a bf16 x has its
// normalized value h rounded to bf16 before the multiplication by w, as HF does; the backward
// uses that same rounded h for dw (the exact gradient of what the forward computed) and treats
// the rounding as the identity for dx, as autograd does.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"

namespace shardlm::ops::cpu {

namespace {

inline float round_to_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// w as f32 (it is read once per row by every thread; converting it up front is cheaper).
std::vector<float> weight_f32(const Tensor& w, int64_t D) {
  std::vector<float> wf(size_t(D), 0.0f);
  for (int64_t j = 0; j < D; ++j) wf[size_t(j)] = load(w.data, w.dtype, j);
  return wf;
}

}  // namespace

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  const int64_t N = x.shape[0], D = x.shape[1];
  const bool x_bf16 = x.dtype == DType::BF16;
  const std::vector<float> wf = weight_f32(w, D);
  float* rstd_out = rstd.f32();

  parallel_region(N * D >= kMinParallelWork, [&] {
    const size_t d = static_cast<size_t>(D);
    std::vector<float> x_scratch(d), y_row(d);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = row_f32(x, n, D, x_scratch.data());
      // torch sums x^2 in f32 with several partial sums; a double sum rounded to f32 is at least
      // as accurate and agrees with it to about an ulp. The mean is then an f32 division, as in
      // torch (sum, then divide by D).
      double ss = 0.0;
      for (int64_t j = 0; j < D; ++j) ss += double(xr[j]) * double(xr[j]);
      const float var = float(ss) / float(D);
      const float r = 1.0f / std::sqrt(var + eps);  // torch.rsqrt is 1 / sqrt in f32
      rstd_out[n] = r;
      for (int64_t j = 0; j < D; ++j) {
        float h = xr[j] * r;
        if (x_bf16) h = round_to_bf16(h);  // HF: h.to(input_dtype) before the multiply by w
        y_row[size_t(j)] = wf[size_t(j)] * h;
      }
      store_row(y, n, D, y_row.data());
    }
  });
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  const int64_t N = x.shape[0], D = x.shape[1];
  const bool x_bf16 = x.dtype == DType::BF16;
  const std::vector<float> wf = weight_f32(w, D);
  const float* r = rstd.f32();

  // dw[j] += sum_n dy[n, j] * h[n, j], h = x * rstd (rounded to bf16 when x is: see the top).
  // Parallel over blocks of columns, each summing its rows in order into doubles: no per-thread
  // copies of dw, and the result is the same bits whatever the number of threads. It runs before
  // dx is written, so it still reads the right dy even if a caller passes dx aliasing dy.
  // Skipped for a frozen weight (dw undefined); dx does not depend on it.
  if (dw.defined()) {
    constexpr int64_t kBlock = 64;
    float* dw_out = dw.f32();
    const int64_t blocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t j0 = b * kBlock, j1 = std::min(D, j0 + kBlock);
      double acc[kBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const int64_t row = n * D;
        for (int64_t j = j0; j < j1; ++j) {
          float h = load(x.data, x.dtype, row + j) * r[n];
          if (x_bf16) h = round_to_bf16(h);
          acc[j - j0] += double(load(dy.data, dy.dtype, row + j)) * double(h);
        }
      }
      for (int64_t j = j0; j < j1; ++j) dw_out[j] += float(acc[j - j0]);
    }
  }

  // y = w * x * r with r = (mean(x^2) + eps)^(-1/2) and dr/dx_j = -r^3 x_j / D, so
  //   dx = r * (w * dy) - x * r^3 * mean(w * dy * x).
#pragma omp parallel
  {
    const size_t d = static_cast<size_t>(D);
    std::vector<float> x_scratch(d), dy_scratch(d), dx_row(d);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = row_f32(x, n, D, x_scratch.data());
      const float* dyr = row_f32(dy, n, D, dy_scratch.data());
      double dot = 0.0;
      for (int64_t j = 0; j < D; ++j) dot += double(wf[size_t(j)] * dyr[j]) * double(xr[j]);
      const float rn = r[n];
      const float c = float(dot / double(D)) * rn * rn * rn;
      for (int64_t j = 0; j < D; ++j) dx_row[size_t(j)] = rn * (wf[size_t(j)] * dyr[j]) - xr[j] * c;
      store_row(dx, n, D, dx_row.data());
    }
  }
}

}  // namespace shardlm::ops::cpu
