// RoPE: the rotation's definition, its inverse, finite-difference gradients, the frequencies
// and argument checks. (Agreement with Hugging Face is tests/parity_rope.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "testing.h"

using namespace shardlm;
using shardlm::testing::expect_error;
using shardlm::testing::view;
namespace st = shardlm::testing;

TEST(RoPE, MatchesTheRotateHalfFormula) {
  // ops.h's definition, evaluated in double: pairs (i, i + Dh/2) rotate by positions * inv_freq[i].
  const int64_t B = 1, T = 3, H = 2, Dh = 6, half = Dh / 2;
  std::vector<float> x = st::randn(B * T * H * Dh, 4, "x"), out(static_cast<size_t>(B * T * H * Dh));
  std::vector<int32_t> pos = {3, 0, 250};
  std::vector<float> freq = {1.0f, 0.1f, 0.003f};
  ops::rope_forward(view(out, {B, T, H, Dh}), view(x, {B, T, H, Dh}), view(pos, {B, T}), view(freq, {half}));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t base = (t * H + h) * Dh;
        const double a = double(float(pos[size_t(t)]) * freq[size_t(i)]);
        const double x1 = x[size_t(base + i)], x2 = x[size_t(base + half + i)];
        EXPECT_NEAR(out[size_t(base + i)], x1 * std::cos(a) - x2 * std::sin(a), 1e-6);
        EXPECT_NEAR(out[size_t(base + half + i)], x2 * std::cos(a) + x1 * std::sin(a), 1e-6);
      }
}

TEST(RoPE, PositionZeroIsIdentity) {
  const int64_t B = 2, T = 3, H = 2, Dh = 16;
  std::vector<float> x = st::randn(B * T * H * Dh, 5, "x"), out(x.size());
  std::vector<int32_t> pos(size_t(B * T), 0);
  std::vector<float> freq = ops::rope_inv_freq(Dh, 10000.0f, {});
  ops::rope_forward(view(out, {B, T, H, Dh}), view(x, {B, T, H, Dh}), view(pos, {B, T}), view(freq, {Dh / 2}));
  EXPECT_EQ(std::memcmp(out.data(), x.data(), x.size() * 4), 0);  // cos 0 = 1, sin 0 = 0: exact
}

TEST(RoPE, BackwardInvertsForward) {
  const int64_t B = 2, T = 7, H = 3, Dh = 16;
  std::vector<float> x = st::randn(B * T * H * Dh, 6, "x"), y(x.size()), back(x.size());
  std::vector<int32_t> pos(static_cast<size_t>(B * T));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i * 131 % 1000);
  std::vector<float> freq = ops::rope_inv_freq(Dh, 10000.0f, {});
  const Tensor P = view(pos, {B, T}), F = view(freq, {Dh / 2});
  ops::rope_forward(view(y, {B, T, H, Dh}), view(x, {B, T, H, Dh}), P, F);
  ops::rope_backward(view(back, {B, T, H, Dh}), view(y, {B, T, H, Dh}), P, F);
  EXPECT_TRUE(st::all_close(back, x, 1e-6, 1e-6, "backward(forward(x))"));
}

TEST(RoPE, GradientMatchesFiniteDifferences) {
  const int64_t B = 1, T = 3, H = 2, Dh = 6;
  std::vector<float> x = st::randn(B * T * H * Dh, 7, "x"), out(x.size());
  std::vector<float> g = st::randn(B * T * H * Dh, 7, "g"), dx(x.size());
  std::vector<int32_t> pos = {5, 0, 17};
  std::vector<float> freq = ops::rope_inv_freq(Dh, 10000.0f, {});
  const Tensor P = view(pos, {B, T}), F = view(freq, {Dh / 2});
  auto loss = [&]() {
    ops::rope_forward(view(out, {B, T, H, Dh}), view(x, {B, T, H, Dh}), P, F);
    return st::dot(out.data(), g.data(), int64_t(out.size()));
  };
  ops::rope_backward(view(dx, {B, T, H, Dh}), view(g, {B, T, H, Dh}), P, F);
  EXPECT_TRUE(st::check_gradient(loss, x.data(), int64_t(x.size()), dx.data(), {}, "rope dx"));
}

