// Unit tests of src/model/config: Hugging Face config.json parsing, presets, validation
// messages and parameter counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "testing.h"
#include "core/error.h"
#include "model/config.h"

using namespace shardlm;
using shardlm::testing::error_of;
using json = nlohmann::json;

namespace {


bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// config.json files as published on the Hugging Face hub.
const char* kLlama2_7b = R"json({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})json";

const char* kLlama31_8b_instruct = R"json({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 128256
})json";

const char* kLlama32_1b = R"json({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})json";

const char* kMistral_7b = R"json({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})json";

const char* kQwen2_05b = R"json({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 131072,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})json";

ModelConfig parse(const char* text) { return model_config_from_json(json::parse(text)); }

// The tiny preset's JSON with one field replaced (or removed, for a discarded value).
json tiny_with(const std::string& key, const json& value) {
  json j = to_hf_json(preset("tiny"));
  if (value.is_discarded()) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  return j;
}
std::string error_with(const std::string& key, const json& value) {
  return error_of([&] { model_config_from_json(tiny_with(key, value)); });
}

}  // namespace

TEST(ModelConfigTest, PresetsRoundTripThroughHfJson) {
  ASSERT_FALSE(preset_names().empty());
  for (const std::string& name : preset_names()) {
    const ModelConfig c = preset(name);
    EXPECT_NO_THROW(validate_model_config(c)) << name;
    const json j = to_hf_json(c);
    EXPECT_EQ(j["hidden_act"], "silu") << name;
    EXPECT_EQ(model_config_from_json(j), c) << name;
    // Through text too, as a file on disk would go.
    EXPECT_EQ(model_config_from_json(json::parse(j.dump(2))), c) << name;
  }
}

