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

std::optional<int32_t> ByteTokenizer::special_token(std::string_view text) const {
  if (text == "<pad>") return kPad;
  if (text == "<s>") return kBos;
  if (text == "</s>") return kEos;
  return std::nullopt;
}

std::string ByteTokenizer::piece(int32_t id) const {
  if (id == kPad) return "<pad>";
  if (id == kBos) return "<s>";
  if (id == kEos) return "</s>";
  if (id >= kFirstByte && id < kFirstByte + 256) return fmt::format("<0x{:02X}>", id - kFirstByte);
  return "<unk>";
}

}  // namespace shardlm::data
