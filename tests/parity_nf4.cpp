// NF4 quantization (ops/nf4.h) against the independent numpy reference of bitsandbytes' algorithm
// (tests/torch_ref/nf4_reference.py, cases from ref_nf4.py), and the bitsandbytes-layout directory
// loader (model/nf4_loader.h) against directories that reference writes. Everything is compared
// bit for bit: packed bytes, absmax, nested state, and the dequantized values (f32 and bf16).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "io/safetensors.h"
#include "model/nf4_loader.h"
#include "ops/nf4.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

std::vector<uint8_t> u8_of(const RefCase& c, const std::string& name) {
  std::vector<uint8_t> out;
  for (int32_t v : c.i32(name)) out.push_back(uint8_t(v));
  return out;
}

// Bitwise equality (so -0.0 and NaN payloads count), naming the first difference.
::testing::AssertionResult same_bits(const void* got, const void* want, size_t n, size_t esize,
                                     const std::string& label) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(static_cast<const char*>(got) + i * esize, static_cast<const char*>(want) + i * esize, esize) != 0) {
      float g = 0, w = 0;
      if (esize == 4) {
        std::memcpy(&g, static_cast<const char*>(got) + i * 4, 4);
        std::memcpy(&w, static_cast<const char*>(want) + i * 4, 4);
      } else if (esize == 1) {
        g = static_cast<const uint8_t*>(got)[i];
        w = static_cast<const uint8_t*>(want)[i];
      }
      return ::testing::AssertionFailure() << label << ": element " << i << " of " << n << " differs: got " << g
                                           << ", want " << w;
    }
  }
  return ::testing::AssertionSuccess();
}
template <class T>
::testing::AssertionResult same(const std::vector<T>& got, const std::vector<T>& want, const std::string& label) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << label << ": size " << got.size() << " != " << want.size();
  return same_bits(got.data(), want.data(), got.size(), sizeof(T), label);
}

// The op's input in its case dtype: f32 values, bf16 bits, or f16 from the (exact) f32 values.
struct Input {
  std::vector<float> f;
  std::vector<uint16_t> h;
  Tensor t;
  explicit Input(const RefCase& c) {
    const std::string dt = c.params["dtype"];
    const int64_t n = c.params["n"];
    NpyArray a = c.array("x");
    if (dt == "bf16") {
      h = a.u16();
      t = Tensor::view(h.data(), DType::BF16, {n});
    } else if (dt == "f16") {
      for (float v : a.f32()) h.push_back(f32_to_f16(v).bits);
      t = Tensor::view(h.data(), DType::F16, {n});
    } else {
      f = a.f32();
      t = Tensor::view(f.data(), DType::F32, {n});
    }
  }
};

}  // namespace

TEST(Parity, Nf4Tables) {
  for (const RefCase& c : load_ref_cases("nf4")) {
    if (c.name != "dynamic_map") continue;
    const std::vector<float> map(ops::kDynamicMapSigned.begin(), ops::kDynamicMapSigned.end());
    const std::vector<float> nf4(ops::kNf4Code.begin(), ops::kNf4Code.end());
    const std::vector<float> thr(ops::kNf4Thresholds.begin(), ops::kNf4Thresholds.end());
    EXPECT_TRUE(same(map, c.f32("map"), "create_dynamic_map(signed=True)"));
    EXPECT_TRUE(same(nf4, c.f32("nf4"), "NF4 code"));
    EXPECT_TRUE(same(thr, c.f32("thresholds"), "NF4 thresholds"));
    return;
  }
  FAIL() << "no dynamic_map case";
}

