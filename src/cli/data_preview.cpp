// `shardlm data-preview`: shows what training will see — the first examples as text with the
// loss-masked parts marked, their token counts, and how they pack into rows.
// Owner: the data pipeline (docs/data.md).
#include <fmt/format.h>

#include <algorithm>

#include "cli/commands.h"
#include "data/instruct.h"
#include "data/packing.h"
#include "data/run_data.h"
#include "data/sampler.h"
#include "io/model_files.h"
#include "ops/ops.h"
#include "model/hf_dir.h"
#include "train/train_config.h"
#include "data/run_data.h"

namespace shardlm::cli {

void register_data_preview(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("data-preview", "Show the first training examples as the model will see them");
  struct Opts {
    std::string config;
    int64_t n = 3;
    std::vector<std::string> overrides;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--config", o->config, "Training configuration (YAML), as for `shardlm train`")->required();
  cmd->add_option("-n", o->n, "How many examples to show")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("overrides", o->overrides, "key=value settings that replace the file's (dotted keys for sections)");
  cmd->footer(
      "Examples:\n"
      "  shardlm data-preview --config configs/alpaca-llama2.yaml -n 2\n"
      "  shardlm data-preview --config run.yaml data.train_on_input=true data.chat_format=llama2\n"
      "\n"
      "Text inside «guillemets» is context: it is read but gets no loss (the prompt, chat headers,\n"
      "non-assistant turns). Text outside them is trained. Special tokens show as their pieces\n"
      "(<s>, </s>, <|eot_id|>). Each example is followed by its token counts: input tokens / trained\n"
      "targets. The summary says how the examples form rows (packing) and how many steps an epoch has.");
  cmd->callback([o] {
    const train::TrainConfig cfg = train::load_train_config(o->config, o->overrides);
    const int64_t vocab_size = load_hf_config(cfg.model).vocab_size;
    const std::unique_ptr<data::Tokenizer> tok =
        data::load_model_tokenizer(cfg.model, vocab_size, data::reads_text(cfg.data));
    data::DataConfig dc = cfg.data;
    dc.chat_template = data::read_chat_template(cfg.model);
    const data::RunData d = data::load_run_data(dc, cfg.seq_len, cfg.seed, *tok, vocab_size);
    fmt::print("data: {} (tokenizer: {})\n", d.type, tok->name());
    for (const std::string& line : d.report) fmt::print("  {}\n", line);
    const int64_t n = std::min(o->n, d.train->size());
    for (int64_t i = 0; i < n; ++i) {
      const data::Example e = d.train->get(i);
      const int64_t trained = std::count_if(e.targets.begin(), e.targets.end(),
                                            [](int32_t t) { return t != ops::kIgnoreIndex; });
      fmt::print("\n--- example {} ({} tokens, {} trained) ---\n{}\n", i, e.ids.size(), trained,
                 data::render_masked(*tok, e));
    }
    data::SamplerOptions so;
    so.seq_len = d.seq_len;
    so.packing = d.packing;
    so.micro_batch_size = cfg.micro_batch_size;
    so.gradient_accumulation_steps = cfg.gradient_accumulation_steps;
    so.seed = cfg.seed;
    data::DistributedSampler sampler(*d.train, so);
    const auto& rows = sampler.epoch_rows(0);
    int64_t tokens = 0;
    for (const auto& row : rows)
      for (const int64_t i : row) tokens += std::min(d.train->length(i), d.seq_len);
    const double fill = rows.empty() ? 0.0 : 100.0 * double(tokens) / double(int64_t(rows.size()) * d.seq_len);
    fmt::print("\n{}: {} examples -> {} rows of {} tokens ({:.1f}% real tokens{}); {} steps per epoch of {} rows\n",
               d.packing ? "packing" : "no packing (padded to the longest row of each micro-batch)",
               d.train->size(), rows.size(), d.seq_len, fill,
               d.packing ? fmt::format(", {:.2f} examples per row", double(d.train->size()) / double(rows.size()))
                         : "",
               sampler.steps_in_epoch(0), sampler.rows_per_step());
  });
}

}  // namespace shardlm::cli
