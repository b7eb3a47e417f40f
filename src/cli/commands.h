// Registration of the subcommands of `shardlm`. Each function adds one subcommand to the app,
// with its options, help text and examples, and a callback that runs it.
#pragma once

#include <CLI/CLI.hpp>

#include "comm/communicator.h"

namespace shardlm::cli {

// This process's ranks (MPI under mpirun/srun, else one local rank); made by main().
comm::Communicator& world();

void register_env(CLI::App& app);
void register_init(CLI::App& app);
void register_train(CLI::App& app);
void register_launch(CLI::App& app);
void register_generate(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_data_preview(CLI::App& app);
void register_convert(CLI::App& app);
void register_merge(CLI::App& app);
void register_estimate_memory(CLI::App& app);

}  // namespace shardlm::cli
