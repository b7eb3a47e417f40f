// CPU reference kernels of the NF4 ops (ops/nf4.h): bitsandbytes' arithmetic, f32 operation by
// f32 operation. Contraction into FMA would change the nested absmax (q * nested + offset), so it
// is off for this file, as in rope.cpp.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cmath>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/parallel.h"
#include "ops/nf4_codes.h"

namespace shardlm::ops::cpu {

namespace {

inline float load_value(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(static_cast<const bf16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const f16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

inline void store_value(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::BF16: static_cast<bf16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<f16_t*>(p)[i] = f32_to_f16(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}


}  // namespace

void nf4_quantize(const Tensor& packed, const Tensor& absmax, const Tensor& x) {
  const int64_t n = x.numel();
  const int64_t blocks = absmax.numel();
  uint8_t* out = static_cast<uint8_t*>(packed.data);
  float* amax_out = static_cast<float*>(absmax.data);
  parallel_region(blocks > 256, [&] {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kNf4BlockSize;
      const int64_t len = std::min<int64_t>(kNf4BlockSize, n - begin);
      float v[kNf4BlockSize];
      float amax = 0.0f;
      for (int64_t i = 0; i < len; ++i) {
        v[i] = load_value(x.data, x.dtype, begin + i);
        amax = std::fmax(amax, std::fabs(v[i]));
      }
      for (int64_t i = len; i < kNf4BlockSize; ++i) v[i] = 0.0f;  // bitsandbytes' padding
      const float inv = 1.0f / amax;
      amax_out[b] = amax;
      const float* t = kNf4Thresholds.data();
      for (int64_t j = 0; 2 * j < len; ++j)
        out[begin / 2 + j] = uint8_t(nf4_code(v[2 * j] * inv, t) << 4 | nf4_code(v[2 * j + 1] * inv, t));
    }
  });
}

double nf4_absmax_sum(const Tensor& absmax) {
  const float* a = static_cast<const float*>(absmax.data);
  double s = 0.0;
  for (int64_t i = 0; i < absmax.numel(); ++i) s += double(a[i]);
  return s;
}

void nf4_quantize_absmax(const Tensor& qabsmax, const Tensor& nested_absmax, const Tensor& absmax,
                         const Tensor& offset) {
  const int64_t m = absmax.numel();
  const int64_t groups = nested_absmax.numel();
  const float* a = static_cast<const float*>(absmax.data);
  const float off = *static_cast<const float*>(offset.data);
  uint8_t* q = static_cast<uint8_t*>(qabsmax.data);
  float* nested = static_cast<float*>(nested_absmax.data);
  parallel_region(groups > 16, [&] {
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * kNf4NestedBlockSize;
      const int64_t len = std::min<int64_t>(kNf4NestedBlockSize, m - begin);
      float amax = 0.0f;
      for (int64_t i = 0; i < len; ++i) amax = std::fmax(amax, std::fabs(a[begin + i] - off));
      const float inv = 1.0f / amax;
      nested[g] = amax;
      for (int64_t i = 0; i < len; ++i)
        q[begin + i] = uint8_t(dynamic_code((a[begin + i] - off) * inv, kDynamicMapSigned.data()));
    }
  });
}

void nf4_dequantize_absmax(const Tensor& absmax, const Tensor& qabsmax, const Tensor& nested_absmax,
                           const Tensor& offset) {
  const int64_t m = absmax.numel();
  const uint8_t* q = static_cast<const uint8_t*>(qabsmax.data);
  const float* nested = static_cast<const float*>(nested_absmax.data);
  const float off = *static_cast<const float*>(offset.data);
  float* a = static_cast<float*>(absmax.data);
  for (int64_t i = 0; i < m; ++i) {
    const float scaled = kDynamicMapSigned[q[i]] * nested[i / kNf4NestedBlockSize];
    a[i] = scaled + off;
  }
}

void nf4_dequantize(const Tensor& out, const Tensor& packed, const Tensor& absmax) {
  const int64_t n = out.numel();
  const int64_t blocks = absmax.numel();
  const uint8_t* p = static_cast<const uint8_t*>(packed.data);
  const float* a = static_cast<const float*>(absmax.data);
  parallel_region(blocks > 256, [&] {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = b * kNf4BlockSize;
      const int64_t end = std::min<int64_t>(begin + kNf4BlockSize, n);
      const float scale = a[b];
      for (int64_t i = begin; i < end; ++i) {
        const uint8_t byte = p[i / 2];
        const int code = (i % 2 == 0) ? byte >> 4 : byte & 15;
        store_value(out.data, out.dtype, i, kNf4Code[code] * scale);
      }
    }
  });
}

void nf4_dequantize_nested(const Tensor& out, const Tensor& packed, const Tensor& qabsmax,
                           const Tensor& nested_absmax, const Tensor& offset) {
  const int64_t n = out.numel();
  const int64_t blocks = qabsmax.numel();
  const uint8_t* p = static_cast<const uint8_t*>(packed.data);
  const uint8_t* q = static_cast<const uint8_t*>(qabsmax.data);
  const float* nested = static_cast<const float*>(nested_absmax.data);
  const float off = *static_cast<const float*>(offset.data);
  parallel_region(blocks > 256, [&] {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      const float scaled = kDynamicMapSigned[q[b]] * nested[b / kNf4NestedBlockSize];
      const float scale = scaled + off;
      const int64_t begin = b * kNf4BlockSize;
      const int64_t end = std::min<int64_t>(begin + kNf4BlockSize, n);
      for (int64_t i = begin; i < end; ++i) {
        const uint8_t byte = p[i / 2];
        const int code = (i % 2 == 0) ? byte >> 4 : byte & 15;
        store_value(out.data, out.dtype, i, kNf4Code[code] * scale);
      }
    }
  });
}

}  // namespace shardlm::ops::cpu
