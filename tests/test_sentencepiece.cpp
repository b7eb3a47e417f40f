// SentencePiece tokenizer and tokenizer selection (load_tokenizer, load_tokenizer_file).
// Owner: the SentencePiece tokenizer work.
//
// Reads Llama 2's tokenizer.model and the Alpaca demo records from <repo>/../shared/data. The
// key test compares shardlm's ids with python sentencepiece's (tests/torch_ref/sp_reference.py,
// run with /usr/bin/python3 or $SHARDLM_TEST_PYTHON) on every field of all 999 records.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tokenizer.h"
#include "testing.h"

namespace fs = std::filesystem;
using namespace shardlm;
using shardlm::testing::error_of;
using shardlm::testing::expect_error;

namespace {

const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path();
const fs::path kData = kRepo.parent_path() / "shared" / "data";
const std::string kLlama2 = (kData / "llama2_tokenizer.model").string();
const std::string kLlama3 = (kData / "llama3_tokenizer.model").string();
const std::string kAlpaca = (kData / "alpaca_en_demo.json").string();

#define REQUIRE_SHARED_DATA()                                                            \
  do {                                                                                   \
    ASSERT_TRUE(fs::exists(kLlama2)) << "shared test data not found at " << kData; \
  } while (0)

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("shardlm_sp_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

const data::Tokenizer& llama2() {
  static const std::unique_ptr<data::Tokenizer> tok = data::load_sentencepiece(kLlama2);
  return *tok;
}

struct Field {
  size_t record;
  std::string field, text;
};
std::vector<Field> alpaca_texts() {
  std::ifstream in(kAlpaca);
  const nlohmann::json records = nlohmann::json::parse(in);
  std::vector<Field> out;
  for (size_t i = 0; i < records.size(); ++i)
    for (const char* f : {"instruction", "input", "output"}) {
      const std::string t = records[i].value(f, std::string());
      if (!t.empty()) out.push_back({i, f, t});
    }
  return out;
}

// shardlm's ids for every Alpaca text, encoded once: libsentencepiece's BPE runs at about
// 0.6 MB/s, so the two Alpaca tests share one pass.
const std::vector<std::vector<int32_t>>& alpaca_ids() {
  static const std::vector<std::vector<int32_t>> ids = [] {
    std::vector<std::vector<int32_t>> out;
    for (const Field& f : alpaca_texts()) out.push_back(llama2().encode(f.text));
    return out;
  }();
  return ids;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += fmt::format("{}{}", s.empty() ? "" : " ", id);
  return s;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = char(rng() & 0xff);
  return s;
}

}  // namespace

TEST(SentencePiece, PublishedLlama2Vector) {
  REQUIRE_SHARED_DATA();
  EXPECT_EQ(ids_str(llama2().encode_with("I believe the meaning of life is", true, false)),
            "1 306 4658 278 6593 310 2834 338");
  EXPECT_EQ(ids_str(llama2().encode_with("I believe", true, true)), "1 306 4658 2");
}

TEST(SentencePiece, VocabularyAndSpecialTokens) {
  REQUIRE_SHARED_DATA();
  const data::Tokenizer& t = llama2();
  EXPECT_EQ(t.name(), "sentencepiece");
  EXPECT_EQ(t.vocab_size(), 32000);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.special_token("<unk>"), std::optional<int32_t>(0));
  EXPECT_EQ(t.special_token("<s>"), std::optional<int32_t>(1));
  EXPECT_EQ(t.special_token("</s>"), std::optional<int32_t>(2));
  // Plain text in Llama 2, and ordinary or byte pieces are no special tokens.
  EXPECT_EQ(t.special_token("[INST]"), std::nullopt);
  EXPECT_EQ(t.special_token("▁the"), std::nullopt);
  EXPECT_EQ(t.special_token("<0x0A>"), std::nullopt);
  EXPECT_EQ(t.special_token("<pad>"), std::nullopt);
  EXPECT_EQ(t.piece(0), "<unk>");
  EXPECT_EQ(t.piece(1), "<s>");
  EXPECT_EQ(t.piece(13), "<0x0A>");
  EXPECT_EQ(t.piece(278), "▁the");
  expect_error([&] { t.piece(32000); }, "outside the vocabulary");
}