TEST(Parity, Nf4QuantizeDequantize) {
  int cases = 0;
  for (const RefCase& c : load_ref_cases("nf4")) {
    if (c.name == "dynamic_map") continue;
    ++cases;
    SCOPED_TRACE(c.name);
    const int64_t n = c.params["n"];
    const int64_t blocks = (n + 63) / 64, groups = (blocks + 255) / 256;
    Input x(c);
    std::vector<uint8_t> packed(size_t((n + 1) / 2), 0xEE);
    std::vector<float> absmax(size_t(blocks), -7.0f);
    ops::nf4_quantize(Tensor::view(packed.data(), DType::U8, {int64_t(packed.size())}),
                      Tensor::view(absmax.data(), DType::F32, {blocks}), x.t);
    EXPECT_TRUE(same(packed, u8_of(c, "packed"), c.name + " packed"));
    EXPECT_TRUE(same(absmax, c.f32("absmax"), c.name + " absmax"));

    std::vector<float> out(size_t(n), 99.0f);
    ops::nf4_dequantize(view(out, {n}), Tensor::view(packed.data(), DType::U8, {int64_t(packed.size())}),
                        view(absmax, {blocks}));
    EXPECT_TRUE(same(out, c.f32("out"), c.name + " dequantized"));

    // Double quantization of the absmax values.
    const float offset = ops::nf4_offset_from_sum(ops::nf4_absmax_sum(view(absmax, {blocks})), blocks);
    std::vector<float> off{offset};
    EXPECT_TRUE(same(off, c.f32("offset"), c.name + " offset"));
    std::vector<uint8_t> q(size_t(blocks), 0xEE);
    std::vector<float> nested(size_t(groups), -7.0f);
    const Tensor qt = Tensor::view(q.data(), DType::U8, {blocks});
    ops::nf4_quantize_absmax(qt, view(nested, {groups}), view(absmax, {blocks}), view(off, {1}));
    EXPECT_TRUE(same(q, u8_of(c, "qabsmax"), c.name + " qabsmax"));
    EXPECT_TRUE(same(nested, c.f32("nested_absmax"), c.name + " nested_absmax"));
    std::vector<float> deq_absmax(static_cast<size_t>(blocks));
    ops::nf4_dequantize_absmax(view(deq_absmax, {blocks}), qt, view(nested, {groups}), view(off, {1}));
    EXPECT_TRUE(same(deq_absmax, c.f32("deq_absmax"), c.name + " dequantized absmax"));
    std::fill(out.begin(), out.end(), 99.0f);
    const Tensor pt = Tensor::view(packed.data(), DType::U8, {int64_t(packed.size())});
    ops::nf4_dequantize_nested(view(out, {n}), pt, qt, view(nested, {groups}), view(off, {1}));
    EXPECT_TRUE(same(out, c.f32("out_nested"), c.name + " dequantized (nested)"));
    std::vector<uint16_t> out_bf16(size_t(n), 0xFFFF);
    ops::nf4_dequantize_nested(Tensor::view(out_bf16.data(), DType::BF16, {n}), pt, qt, view(nested, {groups}),
                               view(off, {1}));
    EXPECT_TRUE(same(out_bf16, c.array("out_nested_bf16").u16(), c.name + " dequantized (nested, bf16)"));

    // The whole-tensor entry points over one flat buffer give the same bytes.
    for (bool dq : {false, true}) {
      const ops::Nf4Layout l = ops::Nf4Layout::of(n, dq);
      std::vector<uint8_t> flat(l.total_bytes, 0xEE);
      const ops::Nf4Tensor qq = ops::nf4_view(flat.data(), l, {n}, x.t.dtype);
      ops::nf4_quantize(qq, x.t);
      EXPECT_EQ(std::memcmp(flat.data() + l.packed_offset, packed.data(), packed.size()), 0) << c.name;
      if (dq) {
        EXPECT_EQ(std::memcmp(flat.data() + l.absmax_offset, q.data(), q.size()), 0) << c.name;
        EXPECT_EQ(std::memcmp(flat.data() + l.nested_absmax_offset, nested.data(), nested.size() * 4), 0) << c.name;
        EXPECT_EQ(std::memcmp(flat.data() + l.offset_offset, &offset, 4), 0) << c.name;
      } else {
        EXPECT_EQ(std::memcmp(flat.data() + l.absmax_offset, absmax.data(), absmax.size() * 4), 0) << c.name;
      }
      std::fill(out.begin(), out.end(), 99.0f);
      ops::nf4_dequantize(view(out, {n}), qq);
      EXPECT_TRUE(same(out, c.f32(dq ? "out_nested" : "out"), c.name + (dq ? " flat nested" : " flat plain")));
    }
  }
  EXPECT_GE(cases, 10);
}

// The loader against directories in bitsandbytes' layout written by nf4_reference.py (the ctest
// fixture nf4_bnb_dirs, into $SHARDLM_TORCH_REFS/nf4_dirs): every tensor, dequantized to f32,
// equals the reference bit for bit.
TEST(Parity, Nf4BitsandbytesDirectory) {
  const char* refs = std::getenv("SHARDLM_TORCH_REFS");
  ASSERT_NE(refs, nullptr) << "SHARDLM_TORCH_REFS is not set (run through ctest)";
  for (const char* variant : {"double_quant", "plain"}) {
    SCOPED_TRACE(variant);
    const std::string dir = std::string(refs) + "/nf4_dirs/" + variant;
    const model::Nf4ModelReader reader(dir + "/model");
    ASSERT_TRUE(reader.quantization().has_value());
    EXPECT_TRUE(reader.quantization()->is_bnb_nf4());
    EXPECT_EQ(reader.quantization()->double_quant, std::string(variant) == "double_quant");
    EXPECT_EQ(reader.quantized_names().size(), 7u);
    const io::SafetensorsFile expected(dir + "/expected.safetensors");
    const std::vector<std::string> names = reader.names();
    EXPECT_EQ(names.size(), expected.names().size());
    for (const std::string& name : expected.names()) {
      const Tensor want = expected.tensor(name);
      const OwnedTensor got = reader.dequantize_f32(name);
      ASSERT_EQ(got.t.numel(), want.numel()) << name;
      EXPECT_TRUE(same_bits(got.t.data, want.data, size_t(want.numel()), 4, name));
    }
    const std::map<std::string, OwnedTensor> all = model::load_dequantized_f32(dir + "/model");
    EXPECT_EQ(all.size(), names.size());

    // A rank's range of blocks, read alone into its part of the flat buffer, matches the whole read.
    const std::string w = "model.layers.0.mlp.down_proj.weight";
    const model::Nf4Weight whole = reader.read(w);
    EXPECT_EQ(whole.state.nested, std::string(variant) == "double_quant");
    EXPECT_EQ(whole.state.dtype, DType::BF16);
    EXPECT_TRUE(whole.state.standard_nested_map);
    const ops::Nf4Layout& l = whole.layout;
    std::vector<uint8_t> parts(l.total_bytes, 0);
    const int64_t step = l.nested ? l.blocks : 17;  // nested: one group here (88 blocks)
    for (int64_t b0 = 0; b0 < l.blocks; b0 += step)
      reader.read_blocks(w, b0, std::min(l.blocks, b0 + step), parts.data());
    EXPECT_EQ(std::memcmp(parts.data(), whole.buffer.data(), l.total_bytes), 0);
  }
}
