// Alpaca and chat records -> Examples (see instruct.h). Owner: the data pipeline.
#include "data/instruct.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/alloc.h"
#include "core/error.h"
#include "io/json_parse.h"
#include "io/read_file.h"
#include "ops/ops.h"

namespace shardlm::data {

using nlohmann::json;

// ---- Alpaca ----------------------------------------------------------------------------------

std::string alpaca_prompt(std::string_view instruction, std::string_view input) {
  const std::string_view tpl = input.empty() ? kAlpacaPromptNoInput : kAlpacaPromptInput;
  // One pass over the template (as Python's str.format does), so braces or placeholder names
  // inside the record's own text are never substituted.
  std::string out;
  out.reserve(tpl.size() + instruction.size() + input.size());
  for (size_t i = 0; i < tpl.size();) {
    if (tpl.substr(i).starts_with("{instruction}")) {
      out += instruction;
      i += 13;
    } else if (tpl.substr(i).starts_with("{input}")) {
      out += input;
      i += 7;
    } else {
      out += tpl[i++];
    }
  }
  return out;
}

namespace {

// ids/targets from a full token sequence and, per token, whether predicting it is trained.
Example from_sequence(const std::vector<int32_t>& seq, const std::vector<char>& trained) {
  Example e;
  if (seq.size() < 2) return e;
  e.ids.assign(seq.begin(), seq.end() - 1);
  e.targets.resize(seq.size() - 1);
  for (size_t t = 0; t + 1 < seq.size(); ++t) e.targets[t] = trained[t + 1] ? seq[t + 1] : ops::kIgnoreIndex;
  return e;
}

// Appends a string's tokens (prefix + full) where the first n_prompt tokens are not trained,
// matching how stanford_alpaca and Meta's llama2 chat code mask a tokenized prompt+answer.
void append_masked_prefix(std::vector<int32_t>& seq, std::vector<char>& trained, const std::vector<int32_t>& full,
                          size_t n_prompt, bool train_all) {
  for (size_t i = 0; i < full.size(); ++i) {
    seq.push_back(full[i]);
    trained.push_back(train_all || i >= n_prompt);
  }
}

bool starts_with(const std::vector<int32_t>& full, const std::vector<int32_t>& prefix) {
  return full.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), full.begin());
}

std::string_view strip(std::string_view s) {
  // Python's str.strip(): Unicode whitespace, of which ASCII whitespace is what matters here.
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

Example alpaca_example(const Tokenizer& tok, std::string_view prompt, std::string_view output, bool train_on_input,
                       bool* boundary_mismatch) {
  std::string text(prompt);
  text += output;
  const std::vector<int32_t> full = tok.encode_with(text, true, true);
  const std::vector<int32_t> source = tok.encode_with(prompt, true, false);
  if (boundary_mismatch) *boundary_mismatch = !starts_with(full, source);
  std::vector<int32_t> seq;
  std::vector<char> trained;
  append_masked_prefix(seq, trained, full, source.size(), train_on_input);
  return from_sequence(seq, trained);
}

// ---- chat ------------------------------------------------------------------------------------

std::optional<ChatFormat> chat_format_of_template(std::string_view tpl) {
  const auto has = [&](std::string_view m) { return tpl.find(m) != std::string_view::npos; };
  if (has("<|start_header_id|>")) return ChatFormat::Llama3;
  if (has("<|im_start|>")) return ChatFormat::ChatML;
  if (has("[INST]")) return has("<<SYS>>") ? ChatFormat::Llama2 : ChatFormat::Mistral;
  return std::nullopt;
}

ChatFormat resolve_chat_format(std::string_view name, const Tokenizer& tok, std::string_view chat_template) {
  if (name == "llama3") return ChatFormat::Llama3;
  if (name == "llama2") return ChatFormat::Llama2;
  if (name == "chatml") return ChatFormat::ChatML;
  if (name == "mistral") return ChatFormat::Mistral;
  if (name == "auto") {
    if (const std::optional<ChatFormat> f = chat_format_of_template(chat_template)) return *f;
    if (tok.special_token("<|start_header_id|>")) return ChatFormat::Llama3;
    if (tok.special_token("<|im_start|>")) return ChatFormat::ChatML;
    return ChatFormat::Llama2;
  }
  throw Error(fmt::format("unknown chat format '{}' (expected auto, llama3, llama2, chatml or mistral)", name));
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::Llama2: return "llama2";
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Mistral: return "mistral";
  }
  return "?";
}

