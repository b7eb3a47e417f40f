// RMSNorm: finite-difference gradients, the unit-RMS property, determinism and argument checks.
// (Agreement with Hugging Face is tests/parity_rmsnorm.cpp.)
#include <gtest/gtest.h>
#include <omp.h>

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

TEST(RMSNorm, GradientsMatchFiniteDifferences) {
  const int64_t N = 3, D = 7;
  const float eps = 1e-5f;
  std::vector<float> x = st::randn(N * D, 1, "x");
  std::vector<float> w = st::randn(D, 1, "w", 0.5f);
  for (float& v : w) v += 1.0f;
  const std::vector<float> g = st::randn(N * D, 1, "g");  // loss = sum(y * g), so dy = g
  std::vector<float> y(size_t(N * D), 0.0f), rstd(size_t(N), 0.0f);

  auto loss = [&]() {
    ops::rmsnorm_forward(view(y, {N, D}), view(rstd, {N}), view(x, {N, D}), view(w, {D}), eps);
    return st::dot(y.data(), g.data(), N * D);
  };
  loss();
  std::vector<float> dx(size_t(N * D), 0.0f), dw(size_t(D), 0.0f), dy = g;
  ops::rmsnorm_backward(view(dx, {N, D}), view(dw, {D}), view(dy, {N, D}), view(x, {N, D}), view(w, {D}),
                        view(rstd, {N}));
  EXPECT_TRUE(st::check_gradient(loss, x.data(), N * D, dx.data(), {}, "rmsnorm dx"));
  EXPECT_TRUE(st::check_gradient(loss, w.data(), D, dw.data(), {}, "rmsnorm dw"));
}

TEST(RMSNorm, UnitWeightGivesUnitRms) {
  const int64_t N = 5, D = 48;
  std::vector<float> x = st::randn(N * D, 2, "x", 3.0f), w(size_t(D), 1.0f);
  std::vector<float> y(size_t(N * D), 0.0f), rstd(size_t(N), 0.0f);
  ops::rmsnorm_forward(view(y, {N, D}), view(rstd, {N}), view(x, {N, D}), view(w, {D}), 1e-6f);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int64_t j = 0; j < D; ++j) ss += double(y[size_t(n * D + j)]) * y[size_t(n * D + j)];
    EXPECT_NEAR(std::sqrt(ss / D), 1.0, 1e-5) << "row " << n;  // eps shifts it by ~1e-7 here
  }
}

TEST(RMSNorm, BackwardIsIndependentOfThreadCount) {
  // dw is reduced over rows in a fixed order, so its bits must not depend on the thread count.
  const int64_t N = 37, D = 200;  // several column blocks
  std::vector<float> x = st::randn(N * D, 3, "x"), w = st::randn(D, 3, "w");
  std::vector<float> dy = st::randn(N * D, 3, "dy");
  std::vector<float> y(size_t(N * D), 0.0f), rstd(size_t(N), 0.0f);
  ops::rmsnorm_forward(view(y, {N, D}), view(rstd, {N}), view(x, {N, D}), view(w, {D}), 1e-5f);
  auto run = [&](int threads, std::vector<float>& dx, std::vector<float>& dw) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    dx.assign(size_t(N * D), 0.0f);
    dw.assign(size_t(D), 1.0f);
    ops::rmsnorm_backward(view(dx, {N, D}), view(dw, {D}), view(dy, {N, D}), view(x, {N, D}), view(w, {D}),
                          view(rstd, {N}));
    omp_set_num_threads(saved);
  };
  std::vector<float> dx1, dw1, dx3, dw3;
  run(1, dx1, dw1);
  run(3, dx3, dw3);
  EXPECT_EQ(std::memcmp(dx1.data(), dx3.data(), dx1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(dw1.data(), dw3.data(), dw1.size() * 4), 0);
}

