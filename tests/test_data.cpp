// Tests of the data pipeline: Alpaca and chat rendering and masking, bad inputs, the eval split,
// the distributed sampler and prefetch, the data config, and an end-to-end run on Alpaca data.
// Owner: the data pipeline. Reads <repo>/../shared/data when present (skips what needs it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/instruct.h"
#include "data/packing.h"
#include "data/sampler.h"
#include "io/yaml_config.h"
#include "ops/ops.h"
#include "testing.h"
#include "model/config.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"
#include "train/train_config.h"
#include "data/run_data.h"
#include "train/trainer.h"

using namespace shardlm;
using namespace shardlm::testing;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(__FILE__).parent_path().parent_path().parent_path() / "shared" / "data";

fs::path fresh_dir(const std::string& name) {
  // Per process: checkouts beside this one may run the same tests at the same time.
  const fs::path d = fs::path(::testing::TempDir()) / ("shardlm_data_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// The ids whose prediction is trained, in order.
std::vector<int32_t> trained_targets(const data::Example& e) {
  std::vector<int32_t> out;
  for (int32_t t : e.targets)
    if (t != ops::kIgnoreIndex) out.push_back(t);
  return out;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Byte-level tokens plus Llama 3's chat markers as special tokens 259..262.
class ChatStubTokenizer final : public data::Tokenizer {
 public:
  std::string name() const override { return "stub"; }
  int64_t vocab_size() const override { return 263; }
  int32_t bos_id() const override { return 259; }
  int32_t eos_id() const override { return 2; }
  std::vector<int32_t> encode(std::string_view text) const override { return bytes_.encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override { return bytes_.decode(ids); }
  std::optional<int32_t> special_token(std::string_view text) const override {
    for (int32_t i = 0; i < 4; ++i)
      if (text == kSpecials[i]) return 259 + i;
    return bytes_.special_token(text);
  }
  std::string piece(int32_t id) const override { return id >= 259 ? kSpecials[id - 259] : bytes_.piece(id); }

 private:
  static constexpr const char* kSpecials[4] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                               "<|eot_id|>"};
  data::ByteTokenizer bytes_;
};

// An ExampleDataset of n examples with lengths 1..max_len (ids encode the example index).
data::ExampleDataset varied_dataset(int64_t n, int64_t max_len) {
  std::vector<data::Example> ex;
  for (int64_t i = 0; i < n; ++i) {
    data::Example e;
    const int64_t len = 1 + (i * 7) % max_len;
    for (int64_t t = 0; t < len; ++t) {
      e.ids.push_back(int32_t(3 + i % 200));
      e.targets.push_back(t == 0 ? ops::kIgnoreIndex : int32_t(3 + (i + t) % 200));
    }
    ex.push_back(e);
  }
  return data::ExampleDataset(std::move(ex));
}

}  // namespace

// ---- Alpaca ----------------------------------------------------------------------------------

TEST(Alpaca, TemplatesAreStanfordsExactly) {
  const fs::path f = kData / "alpaca_prompt_templates.json";
  ASSERT_TRUE(fs::exists(f)) << "shared test data not found at " << kData;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(f));
  EXPECT_EQ(std::string(data::kAlpacaPromptInput), j["prompt_input"].get<std::string>());
  EXPECT_EQ(std::string(data::kAlpacaPromptNoInput), j["prompt_no_input"].get<std::string>());
  // Placeholders in a record's own text are not substituted (one pass, like str.format).
  EXPECT_EQ(data::alpaca_prompt("say {input}", ""),
            "Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\nsay {input}\n\n### Response:");
}

TEST(Alpaca, ByteLevelMaskCoversExactlyThePrompt) {
  data::ByteTokenizer tok;
  for (const std::string input : {"", "ctx"}) {
    const std::string prompt = data::alpaca_prompt("Add 2 and 3.", input);
    EXPECT_EQ(prompt.find("### Input:") != std::string::npos, !input.empty());
    bool mismatch = true;
    const data::Example e = data::alpaca_example(tok, prompt, "5", false, &mismatch);
    EXPECT_FALSE(mismatch);
    // ids = BOS + prompt + output; the first trained prediction is the output's first token.
    ASSERT_EQ(e.ids.size(), 1 + prompt.size() + 1);
    EXPECT_EQ(trained_targets(e), concat(tok.encode("5"), {tok.eos_id()}));
    EXPECT_EQ(e.targets[prompt.size()], tok.encode("5")[0]);
    EXPECT_EQ(e.targets[prompt.size() - 1], ops::kIgnoreIndex);
    const data::Example all = data::alpaca_example(tok, prompt, "5", true);
    EXPECT_EQ(trained_targets(all).size(), all.ids.size());  // train_on_input: every target
  }
}

TEST(Alpaca, Llama2LossMaskMatchesStanfordTokenization) {
  // Expected ids from python sentencepiece on llama2_tokenizer.model: BOS + encode(prompt), and
  // the rest of BOS + encode(prompt + output) + EOS (the trained targets).
  const std::string model = (kData / "llama2_tokenizer.model").string();
  ASSERT_TRUE(fs::exists(model)) << "shared test data not found at " << kData;
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer_file(model);
  const nlohmann::json recs = nlohmann::json::parse(std::ifstream(kData / "alpaca_en_demo.json"));
  struct Case {
    int record;
    std::vector<int32_t> prompt, trained;
  };
  const std::vector<Case> cases = {
      {362,  // "Calculate 15% of 500." without input
       {1,     13866, 338,   385,   15278, 393,   16612, 263,   3414,  29889, 14350, 263,   2933,  393, 7128, 2486,
        1614,  2167,  278,   2009,  29889, 13,    13,    2277,  29937, 2799,  4080,  29901, 13,    27065, 403, 29871,
        29896, 29945, 29995, 310,   29871, 29945, 29900, 29900, 29889, 13,    13,    2277,  29937, 13291, 29901},
       {29896, 29945, 29995, 310, 29871, 29945, 29900, 29900, 338, 29871, 29955, 29945, 29889, 2}},
      {554,  // "Sum up the numbers." with input "3, 2, 5"
       {1,     13866, 338,   385,   15278, 393,   16612, 263,   3414,  29892, 3300,  2859,  411,   385,   1881,  393,
        8128,  4340,  3030,  29889, 14350, 263,   2933,  393,   7128,  2486,  1614,  2167,  278,   2009,  29889, 13,
        13,    2277,  29937, 2799,  4080,  29901, 13,    11139, 701,   278,   3694,  29889, 13,    13,    2277,  29937,
        10567, 29901, 13,    29941, 29892, 29871, 29906, 29892, 29871, 29945, 13,    13,    2277,  29937, 13291, 29901},
       {1576, 2533, 310, 278, 3694, 338, 29871, 29896, 29900, 29889, 2}},
  };
  for (const Case& c : cases) {
    const nlohmann::json& r = recs[size_t(c.record)];
    const std::string prompt = data::alpaca_prompt(r["instruction"].get<std::string>(), r["input"].get<std::string>());
    bool mismatch = true;
    const data::Example e = data::alpaca_example(*tok, prompt, r["output"].get<std::string>(), false, &mismatch);
    EXPECT_FALSE(mismatch) << c.record;
    const std::vector<int32_t> full = concat(c.prompt, c.trained);
    EXPECT_EQ(e.ids, std::vector<int32_t>(full.begin(), full.end() - 1)) << c.record;
    EXPECT_EQ(trained_targets(e), c.trained) << c.record;
    // Masked: exactly the predictions of prompt tokens 1..n-1 (BOS is never a target).
    for (size_t t = 0; t < e.targets.size(); ++t)
      EXPECT_EQ(e.targets[t] == ops::kIgnoreIndex, t + 1 < c.prompt.size()) << c.record << " position " << t;
  }
  // All 999 records load; 57 of them have a SentencePiece merge across the prompt/output
  // boundary (counted with python sentencepiece), which is reported, not an error.
  data::LoadReport rep;
  const auto ex = data::load_instruct_file((kData / "alpaca_en_demo.json").string(), "alpaca", *tok, {}, rep);
  EXPECT_EQ(rep.records, 999);
  EXPECT_EQ(rep.examples, 999);
  EXPECT_EQ(rep.boundary_mismatch, 57);
  EXPECT_NE(rep.summary().find("57 with a prompt/answer token boundary merge"), std::string::npos) << rep.summary();
}

TEST(Alpaca, ColumnMapJsonArrayAndTruncation) {
  const fs::path d = fresh_dir("columns");
  const std::string path =
      write(d / "qa.json", R"([
  {"question": "Name a color.", "answer": "Blue"},
  {"question": "Double it.", "context": "4", "answer": "8"}
])");
  data::ByteTokenizer tok;
  data::InstructOptions opt;
  opt.columns = {"question", "context", "answer"};
  EXPECT_EQ(data::detect_json_kind(path, opt.columns), "alpaca");
  data::LoadReport rep;
  std::vector<int64_t> ordinals;
  const auto ex = data::load_instruct_file(path, "alpaca", tok, opt, rep, &ordinals);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ordinals, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(ex[1].ids, data::alpaca_example(tok, data::alpaca_prompt("Double it.", "4"), "8", false).ids);
  EXPECT_EQ(trained_targets(ex[0]), concat(tok.encode("Blue"), {2}));
  // max_seq_len cuts an example (counted); one whose cut leaves nothing to learn is dropped.
  opt.max_seq_len = int64_t(data::alpaca_prompt("Name a color.", "").size()) + 2;
  data::LoadReport cut;
  const auto short_ex = data::load_instruct_file(path, "alpaca", tok, opt, cut);
  EXPECT_EQ(cut.truncated, 2);
  EXPECT_EQ(cut.dropped_no_target, 1);  // the second prompt is longer than the limit
  ASSERT_EQ(short_ex.size(), 1u);
  EXPECT_EQ(int64_t(short_ex[0].ids.size()), opt.max_seq_len);
  EXPECT_EQ(trained_targets(short_ex[0]), tok.encode("Bl"));
}

