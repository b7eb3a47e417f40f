// Byte-level BPE tokenizers (src/data/bpe_tokenizer.cpp) on the real Llama 3 and GPT-2 files.
//
// The expected ids come from published examples and from tests/torch_ref/bpe_reference.py, an
// independent pure-Python implementation of tiktoken's and OpenAI's GPT-2 algorithms: its digest
// of the ids of every Alpaca text must equal ours. When it does not, run
//   /usr/bin/python3 tests/torch_ref/bpe_reference.py dump ../shared/data ref.jsonl
// to see the reference's ids text by text.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::data;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

namespace {

fs::path data_dir() { return fs::path(__FILE__).parent_path().parent_path().parent_path() / "shared" / "data"; }
std::string data_file(const char* name) { return (data_dir() / name).string(); }

// Loaded once per test binary: loading is cheap, but not free.
const Tokenizer& llama3() {
  static const auto t = load_tiktoken(data_file("llama3_tokenizer.model"));
  return *t;
}
const Tokenizer& gpt2() {
  static const auto t = load_gpt2_bpe(data_file("gpt2_vocab.json"), data_file("gpt2_merges.txt"));
  return *t;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// instruction, input, output of every Alpaca record, in file order (as bpe_reference.py reads them).
const std::vector<std::string>& alpaca_texts() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    for (const json& r : json::parse(read_text(data_dir() / "alpaca_en_demo.json")))
      for (const char* k : {"instruction", "input", "output"}) out.push_back(r[k].get<std::string>());
    return out;
  }();
  return texts;
}

// 64-bit FNV-1a over each id's 4 little-endian bytes, 0xFFFFFFFF after each text (as in Python).
struct Digest {
  uint64_t hash = 0xcbf29ce484222325ull;
  int64_t tokens = 0;
  void add(uint32_t v) {
    for (int i = 0; i < 4; ++i) hash = (hash ^ ((v >> (8 * i)) & 0xFF)) * 0x100000001b3ull;
  }
  void add_text(const Ids& ids) {
    for (int32_t id : ids) add(uint32_t(id));
    add(0xFFFFFFFFu);
    tokens += int64_t(ids.size());
  }
};

// Encodes every Alpaca text, checks the round trip, and digests the ids.
Digest digest_alpaca(const Tokenizer& tok) {
  Digest d;
  for (const auto& t : alpaca_texts()) {
    const Ids ids = tok.encode(t);
    EXPECT_EQ(tok.decode(ids), t) << tok.name() << " does not round-trip: " << t.substr(0, 80);
    d.add_text(ids);
  }
  return d;
}

// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("shardlm_test_bpe_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return (path / name).string();
  }
};

// GPT-2's byte-to-unicode alphabet, written out independently of the library's.
std::string spell(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    uint32_t cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
      cp = 256;
      for (uint32_t c = 0; c < b; ++c)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) ++cp;
    }
    if (cp < 0x80) {
      out += char(cp);
    } else {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::string base64_decode(const std::string& in) {
  const std::string digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    acc = (acc << 6) | uint32_t(digits.find(c));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xFF);
    }
  }
  return out;
}

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json added_token(int64_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// GPT-2's files as a tokenizer.json (the layout of Hugging Face's gpt2 repository); built once.
json make_gpt2_tokenizer_json() {
  json merges = json::array();
  std::istringstream lines(read_text(data_dir() / "gpt2_merges.txt"));
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && !line.starts_with("#version")) merges.push_back(line);
  return {{"version", "1.0"},
          {"added_tokens", json::array({added_token(50256, "<|endoftext|>", true)})},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                             {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                       {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                     {"continuing_subword_prefix", ""}, {"end_of_word_suffix", ""}, {"fuse_unk", false},
                     {"byte_fallback", false}, {"vocab", json::parse(read_text(data_dir() / "gpt2_vocab.json"))},
                     {"merges", merges}}}};
}

const json& gpt2_tokenizer_json() {
  static const json doc = make_gpt2_tokenizer_json();
  return doc;
}

