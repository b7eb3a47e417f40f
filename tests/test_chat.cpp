// Chat formats (data/instruct.h): the renderer training's chat data and `generate --chat` share,
// against renderings written by hand from the models' published templates.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/instruct.h"
#include "data/tokenizer.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(__FILE__).parent_path().parent_path().parent_path() / "shared" / "data";

// Bytes plus a few special tokens (ids 259...), like a Qwen2 or Llama 3 tokenizer's added tokens.
class StubTokenizer final : public data::Tokenizer {
 public:
  explicit StubTokenizer(std::vector<std::string> specials) : specials_(std::move(specials)) {}
  std::string name() const override { return "stub"; }
  int64_t vocab_size() const override { return 259 + int64_t(specials_.size()); }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  std::vector<int32_t> encode(std::string_view text) const override { return bytes_.encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override { return bytes_.decode(ids); }
  std::optional<int32_t> special_token(std::string_view text) const override {
    for (size_t i = 0; i < specials_.size(); ++i)
      if (text == specials_[i]) return int32_t(259 + i);
    return bytes_.special_token(text);
  }
  std::string piece(int32_t id) const override { return id >= 259 ? specials_[size_t(id - 259)] : bytes_.piece(id); }

 private:
  std::vector<std::string> specials_;
  data::ByteTokenizer bytes_;
};

const std::vector<data::ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}};

}  // namespace

TEST(ChatFormats, TextMatchesThePublishedTemplates) {
  data::ByteTokenizer bytes;  // BOS <s>, EOS </s>
  // Qwen2-Instruct's template (without its default system message, given here explicitly).
  EXPECT_EQ(data::chat_text(data::ChatFormat::ChatML, kConversation, bytes, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  // Meta-Llama-3-8B-Instruct's template with add_generation_prompt.
  EXPECT_EQ(data::chat_text(data::ChatFormat::Llama3, kConversation, bytes, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Llama-2-chat's template.
  EXPECT_EQ(data::chat_text(data::ChatFormat::Llama2, kConversation, bytes, true),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] 2+2? [/INST]");
  // Mistral-7B-Instruct-v0.2's template.
  EXPECT_EQ(data::chat_text(data::ChatFormat::Mistral, kConversation, bytes, true),
            "<s> [INST] Be brief.\n\nHi [/INST] Hello!</s> [INST] 2+2? [/INST]");
  expect_error([&] { data::chat_text(data::ChatFormat::ChatML, {{"user", "a"}, {"assistant", "b"}}, bytes, true); },
               "must end with a user message");
}

TEST(ChatFormats, ChatMLTokensAndLossMask) {
  const StubTokenizer tok({"<|im_start|>", "<|im_end|>"});
  EXPECT_EQ(data::resolve_chat_format("auto", tok), data::ChatFormat::ChatML);
  std::vector<data::ChatMessage> msgs = kConversation;
  msgs.push_back({"assistant", "4"});
  const data::Example e = data::chat_example(tok, data::ChatFormat::ChatML, msgs);
  EXPECT_EQ(data::render_masked(tok, e),
            "«<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n»"
            "Hello!<|im_end|>«\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n»4<|im_end|>");
  // The generation prompt is the conversation's tokens up to the answer, and the text's tokens.
  const std::vector<int32_t> prompt = data::chat_prompt_ids(tok, data::ChatFormat::ChatML, kConversation);
  const std::vector<int32_t>& full = e.ids;  // all but the final "\n"
  ASSERT_LT(prompt.size(), full.size());
  EXPECT_EQ(prompt, std::vector<int32_t>(full.begin(), full.begin() + int64_t(prompt.size())));
  EXPECT_EQ(data::chat_stop_ids(tok, data::ChatFormat::ChatML), std::vector<int32_t>{260});
  expect_error([&] { data::chat_prompt_ids(data::ByteTokenizer(), data::ChatFormat::ChatML, kConversation); },
               "<|im_start|>");
}

TEST(ChatFormats, MistralTokensAndLossMask) {
  data::ByteTokenizer tok;
  std::vector<data::ChatMessage> msgs = kConversation;
  msgs.push_back({"assistant", "4"});
  const data::Example e = data::chat_example(tok, data::ChatFormat::Mistral, msgs);
  // The byte tokenizer has no word-boundary prefix, so the template's spaces before [INST] and
  // the answers are SentencePiece's "▁" and do not show here.
  EXPECT_EQ(data::render_masked(tok, e), "«<s>[INST] Be brief.\n\nHi [/INST]»Hello!</s>«[INST] 2+2? [/INST]»4</s>");
  const std::vector<int32_t> prompt = data::chat_prompt_ids(tok, data::ChatFormat::Mistral, kConversation);
  EXPECT_EQ(prompt, std::vector<int32_t>(e.ids.begin(), e.ids.begin() + int64_t(prompt.size())));
  EXPECT_EQ(tok.decode(prompt), "[INST] Be brief.\n\nHi [/INST]Hello![INST] 2+2? [/INST]");
}

TEST(ChatFormats, Llama3GenerationPromptWithTheRealTokenizer) {
  const fs::path model = kData / "llama3_tokenizer.model";
  ASSERT_TRUE(fs::exists(model)) << "shared test data not found at " << kData;
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer_file(model.string());
  EXPECT_EQ(data::resolve_chat_format("auto", *tok), data::ChatFormat::Llama3);
  const std::vector<int32_t> ids = data::chat_prompt_ids(*tok, data::ChatFormat::Llama3, {{"user", "Hi"}});
  // <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>
  // <|start_header_id|>assistant<|end_header_id|>\n\n, with Llama 3's ids (transformers'
  // apply_chat_template gives these: user = 882, assistant = 78191, "\n\n" = 271, "Hi" = 13347).
  EXPECT_EQ(ids, (std::vector<int32_t>{128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271}));
  EXPECT_EQ(data::chat_stop_ids(*tok, data::ChatFormat::Llama3), std::vector<int32_t>{128009});
}

TEST(ChatFormats, Llama2GenerationPromptWithTheRealTokenizer) {
  const fs::path model = kData / "llama2_tokenizer.model";
  ASSERT_TRUE(fs::exists(model)) << "shared test data not found at " << kData;
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer_file(model.string());
  EXPECT_EQ(data::resolve_chat_format("auto", *tok), data::ChatFormat::Llama2);
  // Meta's chat_completion: BOS + encode("[INST] Hi [/INST]").
  EXPECT_EQ(data::chat_prompt_ids(*tok, data::ChatFormat::Llama2, {{"user", "Hi"}}),
            tok->encode_with("[INST] Hi [/INST]", true, false));
  EXPECT_EQ(data::chat_prompt_ids(*tok, data::ChatFormat::Mistral, {{"user", "Hi"}}),
            tok->encode_with("[INST] Hi [/INST]", true, false));
}

TEST(ChatFormats, FormatFromTheTemplateThenTheSpecialTokens) {
  using F = data::ChatFormat;
  // Markers of the published templates (excerpts).
  EXPECT_EQ(data::chat_format_of_template("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"),
            F::Llama3);
  EXPECT_EQ(data::chat_format_of_template("{{'<|im_start|>' + message['role'] + '\\n' + message['content']}}"),
            F::ChatML);
  EXPECT_EQ(data::chat_format_of_template(
                "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' %}{{ bos_token + '[INST] ' }}"),
            F::Llama2);
  EXPECT_EQ(data::chat_format_of_template("{{- ' [INST] ' + message['content'] + ' [/INST]' }}"), F::Mistral);
  EXPECT_FALSE(data::chat_format_of_template("{{ message['content'] }}").has_value());
  data::ByteTokenizer bytes;
  const StubTokenizer l3({"<|start_header_id|>"});
  EXPECT_EQ(data::resolve_chat_format("auto", bytes, "{{ '<|im_start|>' }}"), F::ChatML);  // the template wins
  EXPECT_EQ(data::resolve_chat_format("auto", l3), F::Llama3);
  EXPECT_EQ(data::resolve_chat_format("auto", bytes), F::Llama2);
  EXPECT_EQ(data::resolve_chat_format("mistral", l3), F::Mistral);
  expect_error([&] { data::resolve_chat_format("vicuna", bytes); }, "chatml");
  // tokenizer_config.json: a string, or a list of named templates.
  const TempDir tmp;  // testing.h: a fresh directory, removed afterwards
  const fs::path d = tmp.path();
  EXPECT_EQ(data::read_chat_template(d.string()), "");
  std::ofstream(d / "tokenizer_config.json")
      << R"({"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "[INST]"}]})";
  EXPECT_EQ(data::read_chat_template(d.string()), "[INST]");
  std::ofstream(d / "tokenizer_config.json") << R"({"chat_template": "<|im_start|>"})";
  EXPECT_EQ(data::read_chat_template(d.string()), "<|im_start|>");
}

