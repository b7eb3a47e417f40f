// Byte-level BPE tokenizers: tiktoken files (Llama 3's tokenizer.model), Hugging Face
// tokenizer.json (GPT-2 / Llama 3 / Qwen2 style), and GPT-2's vocab.json + merges.txt.
// Pre-tokenization uses the model's Unicode regex through PCRE2.
#pragma once

#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace shardlm::data {

// The pre-tokenizer regexes of the vocabularies shardlm knows (PCRE2 syntax, as tokenizer.json
// spells them): Llama 3's (tiktoken files and its tokenizer.json), GPT-2's (vocab.json, and a
// ByteLevel pre-tokenizer with use_regex) and Qwen2's (its tokenizer.json: single digits).
inline constexpr const char* kLlama3PreTokenizerPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr const char* kGpt2PreTokenizerPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr const char* kQwen2PreTokenizerPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Llama 3's tokenizer.model: lines of "base64(token bytes) rank". Adds Llama 3's pre-tokenizer
// pattern and its 256 special tokens (<|begin_of_text|> = 128000, ...). BOS <|begin_of_text|>,
// EOS <|end_of_text|>.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path);
// A Hugging Face tokenizer.json whose model is BPE with a ByteLevel pre-tokenizer/decoder.
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path);
// GPT-2's vocab.json and merges.txt (pattern of GPT-2, <|endoftext|> as BOS and EOS).
std::unique_ptr<Tokenizer> load_gpt2_bpe(const std::string& vocab_json, const std::string& merges_txt);

}  // namespace shardlm::data
