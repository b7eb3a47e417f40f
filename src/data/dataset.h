// Datasets of training examples and the batcher that turns them into model::Batch.
//
// An Example is one row: input ids and aligned targets (targets[t] is the token to predict
// after ids[0..t]; kIgnoreIndex where there is no loss). Datasets index examples; the batcher
// pads rows to the batch's sequence length and fills the i32 arrays the model reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/llama.h"

namespace shardlm::data {

struct Example {
  std::vector<int32_t> ids;
  std::vector<int32_t> targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
};

// A token stream cut into windows of seq_len + 1 tokens (inputs = window[0..T), targets =
// window[1..T]). Windows do not overlap; a final partial window is dropped.
class TokenStreamDataset final : public Dataset {
 public:
  TokenStreamDataset(std::vector<int32_t> tokens, int64_t seq_len);
  int64_t size() const override;
  Example get(int64_t index) const override;
  int64_t num_tokens() const { return int64_t(tokens_.size()); }

 private:
  std::vector<int32_t> tokens_;
  int64_t seq_len_;
};

// Reads a whole text file and tokenizes it (BOS at the start, EOS at the end).
std::vector<int32_t> tokenize_text_file(const std::string& path, const Tokenizer& tok);
// Reads a pre-tokenized file of little-endian uint16 or uint32 ids (token_bytes 2 or 4) and
// checks every id against the vocabulary, naming the file and offset of the first bad one.
std::vector<int32_t> read_token_file(const std::string& path, int token_bytes, int64_t vocab_size);

// A built-in task the product generates itself (no downloads): "a+b=" -> "c" for operands of up
// to `digits` digits, loss on the answer and EOS only. The held-out split holds problems that never
// appear in training (split by a hash of the operands).
class AdditionTask final : public Dataset {
 public:
  AdditionTask(const Tokenizer& tok, int digits, bool held_out, int64_t count, uint64_t seed);
  int64_t size() const override { return int64_t(problems_.size()); }
  Example get(int64_t index) const override;
  std::string prompt(int64_t index) const;  // "37+45="
  std::string answer(int64_t index) const;  // "82"
  static int64_t max_tokens(int digits);    // BOS + prompt + answer + EOS, upper bound

 private:
  const Tokenizer& tok_;
  std::vector<std::pair<int64_t, int64_t>> problems_;
};

// Rows -> a padded batch of B x T. Rows longer than T are truncated.
struct BatchBuffers {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids, targets;
  std::vector<int32_t> positions, segments;  // empty, or B*T each for packed rows
  model::Batch batch() const;
  int64_t count_targets() const;  // non-ignored targets
};
BatchBuffers make_batch(const std::vector<Example>& rows, int64_t T, int32_t pad_id);

}  // namespace shardlm::data
