// Instruction data: Alpaca records and chat conversations, read from JSON / JSONL files and
// rendered into training Examples with the loss only where the model should learn.
// Owner: the data pipeline (src/data). See docs/data.md for formats and masking.
//
//   Alpaca  {"instruction": ..., "input": ..., "output": ...}, one per JSONL line or the items of
//           one JSON array; the prompt is stanford_alpaca's PROMPT_DICT template (prompt_input iff
//           input is non-empty), tokenized as stanford_alpaca's train.py does (below).
//   Chat    {"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}, rendered
//           in the Llama 3, Llama 2, ChatML (Qwen2) or Mistral chat format; loss on assistant
//           content and its end marker. `shardlm generate --chat` renders prompts with the same code.
//   Preference  {"prompt", "chosen", "rejected"} in TRL's conventions: strings (the standard
//           format: BOS + prompt, then completion + EOS) or lists of messages (conversational,
//           rendered in the chat format; without "prompt", the conversations' common first
//           messages are the prompt). Each record gives two examples, chosen then rejected, with
//           the loss on the completion only (DPO, train/preference.h).
//
// Every problem with a record (malformed JSON, a missing field, invalid UTF-8, an unknown role)
// is an Error naming FILE:LINE; with BadRowPolicy::Skip such records are counted and skipped.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"
#include "data/tokenizer.h"

