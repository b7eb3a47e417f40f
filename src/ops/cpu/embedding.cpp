#include <algorithm>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"

namespace shardlm::ops::cpu {

void embedding_forward(const Tensor& out, const Tensor& weight, const Tensor& ids) {
  const int64_t N = out.shape[0], D = out.shape[1];
  const int32_t* id = static_cast<const int32_t*>(ids.data);
  parallel_region(N * D >= kMinParallelWork, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t src = int64_t(id[i]) * D;
      for (int64_t d = 0; d < D; ++d) store(out.data, out.dtype, i * D + d, load(weight.data, weight.dtype, src + d));
    }
  });
}

void embedding_backward(const Tensor& dweight, const Tensor& dout, const Tensor& ids) {
  // Several tokens may share an id, so rows of dweight get concurrent updates. Instead of atomics,
  // each thread owns a band of columns and walks all tokens: no races, and the summation order
  // per element (token order) is fixed, so results are deterministic.
  const int64_t N = dout.shape[0], D = dout.shape[1];
  const int32_t* id = static_cast<const int32_t*>(ids.data);
  float* dw = static_cast<float*>(dweight.data);
  constexpr int64_t kBand = 64;
  const int64_t bands = (D + kBand - 1) / kBand;
#pragma omp parallel for schedule(static)
  for (int64_t band = 0; band < bands; ++band) {
    const int64_t d0 = band * kBand, d1 = std::min(D, d0 + kBand);
    for (int64_t i = 0; i < N; ++i) {
      float* row = dw + int64_t(id[i]) * D;
      for (int64_t d = d0; d < d1; ++d) row[d] += load(dout.data, dout.dtype, i * D + d);
    }
  }
}

}  // namespace shardlm::ops::cpu
