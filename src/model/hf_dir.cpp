#include "model/hf_dir.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_parse.h"
#include "io/read_file.h"

namespace shardlm {

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

int copy_tokenizer_files(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (from.empty() || fs::equivalent(from, to, ec)) return 0;
  int copied = 0;
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path src = fs::path(from) / name;
    if (!fs::exists(src)) continue;
    std::ifstream f(src, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) throw Error("cannot read tokenizer file", {.file = src.string()});
    io::write_text_atomic((fs::path(to) / name).string(), bytes);
    ++copied;
  }
  return copied;
}

void write_hf_side_files(const std::string& dir, const ModelConfig& cfg, DType weights_dtype,
                         const std::string& tokenizer_source) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create the directory: {}", ec.message()), {.file = dir});
  ModelConfig out = cfg;
  out.torch_dtype = torch_dtype_name(weights_dtype);
  io::write_text_atomic((fs::path(dir) / "config.json").string(), to_hf_json(out).dump(2) + "\n");
  nlohmann::json gen = {{"_from_model_config", true}};
  if (cfg.bos_token_id) gen["bos_token_id"] = *cfg.bos_token_id;
  if (cfg.eos_token_ids.size() == 1) gen["eos_token_id"] = cfg.eos_token_ids[0];
  else if (!cfg.eos_token_ids.empty()) gen["eos_token_id"] = cfg.eos_token_ids;
  io::write_text_atomic((fs::path(dir) / "generation_config.json").string(), gen.dump(2) + "\n");
  copy_tokenizer_files(tokenizer_source, dir);
}

std::vector<int64_t> read_generation_eos_ids(const std::string& dir, int64_t vocab_size) {
  const std::string path = (fs::path(dir) / "generation_config.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  // Transformers writes a few hundred bytes; a megabyte is no generation config.
  const std::string text = io::read_file(path, "generation config", uint64_t(1) << 20);
  nlohmann::json j;
  try {
    j = io::parse_json(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("malformed JSON: {}", e.what()), {.file = path});
  }
  if (!j.is_object()) throw Error("expected a JSON object", {.file = path});
  const auto it = j.find("eos_token_id");
  if (it == j.end()) return {};
  try {
    return eos_token_ids_from_json(*it, vocab_size);
  } catch (Error& e) {
    e.set_file(path);
    throw;
  }
}

ModelConfig load_hf_config(const std::string& dir) {
  if (!std::filesystem::is_directory(dir))
    throw Error("not a model directory (expected config.json and safetensors)", {.file = dir});
  return load_model_config(dir);
}

}  // namespace shardlm
