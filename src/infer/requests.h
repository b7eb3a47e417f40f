// What `shardlm generate` and `shardlm serve` do to a request around the Generator, one way for
// both: check its sampling options and read them from JSON, render a conversation in the model's
// chat format, the tokens that end a completion, and the completion's text as its tokens arrive
// (stop strings, and the part that is safe to stream).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "data/instruct.h"
#include "data/stream_decoder.h"
#include "data/tokenizer.h"
#include "infer/generator.h"
#include "io/json_integer.h"
#include "model/config.h"

namespace shardlm::infer {

// Errors name the option by its generate/JSONL name: max_new_tokens, temperature, top_k, top_p,
// repetition_penalty (Error::context().key).
void check_sampling(const SamplingOptions& s);

// The value of an optional numeric JSON field, or `dflt` when absent or null; a wrong type is an
// Error naming the field (the caller adds where the JSON came from).
template <class T>
T json_number(const nlohmann::json& rec, const char* name, T dflt) {
  const auto it = rec.find(name);
  if (it == rec.end() || it->is_null()) return dflt;
  if (!it->is_number())
    throw Error(fmt::format("field '{}' must be a number, got {}", name, it->type_name()), {.key = name});
  // nlohmann's get<T>() converts by a plain cast: a value past T's range would wrap (an integer)
  // or become an infinity (1e300 as a float) and fail later, far from the field.
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) throw Error(fmt::format("field '{}' must be an integer", name), {.key = name});
    if (std::is_unsigned_v<T> && !it->is_number_unsigned() && it->get<int64_t>() < 0)
      throw Error(fmt::format("field '{}' must be >= 0", name), {.key = name});
    constexpr int64_t lo = int64_t(std::numeric_limits<T>::min());
    constexpr int64_t hi = int64_t(std::min<uint64_t>(uint64_t(std::numeric_limits<T>::max()),
                                                      uint64_t(std::numeric_limits<int64_t>::max())));
    if (const std::optional<int64_t> v = io::json_integer(*it, lo, hi)) return T(*v);
    throw Error(fmt::format("field '{}' must be an integer in [{}, {}], got {}", name, lo, hi, it->dump()),
                {.key = name});
  } else {
    const double d = it->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > double(std::numeric_limits<T>::max()))
      throw Error(fmt::format("field '{}' must be a finite number of at most {:g}, got {}", name,
                              double(std::numeric_limits<T>::max()), it->dump()),
                  {.key = name});
    return T(d);
  }
}

// The sampling fields of a request (temperature, top_k, top_p, repetition_penalty, seed), each
// `defaults`' value when absent or null: the one reader for `generate --prompts` rows (whose
// defaults are the command line's) and `serve` requests (OpenAI's). max_new_tokens is the caller's,
// whose key and default differ (max_tokens, max_completion_tokens). Not checked: check_sampling.
SamplingOptions read_sampling(const nlohmann::json& rec, const SamplingOptions& defaults);

// "stop": a non-empty string or an array of them; `dflt` when absent or null.
std::vector<std::string> json_stop(const nlohmann::json& rec, const std::vector<std::string>& dflt);

// A model's chat format and how its prompts are rendered (data/instruct.h: the renderer training
// uses, so a prompt's tokens are those training puts before an answer).
struct ChatPrompt {
  data::ChatFormat format = data::ChatFormat::Llama2;
  std::optional<std::string> default_system;  // a ChatML template's (Qwen2's), added as training adds it

  // `name`: auto (from the model's chat_template, else the tokenizer's special tokens), llama3,
  // llama2, chatml or mistral; a bad name is an Error naming `role`.
  // `role` is what the caller calls the format's choice (a flag, a key), named in its errors.
  static ChatPrompt of_model(const std::string& model_dir, const data::Tokenizer& tok, std::string_view name,
                             const std::string& role);

  struct Rendered {
    std::vector<int32_t> ids;  // the conversation and the start of the assistant's turn
    std::string text;          // as the format's Jinja template renders it (for display)
  };
  // The default system message is put first when the conversation has none. Errors (roles out of
  // order) carry no location.
  Rendered render(const data::Tokenizer& tok, std::vector<data::ChatMessage> messages) const;
};

// The tokens that end a completion by default: the tokenizer's EOS, config.json's eos_token_id(s),
// generation_config.json's eos_token_id(s) in model_dir (model/hf_dir.h), and with a chat format
// its end-of-turn tokens.
std::vector<int32_t> stop_token_ids(const ModelConfig& cfg, const data::Tokenizer& tok, const ChatPrompt* chat,
                                    const std::string& model_dir);
// The value of --stop-token-ids (generate, serve), which replaces that default set as transformers'
// eos_token_id argument does: ids separated by commas, each in [0, vocab_size); "none" or "" for
// no stop token (every completion runs to its length). Errors name the flag.
std::vector<int32_t> parse_stop_token_ids(const std::string& value, int64_t vocab_size);

// The text of one completion as its tokens arrive, cut before the first stop string. The tokens
// are decoded incrementally (data/stream_decoder.h: a short window after the prompt's last tokens,
// so word boundaries and characters split over tokens come out as decoding prompt and completion
// together does), at a cost per token that does not grow with the completion; stop strings are
// looked for only where the new text can complete one. Holds the tokenizer by reference (it must
// outlive this).
class CompletionText {
 public:
  CompletionText(const data::Tokenizer& tok, const std::vector<int32_t>& prompt, std::vector<std::string> stops);
  // Adds a token; true when a stop string has appeared in the text (which ends before it).
  bool push(int32_t id);
  bool stopped() const { return stop_at_ != std::string::npos; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The completion's text so far, cut before the first stop string.
  std::string text() const;
  // For streaming: the text not handed out before that can no longer change, i.e. not the start of
  // a stop string nor an unfinished character (an incomplete UTF-8 sequence or a trailing U+FFFD,
  // which the next token may complete); with `last` (the completion is over), all the rest.
  // The pieces handed out add up to text().
  std::string take_delta(bool last);

 private:
  data::StreamDecoder decoder_;
  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::vector<int32_t> tokens_;
  std::string settled_;                  // the decoder's settled text; the text is settled_ + decoder_.pending()
  size_t stop_at_ = std::string::npos;   // where the first stop string starts in the text
  size_t shown_ = 0;                     // bytes of the text handed out by take_delta
};

}  // namespace shardlm::infer
