// Datasets of training examples and the batcher that turns them into model::Batch.
// Owner: the data pipeline (src/data; see docs/data.md).
//
// An Example is one row: input ids and aligned targets (targets[t] is the token to predict
// after ids[0..t]; kIgnoreIndex where there is no loss). Datasets index examples; the batcher
// pads rows to the batch's sequence length and fills the i32 arrays the model reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
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
  // Input tokens of example `index` (what packing needs), without building the example where
  // a dataset can tell.
  virtual int64_t length(int64_t index) const { return int64_t(get(index).ids.size()); }
};

// Examples held in memory (instruction and chat data, rendered once at load).
class ExampleDataset final : public Dataset {
 public:
  explicit ExampleDataset(std::vector<Example> examples) : examples_(std::move(examples)) {}
  int64_t size() const override { return int64_t(examples_.size()); }
  Example get(int64_t index) const override { return examples_[size_t(index)]; }
  int64_t length(int64_t index) const override { return int64_t(examples_[size_t(index)].ids.size()); }
  const std::vector<Example>& examples() const { return examples_; }

 private:
  std::vector<Example> examples_;
};

// Datasets one after another (a mixture's sources, data/run_data.h): example i of part k is
// example begin(k) + i. Owns its parts.
class ConcatDataset final : public Dataset {
 public:
  explicit ConcatDataset(std::vector<std::unique_ptr<Dataset>> parts);
  int64_t size() const override { return begins_.back(); }
  Example get(int64_t index) const override;
  int64_t length(int64_t index) const override;
  int64_t begin(size_t part) const { return begins_[part]; }

 private:
  std::pair<const Dataset*, int64_t> locate(int64_t index) const;
  std::vector<std::unique_ptr<Dataset>> parts_;
  std::vector<int64_t> begins_;  // parts_.size() + 1 offsets
};

// The byte offset of the first byte that is not part of valid UTF-8 (overlong forms, surrogates
// and code points above U+10FFFF are invalid), or std::string_view::npos when all is valid.
size_t utf8_error_offset(std::string_view s);

// A token stream cut into windows of seq_len + 1 tokens (inputs = window[0..T), targets =
// window[1..T]), one every seq_len tokens: window i is tokens [i T, i T + T], so each window's last
// token is the next window's first (an input there, never a second target), and every token after
// the first is a target exactly once. A final window short of T + 1 tokens is dropped.
class TokenStreamDataset final : public Dataset {
 public:
  TokenStreamDataset(std::vector<int32_t> tokens, int64_t seq_len);
  int64_t size() const override;
  Example get(int64_t index) const override;
  int64_t length(int64_t) const override { return seq_len_; }
  int64_t num_tokens() const { return int64_t(tokens_.size()); }

 private:
  std::vector<int32_t> tokens_;
  int64_t seq_len_;
};

// Reads a whole text file and tokenizes it (BOS at the start, EOS at the end). Text that is not
// UTF-8 is an error naming the file and line.
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
