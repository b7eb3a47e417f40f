#include "train/sample_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "infer/requests.h"
#include "ops/ops.h"

namespace shardlm::train {

namespace {

// "</s> (2), <|eot_id|> (128009)"
std::string token_list(const data::Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<std::string> names;
  for (int32_t id : ids) names.push_back(fmt::format("{} ({})", tok.piece(id), id));
  return fmt::format("{}", fmt::join(names, ", "));
}

bool trains_one_of(const data::Example& e, const std::vector<int32_t>& ids) {
  return std::any_of(e.targets.begin(), e.targets.end(),
                     [&](int32_t t) { return t != ops::kIgnoreIndex && std::count(ids.begin(), ids.end(), t) > 0; });
}

}  // namespace

int64_t check_stop_labels(const std::string& path, const std::vector<data::LoadedSample>& samples,
                          const std::vector<int32_t>& stop_ids, const data::Tokenizer& tok, int64_t seq_len) {
  if (samples.empty()) return 0;
  int64_t with_stop = 0, cut = 0;
  for (const data::LoadedSample& s : samples) {
    if (trains_one_of(s.example, stop_ids)) {
      ++with_stop;
      continue;
    }
    if (s.truncated) {
      ++cut;
      continue;
    }
    throw Error(fmt::format("this example's loss has none of the tokens generation stops on ({}): a model trained "
                            "on it does not learn to end its answer; as training sees it (loss outside «»): {}",
                            token_list(tok, stop_ids), data::render_masked(tok, s.example)),
                {.file = path, .line = s.line});
  }
  if (with_stop == 0)
    throw Error(fmt::format("{} token generation stops on ({}) in its loss: seq_len {} cuts {} before {} end; "
                            "a model trained on {} does not learn to end its answer: raise seq_len",
                            samples.size() == 1
                                ? fmt::format("the only example loading kept (line {}) has no", samples.front().line)
                                : fmt::format("none of the first {} examples (lines {} to {}) has a", samples.size(),
                                              samples.front().line, samples.back().line),
                            token_list(tok, stop_ids), seq_len,
                            samples.size() == 1 ? "it" : fmt::format("{} of them", cut),
                            samples.size() == 1 ? "its" : "their", samples.size() == 1 ? "it" : "them"),
                {.file = path, .line = samples.front().line});
  return with_stop;
}

SampleCheck check_samples(const TrainConfig& c, const RunInputs& in) {
  SampleCheck out;
  const data::RunData& d = in.data;
  if (d.loads.empty()) {
    out.lines.push_back(fmt::format("samples: {} data has no rendered examples to check", d.type));
    return out;
  }
  // What `generate --chat` and `serve` resolve for the trained model: its directory copies this
  // model's tokenizer files (a LoRA adapter is used with this model), so this model's template.
  const infer::ChatPrompt generation = infer::ChatPrompt::of_model(c.model, *in.tok, "auto", "--chat-format");
  const bool chat = d.type == "chat";
  for (const auto& [path, report] : d.loads) {
    if (chat && report.chat_format && *report.chat_format != generation.format) {
      const bool has_template = !data::read_chat_template(c.model).empty();
      throw Error(fmt::format("{}: training renders the conversations in {}, but `generate --chat` and `serve` "
                              "render prompts for this model in {} ({}): the model would be prompted in a format it "
                              "was not trained on; use chat_format: auto",
                              enum_name(c.data.chat_format), data::chat_format_name(*report.chat_format),
                              data::chat_format_name(generation.format),
                              has_template ? fmt::format("the chat_template of {}/tokenizer_config.json", c.model)
                                           : fmt::format("{} has no chat_template; from the tokenizer's special tokens",
                                                         c.model)),
                  {.file = c.source, .key = "data.chat_format"});
    }
  }
  if (chat) {
    out.lines.push_back(fmt::format("chat format: {}, as `generate --chat` and `serve` use it for {}",
                                    data::chat_format_name(generation.format), c.model));
    // shardlm renders only the families it knows; other tools render the template itself.
    const std::string chat_template = data::read_chat_template(c.model);
    if (!chat_template.empty() && !data::chat_format_of_template(chat_template))
      out.warnings.push_back(fmt::format(
          "{}/tokenizer_config.json: its chat_template is none of the formats shardlm renders (llama3, llama2, chatml, "
          "mistral): training and `generate --chat` use {} (from the tokenizer's special tokens), but tools that "
          "apply the template (transformers' apply_chat_template, vLLM) will prompt the model differently",
          c.model, data::chat_format_name(generation.format)));
  }
  else
    out.lines.push_back(fmt::format("{} data: prompts at generation must follow its template (`generate --chat` and "
                                    "`serve`'s chat endpoint would use {})",
                                    d.type, data::chat_format_name(generation.format)));
  const std::vector<int32_t> stops =
      infer::stop_token_ids(in.model, *in.tok, chat ? &generation : nullptr, c.model);
  for (const auto& [path, report] : d.loads) {
    const int64_t with_stop = check_stop_labels(path, report.samples, stops, *in.tok, d.seq_len);
    out.lines.push_back(fmt::format("{}: {} of the first {} examples train a token generation stops on ({})", path,
                                    with_stop, report.samples.size(), token_list(*in.tok, stops)));
    const int64_t kept = report.records - report.skipped;
    const double share = kept > 0 ? double(report.truncated) / double(kept) : 0.0;
    if (share > kTruncationWarnShare)
      out.warnings.push_back(fmt::format("{}: seq_len {} truncates {} of {} examples ({:.1f}%, the longest has {} "
                                         "tokens): their ends, EOS included, are not trained; raise seq_len",
                                         path, d.seq_len, report.truncated, kept, 100.0 * share, report.longest));
  }
  const auto& [path, report] = d.loads.front();
  if (!report.samples.empty()) {
    const data::LoadedSample& s = report.samples.front();
    const int64_t trained = std::count_if(s.example.targets.begin(), s.example.targets.end(),
                                          [](int32_t t) { return t != ops::kIgnoreIndex; });
    out.sample = fmt::format("{}:{} as training sees it ({} tokens, {} trained; «context» gets no loss{}):\n{}", path,
                             s.line, s.example.ids.size(), trained, s.truncated ? "; cut by seq_len" : "",
                             data::render_masked(*in.tok, s.example));
  }
  return out;
}

}  // namespace shardlm::train
