#include "train/hf_export.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/atomic_file.h"

namespace shardlm::train {

namespace fs = std::filesystem;

namespace {
const char* torch_dtype_name(DType d) {
  switch (d) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: return "float32";
  }
}
}  // namespace

void save_hf_model(const std::string& dir, const ModelConfig& cfg, const ParamStore& params, DType dtype,
                   uint64_t max_shard_bytes, const std::string& tokenizer_source) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create the directory: {}", ec.message()), {.file = dir});
  ModelConfig out = cfg;
  out.torch_dtype = torch_dtype_name(dtype);
  params.save(dir, dtype, max_shard_bytes);
  io::write_text_atomic((fs::path(dir) / "config.json").string(), to_hf_json(out).dump(2) + "\n");
  nlohmann::json gen = {{"_from_model_config", true}};
  if (cfg.bos_token_id) gen["bos_token_id"] = *cfg.bos_token_id;
  if (cfg.eos_token_ids.size() == 1) gen["eos_token_id"] = cfg.eos_token_ids[0];
  else if (!cfg.eos_token_ids.empty()) gen["eos_token_id"] = cfg.eos_token_ids;
  io::write_text_atomic((fs::path(dir) / "generation_config.json").string(), gen.dump(2) + "\n");
  if (tokenizer_source.empty() || fs::equivalent(tokenizer_source, dir, ec)) return;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path src = fs::path(tokenizer_source) / name;
    if (!fs::exists(src)) continue;
    std::ifstream f(src, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    io::write_text_atomic((fs::path(dir) / name).string(), bytes);
  }
}

ModelConfig load_hf_config(const std::string& dir) {
  if (!fs::is_directory(dir)) throw Error("not a model directory (expected config.json and safetensors)", {.file = dir});
  return load_model_config(dir);
}

}  // namespace shardlm::train
