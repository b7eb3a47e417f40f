#include <cmath>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"

namespace shardlm::ops::cpu {

namespace {
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float g = load(gate.data, gate.dtype, i);
    store(out.data, out.dtype, i, g * sigmoid(g) * load(up.data, up.dtype, i));
  }
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const int64_t n = dout.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float g = load(gate.data, gate.dtype, i);
    const float u = load(up.data, up.dtype, i);
    const float d = load(dout.data, dout.dtype, i);
    const float s = sigmoid(g);
    // d silu(g)/dg = s + g s (1 - s)
    store(dgate.data, dgate.dtype, i, d * u * (s * (1.0f + g * (1.0f - s))));
    store(dup.data, dup.dtype, i, d * g * s);
  }
}

}  // namespace shardlm::ops::cpu
