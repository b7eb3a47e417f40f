// Registration of the subcommands of `shardlm`. Each function adds one subcommand to the app,
// with its options, help text and examples, and a callback that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "core/error.h"

namespace shardlm::cli {

// This process's ranks (MPI under mpirun/srun, else one local rank); made by main().
comm::Communicator& world();

// The dtype a flag names, one of `allowed`, else an Error naming the flag and the choices:
// "--dtype f8: expected f32, bf16 or f16".
inline DType dtype_flag(const std::string& flag, const std::string& value, std::initializer_list<DType> allowed) {
  std::optional<DType> d;
  try {
    d = parse_dtype(value);
  } catch (const Error&) {
  }
  if (d && std::find(allowed.begin(), allowed.end(), *d) != allowed.end()) return *d;
  std::string choices;
  for (const DType* a = allowed.begin(); a != allowed.end(); ++a)
    choices += std::string(a == allowed.begin() ? "" : a + 1 == allowed.end() ? " or " : ", ") + dtype_name(*a);
  throw Error(fmt::format("{} {}: expected {}", flag, value, choices));
}

void register_env(CLI::App& app);
void register_estimate_time(CLI::App& app);
void register_init(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_launch(CLI::App& app);
void register_generate(CLI::App& app);
void register_serve(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_data_preview(CLI::App& app);
void register_convert(CLI::App& app);
void register_merge(CLI::App& app);
void register_export(CLI::App& app);
void register_estimate_memory(CLI::App& app);
void register_recipes(CLI::App& app);
void register_validate(CLI::App& app);
void register_report(CLI::App& app);

}  // namespace shardlm::cli
