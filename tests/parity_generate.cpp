// Generation with bf16 weights and a bf16 KV cache (`generate --dtype bf16`) against an independent
// PyTorch reference of what bf16 storage means (tests/torch_ref/ref_generate_bf16.py: weights
// rounded to bf16 once, keys and values rounded as they are written to the cache, the rest exact):
// the logits after a prompt and after each of 4 decode steps.
//  - Where every matmul is exact in f32 (decode-sized ones take the skinny kernel on either CPU path;
//    a longer prompt's prefill on the f32 fallback, which widens the weights), within 1e-4 of the
//    largest logit: f32 sums in another order, and a cache element now and then rounded the other
//    way where its f32 and f64 values straddle a bf16 rounding boundary.
//  - A prefill on the bf16 path (oneDNN, ops/cpu_bf16.h) rounds its activations to bf16 too: within
//    2^-6 of the largest logit, as is the bf16 model against shardlm's f32 one (weights rounded to 8
//    significant bits move these logits by about 2^-8 of their scale; the reference's f32 and bf16
//    logits differ by 0.4-0.5%).
// And a sequence's bf16 logits do not depend on its batch: bit for bit the same alone and beside
// two others, so greedy tokens are the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/q8_0.h"
#include "cpu_paths.h"
#include "infer/generator.h"
#include "infer/param_store.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

ModelConfig ref_config(const RefCase& c) {
  ModelConfig cfg = preset("tiny");
  cfg.vocab_size = c.params["vocab_size"];
  cfg.hidden_size = c.params["hidden_size"];
  cfg.intermediate_size = c.params["intermediate_size"];
  cfg.num_hidden_layers = c.params["num_hidden_layers"];
  cfg.num_attention_heads = c.params["num_attention_heads"];
  cfg.num_key_value_heads = c.params["num_key_value_heads"];
  cfg.head_dim = c.params["head_dim"];
  cfg.rms_norm_eps = c.params["rms_norm_eps"];
  cfg.rope_theta = c.params["rope_theta"];
  cfg.tie_word_embeddings = false;
  return cfg;
}

// The reference's f32 weights in a store, by Hugging Face name.
void load_ref_weights(const RefCase& c, infer::ParamStore& p) {
  for (const std::string name : c.params["names"]) {
    const std::vector<float> w = c.f32(name);
    const Tensor m = p.master(name);
    ASSERT_EQ(m.numel(), int64_t(w.size())) << name;
    std::memcpy(m.data, w.data(), w.size() * sizeof(float));
  }
  p.sync_compute();
}

// Prefill of tokens[0, P) in a slot, then one decode step per further token: the logits after each,
// [tokens - P + 1, V]. `others`: sequences that share each step (prefilled first, each fed its own
// tokens at the same steps), so the sequence decodes in a batch of 1 + others.
std::vector<float> generate_logits(const ModelConfig& cfg, const model::LlamaWeights& w, DType kv,
                                   const std::vector<int32_t>& tokens, int64_t P,
                                   const std::vector<std::vector<int32_t>>& others = {}) {
  const int64_t V = cfg.vocab_size, S = int64_t(tokens.size()) - P;
  infer::Generator gen(cfg, w, int64_t(tokens.size()) + 8, int64_t(1 + others.size()), {}, {}, {.dtype = kv});
  std::vector<int> slots;
  for (const auto& o : others) {
    slots.push_back(gen.acquire());
    gen.forward(std::vector<int>{slots.back()}, std::vector<int32_t>(o.begin(), o.end() - S));
  }
  const int me = gen.acquire();
  slots.insert(slots.begin() + int64_t(slots.size() / 2), me);  // in the middle of the batch
  std::vector<float> out = gen.forward(std::vector<int>{me}, std::vector<int32_t>(tokens.begin(), tokens.begin() + P));
  for (int64_t s = 0; s < S; ++s) {
    std::vector<int32_t> step;
    size_t o = 0;
    for (int slot : slots) {
      if (slot == me) {
        step.push_back(tokens[size_t(P + s)]);
        continue;
      }
      const std::vector<int32_t>& seq = others[o++];
      step.push_back(seq[seq.size() - size_t(S - s)]);
    }
    const std::vector<float> logits = gen.forward(slots, step);
    const size_t row = size_t(std::find(slots.begin(), slots.end(), me) - slots.begin());
    out.insert(out.end(), logits.begin() + int64_t(row) * V, logits.begin() + int64_t(row + 1) * V);
  }
  return out;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

}  // namespace

