// How `generate` and `serve` split a model over the ranks of `shardlm launch`: --device-map (each
// rank a run of whole layers, a pipeline: infer/placement.h), --tensor-parallel (each rank a slice
// of every layer: infer/tensor_parallel.h), or neither (the whole model in each process). The same
// flags, checks and placement for both commands.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "cli/generation_flags.h"
#include "infer/generator.h"
#include "infer/param_store.h"
#include "infer/tensor_parallel.h"
#include "model/config.h"

namespace shardlm::cli {

struct ModelSplitFlags {
  std::string device_map, max_memory_per_rank;  // empty: no pipeline
  int64_t tensor_parallel = 0;                   // 0: no tensor parallelism
  bool given() const { return !device_map.empty() || tensor_parallel != 0; }
};
// --device-map, --max-memory-per-rank and --tensor-parallel; `command` names the command in help.
void add_model_split_flags(CLI::App* cmd, ModelSplitFlags& f, const std::string& command);
// The flags' errors, before anything is read: one way of splitting at a time, a known device map,
// a size for --max-memory-per-rank only with --device-map.
void check_model_split_flags(const ModelSplitFlags& f);

// This rank's part of the split: what the Generator and the ParamStore take. `keep` holds copies,
// not references, of what it reads from the config.
struct ModelSplit {
  infer::Pipeline pipeline;             // --device-map: every rank's share
  infer::ParamStore::PartFilter keep;   // --device-map: the parts this rank loads
  infer::TensorSplit split;             // --tensor-parallel: this rank's slice
  infer::TensorParallel tp;
  std::string command;                  // "generate", or "generate: rank 1" on the other ranks
  bool active() const { return pipeline.comm != nullptr || split.active(); }
};
// Places the model over world()'s ranks as the flags say, its parts sized as generation holds
// them (`held`: with q8_0 the Linear weights in Q8_0 blocks); `print`: describe the placement on
// stderr (rank 0 only). Sets the watchdog's activity to name the split.
ModelSplit split_model(const ModelSplitFlags& f, const ModelConfig& cfg, const GenerationDtype& held,
                       const std::string& command, bool print);

}  // namespace shardlm::cli
