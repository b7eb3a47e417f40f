#include "train/hf_export.h"

#include <filesystem>

#include "model/hf_dir.h"

namespace shardlm::train {

namespace fs = std::filesystem;

void save_hf_model(const std::string& dir, const ModelConfig& cfg, const ParamStore& params, DType dtype,
                   uint64_t max_shard_bytes, const std::string& tokenizer_source) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create the directory: {}", ec.message()), {.file = dir});
  params.save(dir, dtype, max_shard_bytes);
  write_hf_side_files(dir, cfg, dtype, tokenizer_source);
}

ModelConfig load_hf_config(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error("not a model directory (expected config.json and safetensors)", {.file = dir});
  return load_model_config(dir);
}

}  // namespace shardlm::train