// ---- chat ------------------------------------------------------------------------------------

TEST(Chat, Llama3RenderingTrainsOnlyAssistantContentAndEot) {
  ChatStubTokenizer tok;
  EXPECT_EQ(data::resolve_chat_format("auto", tok), data::ChatFormat::Llama3);
  const std::vector<data::ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", " Hello! "}, {"user", "Bye"}, {"assistant", "Ciao"}};
  const data::Example e = data::chat_example(tok, data::ChatFormat::Llama3, msgs);
  EXPECT_EQ(data::render_masked(tok, e),
            "«<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n»Hello!<|eot_id|>"
            "«<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n»Ciao<|eot_id|>");
  EXPECT_EQ(trained_targets(e), concat(concat(tok.encode("Hello!"), {262}), concat(tok.encode("Ciao"), {262})));
  EXPECT_EQ(e.ids[0], 259);
}

TEST(Chat, Llama2MatchesMetasFormat) {
  data::ByteTokenizer tok;  // no <|start_header_id|>: auto picks llama2
  EXPECT_EQ(data::resolve_chat_format("auto", tok), data::ChatFormat::Llama2);
  const std::vector<data::ChatMessage> msgs = {
      {"system", "Sys"}, {"user", "Hi "}, {"assistant", "Yo"}, {"user", "Again"}, {"assistant", "Sure"}};
  const data::Example e = data::chat_example(tok, data::ChatFormat::Llama2, msgs);
  // Hugging Face's Llama-2 template gives
  //   <s>[INST] <<SYS>>\nSys\n<</SYS>>\n\nHi [/INST] Yo </s><s>[INST] Again [/INST] Sure </s>
  EXPECT_EQ(data::render_masked(tok, e),
            "«<s>[INST] <<SYS>>\nSys\n<</SYS>>\n\nHi [/INST]» Yo </s>«<s>[INST] Again [/INST]» Sure </s>");
  EXPECT_EQ(trained_targets(e), concat(concat(tok.encode(" Yo "), {2}), concat(tok.encode(" Sure "), {2})));
  expect_error([&] { data::chat_example(tok, data::ChatFormat::Llama2, {{"user", "a"}, {"user", "b"}}); },
               "needs an assistant answer");
  expect_error([&] { data::chat_example(tok, data::ChatFormat::Llama3, msgs); }, "lacks");
}

