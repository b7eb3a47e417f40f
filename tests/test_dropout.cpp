// ops::dropout: the mask's statistics, the kept values' arithmetic, determinism in (key, stream),
// in-place use, bf16, p = 0 and argument checks. (The backward is the same call on the gradient:
// GradCheck.DropoutBackwardIsTheSameMask in test_ops_fd.cpp; agreement with torch's arithmetic:
// Parity.Dropout; CUDA against the CPU, bitwise: backend_ops.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "testing.h"

using namespace shardlm;
using shardlm::testing::expect_error;
using shardlm::testing::view;
namespace st = shardlm::testing;

namespace {

std::vector<float> run_dropout(const std::vector<float>& x, int64_t N, int64_t D, float p, uint64_t key,
                               uint64_t stream) {
  std::vector<float> in = x, out(x.size(), NAN);
  ops::dropout(view(out, {N, D}), view(in, {N, D}), p, key, stream);
  return out;
}

// Nonzero inputs, so a zero output means a dropped element.
std::vector<float> nonzero_input(int64_t n, uint64_t seed) {
  std::vector<float> x = st::randn(n, seed, "dropout x");
  for (float& v : x)
    if (v == 0.0f) v = 1.0f;
  return x;
}

}  // namespace

TEST(Dropout, DropsAFractionPAndScalesTheRest) {
  const int64_t N = 400, D = 1000;  // 400k elements: the dropped fraction's sd is <= 0.0008
  const std::vector<float> x = nonzero_input(N * D, 1);
  for (float p : {0.05f, 0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    const std::vector<float> y = run_dropout(x, N, D, p, 1234, 5);
    const float s = ops::dropout_scale(p);
    EXPECT_EQ(s, 1.0f / float(1.0 - double(p)));
    int64_t dropped = 0, wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const bool keep = rng_uniform(1234, 5, i) >= p;  // the documented mask, element by element
      if (keep ? y[i] != x[i] * s : y[i] != 0.0f) ++wrong;
      if (y[i] == 0.0f) ++dropped;
      if (!keep && std::signbit(y[i]) != std::signbit(x[i])) ++wrong;  // x * 0 keeps x's sign, as torch
    }
    EXPECT_EQ(wrong, 0);
    const double frac = double(dropped) / double(x.size());
    EXPECT_NEAR(frac, p, 5 * std::sqrt(p * (1 - p) / double(x.size())));
    // Within 1 ulp of x / (1 - p) (the contract's formula), computed in double.
    for (size_t i = 0; i < 1000; ++i) {
      if (y[i] != 0.0f) {
        EXPECT_NEAR(y[i], double(x[i]) / (1.0 - double(p)), 2.4e-7 * std::fabs(y[i])) << i;
      }
    }
  }
}

TEST(Dropout, MaskIsAFunctionOfKeyStreamAndIndexAlone) {
  const int64_t N = 64, D = 300;
  const std::vector<float> x = nonzero_input(N * D, 2);
  const std::vector<float> a = run_dropout(x, N, D, 0.3f, 77, 8);
  EXPECT_EQ(a, run_dropout(x, N, D, 0.3f, 77, 8));  // the same call, the same bits
  // Other threads counts: the same bits.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = run_dropout(x, N, D, 0.3f, 77, 8);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.data(), a.data(), a.size() * 4), 0);
  // Another key, another stream, a key differing only in its high 32 bits: other masks.
  auto mask_differences = [&](const std::vector<float>& b) {
    int64_t d = 0;
    for (size_t i = 0; i < a.size(); ++i) d += (a[i] == 0.0f) != (b[i] == 0.0f);
    return d;
  };
  for (auto [key, stream] : {std::pair<uint64_t, uint64_t>{78, 8}, {77, 9}, {77 | (1ull << 32), 8}, {77, 8ull << 32}}) {
    const int64_t d = mask_differences(run_dropout(x, N, D, 0.3f, key, stream));
    // Independent masks at p = 0.3 disagree on 2 p (1 - p) = 42% of elements.
    EXPECT_GT(d, int64_t(0.35 * double(N * D))) << "key " << key << " stream " << stream;
  }
  // A row's mask depends on its flat index: the same values in another row are masked differently.
  std::vector<float> rows(size_t(2 * D), 1.0f);
  const std::vector<float> r = run_dropout(rows, 2, D, 0.5f, 3, 4);
  EXPECT_NE(std::vector<float>(r.begin(), r.begin() + D), std::vector<float>(r.begin() + D, r.end()));
}

