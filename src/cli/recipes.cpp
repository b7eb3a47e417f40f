// `shardlm recipes`: the built-in configurations (src/train/recipes.h), listed or written to a file.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "core/alloc.h"
#include "model/config.h"
#include "train/recipes.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace shardlm::cli {

void register_recipes(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("recipes", "List the built-in training configurations, or write one to edit");
  struct Opts {
    std::string name, file;
    bool force = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cp = cmd->add_subcommand("cp", "Write a built-in recipe to FILE (YAML) to edit");
  cp->add_option("name", o->name, "The recipe (`shardlm recipes` lists them)")->required();
  cp->add_option("file", o->file, "The YAML file to write")->required();
  cp->add_flag("--force", o->force, "Replace FILE if it exists");
  cmd->footer(
      "Examples:\n"
      "  shardlm recipes                                          the table of recipes\n"
      "  shardlm recipes cp llama3_1-8b-lora-single-device my.yaml  a copy to edit\n"
      "  shardlm validate --config my.yaml                        check it (model, data, memory)\n"
      "  shardlm validate --recipe llama3_1-8b-lora-single-device  check a recipe with its preset's shape");
  cp->callback([o] {
    const train::Recipe& r = train::find_recipe(o->name);
    if (std::filesystem::exists(o->file) && !o->force)
      throw Error(fmt::format("{} exists; pass --force to replace it", o->file));
    io::write_text_atomic(o->file, r.yaml);
    fmt::print("wrote {} ({}): fill `model` ({}) and `data.train`, then `shardlm validate --config {}`\n", o->file,
               r.name, r.model, o->file);
  });
  cmd->callback([cmd] {
    if (!cmd->get_subcommands().empty()) return;
    fmt::print("{:<36} {:<26} {:<9} {:>5} {:>12} {:>8}  {}\n", "recipe", "model", "method", "ranks", "memory/rank",
               "budget", "shape (preset)");
    for (const train::Recipe& r : train::recipes()) {
      // The estimate `validate --recipe` checks (a dry run of the engine's plan: milliseconds).
      ConfigTree tree = ConfigTree::parse(r.yaml, "recipe " + r.name);
      const train::TrainConfig cfg = train::read_train_config(tree);
      const ModelConfig shape = preset(r.preset);
      std::string memory = "-";
      try {
        memory = format_bytes(train::check_run(cfg, r.ranks, std::min(r.ranks, 8), &shape).memory_per_rank);
      } catch (const Error&) {  // does not fit its budget: `validate --recipe` says why
        memory = "over budget";
      }
      fmt::print("{:<36} {:<26} {:<9} {:>5} {:>12} {:>8}  {}\n", r.name, r.model, r.method, r.ranks, memory,
                 r.budget, r.preset);
    }
    fmt::print("\n{} recipes. `shardlm recipes cp NAME FILE` writes one to edit; `shardlm validate --recipe NAME`\n"
               "estimates its memory per rank against its max_memory_per_rank (docs/recipes.md).\n",
               train::recipes().size());
  });
}

}  // namespace shardlm::cli
