// Byte-level BPE: one engine behind three file formats (see bpe_tokenizer.h).
//
// The engine works on raw bytes everywhere. tiktoken files already spell tokens as raw bytes;
// vocab.json / tokenizer.json spell them in GPT-2's byte-to-unicode alphabet, which is undone at
// load time. Encoding a text:
//   1. non-special added tokens (tokenizer.json only) are cut out and emitted as their ids;
//   2. each remaining segment is split into pre-tokens by the model's regex (PCRE2, JIT) —
//      matches and any unmatched gaps between them, as Hugging Face's Split "Isolated" does;
//   3. each pre-token becomes ids: whole when it is itself a token and the model says so
//      (tiktoken always, tokenizer.json with ignore_merges), else by byte-pair merging.
// Merging repeatedly joins the adjacent pair of lowest rank, leftmost on ties. The rank is the
// concatenation's rank for tiktoken and the merge's line in the merges list for the Hugging Face
// formats; for Llama 3 and GPT-2 the two orders coincide.
#include "data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "io/json_parse.h"
#include "io/read_file.h"

namespace shardlm::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- GPT-2's byte-to-unicode alphabet ---------------------------------------------------------
// Printable bytes (33..126, 161..172, 174..255) stand for themselves; the other 68 bytes map, in
// byte order, to code points 256, 257, ... so every token is a printable string.
struct ByteAlphabet {
  std::array<uint32_t, 256> code_point{};
  std::array<int16_t, 256 + 68> byte{};  // by code point; -1 for none
  ByteAlphabet() {
    byte.fill(-1);
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      code_point[b] = printable ? b : extra++;
      byte[code_point[b]] = int16_t(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// Raw bytes of a token spelled in the alphabet; false when it holds any other character. Every
// code point of the alphabet is below 0x800, so only 1- and 2-byte UTF-8 sequences can occur.
bool alphabet_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  const auto& a = alphabet();
  for (size_t i = 0; i < s.size();) {
    const auto c = uint8_t(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size() && (uint8_t(s[i + 1]) & 0xC0) == 0x80) {
      cp = (uint32_t(c & 0x1F) << 6) | (uint8_t(s[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;
    }
    if (cp >= a.byte.size() || a.byte[cp] < 0) return false;
    out.push_back(char(a.byte[cp]));
  }
  return true;
}

std::string bytes_to_alphabet(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    const uint32_t cp = alphabet().code_point[b];
    if (cp < 0x80) {
      out.push_back(char(cp));
    } else {
      out.push_back(char(0xC0 | (cp >> 6)));
      out.push_back(char(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

// ---- small helpers ------------------------------------------------------------------------------
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Calls fn(line_number, line) for each non-empty line of `text`: numbers are 1-based (counting
// empty lines too, so errors point at the right line) and a "\r\n" ending is trimmed.
template <class Fn>
void for_each_line(std::string_view text, Fn fn) {
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) fn(line_no, line);
  }
}

json parse_json_file(const std::string& path) {
  const std::string text = io::read_file(path, "tokenizer file");
  try {
    return io::parse_json(text);
  } catch (const json::exception& e) {
    throw Error(fmt::format("invalid JSON: {}", e.what()), {.file = path});
  }
}

// j[key], or null when absent (json's const operator[] must not be asked for a missing key).
const json& member(const json& j, const char* key) {
  static const json null;
  if (!j.is_object()) return null;
  const auto it = j.find(key);
  return it == j.end() ? null : *it;
}

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

// ---- PCRE2 ---------------------------------------------------------------------------------------
std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return reinterpret_cast<const char*>(buf.data());
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};
using MatchData = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

// One pre-tokenizer regex. UCP makes \s, \p{L} etc. Unicode-aware; MATCH_INVALID_UTF lets
// text that is not valid UTF-8 through (invalid bytes never match, so they end up in gaps and
// still reach the byte-level model).
class Regex {
 public:
  Regex(const std::string& pattern, bool literal) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &offset,
                          nullptr);
    if (!code_)
      throw Error(fmt::format("pre-tokenizer regex does not compile at offset {}: {}", offset, pcre2_message(err)));
    // Without JIT support (some platforms) the interpreter gives the same matches, only slower.
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls emit(piece) for every match and every non-empty gap between matches, in text order,
  // so the pieces concatenate to `text`.
  template <class F>
  void split(std::string_view text, pcre2_match_data* md, F&& emit) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t n = text.size();
    size_t pos = 0, gap = 0;
    while (pos < n) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, n, pos, 0, md, nullptr)
                          : pcre2_match(code_, subject, n, pos, 0, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      // rc == 0 only says the ovector is too small for the capture groups; the match is there.
      if (rc < 0) throw Error(fmt::format("pre-tokenizer regex failed: {}", pcre2_message(rc)));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t start = ov[0], end = ov[1];  // copied: emit may reuse md for a later stage
      if (end == start) {  // an empty match: step over one character and keep the gap open
        pos = start + 1;
        while (pos < n && (uint8_t(text[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (start > gap) emit(text.substr(gap, start - gap));
      emit(text.substr(start, end - start));
      pos = gap = end;
    }
    if (gap < n) emit(text.substr(gap));
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ---- the engine ---------------------------------------------------------------------------------
enum class Kind : uint8_t { kUnused, kToken, kSpecial, kAdded };

struct Merge {
  int32_t rank;
  int32_t id;  // the merged token
};

struct PreTokenizerStage {
  std::string pattern;
  bool literal = false;
};

// Everything a loader decides; BpeTokenizer checks it and compiles the regexes.
struct BpeSpec {
  std::string name;
  std::string source;                      // the file, for error messages
  std::vector<std::string> bytes;          // by id: raw bytes of regular tokens, text of added ones
  std::vector<Kind> kinds;                 // by id
  std::unordered_map<uint64_t, Merge> merges;  // empty: rank of a pair = rank of its concatenation
  bool whole_pretoken_first = false;       // emit a pre-token that is a token without merging
  std::vector<PreTokenizerStage> stages;   // applied in order, each splitting the previous pieces
  bool add_prefix_space = false;
  std::vector<std::pair<std::string, int32_t>> aliases;  // extra names for special tokens
  int32_t bos = -1, eos = -1;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec)
      : name_(std::move(spec.name)),
        bytes_(std::move(spec.bytes)),
        kinds_(std::move(spec.kinds)),
        merges_(std::move(spec.merges)),
        whole_first_(spec.whole_pretoken_first),
        add_prefix_space_(spec.add_prefix_space),
        bos_(spec.bos),
        eos_(spec.eos) {
    byte_ids_.fill(-1);
    ranks_.reserve(bytes_.size());
    for (size_t id = 0; id < bytes_.size(); ++id) {
      if (kinds_[id] == Kind::kToken) {
        ranks_.emplace(bytes_[id], int32_t(id));
        if (bytes_[id].size() == 1) byte_ids_[uint8_t(bytes_[id][0])] = int32_t(id);
      } else if (kinds_[id] != Kind::kUnused) {
        specials_.emplace(bytes_[id], int32_t(id));
        if (kinds_[id] == Kind::kAdded) added_.emplace_back(bytes_[id]);
      }
    }
    if (ranks_.size() != size_t(std::count(kinds_.begin(), kinds_.end(), Kind::kToken)))
      throw Error("two tokens have the same bytes", {.file = spec.source});
    // Byte-level BPE starts from single bytes, so a text can only be encoded if all 256 are tokens.
    for (int b = 0; b < 256; ++b)
      if (byte_ids_[b] < 0)
        throw Error(fmt::format("byte 0x{:02X} has no token; not a byte-level BPE vocabulary", b),
                    {.file = spec.source});
    for (auto& [text, id] : spec.aliases) specials_.emplace(text, id);
    try {
      for (const auto& s : spec.stages) {
        regexes_.push_back(std::make_unique<Regex>(s.pattern, s.literal));
        patterns_.push_back(s.literal ? "\\Q" + s.pattern + "\\E" : s.pattern);
      }
    } catch (Error& e) {
      e.set_file(spec.source);
      throw;
    }
  }

  std::string name() const override { return name_; }
  int64_t vocab_size() const override { return int64_t(bytes_.size()); }
  // -1 when the vocabulary has no such token (Qwen2 has no BOS).
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 1);
    MatchData md(pcre2_match_data_create(1, nullptr));
    if (!md) throw std::bad_alloc();
    std::string prefixed;
    for_each_segment(text, [&](std::string_view segment, int32_t added_id) {
      if (added_id >= 0) {
        ids.push_back(added_id);
        return;
      }
      // Hugging Face's ByteLevel(add_prefix_space) makes a leading word look like a later one.
      if (add_prefix_space_ && segment[0] != ' ') {
        prefixed.assign(1, ' ');
        prefixed.append(segment);
        segment = prefixed;
      }
      pretokenize(segment, 0, md.get(), [&](std::string_view piece) { encode_pretoken(piece, ids); });
    });
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || size_t(id) >= bytes_.size()) continue;
      if (kinds_[id] == Kind::kToken || kinds_[id] == Kind::kAdded) out += bytes_[id];
    }
    return out;
  }

  std::optional<int32_t> special_token(std::string_view text) const override {
    const auto it = specials_.find(text);
    if (it == specials_.end()) return std::nullopt;
    return it->second;
  }

  std::string piece(int32_t id) const override {
    if (id < 0 || size_t(id) >= bytes_.size() || kinds_[id] == Kind::kUnused) return "<unk>";
    if (kinds_[id] == Kind::kToken) return bytes_to_alphabet(bytes_[id]);
    return bytes_[id];
  }

  std::optional<VocabularyExport> vocabulary() const override {
    VocabularyExport v;
    v.model = VocabularyExport::Model::ByteLevelBpe;
    v.pre_patterns = patterns_;
    const size_t n = bytes_.size();
    v.pieces.resize(n);
    v.kinds.resize(n);
    for (size_t id = 0; id < n; ++id) {
      switch (kinds_[id]) {
        case Kind::kUnused: v.kinds[id] = TokenKind::Unused; break;
        case Kind::kToken: v.kinds[id] = TokenKind::Normal; break;
        case Kind::kSpecial: v.kinds[id] = TokenKind::Control; break;
        case Kind::kAdded: v.kinds[id] = TokenKind::UserDefined; break;
      }
      if (kinds_[id] != Kind::kUnused) v.pieces[id] = piece(int32_t(id));
    }
    if (!merges_.empty()) {
      std::vector<std::pair<int32_t, uint64_t>> by_rank;  // (rank, pair key)
      by_rank.reserve(merges_.size());
      for (const auto& [key, m] : merges_) by_rank.emplace_back(m.rank, key);
      std::sort(by_rank.begin(), by_rank.end());
      v.merges.reserve(by_rank.size());
      for (const auto& [rank, key] : by_rank)
        v.merges.emplace_back(v.pieces[size_t(key >> 32)], v.pieces[size_t(key & 0xffffffffu)]);
    } else {
      v.merges = recover_merges();
    }
    return v;
  }

 private:
  // Calls f(segment, -1) for text between non-special added tokens and f("", id) for each of
  // them; the earliest occurrence wins, the longest among those starting at the same byte.
  template <class F>
  void for_each_segment(std::string_view text, F&& f) const {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t best = std::string_view::npos, best_len = 0;
      for (const auto& a : added_) {
        const size_t at = text.find(a, pos);
        if (at != std::string_view::npos && (at < best || (at == best && a.size() > best_len))) {
          best = at;
          best_len = a.size();
        }
      }
      const size_t end = best == std::string_view::npos ? text.size() : best;
      if (end > pos) f(text.substr(pos, end - pos), -1);
      if (best == std::string_view::npos) break;
      f(std::string_view{}, specials_.find(text.substr(best, best_len))->second);
      pos = best + best_len;
    }
  }

  template <class F>
  void pretokenize(std::string_view s, size_t stage, pcre2_match_data* md, F&& emit) const {
    if (stage == regexes_.size()) {
      emit(s);
      return;
    }
    regexes_[stage]->split(s, md, [&](std::string_view piece) { pretokenize(piece, stage + 1, md, emit); });
  }

  void encode_pretoken(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
      out.push_back(byte_ids_[uint8_t(piece[0])]);
      return;
    }
    if (whole_first_) {
      const auto it = ranks_.find(piece);
      if (it != ranks_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    // Long pre-tokens (runs of spaces, minified data) are rare and would only flood the cache.
    const bool cacheable = piece.size() <= kMaxCachedBytes;
    const size_t hash = StringHash{}(piece);
    CacheShard& shard = cache_[(hash >> 8) % kCacheShards];
    if (cacheable) {
      std::lock_guard lock(shard.mutex);
      const auto it = shard.map.find(piece);
      if (it != shard.map.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first = out.size();
    merge(piece, out);
    if (cacheable) {
      std::lock_guard lock(shard.mutex);
      if (shard.map.size() >= kCacheEntriesPerShard) shard.map.clear();  // crude bound, rarely hit
      shard.map.emplace(std::string(piece), std::vector<int32_t>(out.begin() + int64_t(first), out.end()));
    }
  }

  // The merge a pair of adjacent parts [left, right) + [right, end) would make, if any.
  std::optional<Merge> pair_merge(std::string_view piece, int32_t left_id, int32_t right_id, int32_t left,
                                  int32_t end) const {
    if (merges_.empty()) {  // tiktoken: a pair merges when its bytes are a token, ranked by it
      const auto it = ranks_.find(piece.substr(size_t(left), size_t(end - left)));
      if (it == ranks_.end()) return std::nullopt;
      return Merge{it->second, it->second};
    }
    const auto it = merges_.find(pair_key(left_id, right_id));
    if (it == merges_.end()) return std::nullopt;
    return it->second;
  }

  // Byte-pair merging of one pre-token in O(n log n): a doubly linked list of parts over the
  // bytes and a min-heap of candidate merges ordered by (rank, position). Candidates are not
  // removed when a neighbour changes; they are checked when popped instead (lazy deletion).
  void merge(std::string_view piece, std::vector<int32_t>& out) const {
    struct Candidate {
      int32_t rank, left, right, end, id;
    };
    struct Later {
      bool operator()(const Candidate& a, const Candidate& b) const {
        return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
      }
    };
    // Scratch reused across calls on this thread: most pre-tokens are short and frequent.
    thread_local std::vector<int32_t> next, prev, ids;
    thread_local std::vector<Candidate> heap;
    const auto n = int32_t(piece.size());
    next.resize(size_t(n));
    prev.resize(size_t(n));
    ids.resize(size_t(n));
    heap.clear();
    // Part i covers bytes [i, next[i]) while ids[i] >= 0.
    for (int32_t i = 0; i < n; ++i) {
      next[size_t(i)] = i + 1;
      prev[size_t(i)] = i - 1;
      ids[size_t(i)] = byte_ids_[uint8_t(piece[size_t(i)])];
    }
    auto consider = [&](int32_t left) {
      const int32_t right = next[size_t(left)];
      if (right >= n) return;
      const int32_t end = next[size_t(right)];
      if (auto m = pair_merge(piece, ids[size_t(left)], ids[size_t(right)], left, end))
      {
        heap.push_back({m->rank, left, right, end, m->id});
        std::push_heap(heap.begin(), heap.end(), Later{});
      }
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), Later{});
      const Candidate c = heap.back();
      heap.pop_back();
      // Stale unless both parts still span exactly what they spanned when this was pushed.
      if (ids[size_t(c.left)] < 0 || next[size_t(c.left)] != c.right || next[size_t(c.right)] != c.end) continue;
      ids[size_t(c.left)] = c.id;
      ids[size_t(c.right)] = -1;
      next[size_t(c.left)] = c.end;
      if (c.end < n) prev[size_t(c.end)] = c.left;
      if (prev[size_t(c.left)] >= 0) consider(prev[size_t(c.left)]);
      consider(c.left);
    }
    for (int32_t i = 0; i < n; i = next[size_t(i)]) out.push_back(ids[size_t(i)]);
  }

  // A tiktoken file ranks tokens, not merges: a pair of adjacent parts merges when their
  // concatenation is a token, with that token's rank as its priority. The merges list that encodes
  // the same way (transformers' tiktoken converter; Llama 3's tokenizer.json has these 280147) is
  // every split of every token into two tokens, ordered by the token's rank, then by the ranks of
  // the left and right parts.
  std::vector<std::pair<std::string, std::string>> recover_merges() const {
    std::vector<std::pair<std::string, std::string>> merges;
    std::vector<std::pair<int32_t, int32_t>> splits;  // (left id, right id) of one token
    for (size_t id = 0; id < bytes_.size(); ++id) {
      if (kinds_[id] != Kind::kToken || bytes_[id].size() < 2) continue;
      const std::string_view token = bytes_[id];
      splits.clear();
      for (size_t cut = 1; cut < token.size(); ++cut) {
        const auto l = ranks_.find(token.substr(0, cut)), r = ranks_.find(token.substr(cut));
        if (l != ranks_.end() && r != ranks_.end()) splits.emplace_back(l->second, r->second);
      }
      std::sort(splits.begin(), splits.end());
      for (const auto& [l, r] : splits) merges.emplace_back(piece(l), piece(r));
    }
    return merges;
  }

  static constexpr size_t kMaxCachedBytes = 256;
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheEntriesPerShard = 1 << 15;
  struct CacheShard {
    std::mutex mutex;
    StringMap<std::vector<int32_t>> map;
  };

  std::string name_;
  std::vector<std::string> bytes_;
  std::vector<Kind> kinds_;
  std::unordered_map<uint64_t, Merge> merges_;
  bool whole_first_;
  bool add_prefix_space_;
  int32_t bos_, eos_;
  StringMap<int32_t> ranks_;     // raw bytes -> id of regular tokens
  std::array<int32_t, 256> byte_ids_{};
  StringMap<int32_t> specials_;  // text -> id of special and added tokens (and aliases)
  std::vector<std::string> added_;  // non-special added tokens, matched in encode
  std::vector<std::unique_ptr<Regex>> regexes_;
  std::vector<std::string> patterns_;  // the regexes' source (a literal stage quoted \Q...\E), for vocabulary()
  mutable std::array<CacheShard, kCacheShards> cache_;
};

// Places a token at `id`, growing the tables; false if the id is taken.
bool place(BpeSpec& spec, int64_t id, std::string bytes, Kind kind) {
  if (size_t(id) >= spec.bytes.size()) {
    spec.bytes.resize(size_t(id) + 1);
    spec.kinds.resize(size_t(id) + 1, Kind::kUnused);
  }
  if (spec.kinds[size_t(id)] != Kind::kUnused) return false;
  spec.bytes[size_t(id)] = std::move(bytes);
  spec.kinds[size_t(id)] = kind;
  return true;
}

// Ids beyond this are surely a corrupt file, and would make the tables absurdly large.
constexpr int64_t kMaxId = int64_t(1) << 26;

// The ids a JSON vocabulary file of this size can hold: each entry takes several bytes, so an id
// beyond the file's byte count leaves most of the table empty — a corrupt file, whose few bytes
// would otherwise size tables of gigabytes ({"a": 60000000} took 5.6 s and 3 GB).
int64_t id_limit(const std::string& path) {
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  return ec ? kMaxId : std::min<int64_t>(kMaxId, int64_t(bytes));
}

// Reads a vocabulary object {"token in the alphabet": id} (vocab.json, tokenizer.json's
// model.vocab). Tokens that are also added tokens may lie outside the alphabet; they are skipped
// here and placed as added tokens.
void read_vocab(const json& vocab, BpeSpec& spec, const std::string& source, const StringMap<int32_t>& added) {
  if (!vocab.is_object()) throw Error("vocabulary is not a JSON object", {.file = source});
  const int64_t limit = id_limit(source);
  std::string bytes;
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0)
      throw Error(fmt::format("token '{}' has no valid id", token), {.file = source});
    if (value.get<int64_t>() >= limit)
      throw Error(fmt::format("token '{}' has id {}, more ids than a file of {} bytes can list", token,
                              value.get<int64_t>(), limit),
                  {.file = source});
    if (const auto it = added.find(token); it != added.end() && it->second == value.get<int64_t>()) continue;
    if (!alphabet_to_bytes(token, bytes))
      throw Error(fmt::format("token '{}' is not spelled in the byte-level alphabet", token), {.file = source});
    if (!place(spec, value.get<int64_t>(), bytes, Kind::kToken))
      throw Error(fmt::format("id {} is given twice (token '{}')", value.get<int64_t>(), token), {.file = source});
  }
}

// Adds merge `rank` (left, right spelled in the alphabet). Returns an error message or "".
std::string add_merge(BpeSpec& spec, const StringMap<int32_t>& ids_by_bytes, std::string_view left,
                      std::string_view right, int32_t rank) {
  std::string l, r;
  if (!alphabet_to_bytes(left, l) || !alphabet_to_bytes(right, r))
    return fmt::format("merge '{} {}' is not spelled in the byte-level alphabet", left, right);
  const auto li = ids_by_bytes.find(l), ri = ids_by_bytes.find(r), mi = ids_by_bytes.find(l + r);
  if (li == ids_by_bytes.end() || ri == ids_by_bytes.end() || mi == ids_by_bytes.end())
    return fmt::format("merge '{} {}' uses or makes a token that is not in the vocabulary", left, right);
  // A repeated merge keeps its first (highest-priority) rank, as Hugging Face does.
  spec.merges.emplace(pair_key(li->second, ri->second), Merge{rank, mi->second});
  return "";
}

StringMap<int32_t> regular_ids(const BpeSpec& spec) {
  StringMap<int32_t> ids;
  ids.reserve(spec.bytes.size());
  for (size_t id = 0; id < spec.bytes.size(); ++id)
    if (spec.kinds[id] == Kind::kToken) ids.emplace(spec.bytes[id], int32_t(id));
  return ids;
}

std::optional<int32_t> find_token(const BpeSpec& spec, std::string_view text) {
  for (size_t id = 0; id < spec.bytes.size(); ++id)
    if (spec.kinds[id] != Kind::kUnused && spec.bytes[id] == text) return int32_t(id);
  return std::nullopt;
}

// ---- tiktoken base64 ------------------------------------------------------------------------
bool base64_decode(std::string_view in, std::string& out) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[uint8_t(digits[i])] = int8_t(i);
    return t;
  }();
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = (in[in.size() - 2] == '=') ? 2 : 1;
  const size_t body = in.size() - pad;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < body; ++i) {
    const int8_t v = table[uint8_t(in[i])];
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFF));
    }
  }
  // Leftover bits must be zero padding, or the text is not canonical base64.
  return (acc & ((1u << bits) - 1)) == 0;
}

}  // namespace

