// PEFT LoRA adapters (model/lora.h, model/peft_adapter.h): the spec and its scale, the tensor list
// against a GQA config, the merge arithmetic, writing and reading back, and every kind of bad
// adapter refused in one line naming the file and the key or tensor. (Against the PyTorch
// reference of PEFT, and through the command line: tests/scripts/peft_cli.sh.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/rng.h"
#include "io/safetensors.h"
#include "model/peft_adapter.h"
#include "testing.h"

using namespace shardlm;
using shardlm::testing::error_of;
using json = nlohmann::json;
using shardlm::testing::TempDir;
namespace fs = std::filesystem;

namespace {


// A GQA Llama: q_dim 64, kv_dim 32, hidden 64, intermediate 172, 2 layers.
ModelConfig config() {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 2;
  return c;
}

model::LoraSpec spec(std::vector<std::string> targets, int64_t r = 4, double alpha = 8) {
  model::LoraSpec s;
  s.rank = r;
  s.alpha = alpha;
  s.dropout = 0.05;
  s.target_modules = std::move(targets);
  s.base_model_name_or_path = "models/tiny";
  return s;
}

// Random A and B (and positive DoRA magnitudes) for every tensor of the adapter (kept alive by `store`).
std::map<std::string, Tensor> random_tensors(const ModelConfig& cfg, const model::LoraSpec& s,
                                             std::vector<std::vector<float>>& store) {
  std::map<std::string, Tensor> out;
  for (const model::LoraTensorInfo& t : model::lora_adapter_tensors(cfg, s)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    store.push_back(shardlm::testing::randn(n, 9, t.name, 0.5f));
    if (t.shape.size() == 1)
      for (float& x : store.back()) x = 1.0f + std::fabs(x);
    out[t.name] = Tensor::view(store.back().data(), DType::F32, t.shape.data(), int(t.shape.size()));
  }
  return out;
}

// A valid adapter in `dir` (q_proj and v_proj, rank 4) and its config as JSON, for corrupting.
json write_valid(const std::string& dir, std::vector<std::vector<float>>& store) {
  const ModelConfig cfg = config();
  const model::LoraSpec s = spec({"q_proj", "v_proj"});
  write_peft_adapter(dir, s, cfg, random_tensors(cfg, s, store));
  return json::parse(std::ifstream(dir + "/adapter_config.json"));
}

void write_json(const std::string& dir, const json& j) { std::ofstream(dir + "/adapter_config.json") << j.dump(2); }

// The error of reading `dir` for config(); checks it is one line.
std::string read_error(const std::string& dir) {
  const std::string e = error_of([&] { read_peft_adapter(dir, config()); });
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  return e;
}

}  // namespace

TEST(Lora, ScaleIsAlphaOverRankOrOverItsRootWithRsLora) {
  model::LoraSpec s = spec({"q_proj"}, 16, 32);
  EXPECT_DOUBLE_EQ(s.scale(), 2.0);
  s.use_rslora = true;
  EXPECT_DOUBLE_EQ(s.scale(), 8.0);
}

