// Rotary position embedding on the CPU, with the numerics of Hugging Face's Llama:
//   freqs = inv_freq @ positions.float()  (an f32 product per (position, frequency))
//   cos, sin = cos(freqs), sin(freqs) in f32
//   out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[Dh/2:], x[:Dh/2])
// as separate f32 multiplies and an add (no fused multiply-add, which would round differently).
// For bf16 tensors the arithmetic stays f32 and only the result is rounded; HF would also round
// cos, sin and each product to bf16.

// See above: keep x*cos - x2*sin as two roundings plus one, as torch computes it.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"

namespace shardlm::ops::cpu {

// sign = +1 rotates by +angle (forward), -1 by -angle (the backward: the transpose of a rotation
// is its inverse). out may be x: each (i, i + Dh/2) pair is read completely before it is written.
void rope_apply(const Tensor& out, const Tensor& x, const Tensor& positions, const Tensor& inv_freq, float sign) {
  const int64_t B = x.shape[0], T = x.shape[1], H = x.shape[2], Dh = x.shape[3];
  const int64_t half = Dh / 2;
  const int32_t* pos = positions.i32();
  const float* freq = inv_freq.f32();
  const DType xt = x.dtype, ot = out.dtype;

  parallel_region(B * T * H * Dh >= kMinParallelWork, [&] {
    std::vector<float> cos_a(static_cast<size_t>(half)), sin_a(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      // One position per (b, t): its angles serve every head.
      const float p = float(pos[bt]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = p * freq[i];
        cos_a[size_t(i)] = std::cos(angle);
        sin_a[size_t(i)] = sign * std::sin(angle);
      }
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = (bt * H + h) * Dh;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = load(x.data, xt, base + i);
          const float x2 = load(x.data, xt, base + half + i);
          const float c = cos_a[size_t(i)], s = sin_a[size_t(i)];
          store(out.data, ot, base + i, x1 * c - x2 * s);
          store(out.data, ot, base + half + i, x2 * c + x1 * s);
        }
      }
    }
  });
}

}  // namespace shardlm::ops::cpu
