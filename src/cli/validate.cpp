// `shardlm validate`: check a training configuration as `shardlm train` would read it (keys,
// values, model directory, tokenizer, data files and their first examples, memory per rank),
// without training.
#include <fmt/format.h>

#include "cli/commands.h"
#include "model/config.h"
#include "train/recipes.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace shardlm::cli {

void register_validate(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "validate", "Check a training configuration (keys, model, data, memory per rank) without training");
  struct Opts {
    std::string config, recipe, preset;
    std::vector<std::string> overrides;
    int world = 0, nproc = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* config = cmd->add_option("--config", o->config, "The training configuration (YAML), as `train` takes it");
  auto* recipe = cmd->add_option("--recipe", o->recipe,
                                 "A built-in recipe instead (`shardlm recipes`); implies --model-preset and "
                                 "--world-size of the recipe");
  config->excludes(recipe);
  cmd->add_option("overrides", o->overrides, "key=value settings that replace the file's (as for train)");
  cmd->add_option("--world-size", o->world,
                  "Ranks the run will have (default: this process's world, or the recipe's ranks)");
  cmd->add_option("--nproc-per-node", o->nproc, "Ranks per node, for hybrid strategies (default: the whole world)");
  cmd->add_option("--model-preset", o->preset,
                  "Take the model's shape from a preset (" + fmt::format("{}", fmt::join(preset_names(), ", ")) +
                      ") instead of the model directory; the directory, tokenizer and data files are then not read");
  cmd->footer(
      "Reads the file exactly as `shardlm train` does (the same reader, the same errors), then loads the model's\n"
      "config.json, its tokenizer and the data as training would, and estimates the memory per rank against\n"
      "max_memory_per_rank. Of each alpaca or chat file it checks the first 8 examples as training renders\n"
      "and masks them: each that seq_len does not cut must train a token generate and serve stop on (EOS,\n"
      "end of turn), and the chat format must be the one generate --chat and serve use for the model; it\n"
      "warns when seq_len truncates more than 2% of the examples, and prints the first example with its\n"
      "context in «guillemets» (docs/data.md). Exit 0 when all is well, else one line naming the file and\n"
      "key (or line) at fault.\n"
      "Examples:\n"
      "  shardlm validate --config run.yaml\n"
      "  shardlm validate --config run.yaml --world-size 8 micro_batch_size=4\n"
      "  shardlm validate --config run.yaml --model-preset llama3.1-8b --world-size 8   before downloading\n"
      "  shardlm validate --recipe llama2-70b-lora-distributed");
  cmd->callback([o] {
    if (o->config.empty() && o->recipe.empty()) throw Error("give --config FILE or --recipe NAME");
    std::string preset_name = o->preset;
    int world_size = o->world;
    train::TrainConfig cfg;
    if (!o->recipe.empty()) {
      const train::Recipe& r = train::find_recipe(o->recipe);
      ConfigTree tree = ConfigTree::parse(r.yaml, "recipe " + r.name);
      tree.apply_overrides(o->overrides);
      cfg = train::read_train_config(tree);
      if (preset_name.empty()) preset_name = r.preset;
      if (world_size == 0) world_size = r.ranks;
    } else {
      cfg = train::load_train_config(o->config, o->overrides);
    }
    if (world_size == 0) world_size = world().size();
    if (world_size < 1) throw Error(fmt::format("--world-size {}: must be >= 1", world_size));
    if (o->nproc < 0 || (o->nproc > 0 && world_size % o->nproc != 0))
      throw Error(fmt::format("--nproc-per-node {} does not divide the world size {}", o->nproc, world_size));
    for (const std::string& w : cfg.deepspeed.warnings) fmt::print(stderr, "shardlm: warning: {}\n", w);
    std::optional<ModelConfig> shape;
    if (!preset_name.empty()) shape = preset(preset_name);
    const train::RunCheck check =
        train::check_run(cfg, world_size, o->nproc > 0 ? o->nproc : world_size, shape ? &*shape : nullptr);
    for (const std::string& w : check.warnings) fmt::print(stderr, "shardlm: warning: {}\n", w);
    fmt::print("{}: valid\n", o->recipe.empty() ? o->config : "recipe " + o->recipe);
    for (const std::string& line : check.lines) fmt::print("  {}\n", line);
    if (!check.sample.empty()) fmt::print("\nsample {}\n", check.sample);
  });
}

}  // namespace shardlm::cli
