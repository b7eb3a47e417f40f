// NF4 (ops/nf4.h) without Python: the tables, the flat layout and its sharding rule, quantizing a
// tensor range by range (as ranks would), argument errors, and config.json's quantization_config.
// Bit-exactness against the bitsandbytes algorithm is Parity.Nf4* (tests/parity_nf4.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/config.h"
#include "ops/dynamic_map.h"
#include "ops/nf4.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;

TEST(Nf4, ThresholdsAreTheMidpointsOfTheCode) {
  // bitsandbytes' literals are the midpoints printed as decimals; converted to f32 directly they
  // land on the midpoint's f32 or, at four near-ties, on its neighbour.
  int neighbours = 0;
  for (size_t k = 0; k < 15; ++k) {
    const float mid = float((double(ops::kNf4Code[k]) + double(ops::kNf4Code[k + 1])) / 2);
    EXPECT_LE(std::fabs(ops::kNf4Thresholds[k] - mid), std::fabs(std::nextafter(mid, 2.0f) - mid)) << k;
    neighbours += ops::kNf4Thresholds[k] != mid;
  }
  EXPECT_EQ(neighbours, 4);
  // A few of bitsandbytes' dQuantizeNF4 literals.
  EXPECT_EQ(ops::kNf4Thresholds[7], 0.03979014977812767f);
  EXPECT_EQ(ops::kNf4Thresholds[14], 0.8614784181118011f);
  EXPECT_EQ(ops::kNf4Thresholds[0], -0.8480964004993439f);
  for (size_t i = 1; i < 256; ++i) EXPECT_LT(ops::kDynamicMapSigned[i - 1], ops::kDynamicMapSigned[i]) << i;
  EXPECT_EQ(ops::kDynamicMapSigned[255], 1.0f);
}

// The CPU's 8-bit quantizer finds codes by counting (ops::DynamicCoder), not by bitsandbytes'
// search: it must give the search's code for every float. Checked on both maps over every map
// value, every midpoint (the search's ties) and their float neighbours, denormals and a sweep of
// magnitudes from 1e-38 to 1e3 of both signs, 2^20 random values, NaN, infinities and zeros.
TEST(DynamicMap, TheCountingCoderGivesTheSearchsCode) {
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    const float* map = ops::dynamic_map(is_signed);
    const ops::DynamicCoder coder(map);
    std::vector<float> xs = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 1.0f, -1.0f, 1e-45f, -1e-45f};
    auto with_neighbours = [&](float v) {
      for (float x : {v, std::nextafter(v, 2.0f), std::nextafter(v, -2.0f)}) xs.push_back(x);
    };
    for (int k = 0; k < 256; ++k) {
      with_neighbours(map[k]);
      if (k > 0) with_neighbours((map[k - 1] + map[k]) * 0.5f);
    }
    for (float v : {1e-45f, 1e-44f, 1e-40f}) xs.insert(xs.end(), {v, -v});  // denormals
    for (float v = 1e-38f; v < 1e3f; v *= 1.01f) xs.insert(xs.end(), {v, -v});
    uint64_t state = 12345;
    for (int i = 0; i < (1 << 20); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      xs.push_back(float(int64_t(state >> 40) - (1 << 23)) / float(1 << 23) * 1.2f);  // [-1.2, 1.2)
    }
    int64_t differ = 0;
    for (float x : xs)
      if (coder(x) != ops::dynamic_code(x, map) && ++differ <= 5)
        ADD_FAILURE() << "x = " << x << ": " << coder(x) << " vs the search's " << ops::dynamic_code(x, map);
    EXPECT_EQ(differ, 0) << "of " << xs.size();
  }
}

