// Element types and their conversions.
//
// shardlm stores tensors as f32 (master weights, optimizer state, accumulators), bf16 or f16
// (compute and communication), i32 (token ids, positions, labels) and u8 (raw bytes: NF4-packed
// weights and their 8-bit absmax codes, ops/nf4.h). The 16-bit floats are
// plain bit patterns wrapped in distinct types so the compiler keeps them apart; conversions
// from f32 round to nearest, ties to even, exactly as PyTorch and the hardware do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/float_bits.h"

namespace shardlm {

enum class DType : uint8_t { F32, BF16, F16, I32, U8 };

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

size_t dtype_size(DType t);
const char* dtype_name(DType t);           // "f32", "bf16", "f16", "i32", "u8"
// Accepts shardlm, PyTorch and safetensors names of f32, bf16, f16 and i32 (never u8: it is no
// compute or storage dtype a user picks); throws Error.
DType parse_dtype(std::string_view name);
bool is_float(DType t);

// Map a C++ element type to its DType (used by Tensor::ptr<T>() to check access).
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::BF16; }
template <> constexpr DType dtype_of<f16_t>() { return DType::F16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

inline float bf16_to_f32(bf16_t h) {
  const uint32_t u = bits::bf16_to_f32(h.bits);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return bf16_t{bits::f32_to_bf16(u)};
}

float f16_to_f32(f16_t h);
f16_t f32_to_f16(float f);

// Bulk conversions (OpenMP-parallel for large n).
void convert_f32_to_bf16(const float* src, bf16_t* dst, size_t n);
void convert_bf16_to_f32(const bf16_t* src, float* dst, size_t n);
void convert_f32_to_f16(const float* src, f16_t* dst, size_t n);
void convert_f16_to_f32(const f16_t* src, float* dst, size_t n);

}  // namespace shardlm
