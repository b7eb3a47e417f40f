// Parity of attention_forward / attention_backward, and of attention_forward_paged (the keys and
// values in blocks), with PyTorch (tests/torch_ref/ref_attention.py).
//
// The reference is float64 math on the same inputs, so the tolerances measure our f32 error:
//   f32 cases:  out, lse atol 2e-5 rtol 2e-4;  dq, dk, dv atol 1e-4 rtol 1e-3 (the backward
//               recomputes P from lse and sums over many more terms).
//   bf16 cases: inputs are bf16 in both; out is rounded to bf16 by the kernel (relative step
//               2^-8), and the backward reads that rounded out for D = rowsum(dO * O), so
//               out atol 1e-2 rtol 1e-2, lse atol 1e-4 rtol 1e-4 (computed in f32 before any
//               rounding), grads atol 2e-2 rtol 2e-2. Where the CPU has a bf16 path they run on
//               both paths; the bf16 one rounds P and dS to bf16 before their products, which
//               these tolerances cover.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "cpu_paths.h"
#include "testing.h"

using namespace shardlm;
using shardlm::testing::all_close;

namespace {

// A CPU tensor of the case's compute dtype holding a reference array: f32 arrays as they are,
// bf16 arrays as their stored bit patterns.
struct Holder {
  std::vector<float> f32;
  std::vector<uint16_t> bits;
  Tensor t;
};

void load_input(const shardlm::testing::RefCase& c, const std::string& name, bool bf16, Holder& h) {
  const shardlm::testing::NpyArray arr = c.array(name);
  std::vector<int64_t> shape = arr.shape;
  if (bf16) {
    h.bits = arr.u16();
    h.t = Tensor::view(h.bits.data(), DType::BF16, shape.data(), int(shape.size()));
  } else {
    h.f32 = arr.f32();
    h.t = Tensor::view(h.f32.data(), DType::F32, shape.data(), int(shape.size()));
  }
}

std::vector<float> bf16_bits_to_f32(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bf16_t{bits[i]});
  return out;
}

}  // namespace