namespace shardlm::data {

// stanford_alpaca train.py PROMPT_DICT (tatsu-lab/stanford_alpaca@761dc5bf), verbatim.
inline constexpr std::string_view kAlpacaPromptInput =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:";
inline constexpr std::string_view kAlpacaPromptNoInput =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:";

// The field names of a record (config `data.columns`): {instruction: question, ...} reads the
// instruction from the field "question".
struct AlpacaColumns {
  std::string instruction = "instruction", input = "input", output = "output";
};

// The prompt for a record: prompt_input when input is non-empty, else prompt_no_input.
std::string alpaca_prompt(std::string_view instruction, std::string_view input);

// Tokenizes like stanford_alpaca: the sequence is BOS + encode(prompt + output) + EOS, and the
// first len(BOS + encode(prompt)) tokens are prompt (no loss unless train_on_input). When the
// tokens of prompt + output do not start with the tokens of the prompt alone (a SentencePiece
// merge across the boundary), the mask still covers that many tokens, as stanford's does, and
// *boundary_mismatch (when given) is set.
Example alpaca_example(const Tokenizer& tok, std::string_view prompt, std::string_view output, bool train_on_input,
                       bool* boundary_mismatch = nullptr);

// The chat formats: the published templates of Llama 3, Llama 2, ChatML (Qwen2) and Mistral
// (v0.1/v0.2 instruct, SentencePiece; [INST] written as text).
enum class ChatFormat { Llama3, Llama2, ChatML, Mistral };
// "llama3", "llama2", "chatml", "mistral", or "auto": the family of `chat_template` (the model's
// tokenizer_config.json chat_template, "" when it has none) when chat_format_of_template knows it,
// else from the tokenizer's special tokens: llama3 with <|start_header_id|>, chatml with
// <|im_start|>, else llama2.
ChatFormat resolve_chat_format(std::string_view name, const Tokenizer& tok, std::string_view chat_template = "");
const char* chat_format_name(ChatFormat f);
// The family a Jinja chat template renders, told by its markers: <|start_header_id|> (llama3),
// <|im_start|> (chatml), [INST] with <<SYS>> (llama2), [INST] without (mistral); nullopt otherwise.
std::optional<ChatFormat> chat_format_of_template(std::string_view chat_template);
// The system message a ChatML template adds when a conversation has none (Qwen2's "You are a
// helpful assistant."): the text of a string literal '<|im_start|>system\n...<|im_end|>' in the
// template; nullopt when it has none. Training's chat data and `generate --chat` insert it, as
// transformers' apply_chat_template renders it.
std::optional<std::string> chat_default_system(std::string_view chat_template);
// tokenizer_config.json's "chat_template" in a model directory: "" when the file or the key is
// absent; of a list of named templates, the one named "default".
std::string read_chat_template(const std::string& model_dir);

struct ChatMessage {
  std::string role, content;
};
// Renders a conversation (errors carry no location; the loader adds FILE:LINE):
//   llama3: <|begin_of_text|> then per message <|start_header_id|>role<|end_header_id|>\n\n
//           content.strip() <|eot_id|> (Hugging Face's Llama 3 template); the loss covers
//           assistant content and its <|eot_id|>.
//   llama2: Meta's format: per (user, assistant) pair BOS "[INST] {user} [/INST] {answer} " EOS,
//           a system message folded into the first user turn as "<<SYS>>\n{system}\n<</SYS>>\n\n";
//           roles must alternate user/assistant after an optional system message. Each turn is
//           tokenized as one string; its first len(BOS + encode("[INST] ... [/INST]")) tokens
//           are masked, the rest (answer and EOS) trained.
//   chatml: per message <|im_start|>role\ncontent<|im_end|>\n (Qwen2's template without its
//           default system message); "role\ncontent" is tokenized as one string and its first
//           len(encode("role\n")) tokens masked; the loss covers assistant content and <|im_end|>.
//   mistral: BOS, then per user turn "[INST] {user} [/INST]" and per answer "{answer}" EOS, the
//           system message folded into the first user turn as "{system}\n\n{user}" (Mistral's
//           v0.2 template: <s> [INST] ... [/INST] answer</s> [INST] ...); each string tokenized on
//           its own (SentencePiece's word-boundary prefix is the template's space before [INST]
//           and the answer); the loss covers answers and their EOS.
// train_on_input: every token after the first is in the loss.
Example chat_example(const Tokenizer& tok, ChatFormat format, const std::vector<ChatMessage>& messages,
                     bool train_on_input = false, bool* boundary_mismatch = nullptr);
// For generation: a conversation ending with a user message, and the start of the assistant's turn
// (the template's add_generation_prompt; for llama2/mistral the prompt ends with [/INST]), with the
// same renderer as chat_example, so its tokens are those training puts before an answer.
std::vector<int32_t> chat_prompt_ids(const Tokenizer& tok, ChatFormat format, const std::vector<ChatMessage>& messages);
// The string the format's published Jinja template renders for `messages` (special tokens written
// out, BOS/EOS as the tokenizer's pieces), with the generation prompt when asked: for display and
// for checking the renderer against the templates.
std::string chat_text(ChatFormat format, const std::vector<ChatMessage>& messages, const Tokenizer& tok,
                      bool generation_prompt);
// The end-of-turn tokens of the format that the tokenizer has (<|eot_id|>, <|im_end|>): where an
// assistant's answer ends besides EOS.
std::vector<int32_t> chat_stop_ids(const Tokenizer& tok, ChatFormat format);
// The "messages" of a chat record ({"role": ..., "content": ...} objects), checked for shape.
std::vector<ChatMessage> chat_messages_of(const nlohmann::json& record);

enum class BadRowPolicy { Fail, Skip };

struct InstructOptions {
  AlpacaColumns columns;
  bool train_on_input = false;
  std::string chat_format = "auto";
  std::string chat_template;  // the model's tokenizer_config.json chat_template, for "auto"
  BadRowPolicy on_bad_row = BadRowPolicy::Fail;
  int64_t max_seq_len = 0;  // > 0: examples longer than this many input tokens are truncated
};

// One of the first examples loading kept, as training renders it, and where its record is.
struct LoadedSample {
  int64_t line = 0;        // 1-based line of the record's first character
  Example example;         // after truncation to max_seq_len
  bool truncated = false;  // cut to max_seq_len
};

// What loading found; summary() is the line the trainer prints.
struct LoadReport {
  static constexpr size_t kSamples = 8;  // how many of the first kept examples `samples` holds
  int64_t records = 0;            // records read (including skipped ones)
  int64_t examples = 0;           // examples kept
  int64_t skipped = 0;            // bad records skipped (on_bad_row: skip)
  std::string first_skip;         // the first skipped record's error
  int64_t truncated = 0;          // examples cut to max_seq_len
  int64_t dropped_no_target = 0;  // examples with nothing left to learn after truncation
  int64_t boundary_mismatch = 0;  // prompt/answer tokenization boundary effects (see alpaca_example)
  int64_t tokens = 0, trained_tokens = 0;  // input tokens and loss-counted targets of the kept examples
  std::string format;             // "alpaca", "chat (llama3)", ...
  std::optional<ChatFormat> chat_format;  // chat files: the format their conversations were rendered in
  int64_t longest = 0;            // input tokens of the longest example before truncation
  std::vector<LoadedSample> samples;  // the first kSamples kept examples (`shardlm validate` checks them)
  std::string summary() const;
};

// The kind of a .json/.jsonl file, from its first record: "preference" when it has "chosen" and
// "rejected", "chat" when it has "messages", "alpaca" when it has the instruction column. Throws
// when it is none of them.
std::string detect_json_kind(const std::string& path, const AlpacaColumns& columns);

// Reads every record of an Alpaca, chat or preference file ("alpaca" | "chat" | "preference") and
// renders it; a preference record gives two consecutive examples (chosen, rejected), kept or dropped
// together. ordinals (when given) receives each kept example's record number in the file (0-based),
// for the eval split (a pair's two examples share it, so a pair is never split).
std::vector<Example> load_instruct_file(const std::string& path, const std::string& kind, const Tokenizer& tok,
                                        const InstructOptions& opt, LoadReport& report,
                                        std::vector<int64_t>* ordinals = nullptr);

// The text of an example with the loss-masked parts in «guillemets» and the trained parts plain;
// special tokens (BOS, EOS, chat markers) appear as their pieces ("<s>", "<|eot_id|>").
std::string render_masked(const Tokenizer& tok, const Example& e);

}  // namespace shardlm::data
