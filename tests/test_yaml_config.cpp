// Unit tests of src/io/yaml_config: typed reads, overrides, aliases, and the one-line errors
// that name file, line and key.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "testing.h"
#include "core/error.h"
#include "io/yaml_config.h"

using namespace shardlm;
using shardlm::testing::error_of;

namespace {

// Writes `text` to a file named after the running test and returns its path.
std::string write_yaml(const std::string& text, const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string path = ::testing::TempDir() + "shardlm_" + info->test_suite_name() + "_" + info->name() +
                           suffix + ".yaml";
  std::ofstream(path) << text;
  return path;
}


const char* kRun = R"yaml(# a training run
model: tiny
micro_batch_size: 8
gradient_accumulation_steps: 4
max_steps: 1e3
bf16: true
seed: 1234
optimizer:
  lr: 3e-4
  eps: 1e-5
  betas: [0.9, 0.95]
  weight_decay: 0.1
sharding_strategy: FULL_SHARD
run_name: "007"
nothing:
datasets:
  - path: a.jsonl
    weight: 2
  - path: b.jsonl
)yaml";

}  // namespace

TEST(YamlConfig, TypedGets) {
  ConfigTree cfg = ConfigTree::load(write_yaml(kRun));
  EXPECT_EQ(cfg.get<std::string>("model", ""), "tiny");
  EXPECT_EQ(cfg.get("micro_batch_size", 1), 8);
  EXPECT_EQ(cfg.get<int64_t>("gradient_accumulation_steps", 1), 4);
  EXPECT_EQ(cfg.get<int64_t>("max_steps", 0), 1000);  // an integral float is an integer
  EXPECT_EQ(cfg.get<uint64_t>("seed", 0), 1234u);
  EXPECT_TRUE(cfg.get("bf16", false));
  EXPECT_DOUBLE_EQ(cfg.get("optimizer.lr", 0.0), 3e-4);
  EXPECT_DOUBLE_EQ(cfg.require<double>("optimizer.eps"), 1e-5);
  EXPECT_FLOAT_EQ(cfg.get<float>("optimizer.weight_decay", 0.0f), 0.1f);
  EXPECT_EQ(cfg.get<std::vector<double>>("optimizer.betas", {}), (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(cfg.get("sharding_strategy", "NO_SHARD"), "FULL_SHARD");
  EXPECT_EQ(cfg.get("run_name", ""), "007");  // strings stay strings
  EXPECT_EQ(cfg.get<int>("run_name", 0), 7);  // and read as numbers when asked to
  EXPECT_EQ(cfg.file(), write_yaml(kRun));
}

TEST(YamlConfig, DefaultsAndNulls) {
  ConfigTree cfg = ConfigTree::parse(kRun, "run.yaml");
  EXPECT_EQ(cfg.get("absent", 5), 5);
  EXPECT_EQ(cfg.get("optimizer.absent", 2.5), 2.5);
  EXPECT_EQ(cfg.get_optional<int>("absent"), std::nullopt);
  EXPECT_EQ(cfg.get("nothing", 7), 7);  // `nothing:` is null: not set
  EXPECT_FALSE(cfg.has("nothing"));
  EXPECT_FALSE(cfg.has("absent"));
  EXPECT_TRUE(cfg.has("optimizer.lr"));
  EXPECT_EQ(cfg.get_optional<int64_t>("micro_batch_size"), 8);
  EXPECT_EQ(cfg.source_of("micro_batch_size"), "run.yaml:3");
  EXPECT_EQ(cfg.source_of("absent"), "default");
}

TEST(YamlConfig, RequireMissingNamesKey) {
  ConfigTree cfg = ConfigTree::parse(kRun, "run.yaml");
  EXPECT_EQ(error_of([&] { cfg.require<double>("optimizer.momentum"); }),
            "run.yaml: key 'optimizer.momentum': missing required key");
  const std::string null_msg = error_of([&] { cfg.require<std::string>("nothing"); });
  EXPECT_NE(null_msg.find("run.yaml:15: key 'nothing'"), std::string::npos) << null_msg;
}

TEST(YamlConfig, SectionsAndLists) {
  ConfigTree cfg = ConfigTree::parse(kRun, "run.yaml");
  ConfigTree opt = cfg.section("optimizer");
  EXPECT_DOUBLE_EQ(opt.require<double>("lr"), 3e-4);
  EXPECT_EQ(opt.prefix(), "optimizer");
  EXPECT_EQ(opt.keys(), (std::vector<std::string>{"lr", "eps", "betas", "weight_decay"}));
  EXPECT_TRUE(cfg.section("absent").keys().empty());
  EXPECT_EQ(cfg.section("absent").get("x", 3), 3);

  std::vector<ConfigTree> data = cfg.sections("datasets");
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[0].require<std::string>("path"), "a.jsonl");
  EXPECT_EQ(data[0].get("weight", 1.0), 2.0);
  EXPECT_EQ(data[1].get("weight", 1.0), 1.0);
  EXPECT_EQ(cfg.get<std::string>("datasets.1.path", ""), "b.jsonl");
  EXPECT_EQ(data[1].source_of("path"), "run.yaml:19");

  EXPECT_EQ(error_of([&] { cfg.section("model"); }), "run.yaml:2: key 'model': expected a map, got 'tiny'");
  EXPECT_EQ(error_of([&] { cfg.get("model.size", 1); }),
            "run.yaml:2: key 'model': expected a map containing 'size', got 'tiny'");
}

TEST(YamlConfig, Overrides) {
  ConfigTree cfg = ConfigTree::parse(kRun, "run.yaml");
  cfg.apply_overrides({"optimizer.lr=1e-3", "optimizer.betas=[0.8,0.9]", "sharding_strategy=SHARD_GRAD_OP",
                       "new.nested.key=5", "micro_batch_size = 16", "datasets.1.path=c.jsonl", "nothing.x=1"});
  EXPECT_DOUBLE_EQ(cfg.get("optimizer.lr", 0.0), 1e-3);
  EXPECT_EQ(cfg.get<std::vector<float>>("optimizer.betas", {}), (std::vector<float>{0.8f, 0.9f}));
  EXPECT_EQ(cfg.get("sharding_strategy", ""), "SHARD_GRAD_OP");
  EXPECT_EQ(cfg.get("new.nested.key", 0), 5);
  EXPECT_EQ(cfg.get("micro_batch_size", 0), 16);
  EXPECT_EQ(cfg.get("datasets.1.path", ""), "c.jsonl");
  EXPECT_EQ(cfg.get("nothing.x", 0), 1);
  EXPECT_EQ(cfg.source_of("optimizer.lr"), "command line");
  EXPECT_EQ(cfg.source_of("optimizer.eps"), "run.yaml:10");
  // The file's order of keys is kept: overriding does not move a key.
  EXPECT_EQ(cfg.keys("optimizer"), (std::vector<std::string>{"lr", "eps", "betas", "weight_decay"}));

  cfg.apply_override("optimizer={lr: 2e-3}");  // a whole map
  EXPECT_DOUBLE_EQ(cfg.get("optimizer.lr", 0.0), 2e-3);
  EXPECT_FALSE(cfg.has("optimizer.eps"));
}

TEST(YamlConfig, OverrideErrors) {
  ConfigTree cfg = ConfigTree::parse(kRun, "run.yaml");
  EXPECT_EQ(error_of([&] { cfg.apply_override("lr3e-4"); }),
            "command line: malformed override 'lr3e-4': expected key=value");
  EXPECT_NE(error_of([&] { cfg.apply_override("=5"); }).find("'=5'"), std::string::npos);
  EXPECT_NE(error_of([&] { cfg.apply_override("a..b=5"); }).find("a..b"), std::string::npos);
  const std::string bad_yaml = error_of([&] { cfg.apply_override("optimizer.betas=[0.9,"); });
  EXPECT_NE(bad_yaml.find("command line: key 'optimizer.betas': invalid value"), std::string::npos) << bad_yaml;
  EXPECT_NE(error_of([&] { cfg.apply_override("model.size=7"); }).find("key 'model'"), std::string::npos);

  cfg.apply_override("optimizer.lr=fast");
  EXPECT_EQ(error_of([&] { cfg.get("optimizer.lr", 0.0); }),
            "command line: key 'optimizer.lr': expected a number, got 'fast'");
}

TEST(YamlConfig, TypeErrorsNameFileLineKey) {
  const std::string path = write_yaml(
      "micro_batch_size: \"eight\"\n"
      "steps: 2.5\n"
      "flag: yes\n"
      "lr: [1, 2]\n"
      "betas: [0.9,\n"
      "        high]\n"
      "seed: -1\n"
      "small: 3000000000\n"
      "name: {a: 1}\n");
  ConfigTree cfg = ConfigTree::load(path);
  EXPECT_EQ(error_of([&] { cfg.get("micro_batch_size", 1); }),
            path + ":1: key 'micro_batch_size': expected an integer, got 'eight'");
  EXPECT_EQ(error_of([&] { cfg.get<int64_t>("steps", 1); }), path + ":2: key 'steps': expected an integer, got '2.5'");
  EXPECT_EQ(error_of([&] { cfg.get("flag", false); }), path + ":3: key 'flag': expected true or false, got 'yes'");
  EXPECT_EQ(error_of([&] { cfg.get("lr", 0.0); }), path + ":4: key 'lr': expected a number, got a list");
  EXPECT_EQ(error_of([&] { cfg.get<std::vector<double>>("betas", {}); }),
            path + ":6: key 'betas[1]': expected a number, got 'high'");
  EXPECT_EQ(error_of([&] { cfg.get<std::vector<double>>("steps", {}); }),
            path + ":2: key 'steps': expected a list, got '2.5'");
  EXPECT_EQ(error_of([&] { cfg.get<uint64_t>("seed", 0); }).substr(0, path.size() + 14), path + ":7: key 'seed'");
  EXPECT_NE(error_of([&] { cfg.get<int>("small", 0); }).find("out of range"), std::string::npos);
  EXPECT_EQ(cfg.get<int64_t>("small", 0), 3000000000);
  EXPECT_EQ(error_of([&] { cfg.get<std::string>("name", ""); }), path + ":9: key 'name': expected a string, got a map");
}

TEST(YamlConfig, RejectsUnknownKeysWithSuggestion) {
  const std::string path = write_yaml(
      "micro_batch_size: 8\n"
      "optimizer:\n"
      "  lr: 1e-3\n"
      "  lrr: 2e-3\n"
      "gradient_accumulation_step: 4\n"
      "weight_decay: 0.1\n"
      "totally_unrelated: 1\n");
  ConfigTree cfg = ConfigTree::load(path);
  cfg.get("micro_batch_size", 1);
  cfg.get("gradient_accumulation_steps", 1);
  cfg.get("optimizer.lr", 0.0);
  cfg.get("optimizer.weight_decay", 0.0);
  // The first unread key in file order, with its full dotted name.
  EXPECT_EQ(error_of([&] { cfg.reject_unknown_keys(); }),
            path + ":4: key 'optimizer.lrr': unknown key; did you mean 'optimizer.lr'?");
  cfg.get("optimizer.lrr", 0.0);
  EXPECT_EQ(error_of([&] { cfg.reject_unknown_keys(); }),
            path + ":5: key 'gradient_accumulation_step': unknown key; did you mean 'gradient_accumulation_steps'?");
  cfg.get("gradient_accumulation_step", 0);
  // The right name at the wrong level.
  EXPECT_EQ(error_of([&] { cfg.reject_unknown_keys(); }),
            path + ":6: key 'weight_decay': unknown key; did you mean 'optimizer.weight_decay'?");
  cfg.get("weight_decay", 0.0);
  EXPECT_EQ(error_of([&] { cfg.reject_unknown_keys(); }), path + ":7: key 'totally_unrelated': unknown key");
  cfg.get("totally_unrelated", 0);
  EXPECT_NO_THROW(cfg.reject_unknown_keys());

  cfg.apply_override("extra=1");
  EXPECT_EQ(error_of([&] { cfg.reject_unknown_keys(); }), "command line: key 'extra': unknown key");
}

TEST(YamlConfig, UnknownKeysInListsAndEmptyMaps) {
  ConfigTree cfg = ConfigTree::parse(kRun, "run.yaml");
  for (const char* key : {"model", "micro_batch_size", "gradient_accumulation_steps", "max_steps", "bf16", "seed",
                          "sharding_strategy", "run_name", "nothing"})
    cfg.get<std::string>(key, "");
  ConfigTree opt = cfg.section("optimizer");
  opt.get("lr", 0.0);
  opt.get("eps", 0.0);
  opt.get("weight_decay", 0.0);
  // A section checks only its own keys.
  EXPECT_EQ(error_of([&] { opt.reject_unknown_keys(); }), "run.yaml:11: key 'optimizer.betas': unknown key");
  opt.get<std::vector<double>>("betas", {});
  EXPECT_NO_THROW(opt.reject_unknown_keys());
  std::vector<ConfigTree> data = cfg.sections("datasets");
  data[0].get("path", "");
  data[1].get("path", "");
  EXPECT_EQ(error_of([&] { cfg.reject_unknown_keys(); }), "run.yaml:18: key 'datasets.0.weight': unknown key");
  data[0].get("weight", 1.0);
  EXPECT_NO_THROW(cfg.reject_unknown_keys());

  ConfigTree empty_map = ConfigTree::parse("a: 1\nfsdp: {}\n", "e.yaml");
  empty_map.get("a", 0);
  EXPECT_EQ(error_of([&] { empty_map.reject_unknown_keys(); }), "e.yaml:2: key 'fsdp': unknown key");
}

TEST(YamlConfig, Aliases) {
  const std::string path = write_yaml(
      "fsdp_config:\n"
      "  fsdp_sharding_strategy: 7\n"
      "  fsdp_offload_params: false\n"
      "mixed_precision: bf16\n");
  ConfigTree cfg = ConfigTree::load(path);
  cfg.alias("fsdp_config.fsdp_sharding_strategy", "sharding_strategy");
  cfg.alias("fsdp_config.fsdp_offload_params", "cpu_offload");
  cfg.alias("not_there", "somewhere");  // absent: nothing to do
  EXPECT_FALSE(cfg.has("fsdp_config.fsdp_sharding_strategy"));
  EXPECT_FALSE(cfg.get("cpu_offload", true));
  EXPECT_EQ(cfg.source_of("sharding_strategy"), path + ":2");
  // Messages name the key as the user wrote it, where they wrote it.
  EXPECT_EQ(error_of([&] { cfg.get("sharding_strategy", false); }),
            path + ":2: key 'fsdp_config.fsdp_sharding_strategy': expected true or false, got '7'");
  EXPECT_EQ(error_of([&] { throw cfg.error_at("sharding_strategy", "unknown strategy '7'"); }),
            path + ":2: key 'fsdp_config.fsdp_sharding_strategy': unknown strategy '7'");
  cfg.get("sharding_strategy", "");
  cfg.get("mixed_precision", "");
  EXPECT_NO_THROW(cfg.reject_unknown_keys());  // the emptied fsdp_config is not an unknown key
}

TEST(YamlConfig, AliasConflicts) {
  const std::string text = "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\nsharding_strategy: NO_SHARD\n";
  ConfigTree both = ConfigTree::parse(text, "run.yaml");
  EXPECT_EQ(error_of([&] { both.alias("fsdp_config.fsdp_sharding_strategy", "sharding_strategy"); }),
            "run.yaml:2: key 'fsdp_config.fsdp_sharding_strategy': is another name for 'sharding_strategy', "
            "which is also set at run.yaml:3; set only one");

  // The command line overrides the file, whichever spelling either uses.
  ConfigTree cli_to = ConfigTree::parse("fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n", "run.yaml");
  cli_to.apply_override("sharding_strategy=HYBRID_SHARD");
  cli_to.alias("fsdp_config.fsdp_sharding_strategy", "sharding_strategy");
  EXPECT_EQ(cli_to.get("sharding_strategy", ""), "HYBRID_SHARD");
  EXPECT_NO_THROW(cli_to.reject_unknown_keys());

  ConfigTree cli_from = ConfigTree::parse("sharding_strategy: NO_SHARD\n", "run.yaml");
  cli_from.apply_override("fsdp_config.fsdp_sharding_strategy=SHARD_GRAD_OP");
  cli_from.alias("fsdp_config.fsdp_sharding_strategy", "sharding_strategy");
  EXPECT_EQ(cli_from.get("sharding_strategy", ""), "SHARD_GRAD_OP");
  EXPECT_EQ(cli_from.source_of("sharding_strategy"), "command line");
}

TEST(YamlConfig, MalformedYamlNamesLine) {
  const std::string path = write_yaml("a: 1\nb: [1, 2\nc: 3\n");
  try {
    ConfigTree::load(path);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().file, path);
    EXPECT_GE(e.context().line, 2);
    EXPECT_NE(std::string(e.what()).find("invalid YAML"), std::string::npos) << e.what();
  }
  const std::string bad_indent = write_yaml("a:\n  b: 1\n c: 2\n", "_indent");
  EXPECT_EQ(error_of([&] { ConfigTree::load(bad_indent); }).rfind(bad_indent + ":3: invalid YAML", 0), 0u);
  EXPECT_EQ(error_of([&] { ConfigTree::parse("a: 1\nb: 2\na: 3\n", "dup.yaml"); }),
            "dup.yaml:3: key 'a': duplicate key (first set at dup.yaml:1)");
  EXPECT_EQ(error_of([&] { ConfigTree::load(::testing::TempDir()); }),
            ::testing::TempDir() + ": is a directory, not a config file");
  EXPECT_EQ(error_of([&] { ConfigTree::load(::testing::TempDir() + "no_such_config.yaml"); }),
            ::testing::TempDir() + "no_such_config.yaml: cannot open config file");
}