TEST(Parity, Attention) {
  const auto cases = shardlm::testing::load_ref_cases("attention");
  // bf16 cases run on each CPU path this machine has (the bf16 one rounds the probabilities to
  // bf16 before their products, within the same tolerances); f32 inputs take the f32 path only.
  for (bool bf16_path : shardlm::testing::cpu_paths())
  for (const auto& c : cases) {
    const auto param = [&](const char* key) { return c.params.at(key).get<int64_t>(); };
    const int64_t B = param("B"), Tq = param("Tq"), Tk = param("Tk"), H = param("H"), Hkv = param("Hkv"),
                  Dh = param("Dh");
    const float scale = c.params.at("scale").get<float>();
    const bool bf16 = c.params.at("dtype").get<std::string>() == "bf16";
    if (bf16_path && !bf16) continue;
    const shardlm::testing::CpuPath path(bf16_path);
    const std::string label = "attention/" + c.name + (bf16_path ? " (bf16 path)" : "");

    Holder q, k, v, dout;
    load_input(c, "q", bf16, q);
    load_input(c, "k", bf16, k);
    load_input(c, "v", bf16, v);
    load_input(c, "dout", bf16, dout);
    std::vector<int32_t> seg;
    Tensor seg_t;
    if (c.has("segment_ids")) {
      seg = c.i32("segment_ids");
      seg_t = Tensor::view(seg.data(), DType::I32, {B, Tk});
    }

    // Forward.
    const size_t nq = size_t(B * Tq * H * Dh), nk = size_t(B * Tk * Hkv * Dh);
    std::vector<float> out_f32(nq), lse(size_t(B * H * Tq));
    std::vector<uint16_t> out_bits(nq);
    const Tensor out = bf16 ? Tensor::view(out_bits.data(), DType::BF16, {B, Tq, H, Dh})
                            : Tensor::view(out_f32.data(), DType::F32, {B, Tq, H, Dh});
    const Tensor lse_t = Tensor::view(lse.data(), DType::F32, {B, H, Tq});
    ops::attention_forward(out, lse_t, q.t, k.t, v.t, seg_t, scale);
    const std::vector<float> out_got = bf16 ? bf16_bits_to_f32(out_bits) : out_f32;

    const double out_atol = bf16 ? 1e-2 : 2e-5, out_rtol = bf16 ? 1e-2 : 2e-4;
    const double lse_atol = bf16 ? 1e-4 : 2e-5, lse_rtol = bf16 ? 1e-4 : 2e-4;
    const double grad_atol = bf16 ? 2e-2 : 1e-4, grad_rtol = bf16 ? 2e-2 : 1e-3;
    EXPECT_TRUE(all_close(out_got, c.f32("out"), out_atol, out_rtol, label + " out"));
    EXPECT_TRUE(all_close(lse, c.f32("lse"), lse_atol, lse_rtol, label + " lse"));

    // The same keys and values in a paged KV cache's blocks (one sequence, no segments), the last
    // block partly used, against the same reference.
    if (B == 1 && !seg_t.defined())
      for (int64_t block : {5, 16}) {
        std::vector<OwnedTensor> kb, vb;
        std::vector<Tensor> kv_k, kv_v;
        for (int64_t t0 = 0; t0 < Tk; t0 += block) {
          const int64_t n = std::min(block, Tk - t0);
          for (auto [src, owned, views] : {std::tuple{&k, &kb, &kv_k}, std::tuple{&v, &vb, &kv_v}}) {
            owned->emplace_back(src->t.dtype, std::initializer_list<int64_t>{block, Hkv, Dh}, MemCategory::Workspace);
            ops::cast(owned->back().t.slice(0, n), src->t.reshape({Tk, Hkv, Dh}).slice(t0, t0 + n));
            views->push_back(owned->back().t);
          }
        }
        std::vector<float> paged_lse(lse.size(), -1);
        std::vector<float> paged_f32(nq, -1);
        std::vector<uint16_t> paged_bits(nq);
        const Tensor paged_out = bf16 ? Tensor::view(paged_bits.data(), DType::BF16, {1, Tq, H, Dh})
                                      : Tensor::view(paged_f32.data(), DType::F32, {1, Tq, H, Dh});
        ops::attention_forward_paged(paged_out, Tensor::view(paged_lse.data(), DType::F32, {1, H, Tq}), q.t, kv_k,
                                     kv_v, Tk, scale);
        const std::string what = label + " paged, blocks of " + std::to_string(block);
        EXPECT_TRUE(all_close(bf16 ? bf16_bits_to_f32(paged_bits) : paged_f32, c.f32("out"), out_atol, out_rtol,
                              what + " out"));
        EXPECT_TRUE(all_close(paged_lse, c.f32("lse"), lse_atol, lse_rtol, what + " lse"));
      }

    // Backward, from our own forward's out and lse as in training. Fill the gradients with
    // garbage first: they are written, not accumulated.
    std::vector<float> dq(nq, 7.0f), dk(nk, 7.0f), dv(nk, 7.0f);
    ops::attention_backward(Tensor::view(dq.data(), DType::F32, {B, Tq, H, Dh}),
                            Tensor::view(dk.data(), DType::F32, {B, Tk, Hkv, Dh}),
                            Tensor::view(dv.data(), DType::F32, {B, Tk, Hkv, Dh}), dout.t, q.t, k.t, v.t, out,
                            lse_t, seg_t, scale);
    EXPECT_TRUE(all_close(dq, c.f32("dq"), grad_atol, grad_rtol, label + " dq"));
    EXPECT_TRUE(all_close(dk, c.f32("dk"), grad_atol, grad_rtol, label + " dk"));
    EXPECT_TRUE(all_close(dv, c.f32("dv"), grad_atol, grad_rtol, label + " dv"));
  }
}
