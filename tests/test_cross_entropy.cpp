// ops::linear_cross_entropy: gradients against finite differences, independence from the chunk
// size, bounded workspace, and target validation. PyTorch parity is in parity_cross_entropy.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_paths.h"
#include "ops/cpu/vec_math.h"
#include "ops/cpu_bf16.h"
#include "ops/ops.h"
#include "testing.h"

namespace shardlm {
namespace {

using ops::kIgnoreIndex;

struct Problem {
  int64_t N, D, V;
  std::vector<float> x, w;
  std::vector<int32_t> targets;
  Tensor xt() { return Tensor::view(x.data(), DType::F32, {N, D}); }
  Tensor wt() { return Tensor::view(w.data(), DType::F32, {V, D}); }
  Tensor tt() { return Tensor::view(targets.data(), DType::I32, {N}); }
};

// Random x, w (logits of order 1) and targets, every `ignore_every`-th row ignored.
Problem make_problem(int64_t N, int64_t D, int64_t V, int ignore_every, uint64_t seed) {
  Problem p{N, D, V, testing::randn(N * D, seed, "x"), testing::randn(V * D, seed, "w", 1.0f / std::sqrt(float(D))),
            {}};
  const std::vector<float> u = testing::randn(N, seed, "targets");
  for (int64_t i = 0; i < N; ++i) {
    const bool ignored = ignore_every > 0 && i % ignore_every == ignore_every - 1;
    p.targets.push_back(ignored ? kIgnoreIndex : int32_t(int64_t(std::fabs(u[i]) * 1000) % V));
  }
  return p;
}

struct Grads {
  ops::CrossEntropyResult r;
  std::vector<float> dx, dw;
};

Grads run(Problem& p, float grad_scale, int64_t chunk_rows) {
  Grads g{{}, std::vector<float>(size_t(p.N * p.D), NAN), std::vector<float>(size_t(p.V * p.D), 0.0f)};
  g.r = ops::linear_cross_entropy(p.xt(), p.wt(), p.tt(), Tensor::view(g.dx.data(), DType::F32, {p.N, p.D}),
                                  Tensor::view(g.dw.data(), DType::F32, {p.V, p.D}), grad_scale, chunk_rows);
  return g;
}

// N=6 rows in chunks of 4 (a full and a partial chunk), rows 2 and 5 ignored; the loss is the
// mean, so grad_scale = 1 / count. Checks every element of dx and dw against central differences.
TEST(CrossEntropy, GradientsMatchFiniteDifferences) {
  Problem p = make_problem(/*N=*/6, /*D=*/5, /*V=*/11, /*ignore_every=*/3, /*seed=*/7);
  const int64_t chunk_rows = 4;
  const ops::CrossEntropyResult fwd = ops::linear_cross_entropy(p.xt(), p.wt(), p.tt(), {}, {}, 1.0f, chunk_rows);
  ASSERT_EQ(fwd.count, 4);
  const float grad_scale = 1.0f / float(fwd.count);
  const Grads g = run(p, grad_scale, chunk_rows);
  EXPECT_DOUBLE_EQ(g.r.loss_sum, fwd.loss_sum);  // the backward does not change the forward

  auto loss = [&] {
    return ops::linear_cross_entropy(p.xt(), p.wt(), p.tt(), {}, {}, 1.0f, chunk_rows).loss_sum * grad_scale;
  };
  // f32 logits: the loss carries ~1e-7 rounding, i.e. ~1e-5 in a difference quotient with
  // eps = 1e-2; the O(eps^2) truncation error is below 1e-4 for these order-1 logits. The
  // gradients themselves are ~0.05..0.3, so a missing or doubled grad_scale fails by far.
  testing::GradCheckOptions opt;
  opt.eps = 1e-2;
  opt.atol = 2e-4;
  opt.rtol = 5e-3;
  EXPECT_TRUE(testing::check_gradient(loss, p.x.data(), int64_t(p.x.size()), g.dx.data(), opt, "dx"));
  EXPECT_TRUE(testing::check_gradient(loss, p.w.data(), int64_t(p.w.size()), g.dw.data(), opt, "dw"));
  // Ignored rows get exactly zero gradient (and were written: dx started as NaN).
  for (int64_t i : {2, 5})
    for (int64_t d = 0; d < p.D; ++d) EXPECT_EQ(g.dx[size_t(i * p.D + d)], 0.0f) << "row " << i;
}

// Equal to ~1e-6 of the array's largest element: dw sums terms of both signs over rows, so an
// element that nearly cancels can carry a larger relative error from a different summation order.
::testing::AssertionResult close_to_scale(const std::vector<float>& got, const std::vector<float>& want,
                                          const std::string& label) {
  float scale = 0.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  return testing::all_close(got, want, 1e-6 * scale, 1e-6, label);
}

// Chunking is an implementation detail: any chunk size gives the same loss and gradients up to
// f32 summation order (dw sums over chunks, BLAS may block differently for other row counts).
TEST(CrossEntropy, ResultsDoNotDependOnChunkRows) {
  Problem p = make_problem(/*N=*/37, /*D=*/16, /*V=*/50, /*ignore_every=*/4, /*seed=*/11);
  const Grads ref = run(p, 0.1f, p.N);
  EXPECT_EQ(ref.r.count, 28);
  for (int64_t chunk_rows : {int64_t(1), int64_t(3), p.N, p.N + 5}) {
    SCOPED_TRACE("chunk_rows=" + std::to_string(chunk_rows));
    const Grads g = run(p, 0.1f, chunk_rows);
    EXPECT_EQ(g.r.count, ref.r.count);
    EXPECT_NEAR(g.r.loss_sum, ref.r.loss_sum, 1e-6 * std::fabs(ref.r.loss_sum));
    EXPECT_TRUE(close_to_scale(g.dx, ref.dx, "dx"));
    EXPECT_TRUE(close_to_scale(g.dw, ref.dw, "dw"));
  }
}

// On the f32 fallback bf16 inputs are widened exactly, so they must give the same answer as f32
// inputs holding the same (bf16-representable) values. (The CPU's bf16 path rounds dlogits to bf16
// instead: Parity.CrossEntropy and backend_ops check it under the bf16 policy's tolerance.)
TEST(CrossEntropy, Bf16InputsMatchF32OfSameValues) {
  const shardlm::testing::CpuPath fallback(false);
  Problem p = make_problem(/*N=*/19, /*D=*/12, /*V=*/40, /*ignore_every=*/5, /*seed=*/3);
  std::vector<bf16_t> xb(p.x.size()), wb(p.w.size());
  for (size_t i = 0; i < p.x.size(); ++i) p.x[i] = bf16_to_f32(xb[i] = f32_to_bf16(p.x[i]));
  for (size_t i = 0; i < p.w.size(); ++i) p.w[i] = bf16_to_f32(wb[i] = f32_to_bf16(p.w[i]));
  const Grads ref = run(p, 0.5f, 8);
  Grads g{{}, std::vector<float>(p.x.size()), std::vector<float>(p.w.size())};
  g.r = ops::linear_cross_entropy(Tensor::view(xb.data(), DType::BF16, {p.N, p.D}),
                                  Tensor::view(wb.data(), DType::BF16, {p.V, p.D}), p.tt(),
                                  Tensor::view(g.dx.data(), DType::F32, {p.N, p.D}),
                                  Tensor::view(g.dw.data(), DType::F32, {p.V, p.D}), 0.5f, 8);
  EXPECT_EQ(g.r.count, ref.r.count);
  EXPECT_NEAR(g.r.loss_sum, ref.r.loss_sum, 1e-6 * std::fabs(ref.r.loss_sum));
  EXPECT_TRUE(close_to_scale(g.dx, ref.dx, "dx"));
  EXPECT_TRUE(close_to_scale(g.dw, ref.dw, "dw"));
}

// The point of the fusion: with N=4096 rows and V=32000, full logits would take 500 MiB; the op
// may only hold one chunk of them (32 MiB for 256 rows), forward and backward.
TEST(CrossEntropy, WorkspaceStaysOneChunk) {
  const int64_t N = 4096, D = 64, V = 32000, chunk_rows = 256;
  OwnedTensor x(DType::F32, {N, D}, MemCategory::Other, false), w(DType::F32, {V, D}, MemCategory::Other, false);
  OwnedTensor dx(DType::F32, {N, D}, MemCategory::Other), dw(DType::F32, {V, D}, MemCategory::Other);
  OwnedTensor targets(DType::I32, {N}, MemCategory::Other);
  const std::vector<float> xv = testing::randn(N * D, 5, "x"), wv = testing::randn(V * D, 5, "w", 0.125f);
  std::copy(xv.begin(), xv.end(), x.t.f32());
  std::copy(wv.begin(), wv.end(), w.t.f32());
  for (int64_t i = 0; i < N; ++i) targets.t.i32()[i] = i % 10 == 9 ? kIgnoreIndex : int32_t(i * 7919 % V);

  MemoryTracker& tracker = MemoryTracker::for_device(Device::CPU);
  const int64_t before = tracker.stats().live[int(MemCategory::Workspace)];
  tracker.reset_peaks();
  const ops::CrossEntropyResult r = ops::linear_cross_entropy(x, w, targets, dx, dw, 1.0f / 3687, chunk_rows);
  const MemStats after = tracker.stats();
  const int64_t growth = after.peak[int(MemCategory::Workspace)] - before;

  const int64_t chunk_bytes = chunk_rows * V * 4, full_bytes = N * V * 4;
  EXPECT_EQ(r.count, 3687);
  EXPECT_TRUE(std::isfinite(r.loss_sum));
  EXPECT_GE(growth, chunk_bytes) << "the logits chunk should be a tracked Workspace allocation";
  EXPECT_LE(growth, chunk_bytes + (1 << 20)) << "workspace beyond one logits chunk (+1 MiB slack)";
  EXPECT_LT(growth * 8, full_bytes);
  EXPECT_EQ(after.live[int(MemCategory::Workspace)], before) << "workspace leaked";
}

// A frozen head (LoRA): dw undefined, dx defined. The loss and dx are the bits of the run with dw
// (the dw GEMM is skipped, nothing else changes), for f32 and bf16 inputs and several chunkings,
// an all-ignored chunk included.
TEST(CrossEntropy, FrozenHeadGivesTheSameLossAndDxWithoutDw) {
  Problem p = make_problem(/*N=*/23, /*D=*/12, /*V=*/40, /*ignore_every=*/5, /*seed=*/13);
  for (int64_t i = 8; i < 12; ++i) p.targets[size_t(i)] = kIgnoreIndex;  // rows [8, 12): a whole chunk of 4
  std::vector<bf16_t> xb(p.x.size()), wb(p.w.size());
  for (size_t i = 0; i < p.x.size(); ++i) xb[i] = f32_to_bf16(p.x[i]);
  for (size_t i = 0; i < p.w.size(); ++i) wb[i] = f32_to_bf16(p.w[i]);
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor x = dt == DType::F32 ? p.xt() : Tensor::view(xb.data(), DType::BF16, {p.N, p.D});
    const Tensor w = dt == DType::F32 ? p.wt() : Tensor::view(wb.data(), DType::BF16, {p.V, p.D});
    for (int64_t chunk_rows : {int64_t(4), int64_t(7), p.N}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " chunk_rows=" + std::to_string(chunk_rows));
      std::vector<float> dx_full(size_t(p.N * p.D), NAN), dw(size_t(p.V * p.D), 0.0f);
      std::vector<float> dx_frozen(size_t(p.N * p.D), NAN);
      const ops::CrossEntropyResult full = ops::linear_cross_entropy(
          x, w, p.tt(), testing::view(dx_full, {p.N, p.D}), testing::view(dw, {p.V, p.D}), 0.25f, chunk_rows);
      const ops::CrossEntropyResult frozen = ops::linear_cross_entropy(
          x, w, p.tt(), testing::view(dx_frozen, {p.N, p.D}), Tensor{}, 0.25f, chunk_rows);
      EXPECT_EQ(frozen.count, full.count);
      EXPECT_EQ(frozen.loss_sum, full.loss_sum);
      EXPECT_EQ(std::memcmp(dx_frozen.data(), dx_full.data(), dx_full.size() * sizeof(float)), 0);
      double dw_norm = 0.0;
      for (float v : dw) dw_norm += double(v) * v;
      EXPECT_GT(dw_norm, 0.0);  // the run with dw did compute one
    }
  }
}

