// The flags that describe a training run to the estimators, shared by `estimate-memory` and
// `estimate-time` so both read a run the same way: the model, the mesh, the mixed-precision
// policy, the batch and the fine-tune, as memory::EstimateInput.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "memory/estimator.h"

namespace shardlm::cli {

struct EstimateOptions {
  std::string model, strategy = "FULL_SHARD", param_dtype = "f32", reduce_dtype = "f32", state_dtype = "f32", ckpt = "false";
  std::string wrap = "TRANSFORMER_BASED_WRAP", backward_prefetch = "BACKWARD_PRE", device_memory;
  int world = 1, nproc = 0, shard_group = 0;
  int64_t micro_batch = 8, seq_len = 256, accum = 1, lora_rank = 0, min_num_params = 100000000;
  bool forward_prefetch = false, no_sync = false, offload = false, offload_activations = false, qlora = false,
       dora = false;
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};  // PEFT's default, as the lora: section's
};

// Registers the flags on `cmd`, bound to `o` (which must outlive the command).
void add_estimate_options(CLI::App* cmd, EstimateOptions& o);
// The run the flags describe; an Error naming the flag for any bad value.
memory::EstimateInput estimate_input(const EstimateOptions& o);
// Bytes per rank to fit: --device-memory, else this machine's GPU, else 0 (none); `source` says which.
int64_t device_budget(const EstimateOptions& o, std::string* source);
// A directory or config.json when one exists at that path, else a preset name.
ModelConfig resolve_model(const std::string& m);

}  // namespace shardlm::cli