TEST(Dropout, InPlaceEqualsOutOfPlace) {
  const int64_t N = 17, D = 1001;  // more than one OpenMP chunk
  const std::vector<float> x = nonzero_input(N * D, 3);
  const std::vector<float> want = run_dropout(x, N, D, 0.2f, 9, 10);
  std::vector<float> y = x;
  ops::dropout(view(y, {N, D}), view(y, {N, D}), 0.2f, 9, 10);
  EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * 4), 0);
  // bf16 in place as well: the same as bf16 -> bf16 out of place.
  st::HostArray hx(DType::BF16, x), hy(DType::BF16, x), hout(DType::BF16, std::vector<float>(x.size(), 0.0f));
  ops::dropout(hout.view({N, D}), hx.view({N, D}), 0.2f, 9, 10);
  ops::dropout(hy.view({N, D}), hy.view({N, D}), 0.2f, 9, 10);
  EXPECT_EQ(hy.values(), hout.values());
}

TEST(Dropout, Bf16IsComputedInF32AndRoundedOnce) {
  const int64_t N = 31, D = 97;
  const std::vector<float> x = nonzero_input(N * D, 4);
  st::HostArray hx(DType::BF16, x);
  const std::vector<float> xv = hx.values();  // the bf16 values as f32
  const float p = 0.1f, s = ops::dropout_scale(p);
  // bf16 -> f32: exactly the f32 op on the widened values.
  std::vector<float> f(x.size(), NAN);
  ops::dropout(view(f, {N, D}), hx.view({N, D}), p, 21, 22);
  EXPECT_EQ(f, run_dropout(xv, N, D, p, 21, 22));
  // f32 -> bf16 and bf16 -> bf16: that result rounded once.
  st::HostArray o1(DType::BF16, std::vector<float>(x.size(), 0.0f)), o2 = o1;
  std::vector<float> xf = xv;
  ops::dropout(o1.view({N, D}), view(xf, {N, D}), p, 21, 22);
  ops::dropout(o2.view({N, D}), hx.view({N, D}), p, 21, 22);
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = bf16_to_f32(f32_to_bf16(f[i]));
    ASSERT_EQ(o1.values()[i], want) << i;
    ASSERT_EQ(o2.values()[i], want) << i;
  }
  // (a kept element of a bf16 x is x * s in f32, not x * bf16(s) as torch's bf16 dropout does)
  EXPECT_NE(s, bf16_to_f32(f32_to_bf16(s)));
}

TEST(Dropout, ZeroPIsACopyOrCast) {
  const int64_t N = 5, D = 33;
  std::vector<float> x = nonzero_input(N * D, 5);
  x[3] = -0.0f;
  x[4] = NAN;
  const std::vector<float> y = run_dropout(x, N, D, 0.0f, 1, 2);
  EXPECT_EQ(std::memcmp(y.data(), x.data(), x.size() * 4), 0);
  st::HostArray h(DType::BF16, std::vector<float>(x.size(), 0.0f));
  ops::dropout(h.view({N, D}), view(x, {N, D}), 0.0f, 1, 2);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(h.h[i].bits, f32_to_bf16(x[i]).bits) << i;
}

TEST(Dropout, NanAndInfinityStayNanWhenDropped) {
  // x * 0, as torch: a non-finite input is not hidden by the mask.
  const int64_t D = 64;
  std::vector<float> x(size_t(D), INFINITY);
  x[0] = NAN;
  const std::vector<float> y = run_dropout(x, 1, D, 0.5f, 6, 6);
  EXPECT_TRUE(std::isnan(y[0]));
  int64_t nan = 0, inf = 0;
  for (int64_t i = 1; i < D; ++i) (std::isnan(y[size_t(i)]) ? nan : inf) += 1;
  EXPECT_GT(nan, 0);  // dropped: inf * 0
  EXPECT_GT(inf, 0);  // kept: inf * s
}

TEST(Dropout, RejectsBadArguments) {
  const int64_t N = 4, D = 8;
  std::vector<float> x(size_t(N * D), 1.0f), out(size_t(N * D)), big(size_t(2 * N * D));
  std::vector<int32_t> ints(size_t(N * D));
  const Tensor X = view(x, {N, D}), O = view(out, {N, D});
  for (float p : {-0.1f, 1.0f, 1.5f, NAN}) expect_error([&] { ops::dropout(O, X, p, 1, 2); }, "dropout: p:");
  expect_error([&] { ops::dropout(view(big, {N, D + 1}), X, 0.1f, 1, 2); }, "dropout: out:");
  expect_error([&] { ops::dropout(O, view(x, {2, 2, D}), 0.1f, 1, 2); }, "dropout: x:");
  expect_error([&] { ops::dropout(O, Tensor::view(ints.data(), DType::I32, {N, D}), 0.1f, 1, 2); }, "dropout: x:");
  expect_error([&] { ops::dropout(Tensor{}, X, 0.1f, 1, 2); }, "dropout: out:");
  // Overlap other than out == x: shifted by one row, or the same memory read as another dtype.
  expect_error([&] { ops::dropout(view(big, {N, D}), Tensor::view(big.data() + D, DType::F32, {N, D}), 0.1f, 1, 2); },
               "dropout: out: overlaps x");
  expect_error([&] { ops::dropout(Tensor::view(x.data(), DType::BF16, {N, D}), X, 0.1f, 1, 2); },
               "dropout: out: overlaps x");
}