TEST(Chat, BadConversationsNameFileAndLine) {
  const fs::path d = fresh_dir("chat");
  data::ByteTokenizer tok;
  auto load = [&](const std::string& body) {
    const std::string p = write(d / "c.jsonl", R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
                                                   "\n" + body + "\n");
    data::LoadReport rep;
    return data::load_instruct_file(p, "chat", tok, {}, rep);
  };
  EXPECT_EQ(load(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]})").size(), 2u);
  const std::string p = (d / "c.jsonl").string();
  expect_error([&] { load(R"({"messages": [{"role": "robot", "content": "x"}]})"); },
               p + ":2: message 0 has unknown role 'robot'");
  expect_error([&] { load(R"({"messages": []})"); }, p + ":2: field 'messages' is empty");
  expect_error([&] { load(R"({"messages": [{"role": "user"}]})"); }, p + ":2: missing field 'content' (messages[0])");
  expect_error([&] { load(R"({"text": "hi"})"); }, p + ":2: missing field 'messages'");
}

// ---- bad input -------------------------------------------------------------------------------

TEST(DataErrors, BadRowsNameFileAndLineAndSkipCounts) {
  const fs::path d = fresh_dir("bad");
  data::ByteTokenizer tok;
  const std::string good = R"({"instruction": "i", "input": "", "output": "o"})";
  const std::string path = write(d / "a.jsonl", good + "\n" + R"({"instruction": "i", "input": ""})" + "\n\n" +
                                                    R"({"instruction": "i", "output": )" + "\n" + good + "\n" +
                                                    "{\"instruction\": \"caf\xff\", \"output\": \"o\"}\n" + good + "\n");
  data::LoadReport rep;
  expect_error([&] { data::load_instruct_file(path, "alpaca", tok, {}, rep); }, path + ":2: missing field 'output'");
  data::InstructOptions skip;
  skip.on_bad_row = data::BadRowPolicy::Skip;
  data::LoadReport srep;
  const auto ex = data::load_instruct_file(path, "alpaca", tok, skip, srep);
  EXPECT_EQ(ex.size(), 3u);
  EXPECT_EQ(srep.records, 6);
  EXPECT_EQ(srep.skipped, 3);
  EXPECT_NE(srep.summary().find("skipped 3 bad rows (first: " + path + ":2: missing field 'output'"),
            std::string::npos)
      << srep.summary();
  // Each kind of bad line on its own, in fail mode.
  const std::string one = (d / "one.jsonl").string();
  auto fails = [&](const std::string& text, const std::string& needle) {
    write(one, text);
    data::LoadReport r;
    expect_error([&] { data::load_instruct_file(one, "alpaca", tok, {}, r); }, needle);
  };
  fails(good + "\n" + good + "\n{\"instruction\": \"i\", \"output\": \n", one + ":3: malformed JSON");
  fails(good + "\n\n\n{\"instruction\": \"caf\xff\", \"output\": \"o\"}\n", one + ":4: invalid UTF-8 (byte 0xFF)");
  fails(good + "\n{\"instruction\": 3, \"output\": \"o\"}\n", one + ":2: field 'instruction' must be a string");
  fails("  \n\n", one + ": the data file is empty");
  fails("[\n  " + good + ",\n  {\"instruction\": \"x\",\n   \"output\": oops}\n]", one + ":4: malformed JSON");
  fails("[\n  " + good + ",\n", one + ":3: malformed JSON array: no closing ']'");
  // Nothing usable, even when skipping.
  write(one, "{\"x\": 1}\n");
  data::LoadReport r;
  expect_error([&] { data::load_instruct_file(one, "alpaca", tok, skip, r); }, "no usable examples in 1 records");
  // Plain text must be UTF-8 too.
  const std::string txt = write(d / "t.txt", "fine\nbad \xc3\x28 here\n");
  expect_error([&] { data::tokenize_text_file(txt, tok); }, txt + ":2: invalid UTF-8 (byte 0xC3)");
  EXPECT_EQ(data::utf8_error_offset("h\xc3\xa9llo \xf0\x9f\x98\x80"), std::string_view::npos);
  EXPECT_EQ(data::utf8_error_offset("\xed\xa0\x80"), 0u);  // a surrogate
  EXPECT_EQ(data::utf8_error_offset("ab\xc0\xaf"), 2u);    // overlong
}