TEST(ChatFormats, DefaultSystemMessageOfAChatMLTemplate) {
  // Qwen2-Instruct's template (as tokenizer_config.json holds it, "\n" written as an escape).
  const std::string qwen2 =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  EXPECT_EQ(data::chat_format_of_template(qwen2), data::ChatFormat::ChatML);
  EXPECT_EQ(data::chat_default_system(qwen2), "You are a helpful assistant.");
  // A template that only renders the conversation's own system message has none.
  EXPECT_FALSE(data::chat_default_system(
                   "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{{ '<|im_start|>' }}")
                   .has_value());
  EXPECT_FALSE(data::chat_default_system("{{ '<|start_header_id|>' }}").has_value());
  // Training data in that format gets it, as apply_chat_template renders it.
  const StubTokenizer tok({"<|im_start|>", "<|im_end|>"});
  const TempDir tmp;
  const fs::path d = tmp.path();
  std::ofstream(d / "c.jsonl")
      << R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})" << "\n";
  data::InstructOptions opt;
  opt.chat_template = qwen2;
  data::LoadReport rep;
  const std::vector<data::Example> ex = data::load_instruct_file((d / "c.jsonl").string(), "chat", tok, opt, rep);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(data::render_masked(tok, ex[0]),
            "«<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n»Yo<|im_end|>");
  EXPECT_EQ(rep.format, "chat (chatml, default system message)");
}