TEST(Nf4, LayoutSectionsAndRanges) {
  const ops::Nf4Layout p = ops::Nf4Layout::of(64 * 3 + 5, false);
  EXPECT_EQ(p.blocks, 4);
  EXPECT_EQ(p.packed_bytes, 99u);
  EXPECT_EQ(p.absmax_offset, 112u);
  EXPECT_EQ(p.absmax_bytes, 16u);
  EXPECT_EQ(p.total_bytes, 128u);
  const ops::Nf4Layout::Range r = p.range(1, 4);
  EXPECT_EQ(r.elem_begin, 64);
  EXPECT_EQ(r.elem_end, 197);
  EXPECT_EQ(r.packed_begin, 32u);
  EXPECT_EQ(r.packed_end, 99u);
  EXPECT_EQ(r.absmax_begin, 116u);
  EXPECT_EQ(r.absmax_end, 128u);

  const ops::Nf4Layout d = ops::Nf4Layout::of(64 * 600 + 1, true);
  EXPECT_EQ(d.blocks, 601);
  EXPECT_EQ(d.nested_blocks, 3);
  EXPECT_EQ(d.absmax_bytes, 601u);
  EXPECT_EQ(d.nested_absmax_bytes, 12u);
  EXPECT_EQ(d.offset_bytes, 4u);
  EXPECT_EQ(d.absmax_offset % 16, 0u);
  EXPECT_EQ(d.nested_absmax_offset % 16, 0u);
  EXPECT_EQ(d.offset_offset % 16, 0u);
  const ops::Nf4Layout::Range g = d.range(256, 601);
  EXPECT_EQ(g.nested_absmax_begin, d.nested_absmax_offset + 4);
  EXPECT_EQ(g.nested_absmax_end, d.nested_absmax_offset + 12);
  expect_error([&] { (void)d.range(100, 256); }, "multiple of 256");
  expect_error([&] { (void)d.range(0, 602); }, "outside [0, 601)");
  expect_error([] { (void)ops::Nf4Layout::of(0, false); }, "positive element count");
}

// Ranks quantize their own ranges of whole blocks (256-block groups for the nested state, with the
// offset from the all-reduced absmax sum); the assembled buffer equals quantizing the whole.
TEST(Nf4, QuantizingByRangesEqualsTheWhole) {
  const int64_t n = 64 * 256 * 2 + 64 * 9 + 7;
  std::vector<float> x = randn(n, 3, "nf4");
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= float(1 + (i / 64) % 13);
  const Tensor xt = view(x, {n});
  for (bool nested : {false, true}) {
    const ops::Nf4Layout l = ops::Nf4Layout::of(n, nested);
    std::vector<uint8_t> whole(l.total_bytes, 0), parts(l.total_bytes, 0);
    ops::nf4_quantize(ops::nf4_view(whole.data(), l, {n}, DType::F32), xt);

    const int64_t step = nested ? 256 : 37;
    std::vector<float> absmax(size_t(l.blocks));
    double sum = 0;
    for (int64_t b0 = 0; b0 < l.blocks; b0 += step) {  // phase 1: each rank its blocks
      const ops::Nf4Layout::Range r = l.range(b0, std::min(l.blocks, b0 + step));
      const int64_t len = r.elem_end - r.elem_begin;
      const Tensor packed = Tensor::view(parts.data() + r.packed_begin, DType::U8, {int64_t(r.packed_end - r.packed_begin)});
      const int64_t nb = (len + 63) / 64;
      const Tensor amax = nested ? view(absmax, {l.blocks}).slice(b0, b0 + nb)
                                 : Tensor::view(parts.data() + r.absmax_begin, DType::F32, {nb});
      ops::nf4_quantize(packed, amax, xt.slice(r.elem_begin, r.elem_end));
      sum += ops::nf4_absmax_sum(amax);  // the engine would all-reduce these
    }
    if (nested) {  // phase 2: the offset is global, the double quantization per group
      float offset = ops::nf4_offset_from_sum(sum, l.blocks);
      std::memcpy(parts.data() + l.offset_offset, &offset, 4);
      const Tensor off = Tensor::view(parts.data() + l.offset_offset, DType::F32, {1});
      for (int64_t b0 = 0; b0 < l.blocks; b0 += 256) {
        const int64_t b1 = std::min(l.blocks, b0 + 256);
        const ops::Nf4Layout::Range r = l.range(b0, b1);
        ops::nf4_quantize_absmax(
            Tensor::view(parts.data() + r.absmax_begin, DType::U8, {b1 - b0}),
            Tensor::view(parts.data() + r.nested_absmax_begin, DType::F32,
                         {int64_t(r.nested_absmax_end - r.nested_absmax_begin) / 4}),
            view(absmax, {l.blocks}).slice(b0, b1), off);
      }
    }
    EXPECT_EQ(std::memcmp(whole.data(), parts.data(), l.total_bytes), 0) << "nested " << nested;

    // And dequantization is close to the input (NF4's error is at most half a code step of absmax).
    std::vector<float> back(static_cast<size_t>(n));
    ops::nf4_dequantize(view(back, {n}), ops::nf4_view(whole.data(), l, {n}, DType::F32));
    for (int64_t i = 0; i < n; i += 97) {
      float amax = 0;
      for (int64_t j = i / 64 * 64; j < std::min(n, i / 64 * 64 + 64); ++j) amax = std::max(amax, std::fabs(x[size_t(j)]));
      EXPECT_NEAR(back[size_t(i)], x[size_t(i)], 0.16f * amax) << i;  // half the widest NF4 gap (0.304)
    }
  }
}