// Llama 3's tiktoken ranks as a tokenizer.json, converted the way Hugging Face's TikTokenConverter
// does: a merge for every split of a token into two tokens, ordered by the token's rank (then by
// the pieces' ranks); merges written as [left, right] arrays, as newer files have them.
json llama3_tokenizer_json() {
  std::map<int64_t, std::string> by_rank;
  std::unordered_map<std::string, int64_t> ranks;
  std::istringstream lines(read_text(data_dir() / "llama3_tokenizer.model"));
  for (std::string b64, rank; lines >> b64 >> rank;) {
    const std::string bytes = base64_decode(b64);
    by_rank[std::stoll(rank)] = bytes;
    ranks[bytes] = std::stoll(rank);
  }
  json vocab = json::object();
  json merges = json::array();
  for (const auto& [rank, bytes] : by_rank) {
    vocab[spell(bytes)] = rank;
    std::vector<std::tuple<int64_t, int64_t, size_t>> local;  // (left rank, right rank, split)
    for (size_t i = 1; i < bytes.size(); ++i) {
      const auto l = ranks.find(bytes.substr(0, i)), r = ranks.find(bytes.substr(i));
      if (l != ranks.end() && r != ranks.end()) local.emplace_back(l->second, r->second, i);
    }
    std::sort(local.begin(), local.end());
    for (const auto& [lr, rr, i] : local) merges.push_back({spell(bytes.substr(0, i)), spell(bytes.substr(i))});
  }
  json added = json::array();
  std::vector<std::string> specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                                       "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                                       "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                                       "<|reserved_special_token_4|>", "<|eot_id|>"};
  for (int i = 5; specials.size() < 256; ++i) specials.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  for (size_t i = 0; i < specials.size(); ++i) added.push_back(added_token(128000 + int64_t(i), specials[i], true));
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                           {"use_regex", false}}})}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                       {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                     {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                     {"byte_fallback", false}, {"ignore_merges", true}, {"vocab", std::move(vocab)},
                     {"merges", std::move(merges)}}}};
}

// Reference digests of all 2997 Alpaca texts, from `bpe_reference.py digest ../shared/data`.
constexpr uint64_t kLlama3AlpacaDigest = 0xa8bac77b861504b1ull;
constexpr int64_t kLlama3AlpacaTokens = 161678;
constexpr uint64_t kGpt2AlpacaDigest = 0xb66343d632a69901ull;
constexpr int64_t kGpt2AlpacaTokens = 169853;

}  // namespace

// ---- Llama 3 (tiktoken) ------------------------------------------------------------------------
TEST(TiktokenLlama3, PublishedAndReferenceVectors) {
  const Tokenizer& t = llama3();
  // Published (Meta's and tiktoken's documentation).
  EXPECT_EQ(t.encode("hello world"), (Ids{15339, 1917}));
  EXPECT_EQ(t.encode("Hello, world!"), (Ids{9906, 11, 1917, 0}));
  EXPECT_EQ(t.encode_with("hello world", true, false), (Ids{128000, 15339, 1917}));
  // From bpe_reference.py.
  EXPECT_EQ(t.encode(" Hello world"), (Ids{22691, 1917}));
  EXPECT_EQ(t.encode("a\n\n  b\t c  "), (Ids{64, 271, 220, 293, 197, 272, 256}));
  EXPECT_EQ(t.encode("   leading"), (Ids{256, 6522}));
  EXPECT_EQ(t.encode("trailing   "), (Ids{376, 14612, 262}));
  EXPECT_EQ(t.encode("12345678 3.14159"), (Ids{4513, 10961, 2495, 220, 18, 13, 9335, 2946}));
  EXPECT_EQ(t.encode("HELLO'S it's"), (Ids{51812, 1623, 13575, 433, 596}));
  EXPECT_EQ(t.encode("na\u00efve caf\u00e9 \u6771\u4eac \U0001F642"), (Ids{3458, 38672, 588, 53050, 119109, 28584}));
  EXPECT_EQ(t.encode(""), Ids{});
  // A pre-token that is a token is emitted whole; merging its bytes would not reach it
  // (" vi\u1ec7c" would become [3355, 26298, 66], "lardan" [75, 569, 276]).
  EXPECT_EQ(t.encode(" vi\u1ec7c"), Ids{100769});
  EXPECT_EQ(t.encode("lardan"), Ids{103084});
}

TEST(TiktokenLlama3, SpecialTokensArePlainTextInEncode) {
  const Tokenizer& t = llama3();
  EXPECT_EQ(t.encode("<|endoftext|>"), (Ids{27, 91, 8862, 728, 428, 91, 29}));
  EXPECT_EQ(t.encode("</s><|eot_id|>"), (Ids{524, 82, 1822, 91, 68, 354, 851, 91, 29}));
}

