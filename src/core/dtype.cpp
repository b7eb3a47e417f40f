#include "core/dtype.h"

#include "core/error.h"

namespace shardlm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
  }
  return "?";
}

bool is_float(DType t) { return t != DType::I32; }

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "F32" || s == "float32" || s == "fp32" || s == "float") return DType::F32;
  if (s == "bf16" || s == "BF16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "F16" || s == "float16" || s == "fp16" || s == "half") return DType::F16;
  if (s == "i32" || s == "I32" || s == "int32") return DType::I32;
  throw Error(fmt::format("unknown dtype '{}' (expected f32, bf16, f16 or i32)", s));
}

float f16_to_f32(f16_t h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf or NaN (payload kept)
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);  // normal: rebias 15 -> 127
  } else if (man == 0) {
    u = sign;  // signed zero
  } else {
    // Subnormal half: normalize the mantissa into an f32 normal.
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | (uint32_t(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{uint16_t(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return f16_t{uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (abs >= 0x38800000u) {
    // Normal half. Drop 13 mantissa bits with round-to-nearest-even; a carry into the
    // exponent is correct (it yields the next binade, or inf, handled above).
    uint32_t r = abs + 0x0fffu + ((abs >> 13) & 1u);
    return f16_t{uint16_t(sign | ((r - 0x38000000u) >> 13))};
  }
  if (abs < 0x33000000u) return f16_t{sign};  // below half the smallest subnormal: zero
  // Subnormal half: value = man * 2^-24. Shift the full 24-bit significand and round to even.
  const uint32_t exp = abs >> 23;
  const uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t half = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1);
  const uint32_t mid = 1u << (shift - 1);
  if (rem > mid || (rem == mid && (half & 1u))) ++half;
  return f16_t{uint16_t(sign | half)};
}

void convert_f32_to_bf16(const float* src, bf16_t* dst, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
void convert_bf16_to_f32(const bf16_t* src, float* dst, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void convert_f32_to_f16(const float* src, f16_t* dst, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}
void convert_f16_to_f32(const f16_t* src, float* dst, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

}  // namespace shardlm