// Small cases whose ids python sentencepiece gives (dummy prefix, byte fallback, whitespace).
TEST(SentencePiece, EdgeCases) {
  REQUIRE_SHARED_DATA();
  const data::Tokenizer& t = llama2();
  EXPECT_EQ(ids_str(t.encode("")), "");
  EXPECT_EQ(ids_str(t.encode(" ")), "259");
  EXPECT_EQ(ids_str(t.encode("  hi")), "259 7251");
  EXPECT_EQ(ids_str(t.encode("\n")), "29871 13");
  EXPECT_EQ(ids_str(t.encode("a\n\nb")), "263 13 13 29890");
  EXPECT_EQ(ids_str(t.encode("[INST] x")), "518 25580 29962 921");
  EXPECT_EQ(ids_str(t.encode("<s>")), "529 29879 29958");  // special text is not parsed in input
  EXPECT_EQ(ids_str(t.encode("é 中文 😀")), "904 29871 30275 30333 29871 243 162 155 131");
  for (const char* s : {"", " ", "  hi", "hi  ", "\n", "\t", "é 中文 😀", "ｆｕｌｌ"}) EXPECT_EQ(t.decode(t.encode(s)), s);
}

TEST(SentencePiece, DecodeDropsSpecialAndInvalidIds) {
  REQUIRE_SHARED_DATA();
  const data::Tokenizer& t = llama2();
  // <s>, </s>, <unk> and ids past the vocabulary (padded embedding rows) are dropped.
  EXPECT_EQ(t.decode({1, 306, 2, 0, 4658, 32000, -1}), "I believe");
  EXPECT_EQ(t.decode({243, 162, 155, 131}), "😀");  // byte-fallback pieces decode to bytes
  EXPECT_EQ(t.decode({}), "");
}

// Llama 2's normalizer is the identity (no NFKC, no whitespace folding) and decoding removes
// exactly the dummy prefix, so every Alpaca text round-trips; python sentencepiece agrees
// (checked with sp.decode(sp.encode(t)) == t on all 2410 texts).
TEST(SentencePiece, RoundTripsAlpaca) {
  REQUIRE_SHARED_DATA();
  const auto texts = alpaca_texts();
  ASSERT_EQ(texts.size(), 2410u);
  for (size_t k = 0; k < texts.size(); ++k)
    ASSERT_EQ(llama2().decode(alpaca_ids()[k]), texts[k].text) << "record " << texts[k].record << " field "
                                                                 << texts[k].field;
}

TEST(SentencePiece, MatchesPythonSentencePieceOnAllAlpacaRecords) {
  REQUIRE_SHARED_DATA();
  TempDir tmp;
  const std::string out = tmp / "sp_ref.json";
  const char* py_env = std::getenv("SHARDLM_TEST_PYTHON");
  const std::string python = py_env ? py_env : "/usr/bin/python3";
  const std::string script = (kRepo / "tests" / "torch_ref" / "sp_reference.py").string();
  const std::string cmd = fmt::format("'{}' '{}' '{}' '{}' '{}'", python, script, kLlama2, kAlpaca, out);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference script failed: " << cmd;

  std::ifstream in(out);
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto texts = alpaca_texts();
  const nlohmann::json& cases = ref.at("cases");
  ASSERT_EQ(cases.size(), texts.size());
  size_t tokens = 0;
  for (size_t k = 0; k < texts.size(); ++k) {
    const Field& f = texts[k];
    const nlohmann::json& c = cases[k];
    const std::string where = fmt::format("record {} field {}", f.record, f.field);
    ASSERT_EQ(c.at("record").get<size_t>(), f.record) << where;
    ASSERT_EQ(c.at("field").get<std::string>(), f.field) << where;
    ASSERT_EQ(c.at("text").get<std::string>(), f.text) << where;  // both read the same text
    const std::vector<int32_t> want = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t>& got = alpaca_ids()[k];
    ASSERT_EQ(ids_str(got), ids_str(want)) << where << ": ids differ from python sentencepiece";
    ASSERT_EQ(llama2().decode(got), c.at("decoded").get<std::string>()) << where << ": decoded text differs";
    tokens += got.size();
  }
  EXPECT_GT(tokens, 100000u);  // the comparison covered real text, not empty lists
}

TEST(SentencePiece, CorruptOrMissingModelNamesTheFile) {
  TempDir tmp;
  const std::string bad = tmp / "tokenizer.model";
  write_bytes(bad, random_bytes(100, 1));
  EXPECT_FALSE(data::is_sentencepiece_model(bad));
  expect_error([&] { data::load_sentencepiece(bad); }, bad);
  expect_error([&] { data::load_tokenizer_file(bad); }, bad);
  const std::string msg = error_of([&] { data::load_tokenizer(tmp.path.string()); });
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;

  // Starts like a ModelProto (field 1, length-delimited) but is truncated garbage.
  const std::string proto_like = tmp / "proto_like.model";
  write_bytes(proto_like, std::string("\x0a\x40").append(random_bytes(20, 2)));
  EXPECT_FALSE(data::is_sentencepiece_model(proto_like));
  expect_error([&] { data::load_sentencepiece(proto_like); }, proto_like);

  const std::string empty = tmp / "empty.model";
  write_bytes(empty, "");
  EXPECT_FALSE(data::is_sentencepiece_model(empty));
  expect_error([&] { data::load_tokenizer_file(empty); }, empty);

  const std::string missing = tmp / "missing.model";
  EXPECT_FALSE(data::is_sentencepiece_model(missing));
  expect_error([&] { data::load_sentencepiece(missing); }, missing);
  expect_error([&] { data::load_tokenizer_file(missing); }, missing);
}

