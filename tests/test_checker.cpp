// The checkers must be able to fail: a test that cannot fail proves nothing.
#include <gtest/gtest.h>

#include <cmath>

#include "testing.h"

using namespace shardlm::testing;

TEST(Checker, AllCloseCatchesOnePerturbedElement) {
  std::vector<float> want = randn(1000, 1, "want");
  std::vector<float> got = want;
  EXPECT_TRUE(all_close(got, want, 1e-6, 1e-6));
  got[517] += 1e-3f;
  auto r = all_close(got, want, 1e-6, 1e-5, "perturbed");
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("[517]"), std::string::npos) << r.message();
  got[517] = NAN;
  EXPECT_FALSE(all_close(got, want, 1.0, 1.0));  // NaN never passes, whatever the tolerance
  got = want;
  got.pop_back();
  EXPECT_FALSE(all_close(got, want, 1.0, 1.0));  // size mismatch
}

TEST(Checker, GradientCheckAcceptsTrueAndRejectsPerturbedGradients) {
  // L(x) = sum_i w_i * x_i^3 ; dL/dx_i = 3 w_i x_i^2.
  std::vector<float> x = randn(50, 2, "x"), w = randn(50, 3, "w");
  auto loss = [&] {
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += double(w[i]) * x[i] * x[i] * x[i];
    return s;
  };
  std::vector<float> grad(50);
  for (size_t i = 0; i < x.size(); ++i) grad[i] = 3 * w[i] * x[i] * x[i];
  EXPECT_TRUE(check_gradient(loss, x.data(), 50, grad.data()));
  std::vector<float> wrong = grad;
  wrong[13] *= 1.1f;  // a 10% error in one element
  EXPECT_FALSE(check_gradient(loss, x.data(), 50, wrong.data(), {}, "perturbed"));
  std::vector<float> scaled = grad;
  for (float& g : scaled) g *= 0.5f;  // the classic missing-factor bug
  EXPECT_FALSE(check_gradient(loss, x.data(), 50, scaled.data()));
}

TEST(Checker, NpyRoundTripThroughAFile) {
  // A minimal .npy written by hand is read back with shape and values.
  const std::string path = ::testing::TempDir() + "checker.npy";
  {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const char magic[] = "\x93NUMPY\x01\x00";
    std::fwrite(magic, 1, 8, f);
    const uint16_t len = uint16_t(header.size());
    std::fwrite(&len, 2, 1, f);
    std::fwrite(header.data(), 1, header.size(), f);
    const float v[6] = {1, 2, 3, 4, 5, 6};
    std::fwrite(v, 4, 6, f);
    std::fclose(f);
  }
  NpyArray a = load_npy(path);
  ASSERT_EQ(a.shape.size(), 2u);
  EXPECT_EQ(a.shape[0], 2);
  EXPECT_EQ(a.shape[1], 3);
  EXPECT_EQ(a.f32()[5], 6.0f);
}
