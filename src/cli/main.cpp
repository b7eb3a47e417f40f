// shardlm: the command line. Each subcommand lives in its own file and registers itself here.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"shardlm: train and fine-tune Llama-family models on one process or many, with FSDP/ZeRO sharding.",
               "shardlm"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("shardlm ") + SHARDLM_VERSION);
  app.footer(
      "Examples:\n"
      "  shardlm init --preset tiny --out runs/tiny              a random tiny Llama (HF layout)\n"
      "  shardlm train --config configs/demo-addition.yaml       train it (YAML config, key=value overrides)\n"
      "  shardlm generate --model runs/demo --prompt \"12+34=\"   continue a prompt\n"
      "  shardlm env                                             threads, BLAS, MPI, CUDA of this build\n"
      "\n"
      "Run 'shardlm <command> --help' for a command's options.");
  shardlm::cli::register_init(app);
  shardlm::cli::register_train(app);
  shardlm::cli::register_generate(app);
  shardlm::cli::register_tokenize(app);
  shardlm::cli::register_data_preview(app);
  shardlm::cli::register_env(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const shardlm::Error& e) {
    std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardlm: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