// ---- loaders --------------------------------------------------------------------------------------
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path) {
  const std::string text = io::read_file(path, "tokenizer file");
  BpeSpec spec;
  spec.name = "tiktoken (Llama 3)";
  spec.source = path;
  spec.bytes.reserve(128256);
  spec.kinds.reserve(128256);
  // A tiktoken file lists ranks 0..N-1 over its N lines, and Llama 3's special tokens take the ids
  // after them; a rank beyond N is a corrupt file, refused before it sizes the tables.
  int64_t ranks = 0;
  for_each_line(text, [&](int64_t, std::string_view) { ++ranks; });
  std::string bytes;
  int64_t max_rank = -1;
  for_each_line(text, [&](int64_t line_no, std::string_view line) {
    const size_t space = line.find(' ');
    if (space == std::string_view::npos)
      throw Error("expected \"<base64 token> <rank>\"", {.file = path, .line = line_no});
    const std::string_view b64 = line.substr(0, space), rank_text = line.substr(space + 1);
    if (!base64_decode(b64, bytes))
      throw Error(fmt::format("invalid base64 '{}'", b64), {.file = path, .line = line_no});
    int64_t rank = -1;
    const auto [end, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || end != rank_text.data() + rank_text.size() || rank < 0 || rank >= kMaxId)
      throw Error(fmt::format("invalid rank '{}'", rank_text), {.file = path, .line = line_no});
    if (rank >= ranks)
      throw Error(fmt::format("rank {} is beyond the file's {} ranks (they run from 0 to {})", rank, ranks, ranks - 1),
                  {.file = path, .line = line_no});
    if (!place(spec, rank, bytes, Kind::kToken))
      throw Error(fmt::format("rank {} is given twice", rank), {.file = path, .line = line_no});
    max_rank = std::max(max_rank, rank);
  });
  if (max_rank < 0) throw Error("no tokens", {.file = path});

  // Llama 3's special tokens, named as in Meta's llama3 tokenizer.py (Llama 3.0), follow the ranks.
  std::vector<std::string> specials = {
      "<|begin_of_text|>", "<|end_of_text|>",   "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
      "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>",
      "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"};
  for (int i = 5; specials.size() < 256; ++i) specials.push_back(fmt::format("<|reserved_special_token_{}|>", i));
  const int32_t first = int32_t(max_rank + 1);
  for (size_t i = 0; i < specials.size(); ++i) place(spec, first + int64_t(i), specials[i], Kind::kSpecial);
  // Llama 3.1 gave some reserved tokens names; accept those too when looking tokens up.
  spec.aliases = {{"<|finetune_right_pad_id|>", first + 4},
                  {"<|step_id|>", first + 5},
                  {"<|eom_id|>", first + 8},
                  {"<|python_tag|>", first + 10}};
  spec.bos = first;
  spec.eos = first + 1;
  spec.whole_pretoken_first = true;  // tiktoken emits a pre-token that is a token as it is
  spec.stages = {{kLlama3PreTokenizerPattern, false}};
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

std::unique_ptr<Tokenizer> load_gpt2_bpe(const std::string& vocab_json, const std::string& merges_txt) {
  BpeSpec spec;
  spec.name = "GPT-2 BPE";
  spec.source = vocab_json;
  read_vocab(parse_json_file(vocab_json), spec, vocab_json, {});
  // <|endoftext|> is a regular entry of vocab.json but acts as GPT-2's only special token.
  if (const auto eot = find_token(spec, "<|endoftext|>")) {
    spec.kinds[size_t(*eot)] = Kind::kSpecial;
    spec.bos = spec.eos = *eot;
  }
  const auto ids = regular_ids(spec);
  const std::string text = io::read_file(merges_txt, "tokenizer file");
  int32_t rank = 0;
  for_each_line(text, [&](int64_t line_no, std::string_view line) {
    if (line_no == 1 && line.starts_with("#version")) return;  // the header merges.txt files start with
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      throw Error("expected two tokens separated by one space", {.file = merges_txt, .line = line_no});
    const std::string err = add_merge(spec, ids, line.substr(0, space), line.substr(space + 1), rank++);
    if (!err.empty()) throw Error(err, {.file = merges_txt, .line = line_no});
  });
  spec.stages = {{kGpt2PreTokenizerPattern, false}};
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

namespace {

// tokenizer_config.json's bos_token/eos_token: a string, {"content": ...}, or null.
// Returns nullopt when the key is absent (then heuristics decide), -1 for null.
std::optional<int32_t> configured_token(const json& config, const char* key, const BpeSpec& spec,
                                        const std::string& config_path) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_null()) return -1;
  std::string text;
  if (v.is_string()) {
    text = v.get<std::string>();
  } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    text = v["content"].get<std::string>();
  } else {
    throw Error("expected a string, {\"content\": ...} or null", {.file = config_path, .key = key});
  }
  const auto id = find_token(spec, text);
  if (!id) throw Error(fmt::format("token '{}' is not in the vocabulary", text), {.file = config_path, .key = key});
  return *id;
}

