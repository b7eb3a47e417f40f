// shardlm: the command line. Each subcommand lives in its own file and registers itself here.
//
// The process's world communicator is made here, once: MPI when mpirun or srun started this
// process, otherwise one local rank. An error on any rank ends the whole job: the failing rank
// prints its message once, naming itself, and MPI_Abort takes the other ranks down (never a hang).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/platform.h"

namespace {
shardlm::comm::Communicator* g_world = nullptr;

// SIGUSR1 is how `shardlm launch` relays a stop through mpirun (src/cli/launch.cpp), and what
// Slurm's --signal=USR1 sends: it means what SIGTERM means to the command that runs (training
// finishes its step and checkpoints; see save_on_signal).
void usr1_as_sigterm(int) { kill(getpid(), SIGTERM); }
}

namespace shardlm::cli {
comm::Communicator& world() { return *g_world; }
}  // namespace shardlm::cli

int main(int argc, char** argv) {
  shardlm::select_blas_kernels(argv);  // first: it may re-execute the program (core/platform.h)
  CLI::App app{"shardlm: train and fine-tune Llama-family models on one process or many, with FSDP/ZeRO sharding.",
               "shardlm"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("shardlm ") + SHARDLM_VERSION);
  app.footer(
      "Examples:\n"
      "  shardlm init --preset tiny --out runs/tiny              a random tiny Llama (HF layout)\n"
      "  shardlm train --config configs/demo-addition.yaml       train it (YAML config, key=value overrides)\n"
      "  shardlm launch --nproc-per-node 2 -- train --config configs/demo-addition.yaml   on 2 ranks (FULL_SHARD)\n"
      "  shardlm generate --model runs/demo --prompt \"12+34=\"   continue a prompt\n"
      "  shardlm launch --nproc-per-node 2 -- generate --model DIR --device-map auto --prompt \"Hi\"   layers split over ranks\n"
      "  shardlm serve --model runs/demo --port 8000            an OpenAI-compatible HTTP server (batched)\n"
      "  shardlm tokenize --model DIR --text \"Hello\" --pieces     see how text becomes tokens\n"
      "  shardlm data-preview --config run.yaml -n 3             see rendered examples and their loss masks\n"
      "  shardlm convert runs/demo/checkpoints --out runs/demo-hf  a sharded checkpoint -> Hugging Face model\n"
      "  shardlm merge --base DIR --adapter LORA --out MERGED   a PEFT LoRA adapter merged into its base model\n"
      "  shardlm export --format gguf --outtype q8_0 MERGED m.gguf   a model as one GGUF file for llama.cpp\n"
      "  shardlm estimate-memory --model llama2-7b --world-size 8   memory per rank, by category, per strategy\n"
      "  shardlm estimate-time --model llama3-8b --world-size 64 --nproc-per-node 8 --tflops 400 ...   step time per strategy\n"
      "  shardlm recipes                                         built-in configs (full, LoRA, QLoRA); `recipes cp NAME FILE`\n"
      "  shardlm validate --config run.yaml                      check a config (keys, model, data, memory) without training\n"
      "  shardlm report --metrics runs/demo/metrics.jsonl --out r.html   a run's charts as one HTML page\n"
      "  shardlm env                                             threads, BLAS, MPI, CUDA of this build\n"
      "\n"
      "Run 'shardlm <command> --help' for a command's options.");
  shardlm::cli::register_init(app);
  shardlm::cli::register_train(app);
  shardlm::cli::register_eval(app);
  shardlm::cli::register_launch(app);
  shardlm::cli::register_generate(app);
  shardlm::cli::register_serve(app);
  shardlm::cli::register_tokenize(app);
  shardlm::cli::register_data_preview(app);
  shardlm::cli::register_convert(app);
  shardlm::cli::register_merge(app);
  shardlm::cli::register_export(app);
  shardlm::cli::register_estimate_memory(app);
  shardlm::cli::register_estimate_time(app);
  shardlm::cli::register_recipes(app);
  shardlm::cli::register_validate(app);
  shardlm::cli::register_report(app);
  shardlm::cli::register_env(app);

  // A file-size limit (ulimit -f, a quota) should fail the write that crosses it with EFBIG,
  // which the atomic writers report naming the file, rather than kill the process with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  std::signal(SIGUSR1, usr1_as_sigterm);
  std::unique_ptr<shardlm::comm::Communicator> world;
  auto fail = [&](const char* what, shardlm::ErrorScope scope) {
    if (world && world->size() > 1) world->abort(what, scope);  // prints "rank R: ..." and ends every rank
    std::fprintf(stderr, "shardlm: error: %s\n", what);
    return 1;
  };
  // CLI11 reports an unknown first word as "a subcommand is required", which does not say what
  // was wrong; name it and the commands there are.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
      known = known || sub->check_name(argv[1]);
    }
    if (!known) {
      std::fprintf(stderr, "shardlm: error: unknown command '%s' (commands: %s; see --help)\n", argv[1],
                   fmt::format("{}", fmt::join(names, ", ")).c_str());
      return 2;
    }
  }
  try {
    world = shardlm::comm::make_world_communicator();
    g_world = world.get();
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // A bad command line is one line, like every other error (CLI11 would add a second).
    std::fprintf(stderr, "shardlm: error: %s (see --help)\n", e.what());
    return 2;
  } catch (const shardlm::Error& e) {
    return fail(e.what(), e.context().scope);
  } catch (const std::exception& e) {
    return fail(e.what(), shardlm::ErrorScope::this_rank);
  }
  return 0;
}
