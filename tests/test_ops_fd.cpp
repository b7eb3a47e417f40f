// Finite-difference gradient checks for matmul, embedding, SwiGLU, bias and dropout, plus argument
// checks.
// Each builds L = <out, R> for a fixed random R (in double), so dL/dout = R is what the backward
// receives, and compares the analytic input gradients with central differences.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "ops/ops.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;

namespace {
}  // namespace

TEST(GradCheck, MatmulLinearLayer) {
  // y = x W^T: dx = dy W, dW = dy^T x (accumulated onto an existing gradient).
  const int64_t N = 5, in = 7, out = 6;
  std::vector<float> x = randn(N * in, 1, "x"), W = randn(out * in, 2, "W"), R = randn(N * out, 3, "R");
  std::vector<float> y(size_t(N * out));
  auto loss = [&] {
    ops::matmul(view(y, {N, out}), view(x, {N, in}), view(W, {out, in}), false, true);
    return dot(y.data(), R.data(), N * out);
  };
  std::vector<float> dx(size_t(N * in)), dW(size_t(out * in), 0.25f);
  ops::matmul(view(dx, {N, in}), view(R, {N, out}), view(W, {out, in}));
  ops::matmul(view(dW, {out, in}), view(R, {N, out}), view(x, {N, in}), true, false, 1.0f, 1.0f);
  for (float& g : dW) g -= 0.25f;  // remove the pre-existing gradient the matmul accumulated onto
  EXPECT_TRUE(check_gradient(loss, x.data(), N * in, dx.data(), {}, "dx"));
  EXPECT_TRUE(check_gradient(loss, W.data(), out * in, dW.data(), {}, "dW"));
}

TEST(GradCheck, Embedding) {
  const int64_t N = 6, V = 4, D = 3;
  std::vector<float> W = randn(V * D, 4, "W"), R = randn(N * D, 5, "R"), out(size_t(N * D));
  std::vector<int32_t> ids = {2, 0, 2, 3, 2, 1};
  const Tensor idt = Tensor::view(ids.data(), DType::I32, {N});
  auto loss = [&] {
    ops::embedding_forward(view(out, {N, D}), view(W, {V, D}), idt);
    return dot(out.data(), R.data(), N * D);
  };
  std::vector<float> dW(size_t(V * D), 0.0f);
  ops::embedding_backward(view(dW, {V, D}), view(R, {N, D}), idt);
  EXPECT_TRUE(check_gradient(loss, W.data(), V * D, dW.data(), {}, "dweight"));
}

TEST(GradCheck, SwiGLU) {
  const int64_t N = 4, F = 9;
  std::vector<float> g = randn(N * F, 6, "g", 2.0f), u = randn(N * F, 7, "u"), R = randn(N * F, 8, "R");
  std::vector<float> out(size_t(N * F)), dg(size_t(N * F)), du(size_t(N * F));
  auto loss = [&] {
    ops::swiglu_forward(view(out, {N, F}), view(g, {N, F}), view(u, {N, F}));
    return dot(out.data(), R.data(), N * F);
  };
  ops::swiglu_backward(view(dg, {N, F}), view(du, {N, F}), view(R, {N, F}), view(g, {N, F}), view(u, {N, F}));
  EXPECT_TRUE(check_gradient(loss, g.data(), N * F, dg.data(), {1e-3, 1e-3, 1e-2, 200}, "dgate"));
  EXPECT_TRUE(check_gradient(loss, u.data(), N * F, du.data(), {1e-3, 1e-3, 1e-2, 200}, "dup"));
}