TEST(RoPE, InverseFrequencies) {
  const std::vector<float> f = ops::rope_inv_freq(8, 10000.0f, {});
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[2], 0.01f, 1e-9);  // 10000^(-4/8)

  // Llama 3: long wavelengths (> 8192) divided by the factor, short ones (< 2048) kept, and the
  // band between interpolated, so each scaled value lies in [f / factor, f].
  ops::RopeScaling s;
  s.kind = ops::RopeScaling::Kind::Llama3;
  s.factor = 8.0f;
  const std::vector<float> plain = ops::rope_inv_freq(128, 500000.0f, {});
  const std::vector<float> scaled = ops::rope_inv_freq(128, 500000.0f, s);
  int low = 0, high = 0, medium = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 2048) {
      EXPECT_EQ(scaled[i], plain[i]) << i;
      ++high;
    } else if (wavelen > 8192) {
      EXPECT_EQ(scaled[i], plain[i] / 8.0f) << i;
      ++low;
    } else {
      EXPECT_LE(scaled[i], plain[i]) << i;
      EXPECT_GE(scaled[i], plain[i] / 8.0f) << i;
      ++medium;
    }
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  EXPECT_GT(medium, 0);

  expect_error([] { ops::rope_inv_freq(7, 10000.0f, {}); }, "rope_inv_freq: head_dim:");
  expect_error([] { ops::rope_inv_freq(8, 0.0f, {}); }, "rope_inv_freq: theta:");
  s.high_freq_factor = s.low_freq_factor;
  expect_error([&] { ops::rope_inv_freq(8, 10000.0f, s); }, "rope_inv_freq: rope_scaling:");
}

TEST(RoPE, RejectsBadArguments) {
  const int64_t B = 2, T = 3, H = 2, Dh = 8;
  std::vector<float> x(size_t(B * T * H * Dh), 1.0f), out(x.size()), big(2 * x.size());
  std::vector<int32_t> pos(size_t(B * T), 1);
  std::vector<float> freq = ops::rope_inv_freq(Dh, 10000.0f, {});
  const Tensor X = view(x, {B, T, H, Dh}), O = view(out, {B, T, H, Dh}), P = view(pos, {B, T});
  const Tensor F = view(freq, {Dh / 2});

  expect_error([&] { ops::rope_forward(O, X, view(pos, {T, B}), F); }, "rope_forward: positions:");
  expect_error([&] { ops::rope_forward(O, X, view(big, {B, T}), F); }, "rope_forward: positions:");
  expect_error([&] { ops::rope_forward(O, X, P, view(freq, {Dh / 2 - 1})); }, "rope_forward: inv_freq:");
  expect_error([&] { ops::rope_forward(view(big, {B, T, H, Dh + 2}), X, P, F); }, "rope_forward: out:");
  expect_error([&] { ops::rope_forward(view(out, {B, T, H * Dh}), view(x, {B, T, H * Dh}), P, F); },
               "rope_forward: x:");
  // An odd head dimension has no halves to rotate.
  expect_error([&] { ops::rope_forward(view(out, {B, T, 2 * H, 3}), view(x, {B, T, 2 * H, 3}), P, F); },
               "rope_forward: x:");
  // Overlapping but not identical buffers would read values already rotated.
  std::vector<float> xs(x.size() + 1, 1.0f);
  const Tensor a = view(xs, {B, T, H, Dh}), a1 = Tensor::view(xs.data() + 1, DType::F32, {B, T, H, Dh});
  expect_error([&] { ops::rope_forward(a1, a, P, F); }, "rope_forward: out:");
  expect_error([&] { ops::rope_backward(view(out, {B, T, 2 * H, 3}), view(x, {B, T, 2 * H, 3}), P, F); },
               "rope_backward: dout:");
  expect_error([&] { ops::rope_backward(O, X, P, view(big, {Dh})); }, "rope_backward: inv_freq:");
  expect_error([&] { ops::rope_backward(view(big, {B, T, H, 2 * Dh}), X, P, F); }, "rope_backward: dx:");
  expect_error([&] { ops::rope_backward(O, view(big, {B + 1, T, H, Dh}), P, F); }, "rope_backward: dx:");
}