// ---- the data config, type detection and the eval split --------------------------------------

TEST(DataConfig, KeysTypesAndSplit) {
  const fs::path d = fresh_dir("cfg");
  std::string jsonl;
  for (int i = 0; i < 200; ++i)
    jsonl += fmt::format(R"({{"q": "question {}", "a": "answer {}"}})", i, i) + "\n";
  const std::string path = write(d / "qa.jsonl", jsonl);
  ConfigTree t = ConfigTree::parse("model: m\noutput_dir: o\nseq_len: 64\ndata:\n  train: " + path +
                                   "\n  columns: {instruction: q, output: a}\n  eval_fraction: 0.1\n"
                                   "  on_bad_row: skip\n  train_on_input: true\n");
  const train::TrainConfig c = train::read_train_config(t);
  EXPECT_EQ(c.data.columns.instruction, "q");
  EXPECT_EQ(c.data.columns.input, "input");
  EXPECT_EQ(c.data.on_bad_row, "skip");
  EXPECT_FALSE(c.data.packing.has_value());
  data::ByteTokenizer tok;
  const data::RunData a = data::load_run_data(c.data, c.seq_len, c.seed, tok, tok.vocab_size()),
                      b = data::load_run_data(c.data, c.seq_len, c.seed, tok, tok.vocab_size());
  EXPECT_EQ(a.type, "alpaca");
  EXPECT_TRUE(a.packing);  // the default for instruction data
  EXPECT_EQ(a.train->size() + a.eval->size(), 200);
  EXPECT_GT(a.eval->size(), 8);
  EXPECT_LT(a.eval->size(), 35);
  ASSERT_EQ(a.eval->size(), b.eval->size());  // deterministic
  for (int64_t i = 0; i < a.eval->size(); ++i) EXPECT_EQ(a.eval->get(i).ids, b.eval->get(i).ids);
  EXPECT_EQ(trained_targets(a.train->get(0)).size(), a.train->get(0).ids.size());  // train_on_input
  // `format` is the old name of `type`; bad values name the key.
  ConfigTree old = ConfigTree::parse("model: m\noutput_dir: o\ndata: {train: x.bin, format: tokens}\n");
  EXPECT_EQ(train::read_train_config(old).data.type, "tokens");
  ConfigTree bad = ConfigTree::parse("model: m\noutput_dir: o\ndata: {train: x, on_bad_row: ignore}\n", "run.yaml");
  expect_error([&] { train::read_train_config(bad); }, "run.yaml:3: key 'data.on_bad_row': expected fail or skip");
  ConfigTree builtin = ConfigTree::parse("model: m\noutput_dir: o\ndata: {type: builtin:addition}\n");
  EXPECT_EQ(train::read_train_config(builtin).data.train, "builtin:addition");
}

// Preference records in TRL's forms: standard strings (BOS + prompt, then completion + EOS, only the
// completion and EOS trained) and conversations (the prompt's rendering with the generation prompt
// masked, the rest rendered as chat training renders it), an implicit prompt giving the same pair
// as an explicit one; each record gives (chosen, rejected); a bad record names FILE:LINE.
TEST(Preference, StandardAndConversationalPairs) {
  const fs::path d = fresh_dir("pref");
  data::ByteTokenizer tok;
  data::InstructOptions opt;
  opt.chat_format = "llama2";
  data::LoadReport rep;
  const std::string plain = write(d / "std.jsonl", R"({"prompt": "Q?", "chosen": " yes", "rejected": " no"})" "\n");
  EXPECT_EQ(data::detect_json_kind(plain, {}), "preference");
  const std::vector<data::Example> s = data::load_instruct_file(plain, "preference", tok, opt, rep);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].ids[0], tok.bos_id());
  EXPECT_EQ(trained_targets(s[0]), tok.encode_with(" yes", false, true));
  EXPECT_EQ(trained_targets(s[1]), tok.encode_with(" no", false, true));
  EXPECT_EQ(s[0].ids.size(), 1 + tok.encode("Q? yes").size());  // BOS + prompt + completion; EOS is the last target

  const std::string user = R"({"role": "user", "content": "Q?"})", yes = R"({"role": "assistant", "content": "yes"})",
                    no = R"({"role": "assistant", "content": "no"})";
  const std::string conv = write(d / "conv.jsonl", "{\"prompt\": [" + user + "], \"chosen\": [" + yes + "], \"rejected\": [" +
                                                       no + "]}\n{\"chosen\": [" + user + ", " + yes + "], \"rejected\": [" +
                                                       user + ", " + no + "]}\n");
  const std::vector<data::Example> c = data::load_instruct_file(conv, "preference", tok, opt, rep);
  ASSERT_EQ(c.size(), 4u);
  for (size_t i = 0; i < 2; ++i) {  // the implicit prompt is the explicit one
    EXPECT_EQ(c[i].ids, c[i + 2].ids);
    EXPECT_EQ(c[i].targets, c[i + 2].targets);
  }
  const data::Example whole = data::chat_example(tok, data::ChatFormat::Llama2, {{"user", "Q?"}, {"assistant", "yes"}});
  EXPECT_EQ(c[0].ids, whole.ids);
  EXPECT_EQ(trained_targets(c[0]), trained_targets(whole));
  EXPECT_FALSE(trained_targets(c[1]).empty());
  const std::vector<int32_t> prompt = data::chat_prompt_ids(tok, data::ChatFormat::Llama2, {{"user", "Q?"}});
  for (size_t t = 0; t + 1 < prompt.size(); ++t) EXPECT_EQ(c[0].targets[t], ops::kIgnoreIndex) << t;

  const std::string bad = write(d / "bad.jsonl", std::string(R"({"prompt": "Q?", "chosen": " yes", "rejected": " no"})") +
                                                     "\n" + R"({"prompt": "Q?", "chosen": " yes"})" + "\n");
  expect_error([&] { data::load_instruct_file(bad, "preference", tok, opt, rep); },
               "bad.jsonl:2: missing field 'rejected'");
}

