// Choosing a tokenizer from what a model directory holds (see tokenizer.h).
#include <filesystem>

#include "core/error.h"
#include "data/tokenizer.h"

namespace shardlm::data {

namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path) {
  throw Error("this tokenizer format is not supported yet", {.file = path});
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  for (const char* f : {"tokenizer.json", "tokenizer.model", "vocab.json"}) {
    const fs::path p = fs::path(model_dir) / f;
    if (fs::exists(p)) return load_tokenizer_file(p.string());
  }
  return std::make_unique<ByteTokenizer>();
}

}  // namespace shardlm::data