TEST(SentencePiece, TellsSentencePieceFromTiktoken) {
  REQUIRE_SHARED_DATA();
  EXPECT_TRUE(data::is_sentencepiece_model(kLlama2));
  EXPECT_FALSE(data::is_sentencepiece_model(kLlama3));
  EXPECT_FALSE(data::is_sentencepiece_model(kAlpaca));
}

TEST(LoadTokenizer, DirectoryWithSentencePieceModel) {
  REQUIRE_SHARED_DATA();
  TempDir tmp;
  fs::copy_file(kLlama2, tmp / "tokenizer.model");
  const auto tok = data::load_tokenizer(tmp.path.string());
  EXPECT_EQ(tok->name(), "sentencepiece");
  EXPECT_EQ(ids_str(tok->encode_with("I believe the meaning of life is", true, false)),
            "1 306 4658 278 6593 310 2834 338");
  EXPECT_EQ(data::load_tokenizer_file(tmp / "tokenizer.model")->name(), "sentencepiece");
}

TEST(LoadTokenizer, DirectoryWithoutTokenizerIsByteLevel) {
  TempDir tmp;
  write_bytes(tmp / "config.json", "{}");
  const auto tok = data::load_tokenizer(tmp.path.string());
  EXPECT_EQ(tok->name(), "byte-level");
  EXPECT_EQ(tok->vocab_size(), 259);
}

TEST(LoadTokenizer, Errors) {
  TempDir tmp;
  // vocab.json without merges.txt: the error names the missing file.
  write_bytes(tmp / "vocab.json", "{}");
  expect_error([&] { data::load_tokenizer(tmp.path.string()); }, tmp / "merges.txt");
  expect_error([&] { data::load_tokenizer((tmp.path / "nope").string()); }, "nope");
  expect_error([&] { data::load_tokenizer_file(tmp / "tokenizer.model"); }, tmp / "tokenizer.model");
}

// Llama 2 and Mistral repositories ship tokenizer.model and a tokenizer.json converted from it;
// the byte-level BPE loader cannot read the latter, so the SentencePiece model is used there.
TEST(LoadTokenizer, SentencePieceModelBesideConvertedTokenizerJson) {
  REQUIRE_SHARED_DATA();
  // The shape of Llama-2-7b-hf's tokenizer.json (vocabulary cut short) and of Mistral's.
  const std::string llama2_json = R"({"version": "1.0", "added_tokens": [],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                   {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null, "post_processor": null,
    "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
    "model": {"type": "BPE", "byte_fallback": true, "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2}, "merges": []}})";
  const std::string mistral_json = R"({"pre_tokenizer": {"type": "Metaspace", "replacement": "▁"},
    "model": {"type": "BPE", "byte_fallback": null, "vocab": {}, "merges": []}})";
  for (const std::string& json : {llama2_json, mistral_json}) {
    TempDir tmp;
    fs::copy_file(kLlama2, tmp / "tokenizer.model");
    write_bytes(tmp / "tokenizer.json", json);
    const auto tok = data::load_tokenizer(tmp.path.string());
    EXPECT_EQ(tok->name(), "sentencepiece");
    EXPECT_EQ(ids_str(tok->encode("I believe")), "306 4658");
  }
}

// Otherwise tokenizer.json is preferred, as Hugging Face's fast tokenizers do: this byte-level one
// is broken (no vocabulary), and the error shows that it was the file chosen.
TEST(LoadTokenizer, PrefersByteLevelTokenizerJson) {
  REQUIRE_SHARED_DATA();
  TempDir tmp;
  fs::copy_file(kLlama2, tmp / "tokenizer.model");
  write_bytes(tmp / "tokenizer.json",
              R"({"pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {}, "merges": []}})");
  expect_error([&] { data::load_tokenizer(tmp.path.string()); }, tmp / "tokenizer.json");
  // A corrupt tokenizer.json is reported, not skipped.
  write_bytes(tmp / "tokenizer.json", "{not json");
  expect_error([&] { data::load_tokenizer(tmp.path.string()); }, tmp / "tokenizer.json");
}
