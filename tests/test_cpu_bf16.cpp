// The CPU's bf16 path (ops/cpu_bf16.h): which path a matmul takes, and the primitive cache.
// Numerics are checked elsewhere: against PyTorch's autocast (Parity.MatmulBf16Autocast) and against
// the f32 reference op by op (backend_ops, its cpu-bf16 backend).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_paths.h"
#include "testing.h"
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

// A decode step's shape (x [M <= 8, K] f32 times W^T, W [N, K] bf16, into f32) takes a skinny
// kernel with every kernel family (ops/cpu/matmul.cpp), and each row's result does not depend on
// the other rows (a sequence's logits do not depend on its batch):
//  - the f32 skinny kernel (the f32 path, and the bf16 path without AMX): x is never rounded, and
//    the result is bit for bit the f32 product with W widened;
//  - on AMX tiles: x split into two bf16 parts, within f32 rounding of that product (a float64
//    reference; x rounded to bf16 alone would miss it by 2^-9 of |x| |w| per term).
// Just past it (M = 9) the bf16 path, where there is one, rounds x to bf16 (1 + 2^-10 becomes 1).
// N and K leave partial tiles and blocks (37 = 24 + 13 rows = 2 x 16 + 5; 1191 = 2 x 512 + 160 + 7
// = 37 x 32 + 7).
TEST(CpuBf16, DecodeShapesTakeTheSkinnyKernel) {
  const shardlm::testing::CpuPath guard;
  const int64_t N = 37, K = 1191;
  std::vector<float> wf(size_t(N * K));
  std::vector<bf16_t> w(wf.size());
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = f32_to_bf16(std::sin(float(i) * 0.37f) * 2.0f);
    wf[i] = bf16_to_f32(w[i]);
  }
  std::vector<float> x(size_t(9 * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(float(i) * 0.11f) + 1.0f / 1024;
  for (const shardlm::testing::CpuKernel kernel : shardlm::testing::cpu_kernels()) {
    kernel.use();
    const bool bf16_path = kernel.bf16_path;
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
          const std::string where = fmt::format("bf16 path {} amx {} M={} beta={} [{}]", bf16_path, kernel.amx, M,
                                                beta, i);
          ASSERT_EQ(c[i], alone[i]) << where;
          if (!kernel.amx) {
            ASSERT_EQ(c[i], cf[i]) << where;
            continue;
          }
          const int64_t m = int64_t(i) / N, n = int64_t(i) % N;
          double exact = 0, size = 0;  // x . w in float64, and |x| . |w|
          for (int64_t k = 0; k < K; ++k) {
            exact += double(x[size_t(m * K + k)]) * double(wf[size_t(n * K + k)]);
            size += std::abs(double(x[size_t(m * K + k)]) * double(wf[size_t(n * K + k)]));
          }
          const double want = 0.5 * exact + beta * 0.25;
          ASSERT_NEAR(c[i], want, 4e-6 * (0.5 * size + beta * 0.25)) << where << ": the f32 kernel gives " << cf[i];
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

// An infinite activation gives an infinite result on every decode kernel, not NaN (on the tiles
// its lo part would be inf - inf).
TEST(CpuBf16, DecodeKeepsAnInfiniteActivationInfinite) {
  const shardlm::testing::CpuPath guard;
  const int64_t N = 20, K = 70;
  std::vector<bf16_t> w(size_t(N * K), f32_to_bf16(0.5f));
  for (const shardlm::testing::CpuKernel kernel : shardlm::testing::cpu_kernels()) {
    kernel.use();
    for (float inf : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(size_t(2 * K), 1.0f), c(size_t(2 * N));
      x[size_t(K + 33)] = inf;  // row 1 only
      ops::matmul(Tensor::view(c.data(), DType::F32, {2, N}), Tensor::view(x.data(), DType::F32, {2, K}),
                  Tensor::view(w.data(), DType::BF16, {N, K}), false, true);
      for (int64_t n = 0; n < N; ++n) {
        EXPECT_EQ(c[size_t(n)], 0.5f * float(K)) << "bf16 path " << kernel.bf16_path << " amx " << kernel.amx;
        EXPECT_EQ(c[size_t(N + n)], inf) << "bf16 path " << kernel.bf16_path << " amx " << kernel.amx;
      }
    }
  }
}

// Attention's block products on the bf16 path (ops/cpu/attention.cpp): with bf16 q, k, v, the
// probabilities are rounded to bf16 before they multiply V (in the forward) and dO (dV in the
// backward); the f32 path multiplies them unrounded. Both are measured against float64 references
// of each, computed here, with f32 outputs (out, dv) so that nothing else rounds: each path must be
// far closer to its own reference than the two references are to each other. One key block (Tk <=
// 64), so the forward's probabilities are exp(s - row max), as the references take them. The bf16
// path runs with each kernel this CPU has: AVX512-BF16 dot products, and AMX tiles (which take
// every block of 16 rows or more; here all of them: 40 queries, 56 keys).
TEST(CpuBf16, AttentionRoundsTheProbabilitiesOnlyOnTheBf16Path) {
  const shardlm::testing::CpuPath guard;
  const int64_t Tq = 40, Tk = 56, H = 4, Hkv = 2, Dh = 40, off = Tk - Tq;
  const float scale = 1.0f / std::sqrt(float(Dh));
  auto bf16_randn = [](int64_t n, uint64_t seed) {
    std::vector<bf16_t> out;
    for (float x : shardlm::testing::randn(n, seed, "attention input", 1.5f)) out.push_back(f32_to_bf16(x));
    return out;
  };
  const std::vector<bf16_t> q = bf16_randn(Tq * H * Dh, 1), k = bf16_randn(Tk * Hkv * Dh, 2),
                            v = bf16_randn(Tk * Hkv * Dh, 3), dout = bf16_randn(Tq * H * Dh, 4);
  auto at = [](const std::vector<bf16_t>& x, int64_t i) { return double(bf16_to_f32(x[size_t(i)])); };
  auto round_bf16 = [](double p) { return double(bf16_to_f32(f32_to_bf16(float(p)))); };

  // References: out [Tq, H, Dh] and dv [Tk, Hkv, Dh], each with the probabilities exact and rounded.
  std::vector<double> out_exact(size_t(Tq * H * Dh)), out_rounded(out_exact.size());
  std::vector<double> dv_exact(size_t(Tk * Hkv * Dh)), dv_rounded(dv_exact.size());
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / Hkv);
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t seen = i + off + 1;
      std::vector<double> s(static_cast<size_t>(seen));
      double max = -1e300, l = 0;
      for (int64_t j = 0; j < seen; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < Dh; ++d) dot += at(q, (i * H + h) * Dh + d) * at(k, (j * Hkv + g) * Dh + d);
        s[size_t(j)] = dot * scale;
        max = std::max(max, s[size_t(j)]);
      }
      for (int64_t j = 0; j < seen; ++j) l += std::exp(s[size_t(j)] - max);
      for (int64_t j = 0; j < seen; ++j) {
        const double p = std::exp(s[size_t(j)] - max);  // unnormalized, as the forward multiplies it
        const double pn = p / l;                         // normalized, as the backward recomputes it
        for (int64_t d = 0; d < Dh; ++d) {
          const double vj = at(v, (j * Hkv + g) * Dh + d), doi = at(dout, (i * H + h) * Dh + d);
          out_exact[size_t((i * H + h) * Dh + d)] += p * vj / l;
          out_rounded[size_t((i * H + h) * Dh + d)] += round_bf16(p) * vj / l;
          dv_exact[size_t((j * Hkv + g) * Dh + d)] += pn * doi;
          dv_rounded[size_t((j * Hkv + g) * Dh + d)] += round_bf16(pn) * doi;
        }
      }
    }
  }
  auto distance = [](const std::vector<float>& got, const std::vector<double>& want) {
    double sq = 0;
    for (size_t i = 0; i < got.size(); ++i) sq += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    return std::sqrt(sq);
  };
  auto apart = [](const std::vector<double>& a, const std::vector<double>& b) {
    double sq = 0;
    for (size_t i = 0; i < a.size(); ++i) sq += (a[i] - b[i]) * (a[i] - b[i]);
    return std::sqrt(sq);
  };

  auto view = [](const std::vector<bf16_t>& x, std::initializer_list<int64_t> shape) {
    return Tensor::view(const_cast<bf16_t*>(x.data()), DType::BF16, shape);
  };
  // Each kernel this CPU has: the f32 path; the bf16 path's AVX512-BF16 dot products; its AMX tiles.
  for (const shardlm::testing::CpuKernel kernel : shardlm::testing::cpu_kernels()) {
    kernel.use();
    const auto [bf16_path, amx] = kernel;
    std::vector<float> out(out_exact.size()), lse(size_t(H * Tq));
    const Tensor out_t = Tensor::view(out.data(), DType::F32, {1, Tq, H, Dh});
    const Tensor lse_t = Tensor::view(lse.data(), DType::F32, {1, H, Tq});
    ops::attention_forward(out_t, lse_t, view(q, {1, Tq, H, Dh}), view(k, {1, Tk, Hkv, Dh}), view(v, {1, Tk, Hkv, Dh}),
                           Tensor{}, scale);
    std::vector<float> dq(out.size()), dk(dv_exact.size()), dv(dv_exact.size());
    ops::attention_backward(Tensor::view(dq.data(), DType::F32, {1, Tq, H, Dh}),
                            Tensor::view(dk.data(), DType::F32, {1, Tk, Hkv, Dh}),
                            Tensor::view(dv.data(), DType::F32, {1, Tk, Hkv, Dh}), view(dout, {1, Tq, H, Dh}),
                            view(q, {1, Tq, H, Dh}), view(k, {1, Tk, Hkv, Dh}), view(v, {1, Tk, Hkv, Dh}), out_t, lse_t,
                            Tensor{}, scale);
    const std::vector<double>& out_own = bf16_path ? out_rounded : out_exact;
    const std::vector<double>& dv_own = bf16_path ? dv_rounded : dv_exact;
    const double out_gap = apart(out_exact, out_rounded), dv_gap = apart(dv_exact, dv_rounded);
    EXPECT_GT(out_gap, 0.0);
    EXPECT_LT(distance(out, out_own), 0.1 * out_gap)
        << "bf16 path " << bf16_path << " amx " << amx << ": out is " << distance(out, out_exact) << " from the exact reference and "
        << distance(out, out_rounded) << " from the rounded one, which are " << out_gap << " apart";
    EXPECT_LT(distance(dv, dv_own), 0.1 * dv_gap)
        << "bf16 path " << bf16_path << " amx " << amx << ": dv is " << distance(dv, dv_exact) << " from the exact reference and "
        << distance(dv, dv_rounded) << " from the rounded one, which are " << dv_gap << " apart";
  }
  if (!ops::cpu_bf16_status().hardware) GTEST_SKIP() << "only the f32 path was checked: " << shardlm::testing::no_cpu_bf16_path();
}
