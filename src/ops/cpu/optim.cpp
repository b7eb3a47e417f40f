#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/float_bits.h"
#include "core/rng.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"
#include "ops/dynamic_map.h"

// AdamW's update is written as torch computes it, one rounded f32 operation at a time: no fused
// multiply-add, so a bf16 moment's stochastic rounding starts from the value torch's would. Under
// GCC the file is compiled with -ffp-contract=off -fno-math-errno (CMakeLists.txt), not by
// `#pragma GCC optimize`: under the pragma GCC inlined no function of the headers, std::sqrt
// became a call per element, and the update loop, which moves 28 bytes per parameter, ran one
// element at a time (a third of a 506M-parameter bf16 step). Without errno (v is never negative)
// its sqrt vectorizes; every operation is still IEEE's correctly rounded one, so vector and scalar
// results are the same.
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace shardlm::ops::cpu {

namespace {
// The moments as stored: f32, or bf16 with stochastic rounding (ops.h, adamw_step).
struct F32Moments {
  float* m;
  float* v;
  float m_at(int64_t i) const { return m[i]; }
  float v_at(int64_t i) const { return v[i]; }
  void store(int64_t i, float mi, float vi, uint32_t) const {
    m[i] = mi;
    v[i] = vi;
  }
};
struct Bf16Moments {
  uint16_t* m;
  uint16_t* v;
  float m_at(int64_t i) const { return std::bit_cast<float>(bits::bf16_to_f32(m[i])); }
  float v_at(int64_t i) const { return std::bit_cast<float>(bits::bf16_to_f32(v[i])); }
  // word: the 32 random bits of this element (low half for m, high half for v).
  void store(int64_t i, float mi, float vi, uint32_t word) const {
    m[i] = bits::f32_to_bf16_stochastic(std::bit_cast<uint32_t>(mi), word);
    v[i] = bits::f32_to_bf16_stochastic(std::bit_cast<uint32_t>(vi), word >> 16);
  }
};

// The update's scalars, computed once per step.
struct AdamWScalars {
  float decay, step_size, bias2_sqrt, w1, b2, w2, eps, grad_scale;
  uint64_t step;
};

// Elements [begin, end) of the update. A function of its own whose operands are all parameters:
// written inline in the OpenMP region's lambda, it read them through the closure and GCC did not
// vectorize it (the f32 loop, 28 bytes per parameter, then took a third of a 506M-parameter bf16
// step). No element depends on another, so any split gives the same result.
template <class Moments>
void adamw_span(float* p, const float* g, Moments st, AdamWScalars k, StatePosition pos, int64_t begin, int64_t end) {
  constexpr bool kDraws = std::is_same_v<Moments, Bf16Moments>;
  for (int64_t i = begin; i < end; ++i) {
    const float gi = g[i] * k.grad_scale;
    p[i] *= k.decay;
    float mi = st.m_at(i), vi = st.v_at(i);
    mi += k.w1 * (gi - mi);  // torch's lerp for weights < 0.5
    vi = vi * k.b2 + k.w2 * gi * gi;
    const float denom = std::sqrt(vi) / k.bias2_sqrt + k.eps;
    p[i] += -k.step_size * (mi / denom);
    uint32_t word = 0;
    if constexpr (kDraws) {
      const uint64_t j = uint64_t(pos.first + i);  // the element's index in its tensor
      uint32_t r[4];
      rng_detail::draw(r, k.step, pos.stream, j / 4);
      word = r[j % 4];
    }
    st.store(i, mi, vi, word);
  }
}

template <class Moments>
void adamw_loop(float* p, const float* g, const Moments& st, const AdamWConfig& cfg, int64_t step, float grad_scale,
                StatePosition pos, int64_t n) {
  // Follows torch.optim.AdamW (single-tensor path) operation by operation, including where
  // Python computes scalars in double before they meet f32 tensors, so results agree to ~1 ulp.
  const double bias1 = 1.0 - std::pow(cfg.beta1, double(step));
  const double bias2 = 1.0 - std::pow(cfg.beta2, double(step));
  const AdamWScalars k{.decay = float(1.0 - cfg.lr * cfg.weight_decay),
                       .step_size = float(cfg.lr / bias1),
                       .bias2_sqrt = float(std::sqrt(bias2)),
                       .w1 = float(1.0 - cfg.beta1),  // lerp weight of the new gradient
                       .b2 = float(cfg.beta2),
                       .w2 = float(1.0 - cfg.beta2),
                       .eps = float(cfg.eps),
                       .grad_scale = grad_scale,
                       .step = uint64_t(step)};
  constexpr int64_t kSpan = 16384;  // elements per piece of work: whole vectors, a few pages
  const int64_t spans = (n + kSpan - 1) / kSpan;
  parallel_region(spans > 1, [&] {
#pragma omp for schedule(static)
    for (int64_t s = 0; s < spans; ++s) adamw_span(p, g, st, k, pos, s * kSpan, std::min(n, (s + 1) * kSpan));
  });
}
}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWConfig& cfg,
                int64_t step, float grad_scale, StatePosition pos) {
  float* p = static_cast<float*>(param.data);
  const float* g = static_cast<const float*>(grad.data);
  if (m.dtype == DType::BF16)
    adamw_loop(p, g, Bf16Moments{static_cast<uint16_t*>(m.data), static_cast<uint16_t*>(v.data)}, cfg, step, grad_scale,
               pos, param.numel());
  else
    adamw_loop(p, g, F32Moments{static_cast<float*>(m.data), static_cast<float*>(v.data)}, cfg, step, grad_scale, pos,
               param.numel());
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

namespace shardlm::ops::cpu {

void quantize_blockwise8(const Tensor& codes, const Tensor& absmax, const Tensor& x, bool is_signed) {
  const float* map = dynamic_map(is_signed);
  static const DynamicCoder kSignedCoder(kDynamicMapSigned.data()), kUnsignedCoder(kDynamicMapUnsigned.data());
  const DynamicCoder& coder = is_signed ? kSignedCoder : kUnsignedCoder;
  const auto zero = uint8_t(std::lower_bound(map, map + 256, 0.0f) - map);  // the code of 0
  const int64_t n = x.numel(), blocks = absmax.numel();
  const float* in = x.f32();
  uint8_t* out = static_cast<uint8_t*>(codes.data);
  float* amax = absmax.f32();
  parallel_region(n > 16384, [&] {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t lo = b * kQuant8Block, hi = std::min(n, lo + kQuant8Block);
      float m = 0.0f;
      for (int64_t i = lo; i < hi; ++i) m = std::max(m, std::fabs(in[i]));
      amax[b] = m;
      const float inv = 1.0f / m;  // bitsandbytes scales by the reciprocal, not by a division
      for (int64_t i = lo; i < hi; ++i) out[i] = m == 0.0f ? zero : uint8_t(coder(in[i] * inv));
    }
  });
}

void dequantize_blockwise8(const Tensor& x, const Tensor& codes, const Tensor& absmax, bool is_signed) {
  const float* map = dynamic_map(is_signed);
  const int64_t n = x.numel();
  const uint8_t* in = static_cast<const uint8_t*>(codes.data);
  const float* amax = absmax.f32();
  float* out = x.f32();
  parallel_region(n > 16384, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = map[in[i]] * amax[i / kQuant8Block];
  });
}

}  // namespace shardlm::ops::cpu
