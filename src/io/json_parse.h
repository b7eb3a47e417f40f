// JSON read from files and requests, parsed with limits.
//
// nlohmann's parser keeps its own stack on the heap, but copying, dumping or walking a parsed value
// recurses once per level, so a value nested a million deep (a few MB of "[") overflows the stack
// wherever it is next used (issue 30: config.json and safetensors headers died on SIGSEGV). No
// config.json, tokenizer file, safetensors header, dataset record or request nests beyond a handful
// of levels, so every JSON shardlm reads goes through parse_json, which refuses a value nested
// deeper than kMaxJsonDepth while parsing.
//
// Every error is an nlohmann::json::parse_error, as json::parse throws for malformed text, so
// callers report it as they report any malformed JSON:
//   - a number past a double's range (1e400), which nlohmann throws as out_of_range, names the key
//     it was the value of: "number overflow parsing '1e400' (key 'temperature')";
//   - the text is bounded: nlohmann quotes the last token it read ("last read: '...'"), which for
//     an unterminated string is the rest of the input, and a 100 MB body or record must not come
//     back in an error line or an HTTP response.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace shardlm::io {

inline constexpr int kMaxJsonDepth = 128;
inline constexpr size_t kMaxJsonErrorChars = 240;  // of a parse error's reason

namespace detail {

// json::parse's callback: refuses an object or array opened at depth kMaxJsonDepth (the top level
// is depth 0), and notes each object key for the errors that do not say where they are.
class JsonLimits {
 public:
  explicit JsonLimits(std::string* key) : key_(key) {}
  bool operator()(int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) const {
    using E = nlohmann::json::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= kMaxJsonDepth)
      throw nlohmann::json::parse_error::create(
          101, 0, fmt::format("JSON nested deeper than {} levels (refused: no valid input nests so deep)", kMaxJsonDepth),
          nullptr);
    if (event == E::key) *key_ = parsed.get_ref<const std::string&>();
    return true;
  }

 private:
  std::string* key_;
};

// The reason in nlohmann's text "[json.exception.parse_error.N] parse error at line L, column C: WHY".
inline std::string reason(const char* what) {
  std::string s = what;
  if (const size_t colon = s.find("] "); colon != std::string::npos) s = s.substr(colon + 2);
  if (s.rfind("parse error", 0) == 0)
    if (const size_t colon = s.find(": "); colon != std::string::npos) s = s.substr(colon + 2);
  if (s.size() > kMaxJsonErrorChars)
    s = fmt::format("{}... ({} more characters)", s.substr(0, kMaxJsonErrorChars), s.size() - kMaxJsonErrorChars);
  return s;
}

template <class... Input>
nlohmann::json parse(std::string& key, Input&&... in) {
  try {
    return nlohmann::json::parse(std::forward<Input>(in)..., JsonLimits(&key));
  } catch (const nlohmann::json::parse_error& e) {
    if (std::string(e.what()).size() <= kMaxJsonErrorChars) throw;
    throw nlohmann::json::parse_error::create(e.id, e.byte, reason(e.what()), nullptr);
  } catch (const nlohmann::json::out_of_range& e) {  // a number past a double's range: 1e400
    const std::string where = key.empty() ? std::string() : fmt::format(" (key '{}')", key);
    throw nlohmann::json::parse_error::create(e.id, 0, reason(e.what()) + where, nullptr);
  }
}

}  // namespace detail

// nlohmann::json::parse(in...) with the limits above. `in`: what json::parse takes before its
// callback (a string, a stream, two iterators).
template <class... Input>
nlohmann::json parse_json(Input&&... in) {
  std::string key;
  return detail::parse(key, std::forward<Input>(in)...);
}

// As parse_json; on an error, `key` is the last object key read before it (for a number out of
// range, the key whose value it is).
template <class... Input>
nlohmann::json parse_json_noting_key(std::string& key, Input&&... in) {
  return detail::parse(key, std::forward<Input>(in)...);
}

// As parse_json, but malformed (or too deep) JSON gives a discarded value, as
// json::parse(in, nullptr, false) does.
template <class... Input>
nlohmann::json parse_json_or_discarded(Input&&... in) {
  try {
    return parse_json(std::forward<Input>(in)...);
  } catch (const nlohmann::json::exception&) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
}

}  // namespace shardlm::io
