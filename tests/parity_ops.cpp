// Parity with PyTorch for matmul, embedding, SwiGLU, AdamW, the global gradient norm and casts.
// Reference cases come from tests/torch_ref/ref_<op>.py (see gen_refs.py).
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_paths.h"
#include "ops/cpu_bf16.h"
#include "ops/dynamic_map.h"
#include "core/q8_0.h"
#include "ops/ops.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

// Holds a reference array in its stored dtype (f32, or bf16 bits) and views it as a Tensor.
struct Input {
  std::vector<float> f;
  std::vector<uint16_t> h;
  std::vector<int32_t> i;
  Tensor t;
  Input(const RefCase& c, const std::string& name, std::initializer_list<int64_t> shape) {
    NpyArray a = c.array(name);
    if (a.descr == "<u2") {
      h = a.u16();
      t = Tensor::view(h.data(), DType::BF16, shape);
    } else if (a.descr == "<i4" || a.descr == "<i8") {
      i = a.i32();
      t = Tensor::view(i.data(), DType::I32, shape);
    } else {
      f = a.f32();
      t = Tensor::view(f.data(), DType::F32, shape);
    }
    if (t.numel() != a.numel()) throw Error(fmt::format("{}: {} has {} elements, expected {}", c.name, name, a.numel(), t.numel()));
  }
};

}  // namespace

// Tolerances: the reference is computed in f64 from the same (possibly bf16-rounded) inputs, so
// the only differences are f32 accumulation order: rtol 1e-5 scaled by sqrt(K) headroom.
// Every case on each CPU path this machine has (the f32 A of an f32 x bf16 decode case is exact on both).
TEST(Parity, Matmul) {
  for (bool bf16_path : cpu_paths()) {
    const CpuPath path(bf16_path);
    for (const RefCase& c : load_ref_cases("matmul")) {
      const int64_t m = c.params["m"], n = c.params["n"], k = c.params["k"];
      const bool ta = c.params["trans_a"], tb = c.params["trans_b"];
      Input a(c, "a", {ta ? k : m, ta ? m : k});
      Input b(c, "b", {tb ? n : k, tb ? k : n});
      std::vector<float> out = c.f32("c0");
      ops::matmul(view(out, {m, n}), a.t, b.t, ta, tb, c.params["alpha"], c.params["beta"]);
      const double atol = 1e-5 * std::sqrt(double(k)) * 4;
      EXPECT_TRUE(all_close(out, c.f32("c"), atol, 1e-5, c.name + (bf16_path ? " (bf16 path)" : " (f32 path)")));
    }
  }
}

// A q8_0 weight (`generate --dtype q8_0`; core/q8_0.h) against the reference's own quantizer and
// float64 product (tests/torch_ref/ref_matmul_q8_0.py):
//  - shardlm's quantizer gives the reference's bytes, bit for bit;
//  - a decode step (M <= 8) reads the blocks in place and is exact in f32 on either CPU path (the
//    tolerance of Parity.Matmul), and bit for bit matmul on the dequantized f32 weight;
//  - a prefill (M > 8) on the bf16 path rounds x and the dequantized weight to bf16 (each <= 2^-9
//    relative): within 2^-7 of |x| . |w|; on the f32 path exact as above.
TEST(Parity, MatmulQ8_0) {
  int cases = 0;
  for (bool bf16_path : cpu_paths()) {
    const CpuPath path(bf16_path);
    for (const RefCase& c : load_ref_cases("matmul_q8_0")) {
      const int64_t m = c.params["m"], n = c.params["n"], k = c.params["k"];
      const std::string label = c.name + (bf16_path ? " (bf16 path)" : " (f32 path)");
      const std::vector<float> w = c.f32("w");
      const std::vector<int32_t> want_q = c.i32("wq");
      std::vector<uint8_t> q(size_t(n * q8_0_bytes(k)));
      ASSERT_EQ(q.size(), want_q.size()) << label;
      quantize_q8_0(w.data(), n * k, q.data());
      for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(int(q[i]), want_q[i]) << label << " byte " << i;
      const std::vector<float> a = c.f32("a"), want = c.f32("c"), size = c.f32("cabs");
      const Tensor W = Tensor::view(q.data(), DType::U8, {n, q8_0_bytes(k)});
      std::vector<float> out = c.f32("c0");
      ops::matmul_q8_0(view(out, {m, n}), Tensor::view(const_cast<float*>(a.data()), DType::F32, {m, k}), W,
                       c.params["alpha"], c.params["beta"]);
      if (m > 8 && bf16_path) {
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], want[i], 0x1p-7 * std::fabs(double(c.params["alpha"])) * size[i] + 1e-5) << label << " [" << i << "]";
      } else {
        EXPECT_TRUE(all_close(out, want, 1e-5 * std::sqrt(double(k)) * 4, 1e-5, label));
      }
      if (m <= 8) {  // bit for bit the f32 weight's product
        std::vector<float> deq(size_t(n * k)), f32_out = c.f32("c0");
        dequantize_q8_0(q.data(), n * k, deq.data());
        ops::matmul(view(f32_out, {m, n}), Tensor::view(const_cast<float*>(a.data()), DType::F32, {m, k}),
                    view(deq, {n, k}), false, true, c.params["alpha"], c.params["beta"]);
        for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], f32_out[i]) << label << " [" << i << "]";
      }
      ++cases;
    }
  }
  EXPECT_GT(cases, 0);
}

