// Unit tests of how outputs are published and inputs are read (issue 30): a directory that appears
// whole (io/staged_dir.h), a sharded save whose shards are tied to its index by a save id
// (io/model_files.h), the lock on an output directory (io/dir_lock.h), one reader for every input
// file (io/read_file.h), and the tokenizer checked against the model it serves.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/tensor.h"
#include "data/tokenizer.h"
#include "io/atomic_file.h"
#include "io/dir_lock.h"
#include "io/model_files.h"
#include "io/read_file.h"
#include "io/safetensors.h"
#include "io/staged_dir.h"
#include "testing.h"

using namespace shardlm;
using shardlm::testing::error_of;
using shardlm::testing::TempDir;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Two f32 tensors of 16 bytes each, filled with `value`: with a 16-byte limit, two shards.
struct TwoTensors {
  std::vector<float> a, b;
  explicit TwoTensors(float value) : a(4, value), b(4, value) {}
  std::vector<std::pair<std::string, Tensor>> tensors() {
    return {{"a", Tensor::view(a.data(), DType::F32, {4})}, {"b", Tensor::view(b.data(), DType::F32, {4})}};
  }
};

float first_value(const io::ModelWeights& w, const std::string& name) {
  float v = 0;
  w.read_range(name, 0, 1, &v);
  return v;
}

}  // namespace

// ---- a directory published whole ------------------------------------------------------------

TEST(StagedDir, PublishesNewAndReplacesAModelDirectoryWhole) {
  TempDir d;
  const std::string target = d / "model";
  io::publish_dir(target, io::Publish::Replace, "the output", [](const std::string& dir) {
    write_text(fs::path(dir) / "config.json", "{\"v\": 1}");
    write_text(fs::path(dir) / "model.safetensors", "old");
  });
  EXPECT_EQ(read_text(fs::path(target) / "config.json"), "{\"v\": 1}");
  // The new one replaces the old whole: a file only the old one had is gone.
  io::publish_dir(target, io::Publish::Replace, "the output", [](const std::string& dir) {
    write_text(fs::path(dir) / "config.json", "{\"v\": 2}");
  });
  EXPECT_EQ(read_text(fs::path(target) / "config.json"), "{\"v\": 2}");
  EXPECT_FALSE(fs::exists(fs::path(target) / "model.safetensors"));
  // Nothing but the target is left beside it (no staging directory, no old copy).
  EXPECT_EQ(d.list(), std::vector<std::string>{"model"});
}

TEST(StagedDir, AFailedWriteLeavesTheOldDirectoryAndNoStaging) {
  TempDir d;
  const std::string target = d / "model";
  fs::create_directories(target);
  write_text(fs::path(target) / "config.json", "old");
  EXPECT_THROW(io::publish_dir(target, io::Publish::Replace, "the output",
                               [](const std::string& dir) {
                                 write_text(fs::path(dir) / "config.json", "new");
                                 throw Error("the writer failed");
                               }),
               Error);
  EXPECT_EQ(read_text(fs::path(target) / "config.json"), "old");
  EXPECT_EQ(d.list(), std::vector<std::string>{"model"});
}

TEST(StagedDir, RefusesToReplaceWhatIsNotAModel) {
  TempDir d;
  const std::string target = d / "out";
  fs::create_directories(fs::path(target) / "checkpoints");
  write_text(fs::path(target) / "config.json", "{}");
  bool wrote = false;
  const std::string err = error_of([&] {
    io::publish_dir(target, io::Publish::Replace, "--out", [&](const std::string&) { wrote = true; });
  });
  EXPECT_NE(err.find("--out already holds 'checkpoints'"), std::string::npos) << err;
  EXPECT_NE(err.find(target), std::string::npos) << err;
  EXPECT_FALSE(wrote);  // refused before anything was written
  EXPECT_TRUE(fs::exists(fs::path(target) / "checkpoints"));
  // New refuses any non-empty target; ReplaceAnything replaces it.
  fs::remove_all(fs::path(target) / "checkpoints");
  EXPECT_NE(error_of([&] { io::check_publishable(target, io::Publish::New, "--out"); }).find("not empty"),
            std::string::npos);
  io::publish_dir(target, io::Publish::ReplaceAnything, "--out",
                  [](const std::string& dir) { write_text(fs::path(dir) / "notes.bin", "x"); });
  EXPECT_TRUE(fs::exists(fs::path(target) / "notes.bin"));
  EXPECT_FALSE(fs::exists(fs::path(target) / "config.json"));
}

TEST(StagedDir, AnOutputThatIsItsInputIsRefused) {
  TempDir d;
  fs::create_directories(d / "model");
  fs::create_symlink(d / "model", d / "alias");
  for (const std::string& out : {d / "model", d / "model/", d / "model/../model", d / "alias"}) {
    const std::string err =
        error_of([&] { io::refuse_output_over_input(out, "output_dir", d / "model", "model directory"); });
    EXPECT_NE(err.find("output_dir is the model directory it reads"), std::string::npos) << out << ": " << err;
  }
  EXPECT_NO_THROW(io::refuse_output_over_input(d / "model/run", "output_dir", d / "model", "model directory"));
  EXPECT_NO_THROW(io::refuse_output_over_input(d / "other", "output_dir", d / "model", "model directory"));
}

// ---- a sharded save tied to its index ----------------------------------------------------------

