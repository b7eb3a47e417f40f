#include "infer/requests.h"

#include <algorithm>
#include <charconv>

#include "model/hf_dir.h"

namespace shardlm::infer {

void check_sampling(const SamplingOptions& s) {
  auto bad = [](const char* key, const std::string& why) { throw Error(why, {.key = key}); };
  if (s.max_new_tokens < 0) bad("max_new_tokens", fmt::format("max_new_tokens must be >= 0, got {}", s.max_new_tokens));
  if (!(s.temperature >= 0)) bad("temperature", fmt::format("temperature must be >= 0, got {}", s.temperature));
  if (s.top_k < 0) bad("top_k", fmt::format("top_k must be >= 0, got {}", s.top_k));
  if (!(s.top_p > 0 && s.top_p <= 1)) bad("top_p", fmt::format("top_p must be in (0, 1], got {}", s.top_p));
  if (!(s.repetition_penalty > 0))
    bad("repetition_penalty", fmt::format("repetition_penalty must be > 0, got {}", s.repetition_penalty));
}

SamplingOptions read_sampling(const nlohmann::json& rec, const SamplingOptions& defaults) {
  SamplingOptions s = defaults;
  s.temperature = json_number<float>(rec, "temperature", defaults.temperature);
  s.top_k = json_number<int64_t>(rec, "top_k", defaults.top_k);
  s.top_p = json_number<float>(rec, "top_p", defaults.top_p);
  s.repetition_penalty = json_number<float>(rec, "repetition_penalty", defaults.repetition_penalty);
  s.seed = json_number<uint64_t>(rec, "seed", defaults.seed);
  return s;
}

std::vector<std::string> json_stop(const nlohmann::json& rec, const std::vector<std::string>& dflt) {
  const auto it = rec.find("stop");
  if (it == rec.end() || it->is_null()) return dflt;
  if (it->is_string()) {
    if (it->get<std::string>().empty()) throw Error("field 'stop' must not be empty", {.key = "stop"});
    return {it->get<std::string>()};
  }
  if (!it->is_array()) throw Error("field 'stop' must be a string or an array of strings", {.key = "stop"});
  std::vector<std::string> out;
  for (const nlohmann::json& s : *it) {
    if (!s.is_string() || s.get<std::string>().empty())
      throw Error("field 'stop' must hold non-empty strings", {.key = "stop"});
    out.push_back(s.get<std::string>());
  }
  return out;
}

ChatPrompt ChatPrompt::of_model(const std::string& model_dir, const data::Tokenizer& tok, std::string_view name,
                                const std::string& role) {
  const std::string chat_template = data::read_chat_template(model_dir);
  ChatPrompt c;
  try {
    c.format = data::resolve_chat_format(name, tok, chat_template);
  } catch (Error& e) {
    e.set_key(role);
    throw;
  }
  if (c.format == data::ChatFormat::ChatML) c.default_system = data::chat_default_system(chat_template);
  return c;
}

ChatPrompt::Rendered ChatPrompt::render(const data::Tokenizer& tok, std::vector<data::ChatMessage> messages) const {
  if (default_system && (messages.empty() || messages[0].role != "system"))
    messages.insert(messages.begin(), {"system", *default_system});
  Rendered r;
  r.ids = data::chat_prompt_ids(tok, format, messages);
  r.text = data::chat_text(format, messages, tok, true);
  return r;
}

std::vector<int32_t> stop_token_ids(const ModelConfig& cfg, const data::Tokenizer& tok, const ChatPrompt* chat,
                                    const std::string& model_dir) {
  std::vector<int32_t> stops = {tok.eos_id()};
  for (int64_t e : cfg.eos_token_ids) stops.push_back(int32_t(e));
  for (int64_t e : read_generation_eos_ids(model_dir, cfg.vocab_size)) stops.push_back(int32_t(e));
  if (chat)
    for (int32_t id : data::chat_stop_ids(tok, chat->format)) stops.push_back(id);
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  return stops;
}

std::vector<int32_t> parse_stop_token_ids(const std::string& value, int64_t vocab_size) {
  std::vector<int32_t> ids;
  if (value.empty() || value == "none") return ids;
  size_t at = 0;
  while (at <= value.size()) {
    const size_t comma = std::min(value.find(',', at), value.size());
    const std::string item = value.substr(at, comma - at);
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw Error(fmt::format("'{}' in '{}' is not a token id (expected ids separated by commas, or none)", item, value),
                  {.key = "--stop-token-ids"});
    if (id < 0 || id >= vocab_size)
      throw Error(fmt::format("token id {} is outside the model's vocabulary [0, {})", id, vocab_size),
                  {.key = "--stop-token-ids"});
    ids.push_back(int32_t(id));
    at = comma + 1;
  }
  return ids;
}

namespace {

// The earliest position where any of `stops` occurs in `text`, or npos.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t at = std::string::npos;
  for (const std::string& s : stops) at = std::min(at, text.find(s));
  return at;
}

// How much of `text` cannot change with more tokens: without a tail that may begin a stop string
// or be an unfinished character.
size_t settled_length(const std::string& text, const std::vector<std::string>& stops) {
  size_t n = text.size();
  for (const std::string& s : stops)  // the longest proper prefix of s that text ends with
    for (size_t k = std::min(s.size() - 1, text.size()); k > 0; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        n = std::min(n, text.size() - k);
        break;
      }
  // An incomplete UTF-8 sequence at the end: a lead byte within the last 3 whose length reaches past n.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (len > back) n -= back;
    break;
  }
  static const std::string replacement = "\xEF\xBF\xBD";  // what a decoder writes for bytes it cannot finish yet
  while (n >= 3 && text.compare(n - 3, 3, replacement) == 0) n -= 3;
  return n;
}

}  // namespace

CompletionText::CompletionText(const data::Tokenizer& tok, std::vector<int32_t> prompt, std::vector<std::string> stops,
                               bool incremental)
    : tok_(tok), prompt_(std::move(prompt)), stops_(std::move(stops)), incremental_(incremental) {
  prompt_text_ = tok_.decode(prompt_);
}

std::string CompletionText::decode() const {
  std::vector<int32_t> all = prompt_;
  all.insert(all.end(), tokens_.begin(), tokens_.end());
  const std::string text = tok_.decode(all);
  return text.compare(0, prompt_text_.size(), prompt_text_) == 0 ? text.substr(prompt_text_.size()) : text;
}

bool CompletionText::push(int32_t id) {
  tokens_.push_back(id);
  if (!incremental_ || stopped()) return stopped();
  text_ = decode();
  stop_at_ = find_stop(text_, stops_);
  return stopped();
}

std::string CompletionText::text() const {
  std::string t = incremental_ ? text_ : decode();
  if (const size_t at = incremental_ ? stop_at_ : find_stop(t, stops_); at != std::string::npos) t.resize(at);
  return t;
}

std::string CompletionText::take_delta(bool last) {
  const std::string t = text();
  const size_t n = last || stopped() ? t.size() : settled_length(t, stops_);
  if (n <= shown_.size() || t.compare(0, shown_.size(), shown_) != 0) return {};
  std::string delta = t.substr(shown_.size(), n - shown_.size());
  shown_ = t.substr(0, n);
  return delta;
}

}  // namespace shardlm::infer