// Shapes that are not a q8_0 weight's are errors that name them.
TEST(Parity, MatmulQ8_0RejectsWhatIsNotQ8_0) {
  std::vector<float> a(64), c(2);
  std::vector<uint8_t> q(2 * 68);
  auto call = [&](int64_t k, int64_t bytes) {
    ops::matmul_q8_0(view(c, {1, 2}), Tensor::view(a.data(), DType::F32, {1, k}),
                     Tensor::view(q.data(), DType::U8, {2, bytes}));
  };
  EXPECT_NO_THROW(call(64, 68));
  EXPECT_THROW(call(64, 64), Error);  // rows of 64 bytes: not 2 blocks
  try {
    call(48, 51);  // K not a multiple of 32
    FAIL() << "K = 48 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("matmul_q8_0"), std::string::npos) << e.what();
  }
}

TEST(Parity, MatmulIntoBf16Output) {
  // A bf16 C is computed in f32 and rounded once: it equals the f32 result rounded to bf16. (An f32
  // A beside a bf16 B is rounded on the bf16 path when C is bf16: MatmulBf16Autocast checks that.)
  for (const RefCase& c : load_ref_cases("matmul")) {
    if (c.params["beta"] != 0.0 || c.params["dtype"] == std::string("f32_bf16")) continue;
    const int64_t m = c.params["m"], n = c.params["n"], k = c.params["k"];
    const bool ta = c.params["trans_a"], tb = c.params["trans_b"];
    Input a(c, "a", {ta ? k : m, ta ? m : k});
    Input b(c, "b", {tb ? n : k, tb ? k : n});
    std::vector<float> f32_out(size_t(m * n));
    std::vector<bf16_t> h(size_t(m * n));
    ops::matmul(view(f32_out, {m, n}), a.t, b.t, ta, tb);
    ops::matmul(Tensor::view(h.data(), DType::BF16, {m, n}), a.t, b.t, ta, tb);
    for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(h[i].bits, f32_to_bf16(f32_out[i]).bits) << c.name << " [" << i << "]";
  }
}

// The CPU's bf16 path (ops/cpu_bf16.h) against torch.autocast('cpu', bfloat16) on the layouts and
// dtype mixes of a bf16 training step. Forced on (skipped on a CPU without bf16 hardware), then off.
//  - An f32 C against the f64 product of the same bf16-rounded operands: exact products, f32 sums
//    in another order (the tolerance of Parity.Matmul).
//  - A bf16 C against autocast's bf16 result: both round an f32 sum of the same products once, so
//    they differ by at most one bf16 ulp (rtol 2^-7), plus the f32 sums' difference near a tie.
//  - The f32 fallback widens instead of rounding an f32 operand: it differs from autocast by that
//    rounding, at most 2^-8 x sum_k |a_ik b_kj| per element (checked against sum |a||b|). So does
//    the bf16 path's decode shape (f32 A [M <= 8, K] times a transposed bf16 B into an f32 C: the
//    skinny kernel, exact in f32; ops/cpu/matmul.cpp).

