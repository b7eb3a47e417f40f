#include "data/dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/rng.h"
#include "io/read_file.h"
#include "ops/ops.h"

namespace shardlm::data {

TokenStreamDataset::TokenStreamDataset(std::vector<int32_t> tokens, int64_t seq_len)
    : tokens_(std::move(tokens)), seq_len_(seq_len) {
  SHARDLM_CHECK(seq_len >= 1, "sequence length must be >= 1, got {}", seq_len);
}

int64_t TokenStreamDataset::size() const {
  const int64_t n = int64_t(tokens_.size());
  return n <= seq_len_ ? 0 : (n - 1) / seq_len_;
}

Example TokenStreamDataset::get(int64_t index) const {
  const auto begin = tokens_.begin() + index * seq_len_;
  Example e;
  e.ids.assign(begin, begin + seq_len_);
  e.targets.assign(begin + 1, begin + seq_len_ + 1);
  return e;
}

size_t utf8_error_offset(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = cp << 6 | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::vector<int32_t> tokenize_text_file(const std::string& path, const Tokenizer& tok) {
  const std::string text = io::read_file(path, "text file");
  if (text.empty()) throw Error("the text file is empty", {.file = path});
  if (const size_t bad = utf8_error_offset(text); bad != std::string::npos)
    throw Error(fmt::format("invalid UTF-8 (byte 0x{:02X}); the data must be UTF-8 text", uint8_t(text[bad])),
                {.file = path, .line = 1 + std::count(text.begin(), text.begin() + int64_t(bad), '\n')});
  return tok.encode_with(text, true, true);
}

std::vector<int32_t> read_token_file(const std::string& path, int token_bytes, int64_t vocab_size) {
  SHARDLM_CHECK(token_bytes == 2 || token_bytes == 4, "token_bytes must be 2 or 4, got {}", token_bytes);
  const std::string bytes = io::read_file(path, "token file");
  if (bytes.size() % size_t(token_bytes) != 0)
    throw Error(fmt::format("size {} is not a multiple of {} bytes per token (truncated?)", bytes.size(), token_bytes),
                {.file = path});
  std::vector<int32_t> ids(bytes.size() / size_t(token_bytes));
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + i * size_t(token_bytes);
    uint32_t v = uint32_t(p[0]) | uint32_t(p[1]) << 8;
    if (token_bytes == 4) v |= uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    if (int64_t(v) >= vocab_size)
      throw Error(fmt::format("token {} at index {} (byte offset {}) is outside the vocabulary of {}", v, i,
                              i * size_t(token_bytes), vocab_size),
                  {.file = path});
    ids[i] = int32_t(v);
  }
  if (ids.empty()) throw Error("the token file is empty", {.file = path});
  return ids;
}

// ---- addition task ---------------------------------------------------------------------------

namespace {
bool is_held_out(int64_t a, int64_t b) {
  // A fixed 1-in-8 split by a hash of the pair, independent of seed and count.
  return philox4x32({uint32_t(a), uint32_t(b), 0x5eed, 0}, {0xadd, 0})[0] % 8 == 0;
}
}  // namespace

AdditionTask::AdditionTask(const Tokenizer& tok, int digits, bool held_out, int64_t count, uint64_t seed)
    : tok_(tok) {
  SHARDLM_CHECK(digits >= 1 && digits <= 9, "addition digits must be 1..9, got {}", digits);
  int64_t limit = 1;
  for (int i = 0; i < digits; ++i) limit *= 10;
  const uint64_t stream = stream_id(held_out ? "addition/held-out" : "addition/train");
  for (uint64_t i = 0; int64_t(problems_.size()) < count; ++i) {
    const auto r = philox4x32({uint32_t(i), uint32_t(i >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                              {uint32_t(seed), uint32_t(seed >> 32)});
    const int64_t a = int64_t(r[0] % uint32_t(limit)), b = int64_t(r[1] % uint32_t(limit));
    if (is_held_out(a, b) == held_out) problems_.emplace_back(a, b);
    SHARDLM_CHECK(i < uint64_t(count) * 64 + 1024, "cannot draw {} addition problems", count);
  }
}

std::string AdditionTask::prompt(int64_t index) const {
  const auto& [a, b] = problems_[size_t(index)];
  return fmt::format("{}+{}=", a, b);
}

std::string AdditionTask::answer(int64_t index) const {
  const auto& [a, b] = problems_[size_t(index)];
  return fmt::format("{}", a + b);
}

int64_t AdditionTask::max_tokens(int digits) { return 1 + (2 * digits + 2) + (digits + 1) + 1; }

Example AdditionTask::get(int64_t index) const {
  const std::vector<int32_t> p = tok_.encode_with(prompt(index), true, false);
  const std::vector<int32_t> a = tok_.encode_with(answer(index), false, true);
  std::vector<int32_t> seq = p;
  seq.insert(seq.end(), a.begin(), a.end());
  Example e;
  e.ids.assign(seq.begin(), seq.end() - 1);
  e.targets.assign(seq.begin() + 1, seq.end());
  // Loss only where the next token belongs to the answer: the prompt is given, not learned.
  for (size_t t = 0; t + 1 < p.size(); ++t) e.targets[t] = ops::kIgnoreIndex;
  return e;
}

// ---- batching --------------------------------------------------------------------------------

model::Batch BatchBuffers::batch() const {
  model::Batch b;
  b.B = B;
  b.T = T;
  b.ids = ids.data();
  b.targets = targets.data();
  if (!positions.empty()) b.positions = positions.data();
  if (!segments.empty()) b.segment_ids = segments.data();
  return b;
}

int64_t BatchBuffers::count_targets() const {
  return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t != ops::kIgnoreIndex; });
}

BatchBuffers make_batch(const std::vector<Example>& rows, int64_t T, int32_t pad_id) {
  BatchBuffers out;
  out.B = int64_t(rows.size());
  out.T = T;
  out.ids.assign(size_t(out.B * T), pad_id);
  out.targets.assign(size_t(out.B * T), ops::kIgnoreIndex);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t n = std::min<int64_t>(T, int64_t(rows[r].ids.size()));
    std::copy(rows[r].ids.begin(), rows[r].ids.begin() + n, out.ids.begin() + int64_t(r) * T);
    std::copy(rows[r].targets.begin(), rows[r].targets.begin() + n, out.targets.begin() + int64_t(r) * T);
  }
  return out;
}

ConcatDataset::ConcatDataset(std::vector<std::unique_ptr<Dataset>> parts) : parts_(std::move(parts)), begins_{0} {
  for (const auto& p : parts_) begins_.push_back(begins_.back() + p->size());
}

std::pair<const Dataset*, int64_t> ConcatDataset::locate(int64_t index) const {
  SHARDLM_CHECK(index >= 0 && index < size(), "example {} is outside a dataset of {}", index, size());
  const size_t k = size_t(std::upper_bound(begins_.begin(), begins_.end(), index) - begins_.begin()) - 1;
  return {parts_[k].get(), index - begins_[k]};
}

Example ConcatDataset::get(int64_t index) const {
  const auto [part, i] = locate(index);
  return part->get(i);
}

int64_t ConcatDataset::length(int64_t index) const {
  const auto [part, i] = locate(index);
  return part->length(i);
}

}  // namespace shardlm::data