TEST(Lora, TargetsExpandAllLinearInLayerOrder) {
  EXPECT_EQ(model::expand_lora_targets({"all-linear"}),
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  EXPECT_EQ(model::expand_lora_targets({"down_proj", "q_proj", "q_proj"}), (std::vector<std::string>{"q_proj", "down_proj"}));
  const std::string e = error_of([] { model::expand_lora_targets({"q_proj", "lm_head"}); });
  EXPECT_NE(e.find("target_modules"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown target module 'lm_head'"), std::string::npos) << e;
  EXPECT_NE(error_of([] { model::expand_lora_targets({}); }).find("no target modules"), std::string::npos);
  EXPECT_NE(error_of([] { model::validate_lora_spec(spec({"q_proj"}, 0)); }).find("key 'r'"), std::string::npos);
}

TEST(Lora, TensorNamesAndShapesFollowPeft) {
  const ModelConfig cfg = config();
  const std::vector<model::LoraTensorInfo> t = model::lora_adapter_tensors(cfg, spec({"all-linear"}, 4));
  ASSERT_EQ(t.size(), 2u * 7u * 2u);
  auto shape_of = [&](const std::string& name) {
    for (const auto& x : t)
      if (x.name == name) return x.shape;
    ADD_FAILURE() << "no tensor " << name;
    return std::vector<int64_t>{};
  };
  const int64_t H = cfg.hidden_size, Q = cfg.q_dim(), KV = cfg.kv_dim(), F = cfg.intermediate_size;
  ASSERT_NE(Q, KV);
  EXPECT_EQ(t[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(t[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(shape_of("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), (std::vector<int64_t>{4, H}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"), (std::vector<int64_t>{Q, 4}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"), (std::vector<int64_t>{KV, 4}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.self_attn.o_proj.lora_A.weight"), (std::vector<int64_t>{4, Q}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight"), (std::vector<int64_t>{F, 4}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"), (std::vector<int64_t>{4, F}));
  EXPECT_EQ(shape_of("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"), (std::vector<int64_t>{H, 4}));
  const std::vector<model::LoraTarget> targets = model::lora_targets(cfg, spec({"v_proj"}));
  ASSERT_EQ(targets.size(), 2u);
  EXPECT_EQ(targets[1].weight_name, "model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(targets[1].in_features, H);
  EXPECT_EQ(targets[1].out_features, KV);
  EXPECT_EQ(model::lora_parameter_count(cfg, spec({"v_proj"})), 2 * 4 * (H + KV));
}

TEST(Lora, MergeAddsScaledProductOfBAndA) {
  const int64_t out = 5, in = 7, r = 3;
  std::vector<float> w = shardlm::testing::randn(out * in, 1, "w"), a = shardlm::testing::randn(r * in, 1, "a"),
                     b = shardlm::testing::randn(out * r, 1, "b");
  const std::vector<float> w0 = w;
  model::lora_merge_into(shardlm::testing::view(w, {out, in}), shardlm::testing::view(a, {r, in}),
                         shardlm::testing::view(b, {out, r}), 0.75);
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j) {
      double d = 0;
      for (int64_t k = 0; k < r; ++k) d += double(b[size_t(i * r + k)]) * a[size_t(k * in + j)];
      EXPECT_NEAR(w[size_t(i * in + j)], w0[size_t(i * in + j)] + 0.75 * d, 1e-5);
    }
  EXPECT_NE(error_of([&] {
              model::lora_merge_into(shardlm::testing::view(w, {out, in}), shardlm::testing::view(a, {r, in}),
                                     shardlm::testing::view(b, {r, out}), 1.0);
            }).find("do not fit the weight"),
            std::string::npos);
}

// DoRA's merge: W' = m / ||W + s B A||_row * (W + s B A), row by row; a magnitude of the wrong
// length is refused.
TEST(Lora, DoraMergeScalesEachRowOfTheLoraMergeToItsMagnitude) {
  const int64_t out = 5, in = 7, r = 3;
  std::vector<float> w = shardlm::testing::randn(out * in, 1, "w"), a = shardlm::testing::randn(r * in, 1, "a"),
                     b = shardlm::testing::randn(out * r, 1, "b"), m = shardlm::testing::randn(out, 1, "m");
  std::vector<float> lora = w;
  model::lora_merge_into(shardlm::testing::view(lora, {out, in}), shardlm::testing::view(a, {r, in}),
                         shardlm::testing::view(b, {out, r}), 0.75);
  model::lora_merge_into(shardlm::testing::view(w, {out, in}), shardlm::testing::view(a, {r, in}),
                         shardlm::testing::view(b, {out, r}), 0.75, shardlm::testing::view(m, {out}));
  for (int64_t i = 0; i < out; ++i) {
    double norm = 0;
    for (int64_t j = 0; j < in; ++j) norm += double(lora[size_t(i * in + j)]) * lora[size_t(i * in + j)];
    norm = std::sqrt(norm);
    for (int64_t j = 0; j < in; ++j)
      EXPECT_NEAR(w[size_t(i * in + j)], m[size_t(i)] / norm * lora[size_t(i * in + j)], 1e-5) << i << ", " << j;
  }
  EXPECT_NE(error_of([&] {
              model::lora_merge_into(shardlm::testing::view(w, {out, in}), shardlm::testing::view(a, {r, in}),
                                     shardlm::testing::view(b, {out, r}), 1.0, shardlm::testing::view(m, {out - 1}));
            }).find("DoRA merge: the magnitude [4] does not fit the weight [5, 7]"),
            std::string::npos);
}

// use_dora: the magnitude vectors, under PEFT's names, round-trip with the config's use_dora; a
// magnitude of the wrong shape, a missing one, or one in an adapter without use_dora is refused in
// one line naming the file and the tensor.
TEST(PeftAdapter, DoraMagnitudesRoundTripAndBadOnesAreRefused) {
  TempDir d;
  const ModelConfig cfg = config();
  model::LoraSpec s = spec({"q_proj", "down_proj"});
  s.use_dora = true;
  std::vector<std::vector<float>> store;
  const std::map<std::string, Tensor> tensors = random_tensors(cfg, s, store);
  const std::string mag = "base_model.model.model.layers.1.mlp.down_proj.lora_magnitude_vector";
  ASSERT_TRUE(tensors.count(mag));
  EXPECT_EQ(tensors.at(mag).shape_str(), "[64]");
  EXPECT_EQ(tensors.size(), 12u);  // 2 layers x 2 modules x (A, B, m)
  write_peft_adapter(d / "a", s, cfg, tensors);
  const json j = json::parse(std::ifstream(d / "a/adapter_config.json"));
  EXPECT_EQ(j["use_dora"], true);
  const PeftAdapter back = read_peft_adapter(d / "a", cfg);
  EXPECT_TRUE(back.spec.use_dora);
  for (const auto& [name, t] : tensors) {
    const Tensor& got = back.tensors.at(name).t;
    ASSERT_EQ(got.shape_str(), t.shape_str()) << name;
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(got.f32()[i], t.f32()[i]) << name << " element " << i;
  }
  EXPECT_EQ(back.m(back.targets.back()).numel(), 64);

  const std::string st = d / "a/adapter_model.safetensors";
  auto rewrite = [&](const std::string& drop, const std::string& reshape) {
    std::vector<std::pair<std::string, Tensor>> list;
    std::vector<float> longer(65, 1.0f);
    for (const auto& [name, t] : tensors) {
      if (name == drop) continue;
      list.emplace_back(name, name == reshape ? Tensor::view(longer.data(), DType::F32, {65}) : t);
    }
    io::write_safetensors(st, list);
  };
  rewrite("", mag);
  std::string e = read_error(d / "a");
  EXPECT_NE(e.find(st), std::string::npos) << e;
  EXPECT_NE(e.find(mag), std::string::npos) << e;
  EXPECT_NE(e.find("shape [65] in the file"), std::string::npos) << e;
  EXPECT_NE(e.find("needs [64] (DoRA's magnitude: [out_features])"), std::string::npos) << e;
  rewrite(mag, "");
  e = read_error(d / "a");
  EXPECT_NE(e.find(mag), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  rewrite("", "");
  json no_dora = j;
  no_dora["use_dora"] = false;
  write_json(d / "a", no_dora);
  e = read_error(d / "a");
  EXPECT_NE(e.find("lora_magnitude_vector"), std::string::npos) << e;
  EXPECT_NE(e.find("does not say use_dora: true"), std::string::npos) << e;
  // Writing checks the magnitudes too.
  std::map<std::string, Tensor> wrong = tensors;
  std::vector<float> longer(65, 1.0f);
  wrong[mag] = Tensor::view(longer.data(), DType::F32, {65});
  e = error_of([&] { write_peft_adapter(d / "b", s, cfg, wrong); });
  EXPECT_NE(e.find(mag), std::string::npos) << e;
  EXPECT_NE(e.find("shape [65] given"), std::string::npos) << e;
}

TEST(PeftAdapter, WritesPeftConfigAndTensorsAndReadsThemBack) {
  TempDir d;
  const ModelConfig cfg = config();
  model::LoraSpec s = spec({"all-linear"}, 4, 8);
  s.use_rslora = true;
  std::vector<std::vector<float>> store;
  const std::map<std::string, Tensor> tensors = random_tensors(cfg, s, store);
  for (DType dtype : {DType::F32, DType::BF16}) {
    const std::string dir = d / dtype_name(dtype);
    write_peft_adapter(dir, s, cfg, tensors, dtype);
    const json j = json::parse(std::ifstream(dir + "/adapter_config.json"));
    EXPECT_EQ(j["peft_type"], "LORA");
    EXPECT_EQ(j["task_type"], "CAUSAL_LM");
    EXPECT_EQ(j["r"], 4);
    EXPECT_EQ(j["lora_alpha"], 8);
    EXPECT_DOUBLE_EQ(j["lora_dropout"].get<double>(), 0.05);
    EXPECT_EQ(j["target_modules"],
              json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
    EXPECT_EQ(j["bias"], "none");
    EXPECT_EQ(j["use_rslora"], true);
    EXPECT_EQ(j["use_dora"], false);
    EXPECT_EQ(j["fan_in_fan_out"], false);
    EXPECT_EQ(j["inference_mode"], true);
    EXPECT_EQ(j["init_lora_weights"], true);
    EXPECT_TRUE(j["modules_to_save"].is_null());
    EXPECT_TRUE(j["layers_to_transform"].is_null());
    EXPECT_TRUE(j["revision"].is_null());
    EXPECT_EQ(j["base_model_name_or_path"], "models/tiny");
    const io::SafetensorsFile f(dir + "/adapter_model.safetensors");
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.tensors().size(), tensors.size());
    EXPECT_EQ(f.info("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight").dtype_name,
              io::safetensors_dtype_name(dtype));

    const PeftAdapter back = read_peft_adapter(dir, cfg);
    EXPECT_EQ(back.spec.rank, 4);
    EXPECT_DOUBLE_EQ(back.spec.scale(), 4.0);
    EXPECT_EQ(back.targets.size(), 14u);
    EXPECT_EQ(back.stored_dtype, dtype);
    for (const auto& [name, t] : tensors) {
      const Tensor& got = back.tensors.at(name).t;
      ASSERT_EQ(got.numel(), t.numel()) << name;
      for (int64_t i = 0; i < t.numel(); ++i) {
        const float want = dtype == DType::F32 ? t.f32()[i] : bf16_to_f32(f32_to_bf16(t.f32()[i]));
        ASSERT_EQ(got.f32()[i], want) << name << " element " << i;
      }
    }
  }
}

TEST(PeftAdapter, WriteRefusesMissingExtraOrMisshapenTensors) {
  TempDir d;
  const ModelConfig cfg = config();
  const model::LoraSpec s = spec({"q_proj"});
  std::vector<std::vector<float>> store;
  std::map<std::string, Tensor> t = random_tensors(cfg, s, store);
  const std::string b0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
  auto missing = t;
  missing.erase(b0);
  EXPECT_NE(error_of([&] { write_peft_adapter(d / "a", s, cfg, missing); }).find(b0), std::string::npos);
  auto extra = t;
  extra["base_model.model.lm_head.lora_A.weight"] = t.begin()->second;
  EXPECT_NE(error_of([&] { write_peft_adapter(d / "a", s, cfg, extra); }).find("lm_head.lora_A"), std::string::npos);
  auto wrong = t;
  wrong[b0] = t.at("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_NE(error_of([&] { write_peft_adapter(d / "a", s, cfg, wrong); }).find("needs [64, 4]"), std::string::npos);
  EXPECT_FALSE(fs::exists(d / "a/adapter_config.json"));
}

TEST(PeftAdapter, AcceptsPeftSpellingsOfTargets) {
  TempDir d;
  std::vector<std::vector<float>> store;
  json j = write_valid(d / "a", store);
  j["target_modules"] = {"self_attn.v_proj", "q_proj"};  // PEFT matches either by suffix
  write_json(d / "a", j);
  EXPECT_EQ(read_peft_adapter(d / "a", config()).targets.size(), 4u);
  j.erase("use_rslora");       // older PEFT versions
  j["task_type"] = nullptr;    // get_peft_model without a task type: the same names
  j["lora_alpha"] = 16.0;      // a float alpha
  j["some_future_key"] = 1;    // keys that do not change the math are ignored
  write_json(d / "a", j);
  EXPECT_DOUBLE_EQ(read_peft_adapter(d / "a", config()).spec.scale(), 4.0);
}

TEST(PeftAdapter, BadConfigsAreRefusedInOneLineNamingTheKey) {
  TempDir d;
  std::vector<std::vector<float>> store;
  const json valid = write_valid(d / "a", store);
  const std::string file = d / "a/adapter_config.json";
  struct Case {
    const char* key;
    json value;  // null: remove the key
    const char* says;
  };
  const Case cases[] = {
      {"peft_type", "PROMPT_TUNING", "only LoRA adapters"},
      {"peft_type", nullptr, "missing"},
      {"task_type", "SEQ_CLS", "only CAUSAL_LM"},
      {"r", nullptr, "missing"},
      {"r", 0, "positive integer"},
      {"r", "8", "positive integer"},
      {"lora_alpha", "x", "expected a number"},
      {"lora_dropout", 1.5, "must be in [0, 1)"},
      {"target_modules", nullptr, "missing"},
      {"target_modules", json({"q_proj", "lm_head"}), "unknown target module 'lm_head'"},
      {"target_modules", ".*q_proj", "regular expression is not supported"},
      {"target_modules", 3, "expected a list"},
      {"bias", "all", "only \"none\""},
      {"bias", "lora_only", "only \"none\""},
      {"use_dora", "yes", "expected true or false"},
      {"fan_in_fan_out", true, "fan_in_fan_out is for GPT-2"},
      {"modules_to_save", json({"lm_head"}), "save whole modules"},
      // json::array: json({0}) is null under clang (0 is a null pointer constant), [0] under gcc.
      {"layers_to_transform", json::array({0}), "some layers only"},
      {"rank_pattern", json({{"q_proj", 8}}), "per-module ranks"},
      {"alpha_pattern", json({{"q_proj", 8}}), "per-module alphas"},
      {"layer_replication", json({{0, 1}}), "layer replication"},
      {"lora_bias", true, "LoRA biases"},
      {"use_rslora", "yes", "expected true or false"},
  };
  for (const Case& c : cases) {
    json j = valid;
    if (c.value.is_null()) j.erase(c.key);
    else j[c.key] = c.value;
    write_json(d / "a", j);
    const std::string e = read_error(d / "a");
    EXPECT_NE(e.find(file), std::string::npos) << c.key << ": " << e;
    EXPECT_NE(e.find(fmt::format("key '{}'", c.key)), std::string::npos) << c.key << ": " << e;
    EXPECT_NE(e.find(c.says), std::string::npos) << c.key << ": " << e;
  }
  write_json(d / "a", valid);
  std::ofstream(file) << "{ not json";
  EXPECT_NE(read_error(d / "a").find("invalid JSON"), std::string::npos);
  fs::remove(file);
  EXPECT_NE(read_error(d / "a").find("adapter_config.json: missing"), std::string::npos);
}

TEST(PeftAdapter, BadTensorsAreRefusedInOneLineNamingTheTensor) {
  TempDir d;
  const ModelConfig cfg = config();
  std::vector<std::vector<float>> store;
  write_valid(d / "a", store);
  const std::string st = d / "a/adapter_model.safetensors";
  const std::string a0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
  const std::string b1 = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight";
  // The file's tensors, to rewrite with one change.
  auto rewrite = [&](const std::function<void(std::map<std::string, std::vector<float>>&, std::map<std::string, std::vector<int64_t>>&)>& edit) {
    std::map<std::string, std::vector<float>> values;
    std::map<std::string, std::vector<int64_t>> shapes;
    const model::LoraSpec s = spec({"q_proj", "v_proj"});
    for (const model::LoraTensorInfo& t : model::lora_adapter_tensors(cfg, s)) {
      values[t.name] = shardlm::testing::randn(t.shape[0] * t.shape[1], 1, t.name);
      shapes[t.name] = t.shape;
    }
    edit(values, shapes);
    std::vector<std::pair<std::string, Tensor>> list;
    for (auto& [name, v] : values)
      list.emplace_back(name, Tensor::view(v.data(), DType::F32, shapes[name].data(), int(shapes[name].size())));
    io::write_safetensors(st, list);
  };
  rewrite([&](auto& v, auto&) { v.erase(b1); });
  std::string e = read_error(d / "a");
  EXPECT_NE(e.find(st), std::string::npos) << e;
  EXPECT_NE(e.find(b1), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  rewrite([&](auto& v, auto& s) {  // rank 5 where the config says 4
    s[a0] = {5, cfg.hidden_size};
    v[a0].resize(size_t(5 * cfg.hidden_size));
  });
  e = read_error(d / "a");
  EXPECT_NE(e.find(a0), std::string::npos) << e;
  EXPECT_NE(e.find("shape [5, 64] in the file, but r = 4"), std::string::npos) << e;

  rewrite([&](auto& v, auto& s) {  // an adapter of a model with another hidden size
    s[a0] = {4, 32};
    v[a0].resize(4 * 32);
  });
  EXPECT_NE(read_error(d / "a").find("needs [4, 64]"), std::string::npos);

  const std::string mag = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector";
  rewrite([&](auto& v, auto& s) {
    v[mag] = std::vector<float>(64, 1.0f);
    s[mag] = {64};
  });
  e = read_error(d / "a");
  EXPECT_NE(e.find(mag), std::string::npos) << e;
  EXPECT_NE(e.find("DoRA magnitude vector, but adapter_config.json does not say use_dora: true"), std::string::npos) << e;

  const std::string head = "base_model.model.lm_head.lora_A.weight";
  rewrite([&](auto& v, auto& s) {
    v[head] = std::vector<float>(4 * 64, 1.0f);
    s[head] = {4, 64};
  });
  e = read_error(d / "a");
  EXPECT_NE(e.find(head), std::string::npos) << e;
  EXPECT_NE(e.find("not a LoRA tensor of the target modules"), std::string::npos) << e;

  rewrite([&](auto& v, auto&) { v[a0][7] = std::nanf(""); });
  EXPECT_NE(read_error(d / "a").find("element 7 is not finite"), std::string::npos);

  {  // an integer tensor
    std::vector<int32_t> ints(size_t(4 * cfg.hidden_size), 1);
    std::vector<std::pair<std::string, Tensor>> list;
    std::vector<std::vector<float>> keep;
    const model::LoraSpec s = spec({"q_proj", "v_proj"});
    for (const model::LoraTensorInfo& t : model::lora_adapter_tensors(cfg, s)) {
      if (t.name == a0) {
        list.emplace_back(t.name, Tensor::view(ints.data(), DType::I32, {4, cfg.hidden_size}));
        continue;
      }
      keep.push_back(std::vector<float>(size_t(t.shape[0] * t.shape[1]), 0.f));
      list.emplace_back(t.name, Tensor::view(keep.back().data(), DType::F32, {t.shape[0], t.shape[1]}));
    }
    io::write_safetensors(st, list);
    EXPECT_NE(read_error(d / "a").find("dtype I32 is not a float type"), std::string::npos);
  }

  fs::remove(st);
  std::ofstream(d / "a/adapter_model.bin") << "pickle";
  EXPECT_NE(read_error(d / "a").find("adapter_model.bin (a pickle) is not read"), std::string::npos);
  EXPECT_NE(error_of([&] { read_peft_adapter(d / "nowhere", cfg); }).find("not an adapter directory"), std::string::npos);
}
