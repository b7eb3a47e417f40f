// Parsers with limits (issue 30): JSON nested a million deep, a number past a double's range, a
// YAML alias bomb, non-finite and out-of-range numbers, and dimensions whose sizes would not fit.
// Each is refused quickly with an error naming the key, never a crash, a hang or a bad_alloc.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "infer/requests.h"
#include "io/json_parse.h"
#include "io/yaml_config.h"
#include "model/config.h"
#include "testing.h"
#include "train/train_config.h"

using namespace shardlm;
using shardlm::testing::error_of;
using json = nlohmann::json;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string deep(size_t levels) { return std::string(levels, '[') + std::string(levels, ']'); }

std::string parse_error_of(const std::string& text) {
  try {
    io::parse_json(text);
  } catch (const json::parse_error& e) {
    return e.what();
  }
  return "";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST(JsonLimits, DeepNestingIsAParseError) {
  EXPECT_NO_THROW(io::parse_json(deep(io::kMaxJsonDepth)));
  EXPECT_TRUE(contains(parse_error_of(deep(io::kMaxJsonDepth + 1)), "nested deeper than 128 levels"));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = parse_error_of(deep(1000000));  // json::parse alone, then a copy: SIGSEGV
  EXPECT_TRUE(contains(e, "nested deeper than 128 levels")) << e;
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_TRUE(contains(parse_error_of(R"({"a": )" + std::string(200, '[')), "nested deeper"));
  EXPECT_TRUE(io::parse_json_or_discarded(deep(1000000)).is_discarded());
}

TEST(JsonLimits, NumberOutOfRangeNamesItsKey) {
  EXPECT_TRUE(contains(parse_error_of(R"({"x": {"y": 2}, "temperature": 1e400})"),
                       "number overflow parsing '1e400' (key 'temperature')"));
  std::string key;
  EXPECT_THROW(io::parse_json_noting_key(key, std::string(R"({"top_p": -1e999})")), json::parse_error);
  EXPECT_EQ(key, "top_p");
}

TEST(JsonLimits, ErrorTextIsBounded) {
  // An unterminated string: nlohmann quotes all of it as the last token read.
  const std::string e = parse_error_of(R"({"prompt": ")" + std::string(5 << 20, 'z'));
  EXPECT_LT(e.size(), 400u) << e.substr(0, 400);
  EXPECT_TRUE(contains(e, "more characters"));
  EXPECT_TRUE(contains(parse_error_of("[1, 2"), "line 1, column 6"));  // short errors keep their text
}

TEST(JsonLimits, RequestNumbersFitTheirType) {
  auto err = [](const std::string& text, const char* field, auto dflt) {
    return error_of([&] { infer::json_number(json::parse(text), field, dflt); });
  };
  EXPECT_TRUE(contains(err(R"({"temperature": 1e300})", "temperature", 1.0f), "field 'temperature' must be a finite"));
  EXPECT_TRUE(contains(err(R"({"max_tokens": 18446744073709551615})", "max_tokens", int64_t(16)),
                       "field 'max_tokens' must be an integer in"));
  EXPECT_TRUE(contains(err(R"({"seed": -1})", "seed", uint64_t(0)), "field 'seed' must be >= 0"));
  EXPECT_EQ(infer::json_number(json::parse(R"({"seed": 18})"), "seed", uint64_t(0)), 18u);
  EXPECT_EQ(infer::json_number(json{{"top_k", 5}}, "top_k", int64_t(0)), 5);
  EXPECT_FLOAT_EQ(infer::json_number(json::parse(R"({"top_p": 0.5})"), "top_p", 1.0f), 0.5f);
}

TEST(YamlLimits, AliasBombIsRefusedQuickly) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c)
    bomb += fmt::format("{}: &{} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n", c, c,
                        fmt::arg("p", char(c - 1)));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { ConfigTree::parse(bomb, "bomb.yaml"); });
  EXPECT_TRUE(contains(e, "bomb.yaml:")) << e;
  EXPECT_TRUE(contains(e, "more than 100000 values")) << e;
  EXPECT_LT(seconds_since(t0), 2.0);
  // The same on the command line, in flow style.
  std::string flow = "{a: &a [x, x, x, x, x, x, x, x, x, x]";
  for (char c = 'b'; c <= 'j'; ++c)
    flow += fmt::format(", {}: &{} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]", c, c,
                        fmt::arg("p", char(c - 1)));
  ConfigTree t;
  const std::string o = error_of([&] { t.apply_override("lol=" + flow + "}"); });
  EXPECT_TRUE(contains(o, "command line: key 'lol")) << o;
  EXPECT_TRUE(contains(o, "more than 100000 values")) << o;
  // Aliases as configs use them are fine.
  EXPECT_EQ(ConfigTree::parse("a: &a [1, 2]\nb: *a\n", "small.yaml").get<std::vector<int>>("b", {}),
            (std::vector<int>{1, 2}));
}

TEST(YamlLimits, DeepNestingIsRefusedBeforeYamlCppScansIt) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([&] { ConfigTree::parse("a: 1\nb: " + deep(1000000) + "\n", "deep.yaml"); });
  EXPECT_EQ(e, "deep.yaml:2: invalid YAML: nested deeper than 128 levels (refused)");
  EXPECT_LT(seconds_since(t0), 1.0);  // yaml-cpp alone: 9 s and 300 MB
  ConfigTree t;
  EXPECT_TRUE(contains(error_of([&] { t.apply_override("x=" + deep(200)); }), "nested deeper than 128"));
  // Brackets in quotes and comments are not nesting.
  EXPECT_NO_THROW(ConfigTree::parse("a: '" + std::string(300, '[') + "'\nb: \"" + std::string(300, '{') +
                                        "\"\n# " + std::string(300, '[') + "\nc: [[1], {d: 2}]\n",
                                    "ok.yaml"));
}