std::optional<std::string> chat_default_system(std::string_view tpl) {
  // In the template's source the literal reads '<|im_start|>system\nTEXT<|im_end|>\n' with the
  // line break written as the escape \n. A literal that ends right after "system\n" (followed by
  // + messages[0]['content']) is the template rendering the conversation's own system message.
  static constexpr std::string_view kOpen = "<|im_start|>system";
  for (size_t at = tpl.find(kOpen); at != std::string_view::npos; at = tpl.find(kOpen, at + 1)) {
    size_t p = at + kOpen.size();
    if (tpl.substr(p, 2) == "\\n") p += 2;
    else if (tpl.substr(p, 1) == "\n") p += 1;
    else continue;
    const size_t end = tpl.find("<|im_end|>", p);
    if (end == std::string_view::npos) break;
    const std::string_view body = tpl.substr(p, end - p);
    if (body.empty() || body.find_first_of("'\"{}") != std::string_view::npos) continue;  // not one literal
    std::string text;
    for (size_t i = 0; i < body.size(); ++i) {  // the literal's escapes
      if (body[i] == '\\' && i + 1 < body.size()) {
        const char c = body[++i];
        text += c == 'n' ? '\n' : c;
      } else {
        text += body[i];
      }
    }
    return text;
  }
  return std::nullopt;
}

std::string read_chat_template(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  json cfg;
  try {
    cfg = io::parse_json(f);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("malformed JSON: {}", e.what()), {.file = path});
  }
  const auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array())  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
    for (const json& t : *it)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
  return "";
}

