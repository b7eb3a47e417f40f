// The CPU's bf16 path (ops/cpu_bf16.h): which path a matmul takes, and the primitive cache.
// Numerics are checked elsewhere: against PyTorch's autocast (Parity.MatmulBf16Autocast) and against
// the f32 reference op by op (backend_ops, its cpu-bf16 backend).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_paths.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/cpu_bf16.h"
#include "ops/ops.h"

using namespace shardlm;

// The status names the path, agrees with cpu_bf16_enabled(), and cannot claim a path the hardware
// lacks.
TEST(CpuBf16, StatusIsConsistent) {
  const shardlm::testing::CpuPath guard;
  const ops::CpuBf16Status s = ops::cpu_bf16_status();
  EXPECT_FALSE(s.line.empty());
  EXPECT_EQ(s.enabled, ops::cpu_bf16_enabled());
  EXPECT_TRUE(s.hardware || !s.enabled);
  ops::set_cpu_bf16_enabled(false);
  EXPECT_FALSE(ops::cpu_bf16_enabled());
  EXPECT_NE(ops::cpu_bf16_status().line.find("widened"), std::string::npos) << ops::cpu_bf16_status().line;
  if (!s.hardware) {
    EXPECT_THROW(ops::set_cpu_bf16_enabled(true), Error);
  } else {
    ops::set_cpu_bf16_enabled(true);
    EXPECT_NE(ops::cpu_bf16_status().line.find("oneDNN"), std::string::npos) << ops::cpu_bf16_status().line;
  }
}

// A bf16 operand beside an f32 one tells the paths apart: the bf16 path rounds the f32 operand
// (1 + 2^-10 becomes 1), the f32 path widens the bf16 one and keeps it exactly.
TEST(CpuBf16, TheDispatchTakesThePathItSays) {
  if (!ops::cpu_bf16_status().hardware) GTEST_SKIP() << shardlm::testing::no_cpu_bf16_path();
  const shardlm::testing::CpuPath guard;
  const int64_t M = 3, N = 5, K = 70;
  std::vector<bf16_t> a(size_t(M * K), f32_to_bf16(1.0f));
  std::vector<float> b(size_t(K * N), 1.0f + 1.0f / 1024), c(size_t(M * N));
  const Tensor A = Tensor::view(a.data(), DType::BF16, {M, K}), B = Tensor::view(b.data(), DType::F32, {K, N});
  const Tensor C = Tensor::view(c.data(), DType::F32, {M, N});
  ops::set_cpu_bf16_enabled(true);
  ops::matmul(C, A, B);
  for (float v : c) EXPECT_EQ(v, float(K));
  ops::set_cpu_bf16_enabled(false);
  ops::matmul(C, A, B);
  for (float v : c) EXPECT_EQ(v, float(K) * (1.0f + 1.0f / 1024));
}

// More distinct shapes than the primitive cache holds (it is emptied when full), every one right;
// alpha and beta are part of a primitive, so the same shape with other scalars is another one.
TEST(CpuBf16, ManyShapesThroughTheCache) {
  if (!ops::cpu_bf16_status().hardware) GTEST_SKIP() << shardlm::testing::no_cpu_bf16_path();
  const shardlm::testing::CpuPath guard;
  ops::set_cpu_bf16_enabled(true);
  const int64_t N = 3, K = 4;
  std::vector<bf16_t> b(size_t(K * N));
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(float(i % 5) - 2.0f);
  for (int64_t M = 1; M <= 515; ++M) {  // the cache holds 512
    std::vector<bf16_t> a(size_t(M * K));
    for (size_t i = 0; i < a.size(); ++i) a[i] = f32_to_bf16(float(i % 7) - 3.0f);
    std::vector<float> c(size_t(M * N), 1.0f);
    const float alpha = M % 2 ? 1.0f : 0.5f, beta = M % 3 ? 0.0f : 2.0f;
    ops::matmul(Tensor::view(c.data(), DType::F32, {M, N}), Tensor::view(a.data(), DType::BF16, {M, K}),
                Tensor::view(b.data(), DType::BF16, {K, N}), false, false, alpha, beta);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float want = 0.0f;  // small integers: exact in any order
        for (int64_t k = 0; k < K; ++k) want += bf16_to_f32(a[size_t(i * K + k)]) * bf16_to_f32(b[size_t(k * N + j)]);
        ASSERT_EQ(c[size_t(i * N + j)], alpha * want + beta * 1.0f) << "M=" << M << " [" << i << ", " << j << "]";
      }
  }
}