// A diverged model must show up as a NaN loss, not vanish in the max or the exp of the softmax.
TEST(CrossEntropy, NanLogitsGiveNanLoss) {
  Problem p = make_problem(/*N=*/6, /*D=*/5, /*V=*/11, /*ignore_every=*/0, /*seed=*/2);
  p.w[size_t(4 * p.D)] = NAN;  // logit 4 of every row
  const Grads g = run(p, 1.0f, 4);
  EXPECT_TRUE(std::isnan(g.r.loss_sum));
}

TEST(CrossEntropy, RejectsOutOfRangeTargetNamingTheRow) {
  Problem p = make_problem(/*N=*/6, /*D=*/5, /*V=*/11, /*ignore_every=*/0, /*seed=*/1);
  for (int32_t bad : {11, -1, 1 << 20}) {
    p.targets[3] = bad;
    try {
      ops::linear_cross_entropy(p.xt(), p.wt(), p.tt(), {}, {}, 1.0f, 4);
      ADD_FAILURE() << "target " << bad << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("row 3"), std::string::npos) << what;
      EXPECT_NE(what.find(std::to_string(bad)), std::string::npos) << what;
    }
  }
}

TEST(CrossEntropy, RejectsInconsistentArguments) {
  Problem p = make_problem(/*N=*/6, /*D=*/5, /*V=*/11, /*ignore_every=*/0, /*seed=*/1);
  std::vector<float> dx(30), dw(55), short_dw(50);
  const Tensor dxt = Tensor::view(dx.data(), DType::F32, {6, 5}), dwt = Tensor::view(dw.data(), DType::F32, {11, 5});
  // dw without dx, a dw of the wrong shape, and an empty chunk.
  testing::expect_error([&] { ops::linear_cross_entropy(p.xt(), p.wt(), p.tt(), {}, dwt, 1.0f, 4); },
                        "linear_cross_entropy: dw is defined but dx is not");
  EXPECT_THROW(ops::linear_cross_entropy(p.xt(), p.wt(), p.tt(), dxt,
                                         Tensor::view(short_dw.data(), DType::F32, {10, 5}), 1.0f, 4),
               Error);
  EXPECT_THROW(ops::linear_cross_entropy(p.xt(), p.wt(), p.tt(), dxt, dwt, 1.0f, 0), Error);
  // targets must be one i32 per row of x.
  EXPECT_THROW(ops::linear_cross_entropy(p.xt(), p.wt(), Tensor::view(p.targets.data(), DType::I32, {5}), {}, {},
                                         1.0f, 4),
               Error);
}

}  // namespace
}  // namespace shardlm

