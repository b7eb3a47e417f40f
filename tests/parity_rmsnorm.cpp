// RMSNorm against PyTorch (tests/torch_ref/ref_rmsnorm.py, Hugging Face LlamaRMSNorm).
//
// Tolerances: the op sums x^2 in double where torch uses f32 partial sums, so rstd may differ by
// an ulp or two (rtol 1e-6) and f32 outputs by a few ulps of their largest terms (atol and rtol
// of a few 1e-6, atol scaled by the largest reference value). A bf16 output may differ by one
// bf16 ulp (2^-7 relative, worst case) where the two f32 values straddle a rounding boundary;
// that must be rare, so at most 2% of outputs may exceed the f32 tolerance at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "testing.h"

namespace {

using namespace shardlm;
using shardlm::testing::all_close;
using Host = shardlm::testing::HostArray;


DType dtype_of_npy(const shardlm::testing::NpyArray& a) { return a.descr == "<u2" ? DType::BF16 : DType::F32; }

Host load_host(const shardlm::testing::RefCase& c, const std::string& name) {
  const auto a = c.array(name);
  return Host(dtype_of_npy(a), a.f32());
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Fraction of elements beyond atol + rtol * |want|.
double fraction_beyond(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += std::fabs(double(got[i]) - want[i]) > atol + rtol * std::fabs(want[i]);
  return got.empty() ? 0.0 : double(bad) / double(got.size());
}

}  // namespace

TEST(Parity, RMSNorm) {
  const auto cases = shardlm::testing::load_ref_cases("rmsnorm");
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t N = c.params["N"], D = c.params["D"];
    const float eps = c.params["eps"].get<float>();
    Host x = load_host(c, "x"), w = load_host(c, "w"), dy = load_host(c, "dy");
    const auto y_ref = c.array("y");
    Host y(dtype_of_npy(y_ref), std::vector<float>(size_t(N * D), 0.0f));
    std::vector<float> rstd(size_t(N), 0.0f);
    const Tensor rstd_t = Tensor::view(rstd.data(), DType::F32, {N});

    ops::rmsnorm_forward(y.view({N, D}), rstd_t, x.view({N, D}), w.view({D}), eps);
    EXPECT_TRUE(all_close(rstd, c.f32("rstd"), 0.0, 1e-6, c.name + " rstd"));
    const std::vector<float> y_want = y_ref.f32();
    const double y_atol = 2e-6 * max_abs(y_want), y_rtol = 4e-6;
    if (x.dtype == DType::F32 && y.dtype == DType::F32) {
      EXPECT_TRUE(all_close(y.values(), y_want, y_atol, y_rtol, c.name + " y"));
    } else {
      // A bf16 rounding (of h, or of y) may land one bf16 ulp apart, but only rarely.
      EXPECT_TRUE(all_close(y.values(), y_want, y_atol, 7.9e-3, c.name + " y (bf16, 1 ulp)"));
      EXPECT_LE(fraction_beyond(y.values(), y_want, y_atol, y_rtol), 0.02) << c.name << " y: too many differ";
    }

    // Backward into dx of x's dtype; dw is pre-filled to check that it accumulates.
    Host dx(x.dtype, std::vector<float>(size_t(N * D), 0.0f));
    std::vector<float> dw(static_cast<size_t>(D));
    for (int64_t j = 0; j < D; ++j) dw[size_t(j)] = 0.25f * float(j % 7) - 0.5f;
    std::vector<float> dw_want = c.f32("dw");
    for (int64_t j = 0; j < D; ++j) dw_want[size_t(j)] += dw[size_t(j)];
    ops::rmsnorm_backward(dx.view({N, D}), Tensor::view(dw.data(), DType::F32, {D}), dy.view({N, D}),
                          x.view({N, D}), w.view({D}), rstd_t);
    // dx = rstd * w * dy - x * rstd^3 * mean(w * dy * x) may cancel almost completely (with D = 1,
    // to rstd * w * dy * eps / (x^2 + eps)), so its f32 error is relative to the size of the first
    // term, not of the result: atol scales with max |rstd * w * dy|.
    const std::vector<float> dx_want = c.f32("dx"), wv = w.values(), dyv = dy.values();
    double term = max_abs(dx_want);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < D; ++j)
        term = std::max(term, std::fabs(double(rstd[size_t(n)]) * wv[size_t(j)] * dyv[size_t(n * D + j)]));
    if (dx.dtype == DType::F32) {
      EXPECT_TRUE(all_close(dx.values(), dx_want, 2e-6 * term, 1e-5, c.name + " dx"));
    } else {
      // f32 reference on the same bf16 values; the op rounds its f32 result once.
      EXPECT_TRUE(all_close(dx.values(), dx_want, 2e-6 * term, 4e-3, c.name + " dx (bf16)"));
    }
    EXPECT_TRUE(all_close(dw, dw_want, 2e-6 * max_abs(dw_want), 1e-5, c.name + " dw (accumulated)"));

    // bf16: HF's own all-bf16 autograd rounds every intermediate, so it agrees only loosely.
    if (c.has("dx_hf")) {
      const std::vector<float> dx_hf = c.f32("dx_hf");
      EXPECT_TRUE(all_close(dx.values(), dx_hf, 2e-2 * max_abs(dx_hf), 3e-2, c.name + " dx vs HF bf16 autograd"));
      const std::vector<float> dw_hf = c.f32("dw_hf");
      std::vector<float> dw_got = dw;
      for (int64_t j = 0; j < D; ++j) dw_got[size_t(j)] -= 0.25f * float(j % 7) - 0.5f;
      EXPECT_TRUE(all_close(dw_got, dw_hf, 2e-2 * max_abs(dw_hf), 3e-2, c.name + " dw vs HF bf16 autograd"));
    }
  }
}
