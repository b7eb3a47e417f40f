// A Hugging Face model directory: its config.json read as a ModelConfig, and the files other than
// the weights written beside them (config.json, generation_config.json, the tokenizer files).
// The weights themselves are io/model_files.h (read by byte range, written whole or streamed); the
// trainer's final save and `shardlm convert` stream them and call write_hf_side_files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace shardlm {

// config.json of a model directory (an Error naming the path when it is not a model directory).
ModelConfig load_hf_config(const std::string& dir);

// generation_config.json's eos_token_id in the model directory `dir` (an integer or a list of
// them, as transformers writes it): the tokens generation stops at besides config.json's. Empty
// when the file, the key or its value (null) is absent; a malformed file, a value of another type
// or an id outside [0, vocab_size) is an Error naming the file and the key.
std::vector<int64_t> read_generation_eos_ids(const std::string& dir, int64_t vocab_size);

// Writes config.json (torch_dtype set to `weights_dtype`) and generation_config.json into `dir`
// (created if missing), atomically, and copies the tokenizer files found in `tokenizer_source`
// (a model or checkpoint directory; "" or `dir` itself for none).
void write_hf_side_files(const std::string& dir, const ModelConfig& cfg, DType weights_dtype,
                         const std::string& tokenizer_source);

// Copies tokenizer.json, tokenizer.model, tokenizer_config.json and special_tokens_map.json, those
// that exist, from `from` to `to` (atomically each). Returns how many were copied.
int copy_tokenizer_files(const std::string& from, const std::string& to);

}  // namespace shardlm
