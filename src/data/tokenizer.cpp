#include "data/tokenizer.h"

#include <filesystem>

#include "core/error.h"

namespace shardlm::data {

std::vector<int32_t> Tokenizer::encode_with(std::string_view text, bool bos, bool eos) const {
  std::vector<int32_t> ids;
  if (bos) ids.push_back(bos_id());
  std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (eos) ids.push_back(eos_id());
  return ids;
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (unsigned char c : text) ids.push_back(kFirstByte + int32_t(c));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids)
    if (id >= kFirstByte && id < kFirstByte + 256) out.push_back(char(id - kFirstByte));
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  for (const char* f : {"tokenizer.json", "tokenizer.model"}) {
    if (fs::exists(fs::path(model_dir) / f)) {
      throw Error(fmt::format("{} is not supported yet (only the byte-level fallback is); remove it to train with "
                              "byte-level tokens", f),
                  {.file = (fs::path(model_dir) / f).string()});
    }
  }
  return std::make_unique<ByteTokenizer>();
}

}  // namespace shardlm::data