namespace {

int32_t required_special(const Tokenizer& tok, std::string_view text, ChatFormat f) {
  const std::optional<int32_t> id = tok.special_token(text);
  if (!id)
    throw Error(fmt::format("the {} chat format needs the special token {}, which the {} tokenizer lacks "
                            "(choose another chat format)",
                            chat_format_name(f), text, tok.name()));
  return *id;
}

// A rendered conversation: its tokens and, per token, whether it is trained.
struct ChatSeq {
  std::vector<int32_t> seq;
  std::vector<char> trained;
  void add(const std::vector<int32_t>& ids, bool train) {
    seq.insert(seq.end(), ids.begin(), ids.end());
    trained.insert(trained.end(), ids.size(), char(train));
  }
};

// generation_prompt: the conversation ends with a user message and the assistant's turn is opened.
ChatSeq render_llama3(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool train_on_input,
                      bool generation_prompt) {
  const ChatFormat f = ChatFormat::Llama3;
  const int32_t start = required_special(tok, "<|start_header_id|>", f);
  const int32_t end = required_special(tok, "<|end_header_id|>", f);
  const int32_t eot = required_special(tok, "<|eot_id|>", f);
  const int32_t begin = tok.special_token("<|begin_of_text|>").value_or(tok.bos_id());
  ChatSeq out;
  out.add({begin}, false);
  const std::vector<int32_t> nl2 = tok.encode("\n\n");
  // The header is given, not learned; "\n\n" is its own pre-token in Llama 3's tokenizer, so
  // encoding it apart from the content gives the tokens of the template's single string.
  auto header = [&](const std::string& role) {
    std::vector<int32_t> h{start};
    const std::vector<int32_t> r = tok.encode(role);
    h.insert(h.end(), r.begin(), r.end());
    h.push_back(end);
    h.insert(h.end(), nl2.begin(), nl2.end());
    out.add(h, train_on_input);
  };
  for (const ChatMessage& m : msgs) {
    header(m.role);
    std::vector<int32_t> body = tok.encode(strip(m.content));
    body.push_back(eot);
    out.add(body, m.role == "assistant" || train_on_input);
  }
  if (generation_prompt) header("assistant");
  return out;
}

// The index of the first message after a leading system message (whose content goes to
// `system`); a conversation of a system message alone has nothing to render.
size_t split_system(const std::vector<ChatMessage>& msgs, std::string& system) {
  size_t first = 0;
  if (msgs[0].role == "system") {
    system = msgs[0].content;
    first = 1;
  }
  if (first == msgs.size()) throw Error("the conversation has only a system message");
  return first;
}

ChatSeq render_llama2(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool train_on_input,
                      bool* boundary_mismatch) {
  std::string system;
  const size_t first = split_system(msgs, system);
  ChatSeq out;
  for (size_t i = first; i < msgs.size(); i += 2) {
    const size_t turn = (i - first) / 2;
    if (msgs[i].role != "user")
      throw Error(fmt::format("message {} has role '{}' but the llama2 format needs user/assistant turns in "
                              "alternation after an optional system message",
                              i, msgs[i].role));
    std::string user = msgs[i].content;
    if (turn == 0 && first == 1) user = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + user;
    const std::string prompt = "[INST] " + std::string(strip(user)) + " [/INST]";
    const std::vector<int32_t> source = tok.encode_with(prompt, true, false);
    if (i + 1 == msgs.size()) {  // a final question without an answer: context (or the generation prompt)
      append_masked_prefix(out.seq, out.trained, source, source.size(), train_on_input);
      break;
    }
    if (msgs[i + 1].role != "assistant")
      throw Error(fmt::format("message {} has role '{}' but the llama2 format needs an assistant answer after "
                              "each user message",
                              i + 1, msgs[i + 1].role));
    const std::vector<int32_t> full =
        tok.encode_with(prompt + " " + std::string(strip(msgs[i + 1].content)) + " ", true, true);
    if (boundary_mismatch && !starts_with(full, source)) *boundary_mismatch = true;
    append_masked_prefix(out.seq, out.trained, full, source.size(), train_on_input);
  }
  return out;
}

ChatSeq render_chatml(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool train_on_input,
                      bool* boundary_mismatch, bool generation_prompt) {
  const ChatFormat f = ChatFormat::ChatML;
  const int32_t start = required_special(tok, "<|im_start|>", f);
  const int32_t end = required_special(tok, "<|im_end|>", f);
  const std::vector<int32_t> nl = tok.encode("\n");
  ChatSeq out;
  for (const ChatMessage& m : msgs) {
    out.add({start}, train_on_input);
    // "role\ncontent" is one string between two special tokens in the template: tokenize it whole
    // and mask the tokens of "role\n" (a merge across the line break is a boundary mismatch).
    const std::vector<int32_t> head = tok.encode(m.role + "\n");
    const std::vector<int32_t> full = tok.encode(m.role + "\n" + m.content);
    if (boundary_mismatch && !starts_with(full, head)) *boundary_mismatch = true;
    const bool answer = m.role == "assistant";
    append_masked_prefix(out.seq, out.trained, full, answer ? head.size() : full.size(), train_on_input);
    out.add({end}, answer || train_on_input);
    out.add(nl, train_on_input);
  }
  if (generation_prompt) {
    out.add({start}, train_on_input);
    out.add(tok.encode("assistant\n"), train_on_input);
  }
  return out;
}

ChatSeq render_mistral(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool train_on_input) {
  std::string system;
  const size_t first = split_system(msgs, system);
  ChatSeq out;
  out.add({tok.bos_id()}, false);
  for (size_t i = first; i < msgs.size(); ++i) {
    const bool user_turn = (i - first) % 2 == 0;
    const std::string& role = msgs[i].role;
    if (role != (user_turn ? "user" : "assistant"))
      throw Error(fmt::format("message {} has role '{}' but the mistral format needs user/assistant turns in "
                              "alternation after an optional system message",
                              i, role));
    if (user_turn) {
      const std::string user = i == first && first == 1 ? system + "\n\n" + msgs[i].content : msgs[i].content;
      out.add(tok.encode("[INST] " + user + " [/INST]"), train_on_input);
    } else {
      std::vector<int32_t> answer = tok.encode(msgs[i].content);
      answer.push_back(tok.eos_id());
      out.add(answer, true);
    }
  }
  return out;
}

// Roles known, a system message only first; with generation_prompt, the last message a user's.
void check_roles(const std::vector<ChatMessage>& messages, bool generation_prompt) {
  if (messages.empty()) throw Error("the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      throw Error(fmt::format("message {} has unknown role '{}' (expected system, user or assistant)", i, r));
    if (r == "system" && i != 0) throw Error(fmt::format("message {}: a system message may only come first", i));
  }
  if (generation_prompt && messages.back().role != "user")
    throw Error(fmt::format("the last message has role '{}': a prompt for the assistant must end with a user message",
                            messages.back().role));
}

ChatSeq render_chat(const Tokenizer& tok, ChatFormat format, const std::vector<ChatMessage>& messages,
                    bool train_on_input, bool* boundary_mismatch, bool generation_prompt) {
  check_roles(messages, generation_prompt);
  switch (format) {
    case ChatFormat::Llama3: return render_llama3(tok, messages, train_on_input, generation_prompt);
    case ChatFormat::Llama2: return render_llama2(tok, messages, train_on_input, boundary_mismatch);
    case ChatFormat::ChatML: return render_chatml(tok, messages, train_on_input, boundary_mismatch, generation_prompt);
    case ChatFormat::Mistral: return render_mistral(tok, messages, train_on_input);
  }
  throw Error("unknown chat format");
}

}  // namespace

