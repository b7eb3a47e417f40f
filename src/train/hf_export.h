// Writing and reading whole Hugging Face model directories.
#pragma once

#include <string>

#include "model/config.h"
#include "train/param_store.h"

namespace shardlm::train {

// Writes config.json, generation_config.json and the weights (model.safetensors, or shards and
// model.safetensors.index.json above max_shard_bytes) into `dir`, every file atomically, and
// copies tokenizer files from `tokenizer_source` (a model directory; "" for none).
void save_hf_model(const std::string& dir, const ModelConfig& cfg, const ParamStore& params, DType dtype,
                   uint64_t max_shard_bytes, const std::string& tokenizer_source);

// config.json of a model directory, with a check that the model fits the positions asked for.
ModelConfig load_hf_config(const std::string& dir);

}  // namespace shardlm::train
