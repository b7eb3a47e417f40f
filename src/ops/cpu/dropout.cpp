// Dropout on the CPU (ops.h). Element i is kept when rng_uniform(key, stream, i) >= p (core/rng.h,
// Philox keyed by (key, stream), counter i) and becomes x[i] * s with s = 1 / (1 - p) rounded to
// f32 once; a dropped element becomes x[i] * 0. That is torch's dropout, x * noise with noise in
// {0, s} (noise = bernoulli(1 - p) / (1 - p): 1 - p in double rounded to f32, then an f32
// division), so kept values are torch's bits, a dropped element keeps the sign of x (-0) and a NaN
// or infinite x stays NaN. A bf16 x or out is computed in f32 and rounded once on the store.
// ops/cuda/dropout.cu does the same operations on the same draws: the two agree bit for bit.
#include "core/rng.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"

namespace shardlm::ops::cpu {

void dropout(const Tensor& out, const Tensor& x, float p, uint64_t key, uint64_t stream) {
  const int64_t n = x.numel();
  const float s = dropout_scale(p);  // ops.h
  const void* xd = x.data;
  void* od = out.data;
  const DType xt = x.dtype, ot = out.dtype;
  // Element i reads x[i] before writing out[i], so out may be x itself.
  parallel_region(n > 16384, [&] {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float m = rng_uniform(key, stream, uint64_t(i)) >= p ? s : 0.0f;
      store(od, ot, i, load(xd, xt, i) * m);
    }
  });
}

}  // namespace shardlm::ops::cpu