TEST(RMSNorm, FrozenWeightGivesTheSameDxWithoutDw) {
  // dw undefined (a frozen norm weight under LoRA): dx is the bits of the run with dw; bf16 x and
  // dy included, and a D spanning several of the dw pass's column blocks.
  const int64_t N = 9, D = 130;
  std::vector<float> x = st::randn(N * D, 4, "x"), w = st::randn(D, 4, "w"), dy = st::randn(N * D, 4, "dy");
  std::vector<float> y(static_cast<size_t>(N * D)), rstd(static_cast<size_t>(N));
  ops::rmsnorm_forward(view(y, {N, D}), view(rstd, {N}), view(x, {N, D}), view(w, {D}), 1e-5f);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    st::HostArray xa(dt, x), dya(dt, dy);
    std::vector<float> dx_full(size_t(N * D), NAN), dx_frozen(size_t(N * D), NAN), dw(size_t(D), 0.5f);
    ops::rmsnorm_backward(view(dx_full, {N, D}), view(dw, {D}), dya.view({N, D}), xa.view({N, D}), view(w, {D}),
                          view(rstd, {N}));
    ops::rmsnorm_backward(view(dx_frozen, {N, D}), Tensor{}, dya.view({N, D}), xa.view({N, D}), view(w, {D}),
                          view(rstd, {N}));
    EXPECT_EQ(std::memcmp(dx_frozen.data(), dx_full.data(), dx_full.size() * sizeof(float)), 0);
    EXPECT_NE(dw, std::vector<float>(size_t(D), 0.5f));  // the run with dw did accumulate into it
  }
}

TEST(RMSNorm, RejectsBadArguments) {
  const int64_t N = 4, D = 8;
  const size_t nd = size_t(N * D);
  std::vector<float> x(nd, 1.0f), w(size_t(D), 1.0f), y(nd, 0.0f), rstd(size_t(N), 0.0f);
  std::vector<float> dx(nd, 0.0f), dw(size_t(D), 0.0f), big(2 * nd, 0.0f);
  std::vector<int32_t> ints(nd, 0);
  const Tensor X = view(x, {N, D}), W = view(w, {D}), Y = view(y, {N, D}), R = view(rstd, {N});
  const Tensor DX = view(dx, {N, D}), DW = view(dw, {D});

  expect_error([&] { ops::rmsnorm_forward(Y, R, X, view(big, {D + 1}), 1e-5f); }, "rmsnorm_forward: w:");
  expect_error([&] { ops::rmsnorm_forward(view(big, {N, D + 1}), R, X, W, 1e-5f); }, "rmsnorm_forward: y:");
  expect_error([&] { ops::rmsnorm_forward(Y, view(big, {N + 1}), X, W, 1e-5f); }, "rmsnorm_forward: rstd:");
  expect_error([&] { ops::rmsnorm_forward(Y, R, view(x, {2, 2, D}), W, 1e-5f); }, "rmsnorm_forward: x:");
  expect_error([&] { ops::rmsnorm_forward(Y, R, Tensor::view(ints.data(), DType::I32, {N, D}), W, 1e-5f); },
               "rmsnorm_forward: x:");
  expect_error([&] { ops::rmsnorm_forward(Y, R, X, W, -1.0f); }, "rmsnorm_forward: eps:");
  expect_error([&] { ops::rmsnorm_forward(Y, R, X, Tensor{}, 1e-5f); }, "rmsnorm_forward: w:");
  expect_error([&] { ops::rmsnorm_backward(DX, Tensor::view(dw.data(), DType::BF16, {D}), Y, X, W, R); },
               "rmsnorm_backward: dw:");
  expect_error([&] { ops::rmsnorm_backward(DX, DW, view(big, {N + 1, D}), X, W, R); }, "rmsnorm_backward: dy:");
  expect_error([&] { ops::rmsnorm_backward(view(big, {N, 2 * D}), DW, Y, X, W, R); }, "rmsnorm_backward: dx:");
}