TEST(ModelWeightsSaveId, ShardsOfAnotherSaveAreRefusedNotMixed) {
  TempDir d;
  TwoTensors first(1.0f), second(2.0f);
  const std::string dir = d / "m";
  io::write_model_weights(dir, first.tensors(), 16);
  const std::string shard1 = (fs::path(dir) / "model-00001-of-00002.safetensors").string();
  const std::string old_shard1 = read_text(shard1);
  io::write_model_weights(dir, second.tensors(), 16);  // the same shard names
  EXPECT_EQ(first_value(io::ModelWeights(dir), "a"), 2.0f);
  EXPECT_EQ(first_value(io::ModelWeights(dir), "b"), 2.0f);
  // A save that died among its renames: one shard of the earlier save beside the new index.
  write_text(shard1, old_shard1);
  const std::string err = error_of([&] { io::ModelWeights w(dir); });
  EXPECT_NE(err.find("belongs to another save"), std::string::npos) << err;
  EXPECT_NE(err.find(shard1), std::string::npos) << err;
  // transformers ignores the extra metadata key: the index still has total_size and weight_map.
  const nlohmann::json index = nlohmann::json::parse(read_text(fs::path(dir) / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 32);
  EXPECT_EQ(index["weight_map"]["b"], "model-00002-of-00002.safetensors");
}

// ---- the lock on an output directory ---------------------------------------------------------

TEST(DirLock, ASecondHolderIsRefusedNamingTheFirst) {
  TempDir d;
  const std::string dir = d / "run";
  {
    io::DirLock first(dir, "output_dir");
    EXPECT_TRUE(first.held());
    // flock belongs to an open file description, so a second open in this process conflicts too.
    const std::string err = error_of([&] { io::DirLock second(dir, "output_dir"); });
    EXPECT_NE(err.find("output_dir is in use by another run"), std::string::npos) << err;
    EXPECT_NE(err.find("pid " + std::to_string(::getpid())), std::string::npos) << err;
    EXPECT_NE(err.find(dir), std::string::npos) << err;
  }
  // Released with its holder.
  EXPECT_NO_THROW(io::DirLock again(dir, "output_dir"));
}

// ---- reading inputs --------------------------------------------------------------------------

TEST(ReadFile, OnlyRegularFilesWithinTheLimit) {
  TempDir d;
  write_text(d / "a.txt", "hello");
  EXPECT_EQ(io::read_file(d / "a.txt", "data file"), "hello");
  EXPECT_NE(error_of([&] { io::read_file(d.path().string(), "data file"); }).find("is a directory, not a data file"),
            std::string::npos);
  const std::string dev = error_of([&] { io::read_file("/dev/zero", "data file"); });
  EXPECT_NE(dev.find("/dev/zero"), std::string::npos) << dev;
  EXPECT_NE(dev.find("not a regular file"), std::string::npos) << dev;
  const std::string big = error_of([&] { io::read_file(d / "a.txt", "data file", 4); });
  EXPECT_NE(big.find("above the"), std::string::npos) << big;
  EXPECT_NE(error_of([&] { io::read_file(d / "absent", "data file"); }).find("cannot open the data file"),
            std::string::npos);
}

// ---- tokenizers --------------------------------------------------------------------------------

namespace {
// A byte-level BPE tokenizer.json with a 4-token vocabulary and the given added_tokens.
std::string tiny_tokenizer_json(const std::string& added) {
  return R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "d": 3}, "merges": []},
             "pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [)" +
         added + "]}";
}
}  // namespace

TEST(TokenizerChecks, AnAddedTokenWithTwoIdsIsRefused) {
  TempDir d;
  write_text(d / "tokenizer.json",
             tiny_tokenizer_json(R"({"id": 4, "content": "<x>", "special": true},
                                    {"id": 5, "content": "<x>", "special": true})"));
  const std::string err = error_of([&] { data::load_tokenizer_file(d / "tokenizer.json"); });
  EXPECT_NE(err.find("added token '<x>' is given two ids, 4 and 5"), std::string::npos) << err;
}

TEST(TokenizerChecks, TheTokenizerMustFitTheModel) {
  TempDir d;
  // No tokenizer files: the byte fallback serves a byte-sized model only.
  EXPECT_NO_THROW(data::load_model_tokenizer(d.path().string(), 512, true));
  const std::string none = error_of([&] { data::load_model_tokenizer(d.path().string(), 32000, true); });
  EXPECT_NE(none.find("no tokenizer"), std::string::npos) << none;
  EXPECT_NO_THROW(data::load_model_tokenizer(d.path().string(), 32000, false));  // nothing textual is read
  // Ids the embedding does not have: Llama 2's 32000-id tokenizer for a model of 31999.
  const fs::path data = fs::path(__FILE__).parent_path().parent_path().parent_path() / "shared" / "data";
  ASSERT_TRUE(fs::exists(data / "llama2_tokenizer.model")) << "shared test data not found at " << data;
  fs::copy_file(data / "llama2_tokenizer.model", d / "tokenizer.model");
  EXPECT_NO_THROW(data::load_model_tokenizer(d.path().string(), 32000, true));
  const std::string beyond = error_of([&] { data::load_model_tokenizer(d.path().string(), 31999, true); });
  EXPECT_NE(beyond.find("has 32000 ids but the model's vocab_size is 31999"), std::string::npos) << beyond;
  EXPECT_NE(beyond.find("config.json"), std::string::npos) << beyond;
}