// A decode step's shape (x [M <= 8, K] f32 times W^T, W [N, K] bf16, into f32) takes the skinny
// kernel on either path, bf16 hardware or not (ops/cpu/matmul.cpp): the f32 x is never rounded,
// the result is bit for bit the f32 product with W widened, and each row's result does not depend
// on the other rows (a sequence's logits do not depend on its batch). Just past it (M = 9) the bf16
// path, where there is one, rounds x to bf16 (1 + 2^-10 becomes 1).
TEST(CpuBf16, DecodeShapesTakeTheSkinnyKernel) {
  const shardlm::testing::CpuPath guard;
  const int64_t N = 37, K = 1031;
  std::vector<float> wf(size_t(N * K));
  std::vector<bf16_t> w(wf.size());
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = f32_to_bf16(std::sin(float(i) * 0.37f) * 2.0f);
    wf[i] = bf16_to_f32(w[i]);
  }
  std::vector<float> x(size_t(9 * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(float(i) * 0.11f) + 1.0f / 1024;
  for (bool bf16_path : shardlm::testing::cpu_paths()) {
    ops::set_cpu_bf16_enabled(bf16_path);
    for (float beta : {0.0f, 1.5f}) {
      std::vector<float> alone(size_t(8 * N));  // each row on its own (M = 1)
      for (int64_t m = 0; m < 8; ++m) {
        std::fill(alone.begin() + m * N, alone.begin() + (m + 1) * N, 0.25f);
        ops::matmul(Tensor::view(alone.data() + m * N, DType::F32, {1, N}),
                    Tensor::view(x.data() + m * K, DType::F32, {1, K}), Tensor::view(w.data(), DType::BF16, {N, K}),
                    false, true, 0.5f, beta);
      }
      for (int64_t M = 1; M <= 8; ++M) {
        std::vector<float> c(size_t(M * N), 0.25f), cf(size_t(M * N), 0.25f);
        const Tensor X = Tensor::view(x.data(), DType::F32, {M, K});
        ops::matmul(Tensor::view(c.data(), DType::F32, {M, N}), X, Tensor::view(w.data(), DType::BF16, {N, K}),
                    false, true, 0.5f, beta);
        ops::matmul(Tensor::view(cf.data(), DType::F32, {M, N}), X, Tensor::view(wf.data(), DType::F32, {N, K}),
                    false, true, 0.5f, beta);
        for (size_t i = 0; i < c.size(); ++i) {
          ASSERT_EQ(c[i], cf[i]) << "bf16 path " << bf16_path << " M=" << M << " beta=" << beta << " [" << i << "]";
          ASSERT_EQ(c[i], alone[i]) << "bf16 path " << bf16_path << " M=" << M << " beta=" << beta << " [" << i << "]";
        }
      }
    }
  }
  if (!ops::cpu_bf16_status().hardware) return;
  ops::set_cpu_bf16_enabled(true);  // M = 9: oneDNN, x rounded to bf16
  std::vector<float> ones(size_t(9 * K), 1.0f + 1.0f / 1024), c(size_t(9));
  std::vector<bf16_t> w1(size_t(K), f32_to_bf16(1.0f));
  ops::matmul(Tensor::view(c.data(), DType::F32, {9, 1}), Tensor::view(ones.data(), DType::F32, {9, K}),
              Tensor::view(w1.data(), DType::BF16, {1, K}), false, true);
  for (float v : c) EXPECT_EQ(v, float(K));
  ops::matmul(Tensor::view(c.data(), DType::F32, {8, 1}), Tensor::view(ones.data(), DType::F32, {8, K}),
              Tensor::view(w1.data(), DType::BF16, {1, K}), false, true);
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(c[size_t(i)], float(K) * (1.0f + 1.0f / 1024));
}