// ---- the sampler -----------------------------------------------------------------------------

TEST(Sampler, GlobalBatchesAreTheSameForAnyWorldSize) {
  const data::ExampleDataset ds = varied_dataset(90, 12);
  for (const bool packing : {true, false}) {
    const int64_t G = 8, B = 2;
    // world size -> per step, the concatenation of every rank's rows and micro-batch tokens
    auto run = [&](int64_t W, int64_t steps) {
      std::vector<std::vector<std::vector<int64_t>>> rows(static_cast<size_t>(steps));
      std::vector<std::vector<int32_t>> ids(static_cast<size_t>(steps));
      for (int64_t r = 0; r < W; ++r) {
        data::SamplerOptions o;
        o.seq_len = 16;
        o.packing = packing;
        o.micro_batch_size = B;
        o.gradient_accumulation_steps = G / (B * W);
        o.world_size = W;
        o.rank = r;
        o.seed = 7;
        data::DistributedSampler s(ds, o);
        for (int64_t k = 0; k < steps; ++k) {
          const data::StepBatch sb = s.next();
          EXPECT_EQ(int64_t(sb.micro.size()), o.gradient_accumulation_steps);
          rows[size_t(k)].insert(rows[size_t(k)].end(), sb.rows.begin(), sb.rows.end());
          for (const auto& mb : sb.micro) {
            EXPECT_EQ(mb.B, B);
            if (packing) {
              EXPECT_EQ(mb.T, 16);
            }
            for (int64_t i = 0; i < mb.B; ++i)  // padded rows: compare the real tokens only
              for (int64_t t = 0; t < mb.T; ++t)
                if (mb.targets[size_t(i * mb.T + t)] != ops::kIgnoreIndex || t == 0)
                  ids[size_t(k)].push_back(mb.ids[size_t(i * mb.T + t)]);
          }
        }
      }
      return std::make_pair(rows, ids);
    };
    data::SamplerOptions o1;
    o1.seq_len = 16;
    o1.packing = packing;
    o1.micro_batch_size = G;
    data::DistributedSampler probe(ds, o1);
    const int64_t steps = probe.steps_in_epoch(0) + 3;  // across an epoch boundary
    const auto one = run(1, steps);
    EXPECT_EQ(run(2, steps), one) << "packing " << packing;
    EXPECT_EQ(run(4, steps), one) << "packing " << packing;
  }
}

TEST(Sampler, OrderIsDeterministicPerSeedAndEpochAndStateRestores) {
  const data::ExampleDataset ds = varied_dataset(60, 10);
  EXPECT_EQ(data::epoch_order(60, 1, 0), data::epoch_order(60, 1, 0));
  EXPECT_NE(data::epoch_order(60, 1, 0), data::epoch_order(60, 2, 0));
  EXPECT_NE(data::epoch_order(60, 1, 0), data::epoch_order(60, 1, 1));
  std::vector<int64_t> sorted = data::epoch_order(60, 1, 3);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 60; ++i) EXPECT_EQ(sorted[size_t(i)], i);  // a permutation
  data::SamplerOptions o;
  o.seq_len = 12;
  o.packing = true;
  o.micro_batch_size = 2;
  o.gradient_accumulation_steps = 2;
  o.seed = 3;
  data::DistributedSampler a(ds, o);
  const auto epoch0 = a.epoch_rows(0);  // a copy: epoch_rows returns the sampler's cache
  EXPECT_NE(epoch0, a.epoch_rows(1));
  const int64_t per_epoch = a.steps_in_epoch(0);
  ASSERT_GT(per_epoch, 2);
  for (int64_t k = 0; k < per_epoch - 1; ++k) a.next();
  const data::SamplerState saved = a.state();
  EXPECT_EQ(saved, (data::SamplerState{0, per_epoch - 1}));
  std::vector<data::StepBatch> cont;
  for (int k = 0; k < 4; ++k) cont.push_back(a.next());
  EXPECT_EQ(cont[0].next, (data::SamplerState{1, 0}));
  EXPECT_EQ(cont[1].state, (data::SamplerState{1, 0}));
  data::DistributedSampler b(ds, o);
  b.set_state(saved);
  for (int k = 0; k < 4; ++k) {
    const data::StepBatch sb = b.next();
    EXPECT_EQ(sb.rows, cont[size_t(k)].rows) << k;
    EXPECT_EQ(sb.state, cont[size_t(k)].state);
    ASSERT_EQ(sb.micro.size(), cont[size_t(k)].micro.size());
    for (size_t m = 0; m < sb.micro.size(); ++m) {
      EXPECT_EQ(sb.micro[m].ids, cont[size_t(k)].micro[m].ids);
      EXPECT_EQ(sb.micro[m].targets, cont[size_t(k)].micro[m].targets);
      EXPECT_EQ(sb.micro[m].segments, cont[size_t(k)].micro[m].segments);
    }
  }
  data::SamplerOptions other = o;
  other.seed = 4;
  EXPECT_NE(data::DistributedSampler(ds, other).next().rows, data::DistributedSampler(ds, o).next().rows);
  expect_error([&] { b.set_state({0, per_epoch + 5}); }, "outside the data");
  o.micro_batch_size = 1000;
  expect_error([&] { data::DistributedSampler(ds, o); }, "fewer than one global batch");
}

