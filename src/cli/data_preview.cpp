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
    so.pairs = d.pairs;
    so.mixture = d.mixture;
    so.micro_batch_size = cfg.micro_batch_size;
    so.gradient_accumulation_steps = cfg.gradient_accumulation_steps;
    so.seed = cfg.seed;
    data::DistributedSampler sampler(*d.train, so);
    const auto& rows = sampler.epoch_rows(0);
    // A pair is two rows, examples 2i and 2i + 1.
    const int64_t per = d.pairs ? 2 : 1, n_rows = per * int64_t(rows.size());
    int64_t tokens = 0;
    for (const auto& row : rows)
      for (const int64_t i : row)
        for (int64_t k = 0; k < per; ++k) tokens += std::min(d.train->length(per * i + k), d.seq_len);
    const double fill = rows.empty() ? 0.0 : 100.0 * double(tokens) / double(n_rows * d.seq_len);
    fmt::print("\n{}: {} examples -> {} rows of {} tokens ({:.1f}% real tokens{}); {} steps per epoch of {} rows\n",
               d.packing ? "packing" : "no packing (padded to the longest row of each micro-batch)",
               d.train->size(), n_rows, d.seq_len, fill,
               d.packing ? fmt::format(", {:.2f} examples per row", double(d.train->size()) / double(rows.size()))
                         : "",
               sampler.steps_in_epoch(0), per * sampler.rows_per_step());
    if (!d.mixture.empty()) {  // what the first steps draw from each source, as training will
      const int64_t steps = std::min<int64_t>(sampler.steps_in_epoch(0), 10);
      const std::vector<int64_t> pos = sampler.source_positions({0, steps});
      int64_t all = 0;
      for (const int64_t p : pos) all += p;
      fmt::print("mixture: the first {} steps draw", steps);
      for (size_t i = 0; i < pos.size(); ++i)
        fmt::print("{} {} from {} ({:.1f}%)", i ? "," : "", pos[i], d.mixture[i].name,
                   100.0 * double(pos[i]) / double(std::max<int64_t>(all, 1)));
      fmt::print("; an epoch draws");
      for (size_t i = 0; i < pos.size(); ++i) fmt::print("{} {} of {}", i ? "," : "", d.mixture[i].per_epoch, d.mixture[i].size);
      fmt::print("\n");
    }
  });
}

}  // namespace shardlm::cli