// Reads one pre-tokenizer component of tokenizer.json into spec; `component` names it in errors.
void read_pre_tokenizer(const json& pt, BpeSpec& spec, bool& byte_level, const std::string& path,
                        const std::string& component) {
  const std::string type = pt.value("type", "");
  if (type == "ByteLevel") {
    byte_level = true;
    spec.add_prefix_space = pt.value("add_prefix_space", false);
    if (pt.value("use_regex", true)) spec.stages.push_back({kGpt2PreTokenizerPattern, false});
  } else if (type == "Split") {
    const json& pattern = member(pt, "pattern");
    const std::string behavior = pt.value("behavior", "");
    if (behavior != "Isolated" || pt.value("invert", false))
      throw Error(fmt::format("Split with behavior '{}'{} is not supported (only Isolated)", behavior,
                              pt.value("invert", false) ? " inverted" : ""),
                  {.file = path, .key = component});
    if (member(pattern, "Regex").is_string())
      spec.stages.push_back({member(pattern, "Regex").get<std::string>(), false});
    else if (member(pattern, "String").is_string())
      spec.stages.push_back({member(pattern, "String").get<std::string>(), true});
    else
      throw Error("Split has no Regex or String pattern", {.file = path, .key = component});
  } else if (type == "Sequence") {
    const json& list = member(pt, "pretokenizers");
    if (!list.is_array())
      throw Error("Sequence without a pretokenizers list", {.file = path, .key = component});
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(list[i], spec, byte_level, path, fmt::format("{}.pretokenizers[{}]", component, i));
  } else {
    throw Error(fmt::format("pre-tokenizer '{}' is not supported by the byte-level BPE tokenizer", type),
                {.file = path, .key = component});
  }
}