// load_state continues a saved state: the same state for the same global batch; for another
// global batch the same row of the epoch when it divides the rows read, else an Error naming where
// the batch is configured.
TEST(Sampler, LoadStateContinuesAtTheSameRowForAnotherGlobalBatch) {
  const data::ExampleDataset ds = varied_dataset(200, 8);
  data::SamplerOptions o;
  o.seq_len = 8;
  o.micro_batch_size = 2;
  o.gradient_accumulation_steps = 2;  // G = 4
  data::DistributedSampler a(ds, o);
  ASSERT_GT(a.steps_in_epoch(0), 6);
  a.load_state({0, 3}, 4);
  EXPECT_EQ(a.state(), (data::SamplerState{0, 3}));
  a.load_state({0, 3}, 8);  // 24 rows read: step 6 of 4 rows
  EXPECT_EQ(a.state(), (data::SamplerState{0, 6}));
  expect_error([&] { a.load_state({0, 1}, 6, {.file = "run.yaml", .key = "micro_batch_size"}); },
               "run.yaml: key 'micro_batch_size': the checkpoint's global batch is 6 rows per step and this run's is 4");
  const int64_t last = a.steps_in_epoch(0);
  a.load_state({0, last}, 4);  // the epoch's end: the next epoch begins
  EXPECT_EQ(a.state(), (data::SamplerState{0, last}));
  EXPECT_EQ(a.next().state, (data::SamplerState{1, 0}));
}

// A mixture (SamplerOptions::mixture): each epoch draws exactly per_epoch units of each source;
// a source drawn more than its size per epoch repeats every example equally often, one drawn less
// continues its own pass in the next epoch (so all of its examples are seen); the state restores
// the order exactly; source_positions counts what each source gave up to a state.
TEST(Sampler, MixtureDrawsEachSourcesShareAndResumes) {
  std::vector<std::unique_ptr<data::Dataset>> parts;
  parts.push_back(std::make_unique<data::ExampleDataset>(varied_dataset(10, 6)));
  parts.push_back(std::make_unique<data::ExampleDataset>(varied_dataset(30, 6)));
  const data::ConcatDataset ds(std::move(parts));
  ASSERT_EQ(ds.size(), 40);
  data::SamplerOptions o;
  o.seq_len = 8;
  o.micro_batch_size = 2;
  o.gradient_accumulation_steps = 2;  // G = 4 rows, one example each
  o.seed = 5;
  o.mixture = {{"a", 0, 10, 20}, {"b", 10, 30, 20}};  // a: 2 passes an epoch, b: 2/3 of one
  data::DistributedSampler s(ds, o);
  EXPECT_EQ(s.steps_in_epoch(0), 10);
  std::map<int64_t, int> seen;
  for (int64_t e = 0; e < 3; ++e) {
    int from_a = 0;
    for (const auto& row : s.epoch_rows(e)) {
      ASSERT_EQ(row.size(), 1u);
      from_a += row[0] < 10;
      ++seen[row[0]];
    }
    EXPECT_EQ(from_a, 20) << e;  // exactly the share, every epoch
  }
  // Three epochs: a's 10 examples 6 times each, b's 30 twice each (60 draws, whole passes).
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(seen[i], i < 10 ? 6 : 2) << i;
  const auto epoch0 = s.epoch_rows(0);  // a copy: epoch_rows returns the sampler's cache
  EXPECT_NE(epoch0, s.epoch_rows(1));
  // Resuming at {1, 3} continues exactly, and the positions say where each source stands.
  data::DistributedSampler a(ds, o), b(ds, o);
  for (int k = 0; k < 13; ++k) a.next();
  ASSERT_EQ(a.state(), (data::SamplerState{1, 3}));
  b.set_state(a.state());
  for (int k = 0; k < 5; ++k) EXPECT_EQ(a.next().rows, b.next().rows) << k;
  const std::vector<int64_t> pos = b.source_positions({1, 3});
  int64_t a_in_first_steps = 0;
  for (int64_t r = 0; r < 12; ++r) a_in_first_steps += b.epoch_rows(1)[size_t(r)][0] < 10;
  EXPECT_EQ(pos, (std::vector<int64_t>{20 + a_in_first_steps, 20 + 12 - a_in_first_steps}));
  EXPECT_EQ(b.source_positions({0, 10}), (std::vector<int64_t>{20, 20}));
}

