// Tokenizers turn text into token ids and back.
//
// The interface is what training and generation need; implementations are chosen from what a
// model directory holds. This file has the byte-level fallback used when a directory ships no
// tokenizer: ids 0..2 are <pad>, <s> (BOS) and </s> (EOS), as in Llama 2, and byte b is id 3 + b,
// so any text round-trips exactly and the vocabulary is 259.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlm::data {

// The type of a vocabulary entry, as SentencePiece names its pieces' types (and GGUF stores them).
enum class TokenKind : uint8_t { Normal, Unknown, Control, UserDefined, Unused, Byte };

// A whole vocabulary, for a format that embeds the tokenizer rather than pointing at its files (the
// GGUF export, model/gguf_export.h). Everything is by id, 0 .. vocab_size() - 1.
struct VocabularyExport {
  enum class Model : uint8_t { ByteLevelBpe, SentencePiece };
  Model model = Model::ByteLevelBpe;
  std::vector<std::string> pieces;  // as piece(id) spells them; "" for an id the vocabulary leaves unused
  std::vector<TokenKind> kinds;
  // SentencePiece: each piece's score; and whether its normalizer prepends a space (add_dummy_prefix).
  std::vector<float> scores;
  bool add_dummy_prefix = false;
  // Byte-level BPE: the merges in priority order, each side spelled as piece() spells it (tiktoken
  // files list none: they are recovered from the ranks, as Hugging Face's converter does), and the
  // pre-tokenizer's regexes, applied in order (Hugging Face's Split stages; a ByteLevel with
  // use_regex is GPT-2's pattern).
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> pre_patterns;
  int32_t unk = -1, pad = -1;  // -1: none
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // Encodes text without adding BOS/EOS (callers decide; see encode_with).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Decodes ids to text; special tokens (BOS, EOS, pad, chat markers) are dropped.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The id of a special or added token by its text ("<|eot_id|>", "[INST]" is not one: plain
  // text), or nullopt when this vocabulary has no such token.
  virtual std::optional<int32_t> special_token(std::string_view text) const = 0;
  // The piece an id stands for, as the vocabulary spells it ("▁the", "Ġthe", "<0x0A>"), for
  // inspection (`shardlm tokenize --pieces`).
  virtual std::string piece(int32_t id) const = 0;

  // The whole vocabulary (see VocabularyExport), or nullopt for a tokenizer that has none to give
  // (the byte-level fallback, which only shardlm understands).
  virtual std::optional<VocabularyExport> vocabulary() const { return std::nullopt; }

  std::vector<int32_t> encode_with(std::string_view text, bool bos, bool eos) const;
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kPad = 0, kBos = 1, kEos = 2, kFirstByte = 3;
  std::string name() const override { return "byte-level"; }
  int64_t vocab_size() const override { return 259; }
  int32_t bos_id() const override { return kBos; }
  int32_t eos_id() const override { return kEos; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::optional<int32_t> special_token(std::string_view text) const override;
  std::string piece(int32_t id) const override;
};

// The tokenizer for a model directory, chosen from what it holds:
//   tokenizer.json                       Hugging Face byte-level BPE (GPT-2, Llama 3, Qwen2 style)
//   tokenizer.model, SentencePiece proto  SentencePiece (Llama 2, Mistral)
//   tokenizer.model, "base64 rank" lines  tiktoken BPE (Llama 3)
//   vocab.json + merges.txt              GPT-2 byte-level BPE
//   none of these                        the byte-level fallback
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);
// load_tokenizer, checked against the model it serves (vocab_size from its config.json): every id
// the tokenizer can produce must exist in the model's embedding, and the byte-level fallback stands
// in only for byte-sized vocabularies (shardlm init's presets) where text is read at all
// (`reads_text`; the built-in addition task reads none). Errors name the model directory.
std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& model_dir, int64_t vocab_size, bool reads_text);
// A tokenizer from one file (tokenizer.json, tokenizer.model, or vocab.json beside merges.txt).
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path);

}  // namespace shardlm::data