TEST(Parity, GenerateBf16) {
  for (const RefCase& c : load_ref_cases("generate_bf16")) {
    const ModelConfig cfg = ref_config(c);
    const std::vector<int32_t> tokens = c.i32("tokens");
    const int64_t P = c.params["prompt_len"];
    const std::vector<float> want_bf16 = c.f32("logits_bf16"), want_f32 = c.f32("logits_f32");
    const double tight = 1e-4 * max_abs(want_f32), bf16_tol = max_abs(want_f32) / 64;

    infer::ParamStore f32(cfg, DType::F32);
    load_ref_weights(c, f32);
    infer::ParamStore bf16(cfg, DType::F32);
    load_ref_weights(c, bf16);
    bf16.keep_only_bf16();
    EXPECT_EQ(bf16.bytes() * 2, f32.bytes());
    EXPECT_EQ(bf16.compute_weights().layers[0].wq.dtype, DType::BF16);

    for (bool bf16_path : cpu_paths()) {
      const CpuPath path(bf16_path);
      const std::string label = c.name + (bf16_path ? " (bf16 path)" : " (f32 path)");
      const std::vector<float> got_f32 = generate_logits(cfg, f32.compute_weights(), DType::F32, tokens, P);
      EXPECT_TRUE(all_close(got_f32, want_f32, tight, 0, label + " f32 against PyTorch"));

      const std::vector<float> got = generate_logits(cfg, bf16.compute_weights(), DType::BF16, tokens, P);
      const bool exact_prefill = !bf16_path || P <= 8;  // else the prefill rounds activations to bf16
      EXPECT_TRUE(all_close(got, want_bf16, exact_prefill ? tight : bf16_tol, 0, label + " bf16 against PyTorch"));
      EXPECT_TRUE(all_close(got, got_f32, bf16_tol, 0, label + " bf16 against shardlm's f32"));

      // Beside two other sequences (one shorter, one longer), bit for bit.
      std::vector<int32_t> a(tokens.begin() + 1, tokens.end()), b = tokens;
      b.insert(b.begin(), tokens.begin(), tokens.begin() + 3);
      for (int32_t& t : a) t = int32_t((t + 7) % cfg.vocab_size);
      const std::vector<float> batched =
          generate_logits(cfg, bf16.compute_weights(), DType::BF16, tokens, P, {a, b});
      ASSERT_EQ(batched.size(), got.size());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(batched[i], got[i]) << label << " batched [" << i << "]";
    }
  }
}

// Greedy tokens of a prompt alone and in a batch of several (the scheduling of `generate --prompts`).
TEST(Parity, GenerateBf16GreedyTokensIndependentOfTheBatch) {
  for (const RefCase& c : load_ref_cases("generate_bf16")) {
    const ModelConfig cfg = ref_config(c);
    infer::ParamStore p(cfg, DType::F32);
    load_ref_weights(c, p);
    p.keep_only_bf16();
    const std::vector<int32_t> tokens = c.i32("tokens");
    infer::SamplingOptions greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = 12;
    const infer::Request me{tokens, greedy};
    infer::Generator alone(cfg, p.compute_weights(), 64, 1, {}, {}, {.dtype = DType::BF16});
    const std::vector<int32_t> want = alone.run({me}, {})[0].tokens;
    infer::Generator batched(cfg, p.compute_weights(), 64, 4, {}, {}, {.dtype = DType::BF16});
    std::vector<infer::Request> reqs = {{{tokens[0], tokens[1]}, greedy}, me, {{5, 6, 7, 8, 9, 10, 11}, greedy}, me};
    const std::vector<infer::Completion> got = batched.run(reqs, {});
    EXPECT_EQ(got[1].tokens, want) << c.name;
    EXPECT_EQ(got[3].tokens, want) << c.name;
    EXPECT_EQ(want.size(), 12u);
  }
}

