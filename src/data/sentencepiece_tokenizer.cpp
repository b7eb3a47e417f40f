// SentencePiece tokenizers (Llama 2, Mistral) through Debian's libsentencepiece.
// Owner: the SentencePiece tokenizer work (load_sentencepiece, is_sentencepiece_model).
//
// Encoding is the library's own: the model's normalizer spec (Llama 2: identity rule,
// add_dummy_prefix, no whitespace folding) and its BPE with byte fallback. So ids equal
// python sentencepiece's `sp.encode(text)` and Hugging Face's slow (legacy) LlamaTokenizer;
// tests/test_sentencepiece.cpp checks that on every Alpaca demo text.
#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <unordered_set>

#include "core/error.h"
#include "io/read_file.h"

namespace shardlm::data {

namespace {

// The library's public API tells control, unknown, unused and byte pieces apart but not
// user-defined ones (its ModelProto header is not installed), and special_token() must report
// those too. So read the piece types from the serialized ModelProto directly: it is a sequence
// of protobuf fields where field 1 (length-delimited) is one SentencePiece message per piece, in
// id order, whose field 3 (varint) is its type (USER_DEFINED = 4).
class ProtoReader {
 public:
  ProtoReader(const char* p, size_t n) : p_(reinterpret_cast<const unsigned char*>(p)), end_(p_ + n) {}
  bool done() const { return p_ >= end_; }
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && p_ < end_; shift += 7) {
      const unsigned char b = *p_++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // Reads one field header and its payload; for wire type 2 `sub` is the payload.
  bool field(uint32_t& number, uint32_t& wire, uint64_t& value, ProtoReader& sub) {
    uint64_t key = 0;
    if (!varint(key)) return false;
    number = uint32_t(key >> 3);
    wire = uint32_t(key & 7);
    switch (wire) {
      case 0: return varint(value);
      case 1: return skip(8);
      case 5: return skip(4);
      case 2: {
        uint64_t len = 0;
        if (!varint(len) || len > uint64_t(end_ - p_)) return false;
        sub = ProtoReader(reinterpret_cast<const char*>(p_), size_t(len));
        p_ += len;
        return true;
      }
      default: return false;  // groups are not used by sentencepiece_model.proto
    }
  }

 private:
  bool skip(size_t n) {
    if (n > size_t(end_ - p_)) return false;
    p_ += n;
    return true;
  }
  const unsigned char* p_;
  const unsigned char* end_;
};

std::unordered_set<int32_t> user_defined_ids(const std::string& model_bytes) {
  constexpr uint64_t kUserDefined = 4;
  std::unordered_set<int32_t> ids;
  ProtoReader top(model_bytes.data(), model_bytes.size());
  int32_t index = 0;
  while (!top.done()) {
    uint32_t number = 0, wire = 0;
    uint64_t value = 0;
    ProtoReader piece(nullptr, 0);
    if (!top.field(number, wire, value, piece)) break;  // the library accepted it; be lenient
    if (number != 1 || wire != 2) continue;
    while (!piece.done()) {
      uint32_t n = 0, w = 0;
      uint64_t v = 0;
      ProtoReader unused(nullptr, 0);
      if (!piece.field(n, w, v, unused)) break;
      if (n == 3 && w == 0 && v == kUserDefined) ids.insert(index);
    }
    ++index;
  }
  return ids;
}

// NormalizerSpec.add_dummy_prefix (ModelProto field 3, its field 3; proto2 default true): whether
// the normalizer prepends a space to the text, which a format embedding the vocabulary must repeat.
bool add_dummy_prefix(const std::string& model_bytes) {
  bool add = true;
  ProtoReader top(model_bytes.data(), model_bytes.size());
  while (!top.done()) {
    uint32_t number = 0, wire = 0;
    uint64_t value = 0;
    ProtoReader spec(nullptr, 0);
    if (!top.field(number, wire, value, spec)) break;
    if (number != 3 || wire != 2) continue;
    while (!spec.done()) {
      uint32_t n = 0, w = 0;
      uint64_t v = 0;
      ProtoReader unused(nullptr, 0);
      if (!spec.field(n, w, v, unused)) break;
      if (n == 3 && w == 0) add = v != 0;
    }
  }
  return add;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    const std::string bytes = io::read_file(path, "tokenizer file");
    const auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok())
      throw Error(fmt::format("not a valid SentencePiece model: {}", status.ToString()), {.file = path});
    if (sp_.GetPieceSize() <= 0) throw Error("SentencePiece model has no pieces", {.file = path});
    user_defined_ = user_defined_ids(bytes);
    add_dummy_prefix_ = add_dummy_prefix(bytes);
  }

