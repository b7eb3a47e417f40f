// Choosing a tokenizer from what a model directory holds (see tokenizer.h).
// Owner: the SentencePiece tokenizer work; the BPE loaders it calls live in bpe_tokenizer.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tokenizer.h"
#include "io/json_parse.h"

namespace shardlm::data {

namespace fs = std::filesystem;

namespace {

// tiktoken files are lines of "base64 rank": the first bytes are base64 letters, digits, '+',
// '/', '=', spaces and newlines. Anything else (random or truncated binary) is neither format,
// and gets an error of its own instead of a confusing one from the tiktoken parser.
bool looks_like_tiktoken(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char buf[256];
  in.read(buf, sizeof buf);
  const std::streamsize n = in.gcount();
  if (n <= 0) return false;
  for (std::streamsize i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(buf[i]);
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
                    c == '/' || c == '=' || c == ' ' || c == '\n' || c == '\r';
    if (!ok) return false;
  }
  return true;
}

// A Hugging Face tokenizer.json converted from a SentencePiece model (Llama 2, Mistral): "▁" for
// spaces (Metaspace, or a Prepend/Replace normalizer) and byte-fallback pieces instead of GPT-2's
// byte alphabet. False for byte-level BPE and for files that do not parse (those are left to the
// loader, whose error names the file).
bool is_sentencepiece_style_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const nlohmann::json j = io::parse_json_or_discarded(in);
  if (!j.is_object()) return false;
  const std::function<bool(const nlohmann::json&)> has_sp_component = [&](const nlohmann::json& c) {
    if (c.is_array()) return std::any_of(c.begin(), c.end(), has_sp_component);
    if (!c.is_object()) return false;
    if (const auto type = c.find("type"); type != c.end() && type->is_string()) {
      const std::string& t = type->get_ref<const std::string&>();
      if (t == "Metaspace" || t == "ByteFallback" || t == "Prepend") return true;
    }
    for (const char* list : {"pretokenizers", "normalizers", "decoders"})
      if (const auto l = c.find(list); l != c.end() && has_sp_component(*l)) return true;
    return false;
  };
  if (const auto model = j.find("model"); model != j.end() && model->is_object()) {
    const auto fallback = model->find("byte_fallback");
    if (fallback != model->end() && fallback->is_boolean() && fallback->get<bool>()) return true;
  }
  for (const char* part : {"normalizer", "pre_tokenizer", "decoder"})
    if (const auto c = j.find(part); c != j.end() && has_sp_component(*c)) return true;
  return false;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw Error("tokenizer file not found (or not a regular file)", {.file = path});
  {
    std::ifstream probe(path, std::ios::binary);
    if (!probe) throw Error("cannot open tokenizer file", {.file = path});
  }
  const fs::path p(path);
  const std::string name = p.filename().string();
  const std::string ext = p.extension().string();

  // GPT-2 layout: vocab.json beside merges.txt, or a prefixed pair (gpt2_vocab.json, gpt2_merges.txt).
  constexpr std::string_view kVocab = "vocab.json";
  if (name.size() >= kVocab.size() && name.compare(name.size() - kVocab.size(), kVocab.size(), kVocab) == 0) {
    const fs::path merges = p.parent_path() / (name.substr(0, name.size() - kVocab.size()) + "merges.txt");
    if (!fs::exists(merges, ec))
      throw Error(fmt::format("GPT-2 vocabulary {} needs {} beside it, which is missing", name,
                              merges.filename().string()),
                  {.file = merges.string()});
    return load_gpt2_bpe(path, merges.string());
  }
  if (ext == ".json") return load_hf_tokenizer_json(path);  // tokenizer.json
  // tokenizer.model (or any other name): SentencePiece protobuf or tiktoken text, by content.
  if (is_sentencepiece_model(path)) return load_sentencepiece(path);
  if (looks_like_tiktoken(path)) return load_tiktoken(path);
  throw Error("neither a SentencePiece model (protobuf) nor a tiktoken file (base64 rank lines)", {.file = path});
}

// tokenizer.json is preferred when a directory also has tokenizer.model, as Hugging Face's fast
// tokenizers (AutoTokenizer's default) do, with one exception: Llama 2 and Mistral repositories
// ship a SentencePiece tokenizer.model and a tokenizer.json converted from it (Metaspace,
// byte fallback), which the byte-level BPE loader cannot read. There the original model is used:
// it is the same tokenizer (python sentencepiece's ids equal the slow and fast HF tokenizers' on
// ordinary text), and libsentencepiece is its reference implementation.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) throw Error("model directory not found", {.file = model_dir});
  const fs::path dir(model_dir);
  const fs::path json = dir / "tokenizer.json", model = dir / "tokenizer.model";
  if (fs::exists(json, ec)) {
    if (fs::exists(model, ec) && is_sentencepiece_model(model.string()) && is_sentencepiece_style_json(json))
      return load_sentencepiece(model.string());
    return load_tokenizer_file(json.string());
  }
  for (const fs::path& p : {model, dir / "vocab.json"})
    if (fs::exists(p, ec)) return load_tokenizer_file(p.string());
  return std::make_unique<ByteTokenizer>();
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& model_dir, int64_t vocab_size, bool reads_text) {
  // The largest vocabulary the byte-level fallback may stand in for: its 259 ids fit shardlm init's
  // small presets; real tokenizers have tens of thousands, and bytes would mean nothing to them.
  constexpr int64_t kByteFallbackMaxVocab = 4096;
  std::unique_ptr<Tokenizer> tok = load_tokenizer(model_dir);
  if (reads_text && dynamic_cast<const ByteTokenizer*>(tok.get()) && vocab_size >= kByteFallbackMaxVocab)
    throw Error(fmt::format("no tokenizer (tokenizer.json, tokenizer.model or vocab.json) for a vocabulary of {} "
                            "ids; copy the model's tokenizer files beside its config.json",
                            vocab_size),
                {.file = model_dir});
  if (tok->vocab_size() > vocab_size)
    throw Error(fmt::format("the {} tokenizer has {} ids but the model's vocab_size is {}: its last ids have no "
                            "embedding",
                            tok->name(), tok->vocab_size(), vocab_size),
                {.file = (fs::path(model_dir) / "config.json").string(), .key = "vocab_size"});
  return tok;
}

}  // namespace shardlm::data
