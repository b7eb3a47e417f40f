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

CompletionText::CompletionText(const data::Tokenizer& tok, const std::vector<int32_t>& prompt,
                               std::vector<std::string> stops)
    : decoder_(tok, prompt), stops_(std::move(stops)) {
  for (const std::string& s : stops_) longest_stop_ = std::max(longest_stop_, s.size());
}

bool CompletionText::push(int32_t id) {
  tokens_.push_back(id);
  if (stopped()) return true;
  const size_t before = settled_.size();
  settled_ += decoder_.push(id);
  if (stops_.empty()) return false;
  // A stop string not found before ends in the new text (or in the pending tail, looked at again):
  // it starts at most longest_stop_ - 1 bytes before the text that was settled before this token.
  const size_t from = before - std::min(before, longest_stop_ - 1);
  const std::string tail = settled_.substr(from) + decoder_.pending();
  size_t at = std::string::npos;
  for (const std::string& s : stops_) at = std::min(at, tail.find(s));
  if (at != std::string::npos) stop_at_ = from + at;
  return stopped();
}

std::string CompletionText::text() const {
  std::string t = settled_ + decoder_.pending();
  if (stopped()) t.resize(stop_at_);
  return t;
}

std::string CompletionText::take_delta(bool last) {
  size_t n;
  if (stopped()) {
    n = stop_at_;
  } else if (last) {
    n = settled_.size() + decoder_.pending().size();
  } else {
    // Settled text, less a tail that may begin a stop string (the longest proper prefix of one
    // that the text ends with) or end in an unfinished character.
    n = data::settled_utf8_length(settled_);
    const std::string_view text(settled_.data(), n);
    for (const std::string& s : stops_)
      for (size_t k = std::min(s.size() - 1, text.size()); k > 0; --k)
        if (text.compare(text.size() - k, k, s, 0, k) == 0) {
          n = std::min(n, text.size() - k);
          break;
        }
  }
  if (n <= shown_) return {};
  std::string delta;
  if (n <= settled_.size()) {
    delta = settled_.substr(shown_, n - shown_);
  } else {
    delta = (settled_ + decoder_.pending()).substr(shown_, n - shown_);
  }
  shown_ = n;
  return delta;
}

}  // namespace shardlm::infer