TEST(Parity, MatmulBf16Autocast) {
  if (!ops::cpu_bf16_status().hardware) GTEST_SKIP() << shardlm::testing::no_cpu_bf16_path();
  int checked = 0;
  for (const RefCase& c : load_ref_cases("matmul_autocast")) {
    const int64_t m = c.params["m"], n = c.params["n"], k = c.params["k"];
    const bool ta = c.params["trans_a"], tb = c.params["trans_b"];
    Input a(c, "a", {ta ? k : m, ta ? m : k});
    Input b(c, "b", {tb ? n : k, tb ? k : n});
    const std::vector<float> exact = c.f32("c_exact"), autocast = c.f32("c");
    const double atol = 1e-5 * std::sqrt(double(k)) * 4;
    // An f32 C that widened the f32 operand instead of rounding it: within 2^-8 sum_k |a_ik||b_kj|
    // of the product of the rounded operands.
    auto within_rounding = [&](const std::vector<float>& f32_out, const std::string& label) {
      std::vector<float> af(size_t(m * k)), bf(size_t(k * n));  // |op(A)|, |op(B)| (widened values)
      auto widened = [](const Input& x, std::vector<float>& out) {
        for (size_t i = 0; i < out.size(); ++i)
          out[i] = std::fabs(x.h.empty() ? x.f[i] : bf16_to_f32(bf16_t{x.h[i]}));
      };
      widened(a, af);
      widened(b, bf);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double bound = 0.0;
          for (int64_t q = 0; q < k; ++q)
            bound += double(ta ? af[size_t(q * m + i)] : af[size_t(i * k + q)]) *
                     double(tb ? bf[size_t(j * k + q)] : bf[size_t(q * n + j)]);
          const size_t e = size_t(i * n + j);
          ASSERT_LE(std::fabs(double(f32_out[e]) - double(exact[e])), bound / 256 + atol)
              << c.name << " (" << label << ") [" << i << ", " << j << "]";
        }
    };
    const bool skinny = m <= 8 && !ta && tb && a.t.dtype == DType::F32;
    {
      const shardlm::testing::CpuPath on(true);
      std::vector<float> f32_out(size_t(m * n));
      ops::matmul(view(f32_out, {m, n}), a.t, b.t, ta, tb);
      if (skinny) within_rounding(f32_out, "bf16 path, decode shape, f32 C");
      else EXPECT_TRUE(all_close(f32_out, exact, atol, 1e-5, c.name + " (bf16 path, f32 C)"));
      std::vector<bf16_t> h(size_t(m * n));
      ops::matmul(Tensor::view(h.data(), DType::BF16, {m, n}), a.t, b.t, ta, tb);
      std::vector<float> hf(h.size());
      for (size_t i = 0; i < h.size(); ++i) hf[i] = bf16_to_f32(h[i]);
      EXPECT_TRUE(all_close(hf, autocast, atol, 1.0 / 128, c.name + " (bf16 path, bf16 C)"));
    }
    {
      const shardlm::testing::CpuPath off(false);
      std::vector<float> f32_out(size_t(m * n));
      ops::matmul(view(f32_out, {m, n}), a.t, b.t, ta, tb);
      within_rounding(f32_out, "f32 fallback");
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// Embedding is a copy and a sum of a few rows: exact forward, f32-rounding backward.
TEST(Parity, Embedding) {
  for (const RefCase& c : load_ref_cases("embedding")) {
    const int64_t n = c.params["n"], v = c.params["v"], d = c.params["d"];
    Input weight(c, "weight", {v, d});
    Input ids(c, "ids", {n});
    std::vector<float> out(size_t(n * d)), dweight(size_t(v * d), 0.0f);
    ops::embedding_forward(view(out, {n, d}), weight.t, ids.t);
    EXPECT_TRUE(all_close(out, c.f32("out"), 0, 0, c.name + " out"));
    std::vector<float> dout = c.f32("dout");
    ops::embedding_backward(view(dweight, {v, d}), view(dout, {n, d}), ids.t);
    EXPECT_TRUE(all_close(dweight, c.f32("dweight"), 1e-5, 1e-5, c.name + " dweight"));
  }
}

// SwiGLU: elementwise f32; exp() implementations differ by an ulp or two.
TEST(Parity, SwiGLU) {
  for (const RefCase& c : load_ref_cases("swiglu")) {
    const int64_t n = c.params["n"], f = c.params["f"];
    Input gate(c, "gate", {n, f}), up(c, "up", {n, f});
    std::vector<float> out(size_t(n * f)), dgate(size_t(n * f)), dup(size_t(n * f));
    ops::swiglu_forward(view(out, {n, f}), gate.t, up.t);
    EXPECT_TRUE(all_close(out, c.f32("out"), 1e-6, 1e-5, c.name + " out"));
    std::vector<float> dout = c.f32("dout");
    ops::swiglu_backward(view(dgate, {n, f}), view(dup, {n, f}), view(dout, {n, f}), gate.t, up.t);
    EXPECT_TRUE(all_close(dgate, c.f32("dgate"), 1e-6, 1e-5, c.name + " dgate"));
    EXPECT_TRUE(all_close(dup, c.f32("dup"), 1e-6, 1e-5, c.name + " dup"));
  }
}

// A reference case's AdamW hyperparameters.
static ops::AdamWConfig adamw_config_of(const RefCase& c) {
  return {.lr = c.params["lr"],
          .beta1 = c.params["beta1"],
          .beta2 = c.params["beta2"],
          .eps = c.params["eps"],
          .weight_decay = c.params["weight_decay"]};
}

// AdamW follows torch's operation order, so several steps agree to a few ulps.
TEST(Parity, AdamW) {
  for (const RefCase& c : load_ref_cases("adamw")) {
    const int64_t n = c.params["n"], steps = c.params["steps"];
    std::vector<float> p = c.f32("p0"), grads = c.f32("grads"), m(size_t(n), 0.0f), v(size_t(n), 0.0f);
    const ops::AdamWConfig cfg = adamw_config_of(c);
    for (int64_t s = 0; s < steps; ++s) {
      ops::adamw_step(view(p, {n}), Tensor::view(grads.data() + s * n, DType::F32, {n}), view(m, {n}),
                      view(v, {n}), cfg, s + 1, c.params["grad_scale"]);
    }
    EXPECT_TRUE(all_close(p, c.f32("p"), 1e-7, 1e-6, c.name + " param"));
    EXPECT_TRUE(all_close(m, c.f32("m"), 1e-8, 1e-6, c.name + " exp_avg"));
    EXPECT_TRUE(all_close(v, c.f32("v"), 1e-10, 1e-6, c.name + " exp_avg_sq"));
  }
}

// AdamW with bf16 moments (optimizer_state_dtype: bf16) against the torch implementation in
// ref_adamw_bf16.py: the stochastically rounded moments bit for bit, the weights to an ulp. The
// buffer is updated in two calls split at an odd element, as two ranks or two tensors' pieces
// would be: the draws follow the element's position, not the call.
TEST(Parity, AdamwBf16Moments) {
  for (const RefCase& c : load_ref_cases("adamw_bf16")) {
    const int64_t n = c.params["n"], steps = c.params["steps"], first = c.params["first"];
    const uint64_t stream = c.params["stream"];
    std::vector<float> p = c.f32("p0"), grads = c.f32("grads");
    std::vector<bf16_t> m(size_t(n), bf16_t{0}), v(size_t(n), bf16_t{0});
    const ops::AdamWConfig cfg = adamw_config_of(c);
    const int64_t split = n / 3 | 1;
    for (int64_t s = 0; s < steps; ++s)
      for (const std::pair<int64_t, int64_t>& range : {std::pair<int64_t, int64_t>{0, split}, {split, n}}) {
        const int64_t lo = range.first, hi = range.second;  // not a structured binding: the lambda captures them
        auto part = [&](void* base, DType t) { return Tensor::view(static_cast<char*>(base) + lo * dtype_size(t), t, {hi - lo}); };
        ops::adamw_step(part(p.data(), DType::F32), part(grads.data() + s * n, DType::F32), part(m.data(), DType::BF16),
                        part(v.data(), DType::BF16), cfg, s + 1, c.params["grad_scale"], {stream, first + lo});
      }
    EXPECT_TRUE(all_close(p, c.f32("p"), 1e-7, 1e-6, c.name + " param"));
    const std::vector<int32_t> want_m = c.i32("m_bits"), want_v = c.i32("v_bits");
    int64_t m_diff = 0, v_diff = 0;
    for (int64_t i = 0; i < n; ++i) {
      m_diff += m[size_t(i)].bits != uint16_t(want_m[size_t(i)]);
      v_diff += v[size_t(i)].bits != uint16_t(want_v[size_t(i)]);
    }
    EXPECT_EQ(m_diff, 0) << c.name << ": exp_avg elements whose bf16 bits differ";
    EXPECT_EQ(v_diff, 0) << c.name << ": exp_avg_sq elements whose bf16 bits differ";
  }
}

// 8-bit blockwise state (optim: adamw_8bit) against the implementation of bitsandbytes' scheme in
// ref_quant8.py: the dynamic maps, codes, absmax and dequantized values bit for bit.
TEST(Parity, Quant8Blockwise) {
  for (const RefCase& c : load_ref_cases("quant8")) {
    const int64_t n = c.params["n"];
    const bool is_signed = c.params["signed"];
    const std::vector<float> want_map = c.f32("map");
    const float* map = ops::dynamic_map(is_signed);
    EXPECT_EQ(std::vector<float>(map, map + 256), want_map) << c.name << ": the dynamic map";
    const int64_t blocks = (n + ops::kQuant8Block - 1) / ops::kQuant8Block;
    std::vector<float> x = c.f32("x"), absmax(static_cast<size_t>(blocks)), back(static_cast<size_t>(n));
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    const Tensor tc = Tensor::view(codes.data(), DType::U8, {n}), ta = view(absmax, {blocks});
    ops::quantize_blockwise8(tc, ta, view(x, {n}), is_signed);
    const std::vector<int32_t> want_codes = c.i32("codes");
    int64_t diff = 0;
    for (int64_t i = 0; i < n; ++i) diff += codes[size_t(i)] != uint8_t(want_codes[size_t(i)]);
    EXPECT_EQ(diff, 0) << c.name << ": codes that differ";
    EXPECT_EQ(absmax, c.f32("absmax")) << c.name;
    ops::dequantize_blockwise8(view(back, {n}), tc, ta, is_signed);
    EXPECT_EQ(back, c.f32("dequantized")) << c.name << ": map[code] * absmax";
  }
}

// AdamW with 8-bit blockwise moments (optim: adamw_8bit), step by step as the engine takes it
// (dequantize, the f32 AdamW step, quantize with each block's new absmax), against the torch
// implementation in ref_adamw8bit.py: codes and absmax byte for byte after every step, the
// weights to an ulp. The tensor's last block runs past it into zero padding, as in a flat buffer.
TEST(Parity, Adamw8bitMoments) {
  for (const RefCase& c : load_ref_cases("adamw8bit")) {
    const int64_t n = c.params["n"], steps = c.params["steps"], B = ops::kQuant8Block;
    const int64_t padded = (n + B - 1) / B * B;
    std::vector<float> p = c.f32("p0"), grads = c.f32("grads"), m(static_cast<size_t>(padded)), v(m),
                       ma(static_cast<size_t>(padded / B)), va(ma);
    std::vector<uint8_t> mc(static_cast<size_t>(padded)), vc(mc);  // zeroed, as the engine allocates them
    const ops::AdamWConfig cfg = adamw_config_of(c);
    auto u8 = [](std::vector<uint8_t>& x) { return Tensor::view(x.data(), DType::U8, {int64_t(x.size())}); };
    for (int64_t s = 0; s < steps; ++s) {
      ops::dequantize_blockwise8(view(m, {padded}), u8(mc), view(ma, {padded / B}), true);
      ops::dequantize_blockwise8(view(v, {padded}), u8(vc), view(va, {padded / B}), false);
      ops::adamw_step(view(p, {n}), Tensor::view(grads.data() + s * n, DType::F32, {n}), view(m, {padded}).slice(0, n),
                      view(v, {padded}).slice(0, n), cfg, s + 1, c.params["grad_scale"]);
      ops::quantize_blockwise8(u8(mc), view(ma, {padded / B}), view(m, {padded}), true);
      ops::quantize_blockwise8(u8(vc), view(va, {padded / B}), view(v, {padded}), false);
    }
    EXPECT_TRUE(all_close(p, c.f32("p"), 1e-7, 1e-6, c.name + " param"));
    const std::vector<int32_t> want_mc = c.i32("m_codes"), want_vc = c.i32("v_codes");
    int64_t diff = 0;
    for (int64_t i = 0; i < padded; ++i)
      diff += (mc[size_t(i)] != uint8_t(want_mc[size_t(i)])) + (vc[size_t(i)] != uint8_t(want_vc[size_t(i)]));
    EXPECT_EQ(diff, 0) << c.name << ": codes that differ";
    EXPECT_EQ(ma, c.f32("m_absmax")) << c.name;
    EXPECT_EQ(va, c.f32("v_absmax")) << c.name;
  }
}

// The global norm over several buffers, and the clipped gradients, as clip_grad_norm_.
TEST(Parity, GlobalNorm) {
  for (const RefCase& c : load_ref_cases("global_norm")) {
    std::vector<int64_t> sizes = c.params["sizes"].get<std::vector<int64_t>>();
    int64_t total_n = 0;
    for (int64_t s : sizes) total_n += s;
    Input grads(c, "grads", {total_n});
    double sumsq = 0.0;
    int64_t offset = 0;
    for (int64_t s : sizes) {  // one sum_squares per buffer, as the engine does per shard
      Tensor part = grads.t.reshape({total_n, 1}).slice(offset, offset + s);
      sumsq += ops::sum_squares(part);
      offset += s;
    }
    const double norm = std::sqrt(sumsq);
    const double want = c.params["total_norm"];
    EXPECT_NEAR(norm, want, 1e-5 * want) << c.name;
    const float coef = ops::clip_coefficient(norm, c.params["max_norm"]);
    std::vector<float> clipped(static_cast<size_t>(total_n));
    ops::cast(view(clipped, {total_n}), grads.t);
    ops::scale_inplace(view(clipped, {total_n}), coef);
    EXPECT_TRUE(all_close(clipped, c.f32("clipped"), 1e-7, 1e-5, c.name + " clipped"));
  }
}

// Casts must round exactly as PyTorch does: bit-identical.
TEST(Parity, Cast) {
  for (const RefCase& c : load_ref_cases("cast")) {
    std::vector<float> x = c.f32("x");
    const int64_t n = int64_t(x.size());
    std::vector<bf16_t> h(x.size());
    std::vector<f16_t> half(x.size());
    ops::cast(Tensor::view(h.data(), DType::BF16, {n}), view(x, {n}));
    ops::cast(Tensor::view(half.data(), DType::F16, {n}), view(x, {n}));
    const std::vector<uint16_t> want_bf16 = c.array("bf16").u16();
    const std::vector<int32_t> want_f16 = c.i32("f16_bits");
    int64_t bad_bf16 = 0, bad_f16 = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (h[size_t(i)].bits != want_bf16[size_t(i)] && !std::isnan(x[size_t(i)])) ++bad_bf16;
      if (half[size_t(i)].bits != uint16_t(want_f16[size_t(i)] & 0xffff) && !std::isnan(x[size_t(i)])) ++bad_f16;
    }
    EXPECT_EQ(bad_bf16, 0) << "f32 -> bf16 patterns differing from torch";
    EXPECT_EQ(bad_f16, 0) << "f32 -> f16 patterns differing from torch";
    std::vector<float> back(x.size());
    ops::cast(view(back, {n}), Tensor::view(h.data(), DType::BF16, {n}));
    EXPECT_TRUE(all_close(back, c.f32("bf16_back"), 0, 0, "bf16 -> f32"));
    ops::cast(view(back, {n}), Tensor::view(half.data(), DType::F16, {n}));
    EXPECT_TRUE(all_close(back, c.f32("f16_back"), 0, 0, "f16 -> f32"));
  }
}