// Preference pairs (SamplerOptions::pairs): a pair's two examples are adjacent rows of one
// micro-batch, chosen first, and every pair is read once per epoch.
TEST(Sampler, PairsStayTogether) {
  const data::ExampleDataset ds = varied_dataset(40, 6);  // 20 pairs
  data::SamplerOptions o;
  o.seq_len = 8;
  o.micro_batch_size = 2;  // pairs
  o.gradient_accumulation_steps = 2;
  o.pairs = true;
  data::DistributedSampler s(ds, o);
  EXPECT_EQ(s.steps_in_epoch(0), 5);
  std::set<int64_t> pairs;
  for (int k = 0; k < 5; ++k) {
    const data::StepBatch sb = s.next();
    ASSERT_EQ(sb.micro.size(), 2u);
    EXPECT_EQ(sb.micro[0].B, 4);  // two pairs, two rows each
    ASSERT_EQ(sb.rows.size(), 8u);
    for (size_t r = 0; r < sb.rows.size(); r += 2) {
      EXPECT_EQ(sb.rows[r][0] % 2, 0);
      EXPECT_EQ(sb.rows[r + 1][0], sb.rows[r][0] + 1);
      pairs.insert(sb.rows[r][0] / 2);
    }
  }
  EXPECT_EQ(pairs.size(), 20u);
}

// `data:` as a list: a mixture, each source a data section with weight or epochs; the rules.
TEST(DataConfig, MixtureListWeightsAndErrors) {
  const fs::path d = fresh_dir("mix");
  std::string a, b;
  for (int i = 0; i < 40; ++i) a += fmt::format(R"({{"instruction": "q {}", "output": "a {}"}})", i, i) + "\n";
  for (int i = 0; i < 120; ++i)
    b += fmt::format(R"({{"messages": [{{"role": "user", "content": "u {}"}}, {{"role": "assistant", "content": "v"}}]}})", i) + "\n";
  const std::string pa = write(d / "a.jsonl", a), pb = write(d / "b.jsonl", b);
  ConfigTree t = ConfigTree::parse("model: m\noutput_dir: o\nseq_len: 256\ndata:\n  - {train: " + pa +
                                   ", weight: 3, eval_fraction: 0}\n  - {train: " + pb + ", weight: 1, train_on_input: true}\n",
                                   "mix.yaml");
  const train::TrainConfig c = train::read_train_config(t);
  ASSERT_EQ(c.data.mixture.size(), 2u);
  EXPECT_EQ(c.data.mixture[0].weight, 3);
  data::ByteTokenizer tok;
  const data::RunData r = data::load_run_data(c.data, c.seq_len, c.seed, tok, tok.vocab_size());
  ASSERT_EQ(r.mixture.size(), 2u);
  const int64_t nb = r.mixture[1].size, total = 40 + nb;
  EXPECT_EQ(r.mixture[0].size, 40);
  EXPECT_EQ(r.mixture[0].per_epoch, std::llround(0.75 * double(total)));  // 3 : 1 of an epoch as large as both
  EXPECT_EQ(r.mixture[1].per_epoch, std::llround(0.25 * double(total)));
  EXPECT_EQ(r.mixture[1].begin, 40);
  EXPECT_EQ(r.train->size(), total);
  EXPECT_TRUE(r.packing);
  EXPECT_GT(r.eval->size(), 0);  // b's held-out examples (a holds none out)
  EXPECT_EQ(r.type, "mixture (alpaca, chat)");
  auto read = [](const std::string& yaml) {
    ConfigTree bad = ConfigTree::parse("model: m\noutput_dir: o\ndata:\n" + yaml, "mix.yaml");
    return train::read_train_config(bad);
  };
  expect_error([&] { read("  - {train: a, weight: 1, epochs: 2}\n"); }, "mix.yaml:4: key 'data.0.epochs': set weight or epochs");
  expect_error([&] { read("  - {train: a, weight: 1}\n  - {train: b}\n"); }, "key 'data.1.train': either every source has a weight");
  expect_error([&] { read("  - {train: a, wieght: 1}\n"); }, "key 'data.0.wieght': unknown key; did you mean 'data.0.weight'?");
  expect_error([&] { read("  - {train: a, weight: -1}\n"); }, "key 'data.0.weight': must be positive");
  expect_error([&] { read("  []\n"); }, "key 'data': an empty list of data sources");
}

TEST(Sampler, PrefetchKeepsOrderPropagatesErrorsAndShutsDown) {
  const data::ExampleDataset ds = varied_dataset(40, 8);
  data::SamplerOptions o;
  o.seq_len = 8;
  o.packing = true;
  o.micro_batch_size = 2;
  data::DistributedSampler direct(ds, o), behind(ds, o);
  {
    data::Prefetcher p([&] { return behind.next(); });
    for (int k = 0; k < 12; ++k) EXPECT_EQ(p.next().rows, direct.next().rows) << k;
  }  // destroyed with a full queue: must join, not hang
  std::atomic<int> made{0};
  data::Prefetcher p([&]() -> data::StepBatch {
    if (made == 2) throw Error("bad row", {.file = "x.jsonl", .line = 9});
    ++made;
    return {};
  });
  p.next();
  p.next();
  expect_error([&] { p.next(); }, "x.jsonl:9: bad row");
}

