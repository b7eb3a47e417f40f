#include <cstring>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"

namespace shardlm::ops::cpu {

void cast(const Tensor& dst, const Tensor& src) {
  const size_t n = size_t(src.numel());
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data) std::memcpy(dst.data, src.data, dst.nbytes());
    return;
  }
  auto* s = src.data;
  auto* d = dst.data;
  if (src.dtype == DType::F32 && dst.dtype == DType::BF16) return convert_f32_to_bf16(static_cast<const float*>(s), static_cast<bf16_t*>(d), n);
  if (src.dtype == DType::BF16 && dst.dtype == DType::F32) return convert_bf16_to_f32(static_cast<const bf16_t*>(s), static_cast<float*>(d), n);
  if (src.dtype == DType::F32 && dst.dtype == DType::F16) return convert_f32_to_f16(static_cast<const float*>(s), static_cast<f16_t*>(d), n);
  if (src.dtype == DType::F16 && dst.dtype == DType::F32) return convert_f16_to_f32(static_cast<const f16_t*>(s), static_cast<float*>(d), n);
  // bf16 <-> f16 go through f32, which holds both exactly, so there is a single rounding.
  const bool from_bf16 = src.dtype == DType::BF16;
  parallel_region(n > 65536, [&] {
#pragma omp for schedule(static)
    for (size_t i = 0; i < n; ++i) {
      if (from_bf16)
        static_cast<f16_t*>(d)[i] = f32_to_f16(bf16_to_f32(static_cast<const bf16_t*>(s)[i]));
      else
        static_cast<bf16_t*>(d)[i] = f32_to_bf16(f16_to_f32(static_cast<const f16_t*>(s)[i]));
    }
  });
}

void add_inplace(const Tensor& dst, const Tensor& src) {
  const int64_t n = dst.numel();
  if (dst.dtype == DType::F32 && src.dtype == DType::F32) {
    float* d = static_cast<float*>(dst.data);
    const float* s = static_cast<const float*>(src.data);
    parallel_region(n > 65536, [&] {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    });
    return;
  }
  parallel_region(n > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      store(dst.data, dst.dtype, i, load(dst.data, dst.dtype, i) + load(src.data, src.dtype, i));
  });
}

void scale_inplace(const Tensor& x, float s) {
  const int64_t n = x.numel();
  parallel_region(n > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) store(x.data, x.dtype, i, load(x.data, x.dtype, i) * s);
  });
}

void zero(const Tensor& x) { std::memset(x.data, 0, x.nbytes()); }  // all-zero bits are 0 in every dtype shardlm has

}  // namespace shardlm::ops::cpu

namespace shardlm::ops::cpu {

void add_bias(const Tensor& y, const Tensor& b) {
  const int64_t M = y.size(-1), N = y.numel() / M;
  parallel_region(N * M > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < M; ++j)
        store(y.data, y.dtype, i * M + j, load(y.data, y.dtype, i * M + j) + load(b.data, b.dtype, j));
  });
}

void bias_backward(const Tensor& db, const Tensor& dy) {
  // Columns are independent: threads split the columns and sum rows in order (deterministic).
  const int64_t M = dy.size(-1), N = dy.numel() / M;
  float* g = static_cast<float*>(db.data);
  parallel_region(N * M > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t j = 0; j < M; ++j) {
      float s = 0.0f;
      for (int64_t i = 0; i < N; ++i) s += load(dy.data, dy.dtype, i * M + j);
      g[j] += s;
    }
  });
}

}  // namespace shardlm::ops::cpu
