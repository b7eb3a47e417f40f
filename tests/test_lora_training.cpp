// LoRA training in one process, beyond the golden tests (which run without dropout): dropout's
// determinism by key, its absence in evaluation, and its backward by finite differences (LoRA's,
// and DoRA's magnitudes).
#include <gtest/gtest.h>

#include "core/rng.h"
#include "data/dataset.h"
#include "model/llama.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

ModelConfig lora_config() {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 2;
  c.initializer_range = 0.1;
  return c;
}
model::FinetuneSpec lora_spec(double dropout) {
  return {.lora = model::LoraSpec{.rank = 4, .alpha = 8, .dropout = dropout, .target_modules = {"all-linear"}}};
}

data::BatchBuffers batch(int s) {
  std::vector<data::Example> rows;
  for (int r = 0; r < 2; ++r) {
    data::Example e;
    for (int t = 0; t < 16; ++t) {
      const auto x = philox4x32({uint32_t(s), uint32_t(r), uint32_t(t), 0}, {9, 1});
      e.ids.push_back(3 + int32_t(x[0] % 200));
      e.targets.push_back(3 + int32_t(x[1] % 200));
    }
    rows.push_back(e);
  }
  return data::make_batch(rows, 16, 0);
}

// Every B random, so that every A gets a gradient from the first step on.
void randomize_b(LocalEngine& eng) {
  std::map<std::string, std::vector<float>> values = gather_weights(eng.engine);
  for (auto& [name, v] : values)
    if (name.find("lora_B") != std::string::npos) v = randn(int64_t(v.size()), 3, name, 0.2f);
  set_weights(eng.engine, values);
}

double step_loss(LocalEngine& eng, model::LlamaCompute& m, const data::BatchBuffers& b, uint64_t key, double lr, int s) {
  model::Batch mb = b.batch();
  mb.dropout_key = key;
  return eng.engine.train_step(m, {mb}, ops::AdamWConfig{.lr = lr}, s, 0.0).loss;
}

}  // namespace

TEST(LoraTraining, DropoutIsDeterministicByKeyAndOffInEvaluation) {
  const ModelConfig cfg = lora_config();
  const model::FinetuneSpec ft = lora_spec(0.3), ft0 = lora_spec(0.0);
  auto run = [&](uint64_t key) {
    LocalEngine eng(cfg, {}, ft);
    shard::init_random(eng.engine, 1);
    randomize_b(eng);
    model::LlamaCompute m(cfg, DType::F32, Device::CPU, ft.lora);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) losses.push_back(step_loss(eng, m, batch(s), key + uint64_t(s), 1e-2, s + 1));
    return std::make_pair(losses, gather_weights(eng.engine));
  };
  const auto a = run(100), b = run(100), c = run(200);
  EXPECT_EQ(a.first, b.first);    // the same keys: the same masks, bit for bit
  EXPECT_EQ(a.second, b.second);
  EXPECT_NE(a.first[0], c.first[0]);  // other keys: other masks

  // Evaluation (no key) ignores dropout: the same weights give the same loss as with dropout 0.
  LocalEngine with(cfg, {}, ft), without(cfg, {}, ft0);
  shard::init_random(with.engine, 1);
  shard::init_random(without.engine, 1);
  randomize_b(with);
  randomize_b(without);
  model::LlamaCompute mw(cfg, DType::F32, Device::CPU, ft.lora), mo(cfg, DType::F32, Device::CPU, ft0.lora);
  const data::BatchBuffers b0 = batch(7);
  EXPECT_EQ(with.engine.forward_loss(mw, b0.batch()).loss_sum, without.engine.forward_loss(mo, b0.batch()).loss_sum);
  // ... while a training forward with a key does drop.
  EXPECT_NE(step_loss(with, mw, b0, 5, 0.0, 1), step_loss(without, mo, b0, 5, 0.0, 1));
}

// The loss of one training forward with a fixed mask key (dropout 0.25), as a function of each
// named adapter tensor (lr 0: the step changes nothing), against the gradients the backward computed.
static void expect_dropout_gradients_match_finite_differences(const model::FinetuneSpec& ft,
                                                              std::initializer_list<const char*> names) {
  const ModelConfig cfg = lora_config();
  LocalEngine eng(cfg, {}, ft);
  shard::init_random(eng.engine, 2);
  randomize_b(eng);
  model::LlamaCompute m(cfg, DType::F32, Device::CPU, ft.lora);
  const data::BatchBuffers b = batch(1);
  constexpr uint64_t kKey = 77;
  step_loss(eng, m, b, kKey, 0.0, 1);
  for (const char* name : names) {
    std::vector<float> w = eng.weight(name);
    const std::vector<float> g = eng.grad(name);
    auto loss = [&] {
      set_weights(eng.engine, {{name, w}});
      return step_loss(eng, m, b, kKey, 0.0, 1);
    };
    EXPECT_TRUE(check_gradient(loss, w.data(), int64_t(w.size()), g.data(),
                               {.eps = 1e-2, .atol = 1e-4, .rtol = 2e-2, .max_checks = 24}, name));
  }
}

TEST(LoraTraining, DropoutBackwardMatchesFiniteDifferences) {
  expect_dropout_gradients_match_finite_differences(
      lora_spec(0.25), {"base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight",
                        "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight",
                        "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"});
}

TEST(LoraTraining, DoraDropoutBackwardMatchesFiniteDifferences) {
  // DoRA with dropout (PEFT's: the base term on the dropped input too): the weight norm does not
  // depend on m, so these are exact checks of dm; layer 0's also check, through the input
  // gradients of layer 1's DoRA modules, their dx path (the (g - 1) dy W term and the mask).
  model::FinetuneSpec ft = lora_spec(0.25);
  ft.lora->use_dora = true;
  expect_dropout_gradients_match_finite_differences(
      ft, {"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
           "base_model.model.model.layers.0.mlp.down_proj.lora_magnitude_vector",
           "base_model.model.model.layers.1.mlp.gate_proj.lora_magnitude_vector"});
}
