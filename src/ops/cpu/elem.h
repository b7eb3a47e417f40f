// Element access helpers for CPU kernels that accept f32 or bf16 tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace shardlm::ops::cpu {

inline float load(const void* p, DType t, int64_t i) {
  return t == DType::F32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const bf16_t*>(p)[i]);
}

inline void store(void* p, DType t, int64_t i, float v) {
  if (t == DType::F32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<bf16_t*>(p)[i] = f32_to_bf16(v);
}

// Elements [begin, begin + n) of an f32|bf16 tensor as f32: the elements themselves when it is
// f32, otherwise converted into `scratch` (which must hold n floats).
inline const float* span_f32(const Tensor& t, int64_t begin, int64_t n, float* scratch) {
  if (t.dtype == DType::F32) return static_cast<const float*>(t.data) + begin;
  const bf16_t* src = static_cast<const bf16_t*>(t.data) + begin;
  for (int64_t i = 0; i < n; ++i) scratch[i] = bf16_to_f32(src[i]);
  return scratch;
}

// Writes n f32 values to elements [begin, begin + n) of an f32|bf16 tensor.
inline void store_span(const Tensor& t, int64_t begin, int64_t n, const float* src) {
  if (t.dtype == DType::F32) {
    float* dst = static_cast<float*>(t.data) + begin;
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    bf16_t* dst = static_cast<bf16_t*>(t.data) + begin;
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  }
}

// Where to compute elements [begin, begin + n) of an f32|bf16 tensor in f32: the elements themselves
// when it is f32, else `scratch`, which finish_out then rounds into the tensor.
inline float* span_out(const Tensor& t, int64_t begin, float* scratch) {
  return t.dtype == DType::F32 ? static_cast<float*>(t.data) + begin : scratch;
}
inline void finish_out(const Tensor& t, int64_t begin, int64_t n, const float* scratch) {
  if (t.dtype != DType::F32) store_span(t, begin, n, scratch);
}

// Row r (of length n) of an f32|bf16 tensor as f32, and its store (span_f32, store_span).
inline const float* row_f32(const Tensor& t, int64_t r, int64_t n, float* scratch) {
  return span_f32(t, r * n, n, scratch);
}
inline void store_row(const Tensor& t, int64_t r, int64_t n, const float* src) { store_span(t, r * n, n, src); }

}  // namespace shardlm::ops::cpu
