// CPU kernels of the DoRA ops (ops.h): the reference the CUDA kernels are checked against.
#include <cmath>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"

namespace shardlm::ops::cpu {

void row_norms(const Tensor& norms, const Tensor& x) {
  const int64_t M = x.shape[0], K = x.shape[1];
  float* out = norms.f32();
  parallel_region(M * K > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < M; ++i) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double v = load(x.data, x.dtype, i * K + k);
        s += v * v;
      }
      out[i] = float(std::sqrt(s));
    }
  });
}

void dora_forward(const Tensor& y, const Tensor& z, const Tensor& l, const Tensor& m, const Tensor& norm) {
  const int64_t N = y.shape[0], M = y.shape[1];
  const float *zp = z.f32(), *lp = l.f32(), *np = norm.f32();
  parallel_region(N * M > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < M; ++j) {
        const float g = load(m.data, m.dtype, j) / np[j];
        const int64_t k = i * M + j;
        store(y.data, y.dtype, k, load(y.data, y.dtype, k) + ((g - 1.0f) * zp[k] + g * lp[k]));
      }
  });
}

void dora_backward(const Tensor& dz, const Tensor& dl, const Tensor& dm, const Tensor& dy, const Tensor& z,
                   const Tensor& l, const Tensor& m, const Tensor& norm) {
  const int64_t N = dy.shape[0], M = dy.shape[1];
  const float *d = dy.f32(), *zp = z.f32(), *lp = l.f32(), *np = norm.f32();
  float *dzp = dz.f32(), *dlp = dl.f32(), *dmp = dm.f32();
  // Columns are independent: threads split them, and each sums its rows in order (deterministic)
  // before it overwrites them.
  parallel_region(N * M > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t j = 0; j < M; ++j) {
      float s = 0.0f;
      for (int64_t i = 0; i < N; ++i) s += d[i * M + j] * (zp[i * M + j] + lp[i * M + j]);
      dmp[j] += s / np[j];
      const float g = load(m.data, m.dtype, j) / np[j];
      for (int64_t i = 0; i < N; ++i) {
        const float di = d[i * M + j];
        dzp[i * M + j] = (g - 1.0f) * di;
        dlp[i * M + j] = g * di;
      }
    }
  });
}

}  // namespace shardlm::ops::cpu
