// Golden end-to-end parity of LoRA training with an independent PyTorch reference: the Llama of
// tests/torch_ref/llama_ref.py with PEFT's unmerged LoRA (peft_reference.py) attached by
// tests/torch_ref/lora_golden.py.
//
// One case per ctest (golden_lora_<case>, tests/CMakeLists.txt): `shardlm init` writes the golden
// base model, `peft_tool make-adapter` a PEFT adapter with random non-zero A and B, and
// lora_golden.py make computes in float32, with the base frozen: the logits and loss of batch 0,
// every dA / dB, and 5 AdamW steps over A and B with clipping (losses, gradient norms, final A and
// B). $SHARDLM_GOLDEN_LORA_DIR is the case's directory: ref/golden.json names the base and the
// adapter directories.
//
// shardlm runs the same model in one process: the base's ModelConfig with `lora` set to the
// adapter's spec, the engine loading the base, and the adapter's A and B put into the engine's
// master weights by PEFT name (under LoRA the engine's layouts hold only the trainable adapters;
// the frozen base lives apart).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "data/dataset.h"
#include "io/model_files.h"
#include "model/hf_dir.h"
#include "model/llama.h"
#include "model/peft_adapter.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;
namespace fs = std::filesystem;

namespace {

struct LoraCase {
  std::string name, ref_dir, base_dir, adapter_dir;
  nlohmann::json golden;
};

LoraCase lora_case() {
  const char* dir = std::getenv("SHARDLM_GOLDEN_LORA_DIR");
  SHARDLM_CHECK(dir && *dir, "SHARDLM_GOLDEN_LORA_DIR is not set (run through ctest: golden_lora_*)");
  LoraCase c;
  c.name = fs::path(dir).filename().string();
  c.ref_dir = (fs::path(dir) / "ref").string();
  const std::string g = c.ref_dir + "/golden.json";
  SHARDLM_CHECK(fs::exists(g), "{} is missing (lora_golden.py make writes it)", g);
  std::ifstream f(g);
  c.golden = nlohmann::json::parse(f);
  c.base_dir = c.golden["base_dir"];
  c.adapter_dir = c.golden["adapter_dir"];
  return c;
}

data::BatchBuffers load_batch(const LoraCase& c, int s) { return load_reference_batch(c.ref_dir, s); }

// The base model with the adapter, as `shardlm train` with a LoRA section runs it in one process.
struct Loaded {
  ModelConfig cfg;
  model::FinetuneSpec ft;
  std::vector<std::string> lora_names;  // the adapter's tensors, in its order
  std::unique_ptr<LocalEngine> run;
  std::unique_ptr<model::LlamaCompute> model;
};

// Builds the engine and puts the adapter's A and B into its master weights. Fails (without
// throwing) when the engine's trainable tensors are not exactly the adapter's.
::testing::AssertionResult load(const LoraCase& c, Loaded& l) {
  l.cfg = load_hf_config(c.base_dir);
  l.ft.lora = read_peft_config(c.adapter_dir);
  const PeftAdapter adapter = read_peft_adapter(c.adapter_dir, l.cfg);
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, t] : adapter.tensors) {
    const float* p = t.t.f32();
    values[name].assign(p, p + t.t.numel());
  }
  for (const model::LoraTensorInfo& t : model::lora_adapter_tensors(l.cfg, *l.ft.lora)) l.lora_names.push_back(t.name);
  const std::vector<std::string> want = c.golden["lora_names"];
  if (want != l.lora_names)
    return ::testing::AssertionFailure() << c.name << ": shardlm's adapter tensors (" << l.lora_names.size()
                                         << ") differ from the reference's (" << want.size() << ")";

  l.run = std::make_unique<LocalEngine>(l.cfg, shard::ShardingConfig{}, l.ft);
  shard::load_weights(l.run->engine, io::ModelWeights(c.base_dir), c.base_dir);

  // The engine must train exactly A and B of every target.
  const std::vector<std::string> names = l.run->engine.names();
  const std::set<std::string> have(names.begin(), names.end()), lora(l.lora_names.begin(), l.lora_names.end());
  std::vector<std::string> missing, extra;
  for (const std::string& n : l.lora_names)
    if (!have.count(n)) missing.push_back(n);
  for (const std::string& n : names)
    if (!lora.count(n)) extra.push_back(n);
  if (!missing.empty() || !extra.empty())
    return ::testing::AssertionFailure()
           << c.name << ": the engine's trainable tensors are not the adapter's (is LoRA training implemented?): "
           << missing.size() << " of " << l.lora_names.size() << " LoRA tensors missing"
           << (missing.empty() ? "" : " (first " + missing.front() + ")") << ", " << extra.size()
           << " other tensors trainable" << (extra.empty() ? "" : " (first " + extra.front() + ")");

  set_weights(l.run->engine, values);
  const auto got = gather_weights(l.run->engine);
  for (const auto& [name, v] : values)
    if (got.at(name) != v) return ::testing::AssertionFailure() << name << ": the engine did not keep the adapter's values";
  l.model = std::make_unique<model::LlamaCompute>(l.cfg, DType::F32, Device::CPU, l.ft.lora);
  return ::testing::AssertionSuccess();
}

