// RoPE against PyTorch (tests/torch_ref/ref_rope.py, Hugging Face Llama rotary embeddings).
//
// Tolerances: rope_inv_freq repeats transformers' f32 operations and must agree within 1 ulp. It
// is usually bit for bit; the exception is torch's vectorized powf (SLEEF, not correctly rounded),
// e.g. at Dh = 96, theta = 5e5, i = 19 torch's power is 1 ulp below the correctly rounded one this
// op computes. Such an ulp grows with the position (at position 8000 the angle moves ~1e-3 rad),
// so the rotation itself is compared using the reference's own inv_freq, isolating the kernel.
// Its angles are then the same f32 products as HF's; cos and sin may differ by an ulp between libm
// and SLEEF, so f32 outputs agree to ~1e-7 per unit of |x| (atol 1e-6, rtol 1e-5). bf16 outputs
// are checked against the f32 computation on the same bf16 inputs to within one bf16 rounding
// (rtol 2^-8), and against HF's all-bf16 arithmetic (which also rounds cos, sin and each product
// to bf16) only loosely.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "testing.h"

namespace {

using namespace shardlm;
using shardlm::testing::all_close;
using Host = shardlm::testing::HostArray;


Host load_host(const shardlm::testing::RefCase& c, const std::string& name) {
  const auto a = c.array(name);
  return Host(a.descr == "<u2" ? DType::BF16 : DType::F32, a.f32());
}

ops::RopeScaling scaling_of(const nlohmann::json& p) {
  ops::RopeScaling s;
  if (p["scaling"] == "llama3") {
    s.kind = ops::RopeScaling::Kind::Llama3;
    s.factor = p["factor"].get<float>();
    s.low_freq_factor = p["low_freq_factor"].get<float>();
    s.high_freq_factor = p["high_freq_factor"].get<float>();
    s.original_max_position_embeddings = p["original_max_position_embeddings"].get<int64_t>();
  }
  return s;
}

// Distance in units in the last place between two finite floats of the same sign.
int64_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}

bool same_bits(const Host& a, const Host& b) {
  // (std::equal, not memcmp: an empty vector's data() may be null, which memcmp must not get)
  auto bits = [](const auto& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0]));
  };
  return a.dtype == b.dtype && std::ranges::equal(bits(a.f), bits(b.f)) && std::ranges::equal(bits(a.h), bits(b.h));
}

}  // namespace

TEST(Parity, RoPE) {
  const auto cases = shardlm::testing::load_ref_cases("rope");
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t B = c.params["B"], T = c.params["T"], H = c.params["H"], Dh = c.params["head_dim"];
    const float theta = c.params["theta"].get<float>();

    // The frequencies, computed here and by transformers' code.
    const std::vector<float> inv_freq_got = ops::rope_inv_freq(Dh, theta, scaling_of(c.params));
    std::vector<float> inv_freq = c.f32("inv_freq");  // the rotation below uses the reference's
    // None more than 1 ulp off, and only a few that far (a systematic slip, such as the exponent
    // computed in double, moves about half of them by an ulp).
    ASSERT_EQ(inv_freq_got.size(), inv_freq.size());
    size_t inexact = 0;
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      EXPECT_LE(ulp_distance(inv_freq_got[i], inv_freq[i]), 1)
          << c.name << " inv_freq[" << i << "]: got " << inv_freq_got[i] << ", want " << inv_freq[i];
      inexact += inv_freq_got[i] != inv_freq[i];
    }
    EXPECT_LE(inexact, inv_freq.size() / 10) << c.name << ": inv_freq differs from transformers' in " << inexact
                                             << " of " << inv_freq.size() << " values";
    const Tensor freq_t = Tensor::view(inv_freq.data(), DType::F32, {Dh / 2});

    std::vector<int32_t> positions = c.i32("positions");
    const Tensor pos_t = Tensor::view(positions.data(), DType::I32, {B, T});
    Host x = load_host(c, "x"), dout = load_host(c, "dout");
    const int64_t n = B * T * H * Dh;

    Host out(x.dtype, std::vector<float>(size_t(n), 0.0f));
    ops::rope_forward(out.view({B, T, H, Dh}), x.view({B, T, H, Dh}), pos_t, freq_t);
    Host dx(x.dtype, std::vector<float>(size_t(n), 0.0f));
    ops::rope_backward(dx.view({B, T, H, Dh}), dout.view({B, T, H, Dh}), pos_t, freq_t);

    if (x.dtype == DType::F32) {
      EXPECT_TRUE(all_close(out.values(), c.f32("out"), 1e-6, 1e-5, c.name + " out"));
      EXPECT_TRUE(all_close(dx.values(), c.f32("dx"), 1e-6, 1e-5, c.name + " dx"));
    } else {
      EXPECT_TRUE(all_close(out.values(), c.f32("out_f32"), 1e-6, 3.9e-3, c.name + " out vs f32 math"));
      EXPECT_TRUE(all_close(dx.values(), c.f32("dx_f32"), 1e-6, 3.9e-3, c.name + " dx vs f32 math"));
      EXPECT_TRUE(all_close(out.values(), c.f32("out"), 2e-2, 2e-2, c.name + " out vs HF bf16"));
      EXPECT_TRUE(all_close(dx.values(), c.f32("dx"), 2e-2, 2e-2, c.name + " dx vs HF bf16"));
    }

    // In place (out == x, dx == dout) gives the same bits.
    Host inplace = x;
    ops::rope_forward(inplace.view({B, T, H, Dh}), inplace.view({B, T, H, Dh}), pos_t, freq_t);
    EXPECT_TRUE(same_bits(inplace, out)) << c.name << ": rope_forward in place differs";
    inplace = dout;
    ops::rope_backward(inplace.view({B, T, H, Dh}), inplace.view({B, T, H, Dh}), pos_t, freq_t);
    EXPECT_TRUE(same_bits(inplace, dx)) << c.name << ": rope_backward in place differs";
  }
}