  std::string name() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(absl::string_view(text.data(), text.size()), &ids);
    if (!status.ok()) throw Error(fmt::format("SentencePiece encode failed: {}", status.ToString()), {.file = path_});
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  // Control pieces (<s>, </s>, <pad>) decode to nothing in the library already; <unk> would
  // decode to " ⁇ ", and ids outside the vocabulary (a model's padded embedding rows) would make
  // the whole decode fail. Both are dropped, as Hugging Face's decode(skip_special_tokens=True)
  // does. Byte-fallback pieces (<0x0A>) decode to their bytes.
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<int> kept;
    kept.reserve(ids.size());
    const int32_t n = sp_.GetPieceSize();
    for (int32_t id : ids)
      if (id >= 0 && id < n && !sp_.IsControl(id) && !sp_.IsUnknown(id)) kept.push_back(id);
    std::string text;
    const auto status = sp_.Decode(kept, &text);
    if (!status.ok()) throw Error(fmt::format("SentencePiece decode failed: {}", status.ToString()), {.file = path_});
    return text;
  }

  std::optional<int32_t> special_token(std::string_view text) const override {
    const int id = sp_.PieceToId(absl::string_view(text.data(), text.size()));
    // PieceToId answers unk_id for text that is no piece at all: confirm the spelling.
    if (id < 0 || id >= sp_.GetPieceSize() || sp_.IdToPiece(id) != text) return std::nullopt;
    if (sp_.IsControl(id) || sp_.IsUnknown(id) || user_defined_.count(id)) return id;
    return std::nullopt;
  }

  std::string piece(int32_t id) const override {
    if (id < 0 || id >= sp_.GetPieceSize())
      throw Error(fmt::format("token id {} outside the vocabulary of {} pieces", id, sp_.GetPieceSize()),
                  {.file = path_});
    return sp_.IdToPiece(id);
  }

  std::optional<VocabularyExport> vocabulary() const override {
    VocabularyExport v;
    v.model = VocabularyExport::Model::SentencePiece;
    v.add_dummy_prefix = add_dummy_prefix_;
    const int32_t n = sp_.GetPieceSize();
    v.pieces.resize(size_t(n));
    v.kinds.resize(size_t(n));
    v.scores.resize(size_t(n));
    for (int32_t id = 0; id < n; ++id) {
      v.pieces[size_t(id)] = sp_.IdToPiece(id);
      v.scores[size_t(id)] = sp_.GetScore(id);
      TokenKind k = TokenKind::Normal;
      if (sp_.IsUnknown(id)) k = TokenKind::Unknown;
      else if (sp_.IsControl(id)) k = TokenKind::Control;
      else if (sp_.IsUnused(id)) k = TokenKind::Unused;
      else if (sp_.IsByte(id)) k = TokenKind::Byte;
      else if (user_defined_.count(id)) k = TokenKind::UserDefined;
      v.kinds[size_t(id)] = k;
    }
    v.unk = sp_.unk_id();
    v.pad = sp_.pad_id();
    return v;
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
  std::unordered_set<int32_t> user_defined_;
  bool add_dummy_prefix_ = true;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

bool is_sentencepiece_model(const std::string& path) {
  std::string bytes;
  try {
    bytes = io::read_file(path, "tokenizer file");
  } catch (const Error&) {
    return false;
  }
  // A serialized ModelProto starts with field 1, length-delimited: the byte 0x0A. Text formats
  // (tiktoken's "IQ== 0" lines, JSON) never do, so they are told apart without a parse.
  if (bytes.empty() || bytes[0] != '\x0a') return false;
  sentencepiece::SentencePieceProcessor sp;
  return sp.LoadFromSerializedProto(bytes).ok() && sp.GetPieceSize() > 0;
}

}  // namespace shardlm::data