Example chat_example(const Tokenizer& tok, ChatFormat format, const std::vector<ChatMessage>& messages,
                     bool train_on_input, bool* boundary_mismatch) {
  if (boundary_mismatch) *boundary_mismatch = false;
  const ChatSeq s = render_chat(tok, format, messages, train_on_input, boundary_mismatch, false);
  return from_sequence(s.seq, s.trained);
}

std::vector<int32_t> chat_prompt_ids(const Tokenizer& tok, ChatFormat format,
                                     const std::vector<ChatMessage>& messages) {
  return render_chat(tok, format, messages, false, nullptr, true).seq;
}

std::string chat_text(ChatFormat format, const std::vector<ChatMessage>& msgs, const Tokenizer& tok,
                      bool generation_prompt) {
  check_roles(msgs, generation_prompt);
  const std::string bos = tok.piece(tok.bos_id()), eos = tok.piece(tok.eos_id());
  const bool has_system = msgs[0].role == "system";
  std::string out;
  switch (format) {
    case ChatFormat::Llama3:
      out = "<|begin_of_text|>";
      for (const ChatMessage& m : msgs)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + std::string(strip(m.content)) + "<|eot_id|>";
      if (generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::ChatML:
      for (const ChatMessage& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::Llama2:  // Meta's template (Llama-2-chat's tokenizer_config.json)
      for (size_t i = has_system; i < msgs.size(); ++i) {
        if (msgs[i].role == "user") {
          std::string user = msgs[i].content;
          if (i == 1 && has_system) user = "<<SYS>>\n" + msgs[0].content + "\n<</SYS>>\n\n" + user;
          out += bos + "[INST] " + std::string(strip(user)) + " [/INST]";
        } else {
          out += " " + std::string(strip(msgs[i].content)) + " " + eos;
        }
      }
      break;
    case ChatFormat::Mistral:  // Mistral-7B-Instruct-v0.2's template
      out = bos;
      for (size_t i = has_system; i < msgs.size(); ++i) {
        if (msgs[i].role == "user")
          out += " [INST] " + (i == 1 && has_system ? msgs[0].content + "\n\n" : "") + msgs[i].content + " [/INST]";
        else
          out += " " + msgs[i].content + eos;
      }
      break;
  }
  return out;
}

std::vector<int32_t> chat_stop_ids(const Tokenizer& tok, ChatFormat format) {
  std::optional<int32_t> id;
  if (format == ChatFormat::Llama3) id = tok.special_token("<|eot_id|>");
  if (format == ChatFormat::ChatML) id = tok.special_token("<|im_end|>");
  return id ? std::vector<int32_t>{*id} : std::vector<int32_t>{};
}

// ---- files -----------------------------------------------------------------------------------

namespace {

// A record beyond this is not a training example but a broken file (a whole corpus on one line):
// 4 MiB is about a million tokens, 8 times the longest context of the models shardlm trains.
constexpr size_t kMaxRecordBytes = size_t(4) << 20;

struct RawRecord {
  std::string_view text;
  int64_t line;  // 1-based line of the record's first character
};

size_t first_non_space(std::string_view s, size_t from = 0) {
  while (from < s.size() && (s[from] == ' ' || s[from] == '\t' || s[from] == '\n' || s[from] == '\r')) ++from;
  return from;
}

// The items of a top-level JSON array as raw text spans, each with its line, found by a scan
// that tracks strings and nesting only. Each item is parsed on its own afterwards, so one
// malformed record is reported at its own line and can be skipped like a bad JSONL line.
std::vector<RawRecord> split_json_array(const std::string& path, std::string_view text, size_t open) {
  std::vector<RawRecord> out;
  int64_t line = 1 + std::count(text.begin(), text.begin() + int64_t(open), '\n');
  int64_t depth = 0, item_line = 0;
  bool in_str = false, esc = false;
  size_t item = std::string_view::npos;
  auto close_item = [&](size_t end, bool allow_empty) {
    if (item == std::string_view::npos) {
      if (!allow_empty) throw Error("malformed JSON array: an empty item (two commas?)", {.file = path, .line = line});
    } else {
      out.push_back({text.substr(item, end - item), item_line});
    }
    item = std::string_view::npos;
  };
  for (size_t i = open + 1; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') ++line;
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    if (depth == 0 && c == ',') {
      close_item(i, false);
      continue;
    }
    if (depth == 0 && c == ']') {
      close_item(i, out.empty());
      if (first_non_space(text, i + 1) != text.size())
        throw Error("unexpected text after the top-level JSON array", {.file = path, .line = line});
      return out;
    }
    if (item == std::string_view::npos) {
      item = i;
      item_line = line;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') --depth;
  }
  throw Error("malformed JSON array: no closing ']' (truncated file?)", {.file = path, .line = line});
}

std::vector<RawRecord> split_records(const std::string& path, std::string_view text) {
  const size_t first = first_non_space(text);
  if (first == text.size()) throw Error("the data file is empty", {.file = path});
  if (text[first] == '[') return split_json_array(path, text, first);
  std::vector<RawRecord> out;  // JSONL: one record per non-blank line
  int64_t line = 1;
  for (size_t pos = 0; pos < text.size(); ++line) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view l = text.substr(pos, eol - pos);
    if (first_non_space(l) != l.size()) out.push_back({l, line});
    pos = eol + 1;
  }
  return out;
}

// Parses one record; errors name the line inside the record where the parser stopped.
json parse_record(const std::string& path, const RawRecord& r) {
  const size_t bad = utf8_error_offset(r.text);
  if (bad != std::string_view::npos)
    throw Error(fmt::format("invalid UTF-8 (byte 0x{:02X}); the data must be UTF-8 text", uint8_t(r.text[bad])),
                {.file = path, .line = r.line + std::count(r.text.begin(), r.text.begin() + int64_t(bad), '\n')});
  try {
    return io::parse_json(r.text);
  } catch (const json::parse_error& e) {
    const size_t at = std::min<size_t>(e.byte == 0 ? 0 : e.byte - 1, r.text.size());
    std::string what = e.what();
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line 1, column 5: ...";
    // keep only the reason, the location is ours.
    if (const size_t colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    throw Error("malformed JSON: " + what,
                {.file = path, .line = r.line + std::count(r.text.begin(), r.text.begin() + int64_t(at), '\n')});
  } catch (const json::exception& e) {  // out_of_range: a number too large for any JSON type we hold
    std::string what = e.what();
    if (const size_t close = what.find("] "); close != std::string::npos) what = what.substr(close + 2);
    throw Error("malformed JSON: " + what, {.file = path, .line = r.line});
  }
}

std::string string_field(const json& rec, const std::string& name, bool required, const std::string& what) {
  if (!rec.is_object()) throw Error(fmt::format("expected a JSON object ({}), got {}", what, rec.type_name()));
  const auto it = rec.find(name);
  if (it == rec.end() || it->is_null()) {
    if (required) throw Error(fmt::format("missing field '{}' ({})", name, what));
    return "";
  }
  if (!it->is_string()) throw Error(fmt::format("field '{}' must be a string, got {}", name, it->type_name()));
  return it->get<std::string>();
}

}  // namespace

std::vector<ChatMessage> chat_messages_of(const json& rec) {
  if (!rec.is_object()) throw Error(fmt::format("expected a JSON object with \"messages\", got {}", rec.type_name()));
  const auto it = rec.find("messages");
  if (it == rec.end()) throw Error("missing field 'messages'");
  if (!it->is_array()) throw Error(fmt::format("field 'messages' must be an array, got {}", it->type_name()));
  if (it->empty()) throw Error("field 'messages' is empty");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    out.push_back({string_field(m, "role", true, where), string_field(m, "content", true, where)});
  }
  return out;
}

namespace {

// A preference record's side: a string (standard format) or a list of messages (conversational).
std::vector<ChatMessage> messages_field(const json& rec, const std::string& name) {
  const auto it = rec.find(name);
  if (!it->is_array()) throw Error(fmt::format("field '{}' must be a string or a list of messages, got {}", name, it->type_name()));
  return chat_messages_of(json{{"messages", *it}});
}

// The pair as TRL reads it. Standard: BOS + prompt, then the completion and EOS, each tokenized on
// its own; the completion and EOS are trained. Conversational: the prompt's messages rendered with
// the generation prompt, then prompt + completion rendered whole with the prompt's tokens masked
// (a prompt without "prompt" is the longest common prefix of the two conversations, as TRL's
// extract_prompt takes it).
std::pair<Example, Example> preference_pair(const Tokenizer& tok, ChatFormat format,
                                            const std::optional<std::string>& default_system, const json& rec,
                                            bool* mismatch) {
  if (!rec.is_object()) throw Error(fmt::format("expected a JSON object with \"chosen\" and \"rejected\", got {}", rec.type_name()));
  for (const char* k : {"chosen", "rejected"})
    if (!rec.contains(k) || rec.at(k).is_null()) throw Error(fmt::format("missing field '{}' (a preference record)", k));
  if (rec.at("chosen").is_string()) {
    const std::string prompt = string_field(rec, "prompt", true, "a preference record"),
                      chosen = string_field(rec, "chosen", true, "a preference record"),
                      rejected = string_field(rec, "rejected", true, "a preference record");
    const std::vector<int32_t> p = tok.encode_with(prompt, true, false);
    auto side = [&](const std::string& completion) {
      std::vector<int32_t> seq = p;
      std::vector<char> trained(seq.size(), 0);
      append_masked_prefix(seq, trained, tok.encode_with(completion, false, true), 0, true);
      return from_sequence(seq, trained);
    };
    return {side(chosen), side(rejected)};
  }
  std::vector<ChatMessage> chosen = messages_field(rec, "chosen"), rejected = messages_field(rec, "rejected"), prompt;
  if (rec.contains("prompt")) {
    prompt = messages_field(rec, "prompt");
  } else {
    size_t n = 0;
    while (n + 1 < chosen.size() && n + 1 < rejected.size() && chosen[n].role == rejected[n].role &&
           chosen[n].content == rejected[n].content)
      ++n;
    if (n == 0) throw Error("no 'prompt', and the two conversations share no first message to take it from");
    prompt.assign(chosen.begin(), chosen.begin() + int64_t(n));
    chosen.erase(chosen.begin(), chosen.begin() + int64_t(n));
    rejected.erase(rejected.begin(), rejected.begin() + int64_t(n));
  }
  if (default_system && prompt[0].role != "system") prompt.insert(prompt.begin(), {"system", *default_system});
  const std::vector<int32_t> p = chat_prompt_ids(tok, format, prompt);
  auto side = [&](const std::vector<ChatMessage>& completion) {
    std::vector<ChatMessage> all = prompt;
    all.insert(all.end(), completion.begin(), completion.end());
    Example e = chat_example(tok, format, all, false, nullptr);
    // The rendered conversation starts with the prompt's tokens unless a merge crossed the
    // boundary; either way that many tokens are prompt (target t predicts token t + 1).
    if (!starts_with(e.ids, p)) *mismatch = true;
    for (size_t t = 0; t + 1 < p.size() && t < e.targets.size(); ++t) e.targets[t] = ops::kIgnoreIndex;
    return e;
  };
  return {side(chosen), side(rejected)};
}

}  // namespace

std::string detect_json_kind(const std::string& path, const AlpacaColumns& columns) {
  const std::string text = io::read_file(path, "data file");
  const std::vector<RawRecord> recs = split_records(path, text);
  if (recs.empty()) throw Error("the data file holds no records", {.file = path});
  const json first = parse_record(path, recs[0]);
  if (first.is_object() && first.contains("chosen") && first.contains("rejected")) return "preference";
  if (first.is_object() && first.contains("messages")) return "chat";
  if (first.is_object() && first.contains(columns.instruction)) return "alpaca";
  throw Error(fmt::format("cannot tell the data type from the first record: it has neither '{}' (alpaca), "
                          "'messages' (chat) nor 'chosen' and 'rejected' (preference); set data.type or data.columns",
                          columns.instruction),
              {.file = path, .line = recs[0].line});
}

std::vector<Example> load_instruct_file(const std::string& path, const std::string& kind, const Tokenizer& tok,
                                        const InstructOptions& opt, LoadReport& report,
                                        std::vector<int64_t>* ordinals) {
  SHARDLM_CHECK(kind == "alpaca" || kind == "chat" || kind == "preference", "unknown instruction data kind '{}'", kind);
  const std::string text = io::read_file(path, "data file");
  const std::vector<RawRecord> recs = split_records(path, text);
  const bool chat = kind != "alpaca";  // preference records may be conversations
  const ChatFormat fmt_ = chat ? resolve_chat_format(opt.chat_format, tok, opt.chat_template) : ChatFormat::Llama2;
  // ChatML templates that add a default system message (Qwen2's) get it here, as they render.
  const std::optional<std::string> default_system =
      chat && fmt_ == ChatFormat::ChatML ? chat_default_system(opt.chat_template) : std::nullopt;
  if (chat) report.chat_format = fmt_;
  report.format = kind == "alpaca" ? "alpaca"
                                   : fmt::format("{} ({}{})", kind == "chat" ? "chat" : "preference pairs",
                                                 chat_format_name(fmt_), default_system ? ", default system message" : "");
  const std::string what = fmt::format("an Alpaca record; data.columns maps {{instruction: {}, input: {}, output: {}}}",
                                       opt.columns.instruction, opt.columns.input, opt.columns.output);
  std::vector<Example> out;
  for (size_t k = 0; k < recs.size(); ++k) {
    ++report.records;
    std::vector<Example> rendered;  // the record's example, or its pair (chosen, rejected)
    bool mismatch = false;
    try {
      if (recs[k].text.size() > kMaxRecordBytes)
        throw Error(fmt::format("the record is {}, above the {} a record may have (a runaway or concatenated record?)",
                                format_bytes(int64_t(recs[k].text.size())), format_bytes(int64_t(kMaxRecordBytes))));
      const json rec = parse_record(path, recs[k]);
      if (kind == "alpaca") {
        const std::string instruction = string_field(rec, opt.columns.instruction, true, what);
        const std::string input = string_field(rec, opt.columns.input, false, what);
        const std::string output = string_field(rec, opt.columns.output, true, what);
        rendered = {alpaca_example(tok, alpaca_prompt(instruction, input), output, opt.train_on_input, &mismatch)};
      } else if (kind == "chat") {
        std::vector<ChatMessage> msgs = chat_messages_of(rec);
        if (default_system && !msgs.empty() && msgs[0].role != "system")
          msgs.insert(msgs.begin(), {"system", *default_system});
        rendered = {chat_example(tok, fmt_, msgs, opt.train_on_input, &mismatch)};
      } else {
        auto [chosen, rejected] = preference_pair(tok, fmt_, default_system, rec, &mismatch);
        rendered = {std::move(chosen), std::move(rejected)};
      }
      for (const Example& e : rendered)
        for (int32_t id : e.ids)
          if (id < 0 || id >= tok.vocab_size())
            throw Error(fmt::format("token id {} is outside the tokenizer's vocabulary of {}", id, tok.vocab_size()));
    } catch (Error& err) {
      err.set_file(path);
      err.set_line(recs[k].line);
      if (opt.on_bad_row == BadRowPolicy::Fail) throw;
      if (report.skipped++ == 0) report.first_skip = err.what();
      continue;
    }
    report.boundary_mismatch += mismatch;
    // A pair is kept or dropped whole: a preference needs both sides.
    bool empty = false;
    std::vector<char> truncated;
    for (Example& e : rendered) {
      report.longest = std::max(report.longest, int64_t(e.ids.size()));
      truncated.push_back(opt.max_seq_len > 0 && int64_t(e.ids.size()) > opt.max_seq_len);
      if (truncated.back()) {
        e.ids.resize(size_t(opt.max_seq_len));
        e.targets.resize(size_t(opt.max_seq_len));
        ++report.truncated;
      }
      empty |= std::none_of(e.targets.begin(), e.targets.end(), [](int32_t t) { return t != ops::kIgnoreIndex; });
    }
    if (empty) {  // e.g. a prompt longer than max_seq_len: nothing to learn from it
      report.dropped_no_target += int64_t(rendered.size());
      continue;
    }
    for (size_t i = 0; i < rendered.size(); ++i) {
      Example& e = rendered[i];
      report.tokens += int64_t(e.ids.size());
      report.trained_tokens +=
          std::count_if(e.targets.begin(), e.targets.end(), [](int32_t t) { return t != ops::kIgnoreIndex; });
      if (ordinals) ordinals->push_back(int64_t(k));
      if (report.samples.size() < LoadReport::kSamples) report.samples.push_back({recs[k].line, e, bool(truncated[i])});
      out.push_back(std::move(e));
    }
  }
  report.examples += int64_t(out.size());
  if (out.empty())
    throw Error(fmt::format("no usable examples in {} records{}", recs.size(),
                            report.skipped ? fmt::format(" ({} bad rows skipped; first: {})", report.skipped,
                                                         report.first_skip)
                                           : ""),
                {.file = path});
  return out;
}

std::string LoadReport::summary() const {
  std::string s = fmt::format("{}: {} examples from {} records, {} tokens ({} trained)", format, examples, records,
                              tokens, trained_tokens);
  if (truncated) s += fmt::format(", {} truncated", truncated);
  if (dropped_no_target) s += fmt::format(", {} dropped (nothing to learn after truncation)", dropped_no_target);
  if (boundary_mismatch)
    s += fmt::format(", {} with a prompt/answer token boundary merge", boundary_mismatch);
  if (skipped) s += fmt::format("; skipped {} bad rows (first: {})", skipped, first_skip);
  return s;
}

std::string render_masked(const Tokenizer& tok, const Example& e) {
  if (e.ids.empty()) return "";
  // The full sequence is ids plus the last target; token i (i >= 1) is trained iff targets[i-1] is.
  std::vector<int32_t> seq = e.ids;
  std::vector<char> trained(seq.size(), 0);
  for (size_t t = 1; t < seq.size(); ++t) trained[t] = e.targets[t - 1] != ops::kIgnoreIndex;
  if (e.targets.back() != ops::kIgnoreIndex) {
    seq.push_back(e.targets.back());
    trained.push_back(1);
  }
  auto is_special = [&](int32_t id) {
    if (id == tok.bos_id() || id == tok.eos_id()) return true;
    const std::string p = tok.piece(id);
    return tok.decode({id}).empty() && tok.special_token(p) == id;
  };
  std::string out;
  bool open = false;  // inside «...»
  std::vector<int32_t> run;
  auto flush = [&] {
    if (!run.empty()) out += tok.decode(run);
    run.clear();
  };
  for (size_t i = 0; i < seq.size(); ++i) {
    if (bool(trained[i]) == open) {  // the mask changes here
      flush();
      out += open ? "»" : "«";
      open = !open;
    }
    if (is_special(seq[i])) {
      flush();
      out += tok.piece(seq[i]);
    } else {
      run.push_back(seq[i]);
    }
  }
  flush();
  if (open) out += "»";
  return out;
}

}  // namespace shardlm::data