TEST(TiktokenLlama3, VocabularyAndSpecials) {
  const Tokenizer& t = llama3();
  EXPECT_EQ(t.name(), "tiktoken (Llama 3)");
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.bos_id(), 128000);
  EXPECT_EQ(t.eos_id(), 128001);
  EXPECT_EQ(t.special_token("<|begin_of_text|>"), 128000);
  EXPECT_EQ(t.special_token("<|start_header_id|>"), 128006);
  EXPECT_EQ(t.special_token("<|end_header_id|>"), 128007);
  EXPECT_EQ(t.special_token("<|eot_id|>"), 128009);
  EXPECT_EQ(t.special_token("<|reserved_special_token_5|>"), 128010);
  EXPECT_EQ(t.special_token("<|reserved_special_token_250|>"), 128255);
  EXPECT_EQ(t.special_token("<|eom_id|>"), 128008);  // Llama 3.1's name for a reserved token
  EXPECT_EQ(t.special_token("hello"), std::nullopt);  // ordinary tokens are not special
  EXPECT_EQ(t.special_token("[INST]"), std::nullopt);
  EXPECT_EQ(t.piece(15339), "hello");
  EXPECT_EQ(t.piece(1917), "\u0120world");  // "Ġworld"
  EXPECT_EQ(t.piece(198), "\u010a");        // "\n" is spelled "Ċ"
  EXPECT_EQ(t.piece(128009), "<|eot_id|>");
  EXPECT_EQ(t.decode({128000, 128006, 9906, 11, 1917, 0, 128009, 128001}), "Hello, world!");
}

TEST(TiktokenLlama3, MatchesPythonReferenceOnAlpaca) {
  const Digest d = digest_alpaca(llama3());
  EXPECT_EQ(d.tokens, kLlama3AlpacaTokens);
  EXPECT_EQ(d.hash, kLlama3AlpacaDigest);
}