// `generate --dtype q8_0` (ParamStore::keep_only_q8_0): the decoder's Linear weights whose rows are
// whole blocks held as q8_0 (here all but down_proj, whose 100 columns are not), the rest in bf16,
// the KV cache in bf16. Against the same model held as f32 values of exactly those weights (each
// q8_0 weight dequantized, each other one rounded to bf16) with a bf16 KV cache:
//  - on the f32 path, a prompt of at most 8 tokens and every decode step read the same values by
//    the same kernel: bit for bit;
//  - on the bf16 path, the bf16 head takes AMX tiles or oneDNN's rounding where the f32 values take
//    the f32 kernel: within 2^-6 of the largest logit, as Parity.GenerateBf16;
// and the q8_0 model stays within 2^-4 of the largest logit of the f32 reference (8-bit weights).
TEST(Parity, GenerateQ8_0) {
  int checked = 0;
  for (const RefCase& c : load_ref_cases("generate_bf16")) {
    const ModelConfig cfg = ref_config(c);
    infer::ParamStore q8(cfg, DType::F32), same(cfg, DType::F32);
    load_ref_weights(c, q8);
    load_ref_weights(c, same);
    std::vector<std::string> left;
    const int quantized = q8.keep_only_q8_0(&left);
    EXPECT_EQ(quantized, 6 * cfg.num_hidden_layers) << c.name;  // q, k, v, o, gate, up
    EXPECT_EQ(left.size(), size_t(cfg.num_hidden_layers)) << c.name;  // down_proj: 100 columns
    const model::LayerWeights& L = q8.compute_weights().layers[0];
    EXPECT_EQ(L.wq.dtype, DType::U8);
    EXPECT_EQ(L.w_down.dtype, DType::BF16);
    EXPECT_EQ(q8.compute_weights().lm_head.dtype, DType::BF16);
    for (const std::string name : c.params["names"]) {  // the same values, in f32
      const Tensor m = same.master(name);
      std::vector<float> v(size_t(m.numel()));
      const bool is_q8 = name.find(".layers.") != std::string::npos && m.ndim == 2 &&
                         m.shape[1] % kQ8_0Block == 0;
      if (is_q8) {
        std::vector<uint8_t> q(size_t(q8_0_bytes(m.numel())));
        quantize_q8_0(m.f32(), m.numel(), q.data());
        dequantize_q8_0(q.data(), m.numel(), v.data());
      } else {
        for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_f32(f32_to_bf16(m.f32()[i]));
      }
      std::memcpy(m.data, v.data(), v.size() * sizeof(float));
    }
    const std::vector<int32_t> tokens = c.i32("tokens");
    const int64_t P = c.params["prompt_len"];
    const std::vector<float> want_f32 = c.f32("logits_f32");
    const double scale = max_abs(want_f32);
    for (bool bf16_path : cpu_paths()) {
      const CpuPath path(bf16_path);
      const std::string label = c.name + (bf16_path ? " (bf16 path)" : " (f32 path)");
      const std::vector<float> got = generate_logits(cfg, q8.compute_weights(), DType::BF16, tokens, P);
      const std::vector<float> want = generate_logits(cfg, same.compute_weights(), DType::BF16, tokens, P);
      ASSERT_EQ(got.size(), want.size());
      if (!bf16_path && P <= 8) {
        for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << label << " [" << i << "]";
      } else {
        EXPECT_TRUE(all_close(got, want, bf16_path ? scale / 64 : 1e-4 * scale, 0, label + " q8_0 against its values in f32"));
      }
      EXPECT_TRUE(all_close(got, want_f32, scale / 16, 0, label + " q8_0 against PyTorch's f32"));
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}