TEST(ModelConfigTest, PublishedConfigsMatchPresets) {
  EXPECT_EQ(parse(kLlama2_7b), preset("llama2-7b"));
  EXPECT_EQ(parse(kLlama32_1b), preset("llama3.2-1b"));
  EXPECT_EQ(parse(kMistral_7b), preset("mistral-7b"));
  EXPECT_EQ(parse(kQwen2_05b), preset("qwen2-0.5b"));
  // The instruct model differs from the base preset only in its stop tokens.
  ModelConfig instruct = parse(kLlama31_8b_instruct);
  EXPECT_EQ(instruct.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  instruct.eos_token_ids = {128001};
  EXPECT_EQ(instruct, preset("llama3.1-8b"));
}

TEST(ModelConfigTest, ParsesPublishedConfigs) {
  const ModelConfig l2 = parse(kLlama2_7b);
  EXPECT_EQ(l2.architecture, Architecture::Llama);
  EXPECT_EQ(l2.num_key_value_heads, 32);
  EXPECT_EQ(l2.head_dim, 128);
  EXPECT_EQ(l2.rope_scaling.kind, ops::RopeScaling::Kind::None);
  EXPECT_DOUBLE_EQ(l2.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(l2.rms_norm_eps, 1e-5);
  EXPECT_FALSE(l2.qkv_bias || l2.o_bias || l2.tie_word_embeddings);
  EXPECT_EQ(l2.torch_dtype, "float16");
  EXPECT_EQ(l2.bos_token_id, 1);
  EXPECT_FALSE(l2.pad_token_id.has_value());

  const ModelConfig l31 = parse(kLlama31_8b_instruct);
  EXPECT_EQ(l31.rope_scaling.kind, ops::RopeScaling::Kind::Llama3);
  EXPECT_EQ(l31.rope_scaling.factor, 8.0f);
  EXPECT_EQ(l31.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(l31.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(l31.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(l31.rope_theta, 500000.0);
  EXPECT_EQ(l31.max_position_embeddings, 131072);
  EXPECT_EQ(l31.kv_dim(), 1024);

  const ModelConfig l32 = parse(kLlama32_1b);
  EXPECT_TRUE(l32.tie_word_embeddings);
  EXPECT_EQ(l32.head_dim, 64);
  EXPECT_EQ(l32.rope_scaling.factor, 32.0f);
  EXPECT_EQ(l32.eos_token_ids, (std::vector<int64_t>{128001}));

  const ModelConfig m = parse(kMistral_7b);
  EXPECT_EQ(m.architecture, Architecture::Mistral);
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_FALSE(m.qkv_bias);

  const ModelConfig q = parse(kQwen2_05b);
  EXPECT_EQ(q.architecture, Architecture::Qwen2);
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.o_bias);
  EXPECT_EQ(q.sliding_window, 0);  // use_sliding_window is false
  EXPECT_EQ(q.head_dim, 64);
  EXPECT_DOUBLE_EQ(q.rms_norm_eps, 1e-6);
}

TEST(ModelConfigTest, HfJsonIsInHuggingFaceForm) {
  const json j = to_hf_json(preset("llama3.2-1b"));
  EXPECT_EQ(j["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["eos_token_id"], 128001);
  EXPECT_TRUE(to_hf_json(preset("llama2-7b"))["rope_scaling"].is_null());
  ModelConfig instruct = preset("llama3.1-8b");
  instruct.eos_token_ids = {128001, 128009};
  EXPECT_EQ(to_hf_json(instruct)["eos_token_id"], json::array({128001, 128009}));
  EXPECT_EQ(to_hf_json(preset("qwen2-0.5b"))["use_sliding_window"], false);

  ModelConfig bad = preset("llama2-7b");
  bad.qkv_bias = true;  // Llama cannot have q/k/v biases without an o bias
  EXPECT_TRUE(contains(error_of([&] { to_hf_json(bad); }), "key 'attention_bias'"));
}

TEST(ModelConfigTest, LoadsFileOrDirectory) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "shardlm_config_test_model";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << kQwen2_05b;
  EXPECT_EQ(load_model_config(dir.string()), preset("qwen2-0.5b"));
  EXPECT_EQ(load_model_config((dir / "config.json").string()), preset("qwen2-0.5b"));

  const std::filesystem::path bad = dir / "bad.json";
  std::ofstream(bad) << tiny_with("hidden_size", "big").dump(2);
  EXPECT_EQ(error_of([&] { load_model_config(bad.string()); }),
            bad.string() + ": key 'hidden_size': expected an integer, got string \"big\"");
  const std::filesystem::path broken = dir / "broken.json";
  std::ofstream(broken) << "{\"vocab_size\": 12,\n";
  const std::string broken_msg = error_of([&] { load_model_config(broken.string()); });
  EXPECT_TRUE(contains(broken_msg, broken.string() + ": invalid JSON")) << broken_msg;
  EXPECT_TRUE(contains(error_of([&] { load_model_config((dir / "absent").string()); }), "cannot open"));
}

TEST(ModelConfigTest, ValidationErrorsNameTheKey) {
  EXPECT_EQ(error_with("hidden_size", "big"), "key 'hidden_size': expected an integer, got string \"big\"");
  EXPECT_TRUE(contains(error_with("num_hidden_layers", 2.5), "key 'num_hidden_layers': expected an integer"));
  EXPECT_TRUE(contains(error_with("rms_norm_eps", "small"), "key 'rms_norm_eps': expected a number"));
  EXPECT_TRUE(contains(error_with("tie_word_embeddings", 1), "key 'tie_word_embeddings': expected true or false"));
  EXPECT_TRUE(contains(error_with("torch_dtype", 16), "key 'torch_dtype': expected a string"));
  EXPECT_TRUE(contains(error_with("torch_dtype", "int8"), "key 'torch_dtype': unsupported dtype 'int8'"));
  EXPECT_TRUE(contains(error_with("vocab_size", 0), "key 'vocab_size': must be positive"));
  EXPECT_TRUE(contains(error_with("intermediate_size", -4), "key 'intermediate_size': must be positive"));
  EXPECT_TRUE(contains(error_with("max_position_embeddings", 0), "key 'max_position_embeddings'"));
  EXPECT_TRUE(contains(error_with("num_attention_heads", 0), "key 'num_attention_heads': must be positive"));
  EXPECT_TRUE(contains(error_with("num_key_value_heads", 3), "key 'num_key_value_heads': num_attention_heads (4)"));
  EXPECT_TRUE(contains(error_with("head_dim", 15), "key 'head_dim': must be even"));
  EXPECT_TRUE(contains(error_with("rms_norm_eps", 0), "key 'rms_norm_eps': must be positive"));
  EXPECT_TRUE(contains(error_with("rope_theta", -1), "key 'rope_theta': must be positive"));
  EXPECT_TRUE(contains(error_with("hidden_act", "gelu"), "key 'hidden_act': unsupported activation 'gelu'"));
  EXPECT_TRUE(contains(error_with("mlp_bias", true), "key 'mlp_bias'"));
  EXPECT_TRUE(contains(error_with("vocab_size", json(json::value_t::discarded)), "key 'vocab_size': missing"));
  EXPECT_TRUE(contains(error_with("eos_token_id", "eos"), "key 'eos_token_id': expected an integer or a list"));
  EXPECT_TRUE(contains(error_with("eos_token_id", json::array({2, "x"})), "key 'eos_token_id[1]'"));
  EXPECT_TRUE(contains(error_with("bos_token_id", 512), "key 'bos_token_id': token id 512 outside"));
  EXPECT_TRUE(contains(error_of([] { model_config_from_json(json::array()); }), "must be a JSON object"));

  // hidden_size must split into heads unless head_dim says otherwise.
  json j = tiny_with("hidden_size", 66);
  j.erase("head_dim");
  EXPECT_TRUE(contains(error_of([&] { model_config_from_json(j); }), "key 'hidden_size': hidden_size (66) must be "
                                                                      "divisible by num_attention_heads (4)"));
  j["head_dim"] = 16;
  EXPECT_EQ(model_config_from_json(j).q_dim(), 64);

  // Optional keys default like transformers.
  json sparse = {{"model_type", "llama"},      {"vocab_size", 100},       {"hidden_size", 32},
                 {"intermediate_size", 64},    {"num_hidden_layers", 1}, {"num_attention_heads", 4}};
  const ModelConfig d = model_config_from_json(sparse);
  EXPECT_EQ(d.architecture, Architecture::Llama);
  EXPECT_EQ(d.num_key_value_heads, 4);
  EXPECT_EQ(d.head_dim, 8);
  EXPECT_DOUBLE_EQ(d.rope_theta, 10000.0);
  EXPECT_EQ(d.torch_dtype, "float32");
  EXPECT_DOUBLE_EQ(d.initializer_range, 0.02);
  EXPECT_FALSE(d.tie_word_embeddings);
}

TEST(ModelConfigTest, UnsupportedArchitectureAndRope) {
  const std::string arch = error_with("architectures", json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(arch,
            "key 'architectures': unsupported architecture 'GPT2LMHeadModel'; supported: LlamaForCausalLM, "
            "MistralForCausalLM, Qwen2ForCausalLM");

  for (const char* type : {"linear", "dynamic", "yarn", "longrope"}) {
    const std::string msg = error_with("rope_scaling", {{"rope_type", type}, {"factor", 2.0}});
    EXPECT_TRUE(contains(msg, "key 'rope_scaling.rope_type': unsupported rope scaling '" + std::string(type) + "'"))
        << msg;
  }
  // Older configs spell it "type".
  EXPECT_TRUE(contains(error_with("rope_scaling", {{"type", "linear"}, {"factor", 2.0}}), "key 'rope_scaling.type'"));
  const ModelConfig old_style = model_config_from_json(tiny_with(
      "rope_scaling", {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 128}}));
  EXPECT_EQ(old_style.rope_scaling.kind, ops::RopeScaling::Kind::Llama3);
  EXPECT_EQ(old_style.rope_scaling.original_max_position_embeddings, 128);
  EXPECT_TRUE(contains(error_with("rope_scaling", {{"rope_type", "llama3"}, {"low_freq_factor", 1.0}}),
                       "key 'rope_scaling.factor': missing"));
  EXPECT_TRUE(contains(error_with("rope_scaling", "llama3"), "key 'rope_scaling': expected an object"));
  EXPECT_EQ(model_config_from_json(tiny_with("rope_scaling", {{"rope_type", "default"}})).rope_scaling.kind,
            ops::RopeScaling::Kind::None);

  json qwen = json::parse(kQwen2_05b);
  qwen["use_sliding_window"] = true;
  EXPECT_TRUE(contains(error_of([&] { model_config_from_json(qwen); }), "key 'use_sliding_window'"));
}

TEST(ModelConfigTest, AttentionBiasFollowsTheModelingCode) {
  const ModelConfig llama = model_config_from_json(tiny_with("attention_bias", true));
  EXPECT_TRUE(llama.qkv_bias && llama.o_bias);
  EXPECT_EQ(model_config_from_json(to_hf_json(llama)), llama);
  // 2 layers x (q + k + v + o biases) on top of the unbiased count.
  const ModelConfig plain = preset("tiny");
  EXPECT_EQ(parameter_count(llama) - parameter_count(plain),
            plain.num_hidden_layers * (plain.q_dim() + 2 * plain.kv_dim() + plain.hidden_size));
}

TEST(ModelConfigTest, ParameterCountsMatchPublishedModels) {
  EXPECT_EQ(parameter_count(preset("llama2-7b")), 6'738'415'616);
  EXPECT_EQ(parameter_count(preset("llama3-8b")), 8'030'261'248);
  EXPECT_EQ(parameter_count(preset("llama3.1-8b")), 8'030'261'248);
  EXPECT_EQ(parameter_count(preset("llama3.2-1b")), 1'235'814'400);
  EXPECT_EQ(parameter_count(preset("qwen2-0.5b")), 494'032'768);
  EXPECT_EQ(parameter_count(preset("mistral-7b")), 7'241'732'096);
  // Widely quoted sizes of the others.
  EXPECT_EQ(parameter_count(preset("llama2-13b")), 13'015'864'320);
  EXPECT_EQ(parameter_count(preset("llama2-70b")), 68'976'648'192);
  EXPECT_EQ(parameter_count(preset("llama3-70b")), 70'553'706'496);
  EXPECT_EQ(parameter_count(preset("llama3.2-3b")), 3'212'749'824);
  EXPECT_EQ(parameter_count(preset("llama3.1-70b")), 70'553'706'496);  // Meta-Llama-3.1-70B
}

TEST(ModelConfigTest, PresetNames) {
  const std::vector<std::string> names = preset_names();
  for (const char* want : {"tiny", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-8b",
                           "llama3.1-70b", "llama3.2-1b", "llama3.2-3b", "mistral-7b", "qwen2-0.5b"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  const std::string msg = error_of([] { preset("llama4"); });
  EXPECT_TRUE(contains(msg, "unknown model preset 'llama4'")) << msg;
  EXPECT_TRUE(contains(msg, "tiny, llama2-7b")) << msg;
  const ModelConfig tiny = preset("tiny");
  EXPECT_EQ(tiny.head_dim, 16);
  EXPECT_LT(parameter_count(tiny), 200'000);
}