// ---- end to end ------------------------------------------------------------------------------

TEST(TrainingInstruct, AlpacaDemoTrainsAndHeldOutLossFalls) {
  const fs::path alpaca = kData / "alpaca_en_demo.json";
  ASSERT_TRUE(fs::exists(alpaca)) << "shared test data not found at " << kData;
  const fs::path d = fresh_dir("e2e");
  ModelConfig cfg = preset("tiny");  // vocab 512 >= the byte-level tokenizer's 259
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(0);
  p.save((d / "init").string(), DType::F32, ~uint64_t(0), "");
  ConfigTree t = ConfigTree::parse("model: " + (d / "init").string() + "\noutput_dir: " + (d / "out").string() +
                                   "\ndata: {train: " + alpaca.string() +
                                   ", eval_fraction: 0.05}\nseq_len: 256\nmicro_batch_size: 2\n"
                                   "max_steps: 20\neval_batches: 2\n"
                                   "optimizer: {lr: 3e-3}\neval_every: 0\nprogress: none\n");
  const train::TrainResult r = train::run_training(train::read_train_config(t));
  EXPECT_EQ(r.steps, 20);
  EXPECT_LT(r.eval_loss, 0.75 * r.initial_eval_loss) << "held-out loss " << r.initial_eval_loss << " -> " << r.eval_loss;
  EXPECT_TRUE(fs::exists(d / "out" / "model.safetensors"));
}

// Evaluation rows (data::eval_loss_sums, what the trainer's held-out loss and `shardlm eval` run):
// the first max_rows rows, or all, whatever the world size and micro-batch; every rank runs the
// same number of forwards (a rank without rows runs one ignored row).
TEST(EvalRows, SameRowsForAnyWorldSizeAndBound) {
  std::vector<int32_t> stream(10 * 8 + 1);
  for (size_t i = 0; i < stream.size(); ++i) stream[i] = int32_t(i % 97);
  const data::TokenStreamDataset eval(stream, 8);  // 10 windows of 9 tokens, one every 8
  ASSERT_EQ(eval.size(), 10);
  struct Total {
    double loss = 0;
    int64_t tokens = 0, rows = 0;
  };
  auto run = [&](int64_t B, int W, int64_t max_rows) {
    Total t;
    std::vector<int> forwards(size_t(W), 0);
    for (int r = 0; r < W; ++r) {
      // A loss that depends on which rows and targets are seen: the sum of the target ids.
      const data::EvalSums s = data::eval_loss_sums(
          [&](const model::Batch& b) {
            ++forwards[size_t(r)];
            ops::CrossEntropyResult out;
            for (int64_t i = 0; i < b.B * b.T; ++i)
              if (b.targets[i] != ops::kIgnoreIndex) {
                out.loss_sum += b.targets[i];
                ++out.count;
              }
            return out;
          },
          eval, false, B, 8, max_rows, 0, r, W);
      t.loss += s.loss_sum;
      t.tokens += s.tokens;
      t.rows += s.rows;
    }
    for (int f : forwards) EXPECT_EQ(f, forwards[0]) << "B " << B << " W " << W;
    return t;
  };
  for (const int64_t max_rows : {int64_t(-1), int64_t(7), int64_t(1), int64_t(100)}) {
    const int64_t want_rows = max_rows < 0 ? 10 : std::min<int64_t>(max_rows, 10);
    double want_loss = 0;
    for (int64_t w = 0; w < want_rows; ++w)
      for (int64_t k = 1; k <= 8; ++k) want_loss += stream[size_t(w * 8 + k)];
    for (const auto& [B, W] : std::vector<std::pair<int64_t, int>>{{1, 1}, {4, 1}, {3, 2}, {2, 4}, {8, 3}}) {
      const Total t = run(B, W, max_rows);
      EXPECT_EQ(t.rows, want_rows) << "max_rows " << max_rows << " B " << B << " W " << W;
      EXPECT_EQ(t.tokens, want_rows * 8);
      EXPECT_EQ(t.loss, want_loss);
    }
  }
}

// `shardlm eval --data FILE` reads the whole file as the evaluation set: no training split.
TEST(EvalRows, WholeFileIsEvaluated) {
  TempDir dir;
  const std::string path = dir / "t.txt";
  std::ofstream(path) << std::string(300, 'a');
  data::DataConfig dc;
  dc.train = path;
  dc.evaluate_whole_file = true;
  const data::ByteTokenizer tok;
  const data::RunData d = data::load_run_data(dc, 16, 1, tok, 259);
  // BOS + 300 bytes + EOS = 302 tokens: (302 - 1) / 16 = 18 windows, none held back for training.
  EXPECT_EQ(d.eval->size(), 18);
  EXPECT_EQ(d.train->size(), 0);
  dc.evaluate_whole_file = false;
  const data::RunData split = data::load_run_data(dc, 16, 1, tok, 259);
  EXPECT_LT(split.eval->size(), 18);
}
