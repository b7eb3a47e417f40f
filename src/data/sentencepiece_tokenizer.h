// SentencePiece tokenizers (Llama 2, Mistral) through Debian's libsentencepiece.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace shardlm::data {

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);
// True when the file parses as a SentencePiece model (protobuf), as opposed to a tiktoken file.
bool is_sentencepiece_model(const std::string& path);

}  // namespace shardlm::data
