// SwiGLU: out = silu(gate) * up, silu(g) = g * sigmoid(g). Elementwise and memory-bound. Both
// directions run over pieces of kPiece elements: each bf16 operand is widened into f32 scratch,
// the formula runs on f32 vectors, and a bf16 result is rounded back (f32 operands are read and
// written in place). A per-element dtype dispatch (elem.h's load/store) kept the loop scalar, and
// in bf16 training the backward was 6% of a 19M-parameter step.
#include <algorithm>

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

constexpr int64_t kPiece = 1024;  // elements per piece: each scratch array 4 KiB on the stack


}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const int64_t n = out.numel(), pieces = (n + kPiece - 1) / kPiece;
  parallel_region(n > 16384, [&] {
    alignas(64) float gs[kPiece], us[kPiece], os[kPiece];
#pragma omp for schedule(static)
    for (int64_t c = 0; c < pieces; ++c) {
      const int64_t b = c * kPiece, len = std::min(kPiece, n - b);
      const float* g = span_f32(gate, b, len, gs);
      const float* u = span_f32(up, b, len, us);
      float* o = span_out(out, b, os);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) o[i] = swiglu(g[i], u[i]);
      finish_out(out, b, len, os);
    }
  });
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const int64_t n = dout.numel(), pieces = (n + kPiece - 1) / kPiece;
  parallel_region(n > 16384, [&] {
    alignas(64) float gs[kPiece], us[kPiece], ds[kPiece], dgs[kPiece], dus[kPiece];
#pragma omp for schedule(static)
    for (int64_t c = 0; c < pieces; ++c) {
      const int64_t b = c * kPiece, len = std::min(kPiece, n - b);
      const float* g = span_f32(gate, b, len, gs);
      const float* u = span_f32(up, b, len, us);
      const float* d = span_f32(dout, b, len, ds);
      float* dg = span_out(dgate, b, dgs);
      float* du = span_out(dup, b, dus);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) swiglu_grads(g[i], u[i], d[i], dg[i], du[i]);
      finish_out(dgate, b, len, dgs);
      finish_out(dup, b, len, dus);
    }
  });
}

}  // namespace shardlm::ops::cpu