TEST(GradCheck, DropoutBackwardIsTheSameMask) {
  // out = M x with M diagonal (the mask times 1 / (1 - p)), so dx = M dy: the backward is the same
  // call, with the same (key, stream), applied to the gradient. The op is linear, so central
  // differences are exact up to rounding.
  const int64_t N = 6, D = 11;
  const float p = 0.4f;
  const uint64_t key = 0x1234abcd5678ull, stream = 99;
  std::vector<float> x = randn(N * D, 13, "x"), R = randn(N * D, 14, "R"), out(size_t(N * D));
  auto loss = [&] {
    ops::dropout(view(out, {N, D}), view(x, {N, D}), p, key, stream);
    return dot(out.data(), R.data(), N * D);
  };
  std::vector<float> dx(size_t(N * D));
  ops::dropout(view(dx, {N, D}), view(R, {N, D}), p, key, stream);
  EXPECT_TRUE(check_gradient(loss, x.data(), N * D, dx.data(), {1e-2, 1e-4, 1e-4, 1000}, "dx"));
  // dx is the mask applied to dy: zero where the element was dropped, R * scale where kept; and
  // in place on the gradient buffer (how a caller would run it) gives the same bits.
  int64_t dropped = 0;
  for (int64_t i = 0; i < N * D; ++i) {
    const bool keep = rng_uniform(key, stream, uint64_t(i)) >= p;
    EXPECT_EQ(dx[size_t(i)], keep ? R[size_t(i)] * ops::dropout_scale(p) : R[size_t(i)] * 0.0f) << i;
    dropped += !keep;
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, N * D);
  std::vector<float> g = R;
  ops::dropout(view(g, {N, D}), view(g, {N, D}), p, key, stream);
  EXPECT_EQ(g, dx);
}

TEST(GradCheck, AdamWMatchesClosedFormFirstStep) {
  // At step 1, m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps) ~ lr * sign(g).
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.3f, -4.0f, 1e-3f}, m(3, 0.0f), v(3, 0.0f);
  ops::AdamWConfig cfg;
  cfg.lr = 0.1f;
  cfg.weight_decay = 0.5f;
  ops::adamw_step(view(p, {3}), view(g, {3}), view(m, {3}), view(v, {3}), cfg, 1);
  const float expected[3] = {1.0f * 0.95f - 0.1f, -2.0f * 0.95f + 0.1f, 0.5f * 0.95f - 0.1f * 1e-3f / (1e-3f + 1e-8f)};
  EXPECT_TRUE(all_close(p.data(), expected, 3, 1e-6, 1e-5, "p after one step"));
}

TEST(OpArgs, ErrorsNameTheOpAndArgument) {
  std::vector<float> a(6), b(6), c(4);
  try {
    ops::matmul(view(c, {2, 2}), view(a, {2, 3}), view(b, {2, 3}));
    FAIL() << "mismatched inner dimensions were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul: inner dimensions differ"), std::string::npos) << e.what();
  }
  std::vector<int32_t> ids = {0, 9};
  try {
    ops::embedding_forward(view(a, {2, 3}), view(b, {2, 3}), Tensor::view(ids.data(), DType::I32, {2}));
    FAIL() << "an out-of-vocabulary id was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 9 at position 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::swiglu_forward(view(a, {2, 3}), view(b, {3, 2}), view(a, {2, 3})), Error);
  EXPECT_THROW(ops::adamw_step(view(a, {6}), view(b, {6}), view(c, {4}), view(a, {6}), {}, 1), Error);
  EXPECT_THROW(ops::matmul(Tensor{}, view(a, {2, 3}), view(b, {3, 2})), Error);
}

TEST(Ops, SumSquaresIsThreadCountIndependentAndClipCoefficient) {
  std::vector<float> x = randn(100003, 9, "x");
  const double s = ops::sum_squares(view(x, {100003}));
  double ref = 0;
  for (float e : x) ref += double(e) * e;
  EXPECT_NEAR(s, ref, 1e-9 * ref);
  EXPECT_FLOAT_EQ(ops::clip_coefficient(10.0, 1.0f), float(1.0 / (10.0 + 1e-6)));
  EXPECT_EQ(ops::clip_coefficient(0.5, 1.0f), 1.0f);
  EXPECT_EQ(ops::clip_coefficient(5.0, 0.0f), 1.0f);  // max_norm 0 disables clipping
}

TEST(GradCheck, BiasAddAndBackward) {
  const int64_t N = 5, M = 4;
  std::vector<float> x = randn(N * M, 10, "x"), b = randn(M, 11, "b"), R = randn(N * M, 12, "R"), y(size_t(N * M));
  auto loss = [&] {
    y = x;
    ops::add_bias(view(y, {N, M}), view(b, {M}));
    return dot(y.data(), R.data(), N * M);
  };
  std::vector<float> db(size_t(M), 1.0f);
  ops::bias_backward(view(db, {M}), view(R, {N, M}));
  for (float& g : db) g -= 1.0f;  // accumulated onto 1
  EXPECT_TRUE(check_gradient(loss, b.data(), M, db.data(), {}, "dbias"));
  EXPECT_THROW(ops::add_bias(view(y, {N, M}), view(b, {M - 1})), Error);
}