TEST(YamlLimits, NonFiniteAndOutOfRangeNumbers) {
  const ConfigTree t = ConfigTree::parse("lr: .inf\nm: -.Inf\nbig: 1e400\nf: 1e39\nok: 1e-3\nn: .nan\n", "run.yaml");
  EXPECT_TRUE(std::isinf(t.get<double>("lr", 0)));  // a value; config fields refuse it by their rule
  EXPECT_EQ(error_of([&] { t.get<double>("big", 0); }), "run.yaml:3: key 'big': number 1e400 is out of range");
  EXPECT_TRUE(contains(error_of([&] { t.get<float>("f", 0); }), "key 'f': number 1e39 is out of range"));
  EXPECT_DOUBLE_EQ(t.get<double>("f", 0), 1e39);
  EXPECT_DOUBLE_EQ(t.get<double>("ok", 0), 1e-3);
  EXPECT_TRUE(contains(error_of([&] { t.get<double>("n", 0); }), "key 'n': expected a number"));
}

TEST(TrainConfigLimits, AbsurdValuesNameTheKey) {
  auto err = [](std::vector<std::string> overrides) {
    ConfigTree t = ConfigTree::parse("model: m\noutput_dir: o\ndata: {train: builtin:addition}\n", "run.yaml");
    t.apply_overrides(overrides);
    return error_of([&] { train::read_train_config(t); });
  };
  EXPECT_EQ(err({"optimizer.lr=.inf"}), "command line: key 'optimizer.lr': expected a finite number, got inf");
  EXPECT_TRUE(contains(err({"optimizer.weight_decay=.inf"}), "key 'optimizer.weight_decay': expected a finite"));
  EXPECT_TRUE(contains(err({"save_every_minutes=.inf"}), "key 'save_every_minutes': expected a finite"));
  EXPECT_TRUE(contains(err({"optimizer.lr=1e400"}), "key 'optimizer.lr': number 1e400 is out of range"));
  EXPECT_TRUE(contains(err({"max_grad_norm=.inf"}), "key 'max_grad_norm': expected a finite number"));
  EXPECT_TRUE(contains(err({"optimizer.eps=.inf"}), "key 'optimizer.eps': expected a finite number"));
  EXPECT_TRUE(contains(err({"gradient_accumulation_steps=4611686018427387904"}),
                       "key 'gradient_accumulation_steps': must be at most 1048576"));
  EXPECT_TRUE(contains(err({"micro_batch_size=1e12"}), "key 'micro_batch_size': must be at most"));
  EXPECT_TRUE(contains(err({"seq_len=1e9"}), "key 'seq_len': must be at most"));
  EXPECT_TRUE(contains(err({"micro_batch_size=1048576", "seq_len=16777216"}),
                       "key 'micro_batch_size': micro_batch_size 1048576 x seq_len 16777216"));
  EXPECT_TRUE(contains(err({"gradient_accumulation_steps=0"}), "key 'gradient_accumulation_steps': must be positive"));
}

TEST(ModelConfigLimits, HugeDimensionsNameTheKey) {
  auto err = [](const std::string& key, const json& value) {
    json j = to_hf_json(preset("tiny"));
    j[key] = value;
    return error_of([&] { model_config_from_json(j); });
  };
  EXPECT_TRUE(contains(err("vocab_size", int64_t(1) << 62), "key 'vocab_size': must be at most 2147483647"));
  EXPECT_TRUE(contains(err("hidden_size", int64_t(1) << 40), "key 'hidden_size': must be at most"));
  EXPECT_TRUE(contains(err("intermediate_size", int64_t(1) << 30), "key 'intermediate_size': must be at most"));
  EXPECT_TRUE(contains(err("num_hidden_layers", 100000), "key 'num_hidden_layers': must be at most"));
  EXPECT_TRUE(contains(err("max_position_embeddings", int64_t(1) << 40), "key 'max_position_embeddings'"));
  // Each dimension within its bound, the whole past 2^40 parameters.
  json big = to_hf_json(preset("tiny"));
  big["vocab_size"] = 2000000000;
  big["hidden_size"] = 1 << 20;
  big["num_attention_heads"] = 8192;
  big["num_key_value_heads"] = 8192;
  big["head_dim"] = 128;
  const std::string e = error_of([&] { model_config_from_json(big); });
  EXPECT_TRUE(contains(e, "key 'vocab_size': the model would have")) << e;
  for (const std::string& name : preset_names()) EXPECT_NO_THROW(validate_model_config(preset(name))) << name;
}

TEST(ModelConfigLimits, DeepConfigJsonIsInvalidJson) {
  const std::string dir = ::testing::TempDir() + "shardlm_deep_config";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << "{\"vocab_size\": " << deep(1000000) << "}";
  const std::string e = error_of([&] { load_model_config(dir); });
  EXPECT_TRUE(contains(e, "config.json: invalid JSON")) << e;
  EXPECT_TRUE(contains(e, "nested deeper than 128 levels")) << e;
}
