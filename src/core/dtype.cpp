#include "core/dtype.h"

#include "core/error.h"

namespace shardlm {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::U8: return "u8";
  }
  return "?";
}

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "F32" || s == "float32" || s == "fp32" || s == "float") return DType::F32;
  if (s == "bf16" || s == "BF16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "F16" || s == "float16" || s == "fp16" || s == "half") return DType::F16;
  if (s == "i32" || s == "I32" || s == "int32") return DType::I32;
  throw Error(fmt::format("unknown dtype '{}' (expected f32, bf16, f16 or i32)", s));
}

float f16_to_f32(f16_t h) {
  const uint32_t u = bits::f16_to_f32(h.bits);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return f16_t{bits::f32_to_f16(u)};
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