std::unique_ptr<Tokenizer> read_hf_tokenizer_json(const std::string& path) {
  const json doc = parse_json_file(path);
  if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object())
    throw Error("no \"model\" object", {.file = path});
  const json& model = doc["model"];
  const std::string type = model.value("type", "");
  if (type != "BPE")
    throw Error(fmt::format("model type '{}' is not supported (only byte-level BPE)", type),
                {.file = path, .key = "model.type"});
  // Llama 2 / Mistral tokenizer.json files are BPE too, but over SentencePiece pieces.
  if (model.value("byte_fallback", false))
    throw Error("byte_fallback BPE (SentencePiece-style) is not supported here; use tokenizer.model",
                {.file = path, .key = "model.byte_fallback"});
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(affix) && model[affix].is_string() && !model[affix].get<std::string>().empty())
      throw Error("is not supported", {.file = path, .key = fmt::format("model.{}", affix)});
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
    throw Error("BPE dropout is not supported", {.file = path, .key = "model.dropout"});

  BpeSpec spec;
  spec.name = "Hugging Face BPE (tokenizer.json)";
  spec.source = path;

  // Normalizers change the text before it is split. NFC is accepted as a no-op: text is nearly
  // always NFC already (documented limitation); anything else would change tokens silently.
  if (doc.contains("normalizer") && !doc["normalizer"].is_null()) {
    const std::string n = doc["normalizer"].value("type", "");
    if (n != "NFC")
      throw Error(fmt::format("normalizer '{}' is not supported", n), {.file = path, .key = "normalizer"});
  }
  bool byte_level = false;
  if (doc.contains("pre_tokenizer") && !doc["pre_tokenizer"].is_null())
    read_pre_tokenizer(doc["pre_tokenizer"], spec, byte_level, path, "pre_tokenizer");
  if (!byte_level)
    throw Error("no ByteLevel pre-tokenizer: not a byte-level BPE", {.file = path, .key = "pre_tokenizer"});

  // Added tokens: their content is plain text, not spelled in the alphabet.
  StringMap<int32_t> added;
  std::vector<std::tuple<int64_t, std::string, bool>> added_list;
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    const int64_t limit = id_limit(path);
    for (const json& t : doc["added_tokens"]) {
      if (!t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") || !t["content"].is_string())
        throw Error("an added token lacks an integer id or a content string", {.file = path, .key = "added_tokens"});
      const int64_t id = t["id"].get<int64_t>();
      if (id < 0 || id >= limit)
        throw Error(fmt::format("added token id {} out of range (a file of its size lists fewer ids)", id),
                    {.file = path});
      const std::string content = t["content"].get<std::string>();
      added_list.emplace_back(id, content, t.value("special", false));
      // One text, one id: a second id for the same content would make encoding ambiguous.
      if (const auto [it, fresh] = added.emplace(content, int32_t(id)); !fresh && it->second != id)
        throw Error(fmt::format("added token '{}' is given two ids, {} and {}", content, it->second, id),
                    {.file = path, .key = "added_tokens"});
    }
  }
  read_vocab(member(model, "vocab"), spec, path, added);
  for (auto& [id, content, special] : added_list) {
    if (size_t(id) < spec.kinds.size() && spec.kinds[size_t(id)] == Kind::kToken) {
      // An added token may repeat a vocabulary entry (GPT-2's <|endoftext|>); it becomes special.
      if (spec.bytes[size_t(id)] != content)
        throw Error(fmt::format("added token '{}' has id {} of token '{}'", content, id,
                                bytes_to_alphabet(spec.bytes[size_t(id)])),
                    {.file = path, .key = "added_tokens"});
      spec.kinds[size_t(id)] = special ? Kind::kSpecial : Kind::kAdded;
      continue;
    }
    if (!place(spec, id, content, special ? Kind::kSpecial : Kind::kAdded))
      throw Error(fmt::format("added token id {} is given twice", id), {.file = path, .key = "added_tokens"});
  }

  const auto ids = regular_ids(spec);
  const json& merges = member(model, "merges");
  if (!merges.is_array()) throw Error("is not an array", {.file = path, .key = "model.merges"});
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string err;
    if (m.is_string()) {  // "left right"
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        err = fmt::format("merge '{}' is not two tokens separated by one space", s);
      else
        err = add_merge(spec, ids, std::string_view(s).substr(0, space), std::string_view(s).substr(space + 1),
                        int32_t(i));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["left", "right"]
      err = add_merge(spec, ids, m[0].get_ref<const std::string&>(), m[1].get_ref<const std::string&>(), int32_t(i));
    } else {
      err = "a merge is neither \"left right\" nor [left, right]";
    }
    if (!err.empty()) throw Error(err, {.file = path, .key = fmt::format("model.merges[{}]", i)});
  }
  // ignore_merges (Llama 3): a pre-token that is a token is emitted whole, as tiktoken does.
  spec.whole_pretoken_first = model.value("ignore_merges", false);

  // BOS/EOS: tokenizer_config.json beside the file decides; without it, well-known names.
  std::optional<int32_t> bos, eos;
  const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    const json config = parse_json_file(config_path.string());
    bos = configured_token(config, "bos_token", spec, config_path.string());
    eos = configured_token(config, "eos_token", spec, config_path.string());
  }
  auto first_of = [&](std::initializer_list<const char*> names) -> int32_t {
    for (const char* n : names)
      if (const auto id = find_token(spec, n)) return *id;
    return -1;
  };
  // Qwen2-style vocabularies (with <|im_start|>) have no BOS; GPT-2 uses <|endoftext|> for both.
  const bool qwen_style = find_token(spec, "<|im_start|>").has_value();
  spec.bos = bos ? *bos
                 : (qwen_style ? first_of({"<|begin_of_text|>", "<s>"})
                               : first_of({"<|begin_of_text|>", "<s>", "<|endoftext|>"}));
  spec.eos = eos ? *eos : first_of({"<|end_of_text|>", "<|endoftext|>", "</s>"});
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  try {
    return read_hf_tokenizer_json(path);
  } catch (const json::exception& e) {
    // A field of an unexpected JSON type somewhere the reader did not check it one by one
    // (json::value() throws on a present key of another type): still one line naming the file.
    throw Error(fmt::format("unexpected JSON: {}", e.what()), {.file = path});
  }
}

}  // namespace shardlm::data
