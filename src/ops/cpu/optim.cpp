#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"

namespace shardlm::ops::cpu {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWConfig& cfg,
                int64_t step, float grad_scale) {
  // Follows torch.optim.AdamW (single-tensor path) operation by operation, including where
  // Python computes scalars in double before they meet f32 tensors, so results agree to ~1 ulp.
  const int64_t n = param.numel();
  float* p = static_cast<float*>(param.data);
  const float* g = static_cast<const float*>(grad.data);
  float* mm = static_cast<float*>(m.data);
  float* vv = static_cast<float*>(v.data);
  const float decay = float(1.0 - cfg.lr * cfg.weight_decay);
  const double bias1 = 1.0 - std::pow(cfg.beta1, double(step));
  const double bias2 = 1.0 - std::pow(cfg.beta2, double(step));
  const float step_size = float(cfg.lr / bias1);
  const float bias2_sqrt = float(std::sqrt(bias2));
  const float w1 = float(1.0 - cfg.beta1);  // lerp weight of the new gradient
  const float b2 = float(cfg.beta2), w2 = float(1.0 - cfg.beta2);
  const float eps = float(cfg.eps);
  parallel_region(n > 16384, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * grad_scale;
      p[i] *= decay;
      mm[i] += w1 * (gi - mm[i]);  // torch's lerp for weights < 0.5
      vv[i] = vv[i] * b2 + w2 * gi * gi;
      const float denom = std::sqrt(vv[i]) / bias2_sqrt + eps;
      p[i] += -step_size * (mm[i] / denom);
    }
  });
}

double sum_squares(const Tensor& x) {
  // Fixed-size chunks summed in a fixed order: the result does not depend on the thread count.
  constexpr int64_t kChunk = 8192;
  const int64_t n = x.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
  parallel_region(chunks > 4, [&] {
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0.0;
      const int64_t begin = c * kChunk, end = std::min(n, (c + 1) * kChunk);
      if (x.dtype == DType::F32) {
        // The f32 case (every gradient buffer) in its own loop, so that it vectorizes: in double
        // lanes, summed in a fixed order, so the result is still the same for any thread count.
        const float* p = x.f32();
#pragma omp simd reduction(+ : s)
        for (int64_t i = begin; i < end; ++i) s += double(p[i]) * double(p[i]);
      } else {
        for (int64_t i = begin; i < end; ++i) {
          const double e = load(x.data, x.dtype, i);
          s += e * e;
        }
      }
      partial[size_t(c)] = s;
    }
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace shardlm::ops::cpu
