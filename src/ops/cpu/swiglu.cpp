// SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g). Elementwise and memory-bound; the
// all-f32 case (every f32 run) gets its own loop so that it vectorizes, since the per-element
// dtype dispatch of load/store keeps the mixed-dtype loop scalar.
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/vec_math.h"

namespace shardlm::ops::cpu {

namespace {

// The formulas, once for both loops below. d silu(g)/dg = s + g s (1 - s), s = sigmoid(g).
inline float swiglu(float g, float u) { return g * sigmoid(g) * u; }
inline void swiglu_grads(float g, float u, float d, float& dg, float& du) {
  const float s = sigmoid(g);
  dg = d * u * (s * (1.0f + g * (1.0f - s)));
  du = d * g * s;
}

bool all_f32(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype != DType::F32) return false;
  return true;
}

}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel();
  if (all_f32({&out, &gate, &up})) {
    float* o = out.f32();
    const float* g = gate.f32();
    const float* u = up.f32();
    parallel_region(n > 16384, [&] {
#pragma omp for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = swiglu(g[i], u[i]);
    });
    return;
  }
  parallel_region(n > 16384, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      store(out.data, out.dtype, i, swiglu(load(gate.data, gate.dtype, i), load(up.data, up.dtype, i)));
  });
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const int64_t n = dout.numel();
  if (all_f32({&dgate, &dup, &dout, &gate, &up})) {
    float* dg = dgate.f32();
    float* du = dup.f32();
    const float* d = dout.f32();
    const float* g = gate.f32();
    const float* u = up.f32();
    parallel_region(n > 16384, [&] {
#pragma omp for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) swiglu_grads(g[i], u[i], d[i], dg[i], du[i]);
    });
    return;
  }
  parallel_region(n > 16384, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      float dg = 0.0f, du = 0.0f;
      swiglu_grads(load(gate.data, gate.dtype, i), load(up.data, up.dtype, i), load(dout.data, dout.dtype, i), dg, du);
      store(dgate.data, dgate.dtype, i, dg);
      store(dup.data, dup.dtype, i, du);
    }
  });
}

}  // namespace shardlm::ops::cpu