ops::AdamWConfig adamw_of(const nlohmann::json& g) {
  ops::AdamWConfig o;
  o.lr = g["lr"];
  o.beta1 = g["betas"][0];
  o.beta2 = g["betas"][1];
  o.eps = g["eps"];
  o.weight_decay = g["weight_decay"];
  return o;
}

std::vector<float> logits_of(Loaded& l, const data::BatchBuffers& b) {
  std::vector<float> logits(static_cast<size_t>(b.B * b.T * l.cfg.vocab_size));
  l.run->engine.forward_logits(*l.model, b.batch(), Tensor::view(logits.data(), DType::F32, {b.B * b.T, l.cfg.vocab_size}));
  return logits;
}

}  // namespace

// Tolerances are golden_llama.cpp's: f32 on both sides, the difference is summation order.

// Logits of batch 0 at the adapter's A and B: atol 1e-4 (logits are O(1..10)).
TEST(GoldenLora, Logits) {
  const LoraCase c = lora_case();
  Loaded l;
  ASSERT_TRUE(load(c, l));
  const data::BatchBuffers b = load_batch(c, 0);
  EXPECT_TRUE(all_close(logits_of(l, b), load_npy(c.ref_dir + "/logits.npy").f32(), 1e-4, 1e-4, c.name + " logits"));
}

// The loss and every dA and dB of batch 0 (one step at lr 0). atol 2e-6 plus rtol 1e-3.
TEST(GoldenLora, LossAndEveryGradient) {
  const LoraCase c = lora_case();
  Loaded l;
  ASSERT_TRUE(load(c, l));
  const shard::StepStats r = l.run->step(*l.model, {load_batch(c, 0)}, ops::AdamWConfig{.lr = 0.0}, 1, 0.0);
  EXPECT_NEAR(r.loss, double(c.golden["loss0"]), 1e-5) << c.name;
  for (const std::string& name : l.lora_names) {
    const std::string ref = c.ref_dir + "/grads/" + name + ".npy";
    ASSERT_TRUE(fs::exists(ref)) << c.name << ": PyTorch has no gradient for " << name;
    const std::vector<float> g = l.run->grad(name);
    const std::vector<float> want = load_npy(ref).f32();
    ASSERT_EQ(g.size(), want.size()) << name;
    EXPECT_TRUE(all_close(g, want, 2e-6, 1e-3, c.name + " d" + name));
  }
  size_t ref_count = 0;
  for (const auto& e : fs::directory_iterator(c.ref_dir + "/grads")) ref_count += e.is_regular_file();
  EXPECT_EQ(l.lora_names.size(), ref_count) << c.name << ": parameter sets differ";
}

// 5 AdamW steps (weight decay on A and B, clipping over them): losses to 1e-5 and norms to 1e-4
// relative, the final A and B to 5e-4 absolute (see golden_llama.cpp), then batch 5's loss at them.
TEST(GoldenLora, FiveAdamWSteps) {
  const LoraCase c = lora_case();
  Loaded l;
  ASSERT_TRUE(load(c, l));
  const nlohmann::json& g = c.golden;
  const int64_t steps = g["steps"];
  ASSERT_EQ(steps, 5) << c.name;
  for (int64_t s = 0; s < steps; ++s) {
    const shard::StepStats r = l.run->step(*l.model, {load_batch(c, int(s))}, adamw_of(g), s + 1, g["max_grad_norm"]);
    EXPECT_NEAR(r.loss, double(g["step_losses"][size_t(s)]), 1e-5 * std::abs(double(g["step_losses"][size_t(s)])))
        << c.name << " step " << s + 1;
    EXPECT_NEAR(r.grad_norm, double(g["grad_norms"][size_t(s)]), 1e-4 * double(g["grad_norms"][size_t(s)]))
        << c.name << " grad norm, step " << s + 1;
  }
  const auto weights = gather_weights(l.run->engine);
  for (const std::string& name : l.lora_names) {
    const std::vector<float>& p = weights.at(name);
    const std::vector<float> want = load_npy(c.ref_dir + "/final/" + name + ".npy").f32();
    ASSERT_EQ(p.size(), want.size()) << name;
    EXPECT_TRUE(all_close(p, want, 5e-4, 1e-3, c.name + " final " + name));
  }
  const data::BatchBuffers last = load_batch(c, int(steps));
  const ops::CrossEntropyResult fl = l.run->engine.forward_loss(*l.model, last.batch());
  ASSERT_GT(fl.count, 0);
  EXPECT_NEAR(fl.loss_sum / double(fl.count), double(g["final_loss"]), 1e-5 * std::abs(double(g["final_loss"])))
      << c.name << " loss of batch " << steps << " at the final A and B";
}