// ---- GPT-2 (vocab.json + merges.txt) ------------------------------------------------------------
TEST(Gpt2Bpe, PublishedAndReferenceVectors) {
  const Tokenizer& t = gpt2();
  EXPECT_EQ(t.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(t.encode(" Hello world"), (Ids{18435, 995}));
  EXPECT_EQ(t.encode("Hello, world!"), (Ids{15496, 11, 995, 0}));
  EXPECT_EQ(t.encode("a\n\n  b\t c  "), (Ids{64, 628, 220, 275, 197, 269, 220, 220}));
  EXPECT_EQ(t.encode("12345678 3.14159"), (Ids{10163, 2231, 30924, 513, 13, 1415, 19707}));
  EXPECT_EQ(t.encode("na\u00efve caf\u00e9 \u6771\u4eac \U0001F642"),
            (Ids{2616, 38776, 40304, 10545, 251, 109, 12859, 105, 32485}));
}

TEST(Gpt2Bpe, EndOfTextIsSpecialButPlainTextInEncode) {
  const Tokenizer& t = gpt2();
  EXPECT_EQ(t.encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.special_token("<|endoftext|>"), 50256);
  EXPECT_EQ(t.bos_id(), 50256);
  EXPECT_EQ(t.eos_id(), 50256);
  EXPECT_EQ(t.piece(18435), "\u0120Hello");
  EXPECT_EQ(t.piece(50256), "<|endoftext|>");
  EXPECT_EQ(t.decode({50256, 15496, 995, 50256}), "Hello world");
}

TEST(Gpt2Bpe, MatchesPythonReferenceOnAlpaca) {
  const Digest d = digest_alpaca(gpt2());
  EXPECT_EQ(d.tokens, kGpt2AlpacaTokens);
  EXPECT_EQ(d.hash, kGpt2AlpacaDigest);
}

// ---- Hugging Face tokenizer.json ------------------------------------------------------------
TEST(HfTokenizerJson, ByteLevelGpt2EqualsVocabAndMerges) {
  TempDir dir("gpt2");
  const auto start = std::chrono::steady_clock::now();
  const auto tok = load_hf_tokenizer_json(dir.write("tokenizer.json", gpt2_tokenizer_json().dump()));
  std::printf("tokenizer.json (GPT-2) written and loaded in %.3f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->special_token("<|endoftext|>"), 50256);
  EXPECT_EQ(tok->bos_id(), 50256);  // no tokenizer_config.json: GPT-2's convention
  EXPECT_EQ(tok->eos_id(), 50256);
  EXPECT_EQ(tok->piece(18435), "\u0120Hello");
  for (const auto& t : alpaca_texts()) ASSERT_EQ(tok->encode(t), gpt2().encode(t)) << t.substr(0, 80);
}

TEST(HfTokenizerJson, SplitSequenceLlama3EqualsTiktoken) {
  TempDir dir("llama3");
  const std::string path = dir.write("tokenizer.json", llama3_tokenizer_json().dump());
  const auto start = std::chrono::steady_clock::now();
  const auto tok = load_hf_tokenizer_json(path);
  std::printf("tokenizer.json (Llama 3, %.1f MB) loaded in %.3f s\n", double(fs::file_size(path)) / 1e6,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_EQ(tok->special_token("<|eot_id|>"), 128009);
  EXPECT_EQ(tok->encode("hello world"), (Ids{15339, 1917}));
  EXPECT_EQ(tok->encode(" vi\u1ec7c"), Ids{100769});  // ignore_merges: whole, as tiktoken does
  for (const auto& t : alpaca_texts()) ASSERT_EQ(tok->encode(t), llama3().encode(t)) << t.substr(0, 80);
}

TEST(HfTokenizerJson, ConfigDecidesBosEosAndAddedTokensAreMatched) {
  TempDir dir("config");
  json doc = gpt2_tokenizer_json();
  // A Qwen2-like setup: chat markers, one non-special added token, no BOS.
  doc["added_tokens"].push_back(added_token(50257, "<|im_start|>", true));
  doc["added_tokens"].push_back(added_token(50258, "<|im_end|>", true));
  doc["added_tokens"].push_back(added_token(50259, "<think>", false));
  const std::string path = dir.write("tokenizer.json", doc.dump());
  {
    const auto tok = load_hf_tokenizer_json(path);
    EXPECT_EQ(tok->vocab_size(), 50260);
    EXPECT_EQ(tok->bos_id(), -1);  // no config: <|im_start|> marks a Qwen-style vocabulary
    EXPECT_EQ(tok->eos_id(), 50256);
    // Special tokens are plain text; non-special added tokens are found in the text (as HF does).
    EXPECT_EQ(tok->encode("<|im_end|>"), gpt2().encode("<|im_end|>"));
    EXPECT_EQ(tok->encode("Hello<think> world"), (Ids{15496, 50259, 995}));
    EXPECT_EQ(tok->decode({50257, 15496, 50259, 995, 50258}), "Hello<think> world");
  }
  dir.write("tokenizer_config.json", R"({"bos_token": null, "eos_token": {"content": "<|im_end|>"}})");
  {
    const auto tok = load_hf_tokenizer_json(path);
    EXPECT_EQ(tok->bos_id(), -1);
    EXPECT_EQ(tok->eos_id(), 50258);
  }
  dir.write("tokenizer_config.json", R"({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"})");
  EXPECT_EQ(load_hf_tokenizer_json(path)->bos_id(), 50256);
  dir.write("tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(path); }, "eos_token");
}

TEST(HfTokenizerJson, AddPrefixSpace) {
  TempDir dir("prefix");
  json doc = gpt2_tokenizer_json();
  doc["pre_tokenizer"]["add_prefix_space"] = true;
  const auto tok = load_hf_tokenizer_json(dir.write("tokenizer.json", doc.dump()));
  EXPECT_EQ(tok->encode("Hello world"), (Ids{18435, 995}));
  EXPECT_EQ(tok->encode(" Hello world"), (Ids{18435, 995}));
}

// ---- errors ------------------------------------------------------------------------------------
TEST(TiktokenLlama3, FileErrorsNameFileAndLine) {
  TempDir dir("errors");
  const std::string bad_b64 = dir.write("bad.model", "IQ== 0\nIg== 1\nI$== 2\n");
  shardlm::testing::expect_error([&] { load_tiktoken(bad_b64); }, bad_b64 + ":3: invalid base64");
  const std::string bad_rank = dir.write("rank.model", "IQ== 0\nIg== one\n");
  shardlm::testing::expect_error([&] { load_tiktoken(bad_rank); }, bad_rank + ":2: invalid rank");
  const std::string twice = dir.write("twice.model", "IQ== 0\nIg== 0\n");
  shardlm::testing::expect_error([&] { load_tiktoken(twice); }, twice + ":2: rank 0 is given twice");
  // Ranks run 0..N-1 over a file's N lines (Llama 3's special tokens follow them): a rank beyond is
  // refused before it sizes any table (60M ranks would be gigabytes for a file of 14 bytes).
  const std::string beyond = dir.write("beyond.model", "IQ== 0\nIg== 60000000\n");
  shardlm::testing::expect_error([&] { load_tiktoken(beyond); },
                                 beyond + ":2: rank 60000000 is beyond the file's 2 ranks");
  // Well-formed, but without all 256 bytes it cannot encode every text.
  const std::string few = dir.write("few.model", "IQ== 0\nIg== 1\n");
  shardlm::testing::expect_error([&] { load_tiktoken(few); }, "not a byte-level BPE");
  shardlm::testing::expect_error([&] { load_tiktoken((dir.path / "missing.model").string()); }, "missing.model");
}

TEST(HfTokenizerJson, ErrorsNameFileAndComponent) {
  TempDir dir("hf_errors");
  const std::string wordpiece =
      dir.write("wp.json", R"({"model": {"type": "WordPiece", "vocab": {}}, "pre_tokenizer": null})");
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(wordpiece); }, wordpiece + ": key 'model.type'");
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(wordpiece); }, "'WordPiece'");

  const std::string full = gpt2_tokenizer_json().dump();
  const std::string truncated = dir.write("truncated.json", full.substr(0, full.size() / 2));
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(truncated); }, truncated + ": invalid JSON");

  json doc = gpt2_tokenizer_json();
  doc["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                                         {{"type", "ByteLevel"}}})}};
  const std::string digits = dir.write("digits.json", doc.dump());
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(digits); }, "pre_tokenizer.pretokenizers[0]");
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(digits); }, "'Digits'");

  doc = gpt2_tokenizer_json();
  doc["normalizer"] = {{"type", "Lowercase"}};
  const std::string lower = dir.write("lower.json", doc.dump());
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(lower); }, "normalizer 'Lowercase'");

  // An id no file of this size could reach is refused before it sizes the tables (60M ids would
  // be gigabytes).
  doc = gpt2_tokenizer_json();
  doc["model"]["vocab"]["zzzz"] = 60000000;
  const std::string far_id = dir.write("far_id.json", doc.dump());
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(far_id); }, far_id + ": token 'zzzz' has id 60000000");
  doc = gpt2_tokenizer_json();
  doc["added_tokens"] = json::array({{{"id", 60000000}, {"content", "<far>"}, {"special", true}}});
  const std::string far_added = dir.write("far_added.json", doc.dump());
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(far_added); }, far_added + ": added token id 60000000");

  doc = gpt2_tokenizer_json();
  doc["model"]["merges"][7] = "Ġt nosuchtoken";
  const std::string merges = dir.write("merges.json", doc.dump());
  shardlm::testing::expect_error([&] { load_hf_tokenizer_json(merges); }, "model.merges[7]");
}

