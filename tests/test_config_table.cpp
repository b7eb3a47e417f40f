// The table of fields a training config is read through (src/train/config_fields.h): docs/training.md
// lists exactly its keys, each key is in it once, and enumerations are read into their enums.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "testing.h"
#include "train/sharding_config.h"
#include "train/train_config.h"

using namespace shardlm;
using shardlm::testing::error_of;

namespace {

// The keys named in the first column of docs/training.md's key tables ("| `key` (alias `other`) | ..."):
// every backticked word of that cell.
std::set<std::string> documented_keys() {
  const std::string path = std::string(SHARDLM_SOURCE_DIR) + "/docs/training.md";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::set<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("| `")) continue;
    const std::string cell = line.substr(1, line.find(" |", 1) - 1);
    for (size_t open = cell.find('`'); open != std::string::npos; open = cell.find('`', open)) {
      const size_t close = cell.find('`', open + 1);
      if (close == std::string::npos) break;
      keys.insert(cell.substr(open + 1, close - open - 1));
      open = close + 1;
    }
  }
  return keys;
}

// Every key and alias of the training config's table, with the number of times it appears.
std::map<std::string, int> table_keys() {
  std::map<std::string, int> keys;
  for (const auto& f : train::train_config_fields()) {
    ++keys[f.key];
    for (const std::string& a : f.aliases) ++keys[a];
  }
  return keys;
}

}  // namespace

TEST(ConfigTable, DocsListEveryKeyAndNoOther) {
  const std::set<std::string> documented = documented_keys();
  ASSERT_FALSE(documented.empty());
  const std::map<std::string, int> table = table_keys();
  for (const auto& [key, count] : table)
    EXPECT_TRUE(documented.count(key)) << "docs/training.md does not document the key '" << key << "'";
  for (const std::string& key : documented)
    EXPECT_TRUE(table.count(key)) << "docs/training.md documents '" << key << "', which the config table lacks";
}

TEST(ConfigTable, EachKeyOnceWithOneLineOfDoc) {
  for (const auto& [key, count] : table_keys()) EXPECT_EQ(count, 1) << key;
  for (const auto& f : train::train_config_fields()) {
    EXPECT_FALSE(f.doc.empty()) << f.key;
    EXPECT_EQ(f.doc.find('\n'), std::string::npos) << f.key;
  }
}

TEST(ConfigTable, ShardingKeysArePartOfTheTrainingTable) {
  // One table, read one way: the training config reads the sharding fields, not a copy of them.
  const std::map<std::string, int> train = table_keys();
  for (const auto& f : train::sharding_config_fields()) {
    EXPECT_TRUE(train.count(f.key)) << f.key;
    for (const std::string& a : f.aliases) EXPECT_TRUE(train.count(a)) << a;
  }
}

TEST(ConfigTable, EnumerationsAreReadIntoTheirEnums) {
  ConfigTree t = ConfigTree::parse(
      "model: m\noutput_dir: o\nprogress: lines\ndevice: cpu\n"
      "data: {train: x.jsonl, type: chat, chat_format: llama2, on_bad_row: skip}\n");
  const train::TrainConfig c = train::read_train_config(t);
  EXPECT_EQ(c.progress, train::ProgressMode::Lines);
  EXPECT_EQ(c.device, Device::CPU);
  EXPECT_EQ(c.data.type, train::DataType::Chat);
  EXPECT_EQ(c.data.chat_format, train::ChatTemplate::Llama2);
  EXPECT_EQ(c.data.on_bad_row, data::BadRowPolicy::Skip);
  EXPECT_EQ(shardlm::enum_name(train::DataType::BuiltinAddition), "builtin:addition");

  // Defaults are the members' initializers.
  ConfigTree d = ConfigTree::parse("model: m\noutput_dir: o\ndata: {train: x.txt}\n");
  const train::TrainConfig dc = train::read_train_config(d);
  EXPECT_EQ(dc.progress, train::ProgressMode::Auto);
  EXPECT_EQ(dc.data.type, train::DataType::Auto);
  EXPECT_EQ(dc.data.on_bad_row, data::BadRowPolicy::Fail);
  EXPECT_DOUBLE_EQ(dc.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(dc.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(dc.schedule.lr, 3e-4);
  EXPECT_EQ(dc.schedule.total_steps, dc.max_steps);

  // A value outside the enum: the error lists the accepted ones, at the value's line.
  const std::string head = "model: m\noutput_dir: o\ndata: {train: x.txt}\n";
  ConfigTree p = ConfigTree::parse(head + "progress: fancy\n", "run.yaml");
  EXPECT_EQ(error_of([&] { train::read_train_config(p); }),
            "run.yaml:4: key 'progress': expected auto, bar, lines or none, got 'fancy'");
  ConfigTree q = ConfigTree::parse("model: m\noutput_dir: o\ndata:\n  train: x.jsonl\n  chat_format: llama4\n", "run.yaml");
  EXPECT_EQ(error_of([&] { train::read_train_config(q); }),
            "run.yaml:5: key 'data.chat_format': expected auto, llama3, llama2, chatml or mistral, got 'llama4'");
  ConfigTree r = ConfigTree::parse("model: m\noutput_dir: o\ndata: {train: x, format: csv}\n", "run.yaml");
  EXPECT_EQ(error_of([&] { train::read_train_config(r); }),
            "run.yaml:3: key 'data.format': expected auto, text, tokens, alpaca, chat, preference or builtin:addition, got 'csv'");
}

TEST(ConfigTable, SectionsMustBeMaps) {
  ConfigTree t = ConfigTree::parse("model: m\noutput_dir: o\ndata: x.txt\n", "run.yaml");
  const std::string msg = error_of([&] { train::read_train_config(t); });
  EXPECT_TRUE(msg.starts_with("run.yaml:3: key 'data': expected a map")) << msg;
}

// offload_activations moves the checkpointed layers' inputs: without checkpointing it is refused
// at its line; torchtune's name reads the same key.
TEST(ConfigTable, OffloadActivationsNeedsCheckpointing) {
  const std::string head = "model: m\noutput_dir: o\ndata: {train: x.txt}\n";
  ConfigTree bare = ConfigTree::parse(head + "offload_activations: true\n", "run.yaml");
  EXPECT_EQ(error_of([&] { train::read_train_config(bare); }),
            "run.yaml:4: key 'offload_activations': offloads the checkpointed layers' saved inputs: set "
            "activation_checkpointing (true, or a layer interval)");
  ConfigTree torchtune = ConfigTree::parse(head + "activation_checkpointing: 2\nenable_activation_offloading: true\n");
  const train::TrainConfig c = train::read_train_config(torchtune);
  EXPECT_TRUE(c.offload_activations);
  EXPECT_EQ(c.activation_checkpointing, 2);
}