// The softmax's exp (ops/cpu/vec_math.h, shared by cross-entropy, attention and SwiGLU): within
// 1.5 ulp of double-precision exp over its whole range, 0 below it, +inf above, NaN kept.
TEST(VecMath, ExpNonpositiveIsWithinOneAndAHalfUlpAndKeepsTheEdges) {
  double worst = 0.0;
  float at = 0.0f;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f + 175.0f * float(i) / 2000000.0f;
    const double want = std::exp(double(x));
    const float got = shardlm::ops::cpu::exp_nonpositive(x);
    const double ulp = std::nextafter(float(want), INFINITY) - float(want);
    if (std::fabs(double(got) - want) / ulp > worst) {
      worst = std::fabs(double(got) - want) / ulp;
      at = x;
    }
  }
  EXPECT_LT(worst, 1.5) << "at x = " << at;  // 1.003 at most, seen
  EXPECT_EQ(shardlm::ops::cpu::exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(shardlm::ops::cpu::exp_nonpositive(-88.0f), 0.0f);
  EXPECT_EQ(shardlm::ops::cpu::exp_nonpositive(-INFINITY), 0.0f);
  EXPECT_EQ(shardlm::ops::cpu::exp_nonpositive(89.0f), INFINITY);
  EXPECT_EQ(shardlm::ops::cpu::exp_nonpositive(1e30f), INFINITY);
  EXPECT_TRUE(std::isnan(shardlm::ops::cpu::exp_nonpositive(NAN)));
  EXPECT_NEAR(shardlm::ops::cpu::sigmoid(3.0f), 1.0 / (1.0 + std::exp(-3.0)), 1e-7);
  EXPECT_NEAR(shardlm::ops::cpu::sigmoid(-30.0f), 1.0 / (1.0 + std::exp(30.0)), 1e-20);
  EXPECT_EQ(shardlm::ops::cpu::sigmoid(-200.0f), 0.0f);
  EXPECT_EQ(shardlm::ops::cpu::sigmoid(200.0f), 1.0f);
}
