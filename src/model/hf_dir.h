// The files of a Hugging Face model directory other than the weights: config.json,
// generation_config.json and the tokenizer files. Shared by the trainer's final save and by
// `shardlm convert`, which streams the weights themselves (io/model_files.h).
#pragma once

#include <string>

#include "core/dtype.h"
#include "model/config.h"

namespace shardlm {

// Writes config.json (torch_dtype set to `weights_dtype`) and generation_config.json into `dir`
// (created if missing), atomically, and copies the tokenizer files found in `tokenizer_source`
// (a model or checkpoint directory; "" or `dir` itself for none).
void write_hf_side_files(const std::string& dir, const ModelConfig& cfg, DType weights_dtype,
                         const std::string& tokenizer_source);

// Copies tokenizer.json, tokenizer.model, tokenizer_config.json and special_tokens_map.json, those
// that exist, from `from` to `to` (atomically each). Returns how many were copied.
int copy_tokenizer_files(const std::string& from, const std::string& to);

}  // namespace shardlm