TEST(Nf4, ArgumentErrorsNameTheArgument) {
  std::vector<float> x(130, 1.0f), absmax(3);
  std::vector<uint8_t> packed(65);
  const Tensor pt = Tensor::view(packed.data(), DType::U8, {65});
  expect_error([&] { ops::nf4_quantize(pt, view(absmax, {3}).slice(0, 2), view(x, {130})); },
               "nf4_quantize: absmax");
  std::vector<int32_t> ids(65);
  expect_error([&] { ops::nf4_quantize(Tensor::view(ids.data(), DType::I32, {65}), view(absmax, {3}), view(x, {130})); },
               "nf4_quantize: packed: expected dtype u8");
  expect_error([&] { ops::nf4_dequantize(view(x, {130}), pt.slice(0, 64), view(absmax, {3})); },
               "nf4_dequantize: packed");
}

TEST(Nf4, QuantizationConfigIsAcceptedAndReported) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 32}, {"hidden_size", 16},
                      {"intermediate_size", 24}, {"num_hidden_layers", 1}, {"num_attention_heads", 2}};
  EXPECT_FALSE(model_config_from_json(j).quantization.has_value());
  j["quantization_config"] = {{"_load_in_4bit", true},
                              {"bnb_4bit_compute_dtype", "bfloat16"},
                              {"bnb_4bit_quant_storage", "uint8"},
                              {"bnb_4bit_quant_type", "nf4"},
                              {"bnb_4bit_use_double_quant", true},
                              {"llm_int8_skip_modules", nullptr},
                              {"llm_int8_threshold", 6.0},
                              {"load_in_4bit", true},
                              {"load_in_8bit", false},
                              {"quant_method", "bitsandbytes"}};
  const ModelConfig c = model_config_from_json(j);
  ASSERT_TRUE(c.quantization.has_value());
  EXPECT_TRUE(c.quantization->is_bnb_nf4());
  EXPECT_TRUE(c.quantization->double_quant);
  EXPECT_EQ(c.quantization->describe(), "bitsandbytes 4-bit nf4, double quant, compute bfloat16, storage uint8");
  EXPECT_FALSE(to_hf_json(c).contains("quantization_config"));
  j["quantization_config"]["bnb_4bit_use_double_quant"] = "yes";
  expect_error([&] { (void)model_config_from_json(j); }, "quantization_config.bnb_4bit_use_double_quant");
  j["quantization_config"] = 3;
  expect_error([&] { (void)model_config_from_json(j); }, "quantization_config");
}
