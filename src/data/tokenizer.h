// Tokenizers turn text into token ids and back.
//
// The interface is what training and generation need; implementations are chosen from what a
// model directory holds. This file has the byte-level fallback used when a directory ships no
// tokenizer: ids 0..2 are <pad>, <s> (BOS) and </s> (EOS), as in Llama 2, and byte b is id 3 + b,
// so any text round-trips exactly and the vocabulary is 259.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // Encodes text without adding BOS/EOS (callers decide; see encode_with).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Decodes ids to text; special tokens (BOS, EOS, pad) are dropped.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;

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
};

// The tokenizer for a model directory: the byte-level one when the directory has no tokenizer
// files. (SentencePiece, tiktoken and tokenizer.json support come with the data layer.)
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);

}  // namespace shardlm::data
