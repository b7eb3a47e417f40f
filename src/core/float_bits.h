// The rounding rules of shardlm's float formats, on raw bit patterns, for host and device alike.
//
// core/dtype (CPU) and ops/cuda/common.cuh (GPU) both convert through these functions, so a
// bf16 or f16 produced on either side is the same bits; the CPU side is tested exhaustively
// (every bf16 and f16 pattern, and f16 ties and subnormals against a brute-force search).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SHARDLM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SHARDLM_HOST_DEVICE inline
#endif

namespace shardlm::bits {

// f32 -> bf16, round to nearest even; NaNs stay quiet NaNs with their payload's high bits.
SHARDLM_HOST_DEVICE uint16_t f32_to_bf16(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);  // add 0x7fff plus the lowest kept bit, then truncate
  return uint16_t(u >> 16);
}

SHARDLM_HOST_DEVICE uint32_t bf16_to_f32(uint16_t h) { return uint32_t(h) << 16; }

// f32 -> bf16 with stochastic rounding: the low 16 bits that truncation drops are added to 16 random
// bits before truncating, so the magnitude rounds up with probability (dropped bits) / 2^16 and the
// expected result is x itself. A value just below the largest bf16 may round to Inf, as with any
// stochastic rounding. NaN and Inf convert as f32_to_bf16 does.
SHARDLM_HOST_DEVICE uint16_t f32_to_bf16_stochastic(uint32_t u, uint32_t random16) {
  if ((u & 0x7f800000u) == 0x7f800000u) return f32_to_bf16(u);
  return uint16_t((u + (random16 & 0xffffu)) >> 16);
}

SHARDLM_HOST_DEVICE uint32_t f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return sign | 0x7f800000u | (man << 13);  // inf or NaN (payload kept)
  if (exp != 0) return sign | ((exp + 112) << 23) | (man << 13);  // normal: rebias 15 -> 127
  if (man == 0) return sign;  // signed zero
  // Subnormal half: normalize the mantissa into an f32 normal.
  int e = -1;
  do {
    ++e;
    man <<= 1;
  } while ((man & 0x400u) == 0);
  return sign | (uint32_t(112 - e) << 23) | ((man & 0x3ffu) << 13);
}

// f32 -> f16, round to nearest even, overflow to inf, subnormals rounded exactly.
SHARDLM_HOST_DEVICE uint16_t f32_to_f16(uint32_t u) {
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {
    // Normal half. Drop 13 mantissa bits with round-to-nearest-even; a carry into the
    // exponent is correct (it yields the next binade, or inf, handled above).
    const uint32_t r = abs + 0x0fffu + ((abs >> 13) & 1u);
    return uint16_t(sign | ((r - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal: zero
  // Subnormal half: value = man * 2^-24. Shift the full 24-bit significand and round to even.
  const uint32_t exp = abs >> 23;
  const uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t half = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1);
  const uint32_t mid = 1u << (shift - 1);
  if (rem > mid || (rem == mid && (half & 1u))) ++half;
  return uint16_t(sign | half);
}

}  // namespace shardlm::bits