TEST(YamlConfig, TopLevelMustBeMap) {
  EXPECT_EQ(error_of([&] { ConfigTree::parse("- a\n- b\n", "list.yaml"); }),
            "list.yaml:1: the top level must be a map of keys, got a list");
  EXPECT_EQ(error_of([&] { ConfigTree::parse("just a string\n", "s.yaml"); }),
            "s.yaml:1: the top level must be a map of keys, got 'just a string'");
}

TEST(YamlConfig, EmptyFileIsEmptyConfig) {
  for (const char* text : {"", "# only a comment\n", "~\n"}) {
    ConfigTree cfg = ConfigTree::load(write_yaml(text));
    EXPECT_TRUE(cfg.keys().empty());
    EXPECT_EQ(cfg.get("micro_batch_size", 3), 3);
    EXPECT_NO_THROW(cfg.reject_unknown_keys());
  }
  ConfigTree none;
  EXPECT_EQ(none.file(), "");
  none.apply_override("lr=0.5");
  EXPECT_DOUBLE_EQ(none.require<double>("lr"), 0.5);
}

// set_from: another file's value becomes a key of this tree, and messages about it name the other
// file, its line and its own key (how a DeepSpeed JSON's settings are read).
TEST(YamlConfig, SetFromKeepsTheOtherFilesPlace) {
  ConfigTree run = ConfigTree::parse("a: 1\n", "run.yaml");
  ConfigTree other = ConfigTree::parse("{\n  \"x\": {\"y\": 5},\n  \"z\": [1, 2]\n}\n", "ds.json");
  run.set_from("b.c", "5", other, "x.y");
  run.set_from("list", "[1, 2]", other, "z");
  EXPECT_EQ(run.get<int>("b.c", 0), 5);
  EXPECT_EQ(run.get<std::vector<int>>("list", {}), (std::vector<int>{1, 2}));
  EXPECT_EQ(run.source_of("b.c"), "ds.json:2");
  EXPECT_EQ(std::string(run.error_at("b.c", "bad").what()), "ds.json:2: key 'x.y': bad");
  // The other tree's unread keys, in file order; mark_read takes them off the list.
  (void)other.get<int>("x.y", 0);
  EXPECT_EQ(other.unread_keys(), (std::vector<std::string>{"z"}));
  other.mark_read("z");
  EXPECT_TRUE(other.unread_keys().empty());
  EXPECT_NO_THROW(other.reject_unknown_keys());
  (void)run.get<int>("a", 0);
  EXPECT_NO_THROW(run.reject_unknown_keys());
}