TEST(Gpt2Bpe, FileErrorsNameFileAndLine) {
  TempDir dir("gpt2_errors");
  const std::string merges = dir.write("merges.txt", "#version: 0.2\n\u0120 t\nh e x\n");
  shardlm::testing::expect_error([&] { load_gpt2_bpe(data_file("gpt2_vocab.json"), merges); }, merges + ":3:");
}

// ---- pathological input ------------------------------------------------------------------------
// Long runs become single pre-tokens; merging must not be quadratic in their length.
TEST(BpePathological, LongRunsEncodeQuicklyAndRoundTrip) {
  const std::string spaces(100000, ' ');
  std::string word;
  for (int i = 0; i < 50000; ++i) word += char('a' + (i * 7 + i / 13) % 26);
  const std::string mixed = "x" + spaces + "y\n" + word + "\n\n\n" + std::string(30000, '\n') + "1234567";
  for (const Tokenizer* t : {&llama3(), &gpt2()}) {
    for (const std::string* text : std::vector<const std::string*>{&spaces, &word, &mixed}) {
      const auto start = std::chrono::steady_clock::now();
      const Ids ids = t->encode(*text);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_EQ(t->decode(ids), *text) << t->name();
      EXPECT_LE(ids.size(), text->size());
      std::printf("%s: %zu bytes -> %zu tokens in %.3f s\n", t->name().c_str(), text->size(), ids.size(), s);
    }
  }
}

// Text that is not valid UTF-8 still reaches the byte-level model byte for byte.
TEST(BpePathological, InvalidUtf8RoundTrips) {
  const std::string text = std::string("caf\xC3") + "\xFF\xFE ok \xE6\x9D" + " end\x80";
  for (const Tokenizer* t : {&llama3(), &gpt2()}) EXPECT_EQ(t->decode(t->encode(text)), text) << t->name();
}

