// Elementwise math for CPU kernels, written so that GCC and Clang vectorize a loop calling it
// (std::exp is a scalar libm call: in a softmax over 32000 logits, or an attention block, it costs
// more than the matmuls around it). No intrinsics: the compiler picks the vector width for the
// machine (-march=native), and the same source builds everywhere.
//
// Every branch is a select on values already computed (a blend in vector code), never control
// flow around a computation: that is what keeps a loop calling these vectorizable. A loop meant to
// vectorize still needs `#pragma omp simd` when it reduces (sum, max), since without -ffast-math
// the compiler may not reassociate the reduction on its own.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace shardlm::ops::cpu {

// exp(x) for x <= 0 (a softmax's x - max, or a log-probability), within 1.5 ulp of the exact value
// over [-87, 88] (VecMath.ExpNonpositive* checks it). Cephes' expf: x = n ln2 + r with |r| <= ln2/2, exp(r)
// by a degree-7 polynomial, times 2^n built in the exponent bits. Below -87, where expf itself
// reaches the denormals (exp(-87) ~ 1.6e-38), it returns exactly 0, so -inf (a masked score) gives
// 0. NaN propagates, so a NaN logit still gives a NaN loss. Small positive x (a rounding error in
// x - max) is exact too; above 88, where expf overflows, it returns +inf.
inline float exp_nonpositive(float x) {
  // The polynomial runs on a clamped copy: a NaN or an out-of-range x must not reach the int
  // conversion (out of range is undefined behaviour; UBSan reports it). Comparisons with NaN are
  // false, so NaN takes the 0.0f branch here and is put back at the end.
  const bool in_range = x >= -87.0f && x <= 88.0f;
  const float xc = in_range ? x : 0.0f;
  // round(x / ln2): adding and subtracting 1.5 * 2^23 rounds to an integer in the default
  // rounding mode (exact for |x / ln2| < 2^22). std::floor would do, but GCC vectorizes neither
  // floor nor nearbyint without -ffast-math.
  constexpr float kRound = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 split in two for exactness
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float e = p * std::bit_cast<float>((int32_t(n) + 127) << 23);
  if (in_range) return e;
  return x > 88.0f ? HUGE_VALF : (x == x ? 0.0f : x);  // +inf, 0 below -87 (and for -inf), NaN
}

// 1 / (1 + exp(-x)) for any x, through exp of -|x| so the exponential never overflows.
inline float sigmoid(float x) {
  const float e = exp_nonpositive(-std::fabs(x));  // in (0, 1]
  const float s = 1.0f / (1.0f + e);
  return x >= 0.0f ? s : e * s;  // sigmoid(-|x|) = e / (1 + e)
}

// A machine vector of floats, for kernels that keep a register tile of accumulators (the
// compiler's auto-vectorizer keeps such tiles in memory). GCC's vector extension, which Clang also
// implements: arithmetic on vfloat compiles to the widest float vectors -march allows, and to
// several narrower ones otherwise, so the code is portable. kLanes is the width the target
// machine runs natively.
#if defined(__AVX512F__)
inline constexpr int kLanes = 16;
#elif defined(__AVX__)
inline constexpr int kLanes = 8;
#else
inline constexpr int kLanes = 4;
#endif
typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));
// The same vector at a float's alignment, and allowed to alias floats: the type loads and stores
// go through, so any float address may be used.
typedef float vfloat_unaligned __attribute__((vector_size(kLanes * sizeof(float)), aligned(alignof(float)), may_alias));

inline vfloat vload(const float* p) { return *reinterpret_cast<const vfloat_unaligned*>(p); }
inline void vstore(float* p, vfloat v) { *reinterpret_cast<vfloat_unaligned*>(p) = v; }
// x in every lane (x - 0 is x exactly, -0 included, so the compiler emits a bare broadcast).
inline vfloat vsplat(float x) { return x - vfloat{}; }

}  // namespace shardlm::ops::cpu
