// A Hugging Face model directory (Llama 2/3, Mistral, Qwen2) -> one GGUF file that llama.cpp loads:
// `shardlm export --format gguf`.
//
// What llama.cpp's own converter (convert_hf_to_gguf.py) writes for these models, reimplemented:
//  - architecture "llama" (Llama, Mistral) or "qwen2", with its hyperparameters as <arch>.* keys;
//  - tensors renamed (model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight, ...; a tied
//    model has no output.weight: llama.cpp then reads token_embd);
//  - for "llama" the rows of q_proj and k_proj (weights and biases) permuted within each head from
//    Hugging Face's rotate-half layout to the interleaved pairs llama.cpp's "normal" RoPE rotates
//    (llama.cpp ropes llama with LLAMA_ROPE_TYPE_NORM, qwen2 with NEOX, which is Hugging Face's own
//    layout, so qwen2's are left as they are);
//  - Llama 3.1+'s rope_scaling as the rope_freqs tensor of per-frequency divisors;
//  - the tokenizer embedded: byte-level BPE as tokenizer.ggml.model "gpt2" with its merges and the
//    pre-tokenizer llama.cpp knows it by (llama-bpe, qwen2, gpt-2), SentencePiece as "llama" with
//    scores; token types, special ids, add_bos_token and the chat template;
//  - 2-D weights in the chosen type (f32, f16, bf16, q8_0), norms, biases and other 1-D tensors in
//    F32; a weight whose rows are not a multiple of 32 cannot be Q8_0 and is stored F16, as the
//    converter falls back.
// Streams tensor by tensor, in chunks of rows (memory: a few tens of MiB whatever the model size),
// into a file published atomically (io/gguf.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace shardlm {

enum class GgufOutType { F32, F16, BF16, Q8_0 };
// "f32", "f16", "bf16", "q8_0"; anything else is an Error naming `role`.
GgufOutType gguf_outtype_of(const std::string& name, const std::string& role);
const char* gguf_outtype_name(GgufOutType t);

struct GgufExportOptions {
  std::string model;  // a Hugging Face model directory
  std::string out;    // the .gguf file to write (never one of the model's files)
  GgufOutType outtype = GgufOutType::F16;
  std::string name;   // general.name; "" for the model directory's name
};

struct GgufExportReport {
  std::string architecture;        // "llama" or "qwen2"
  int64_t tensors = 0;
  int64_t parameters = 0;
  uint64_t file_bytes = 0;
  std::map<std::string, int64_t> tensors_by_type;  // "Q8_0" -> count, ...
  std::vector<std::string> f16_fallback;           // Q8_0 asked, rows not a multiple of 32: stored F16
  std::string tokenizer;           // "gpt2 (llama-bpe): 128256 tokens, 280147 merges", ...
  bool rope_freqs = false;         // Llama 3 rope scaling written as rope_freqs.weight
  std::vector<std::string> notes;  // what llama.cpp will not reproduce (a sliding window, ...)
};

GgufExportReport export_gguf(const GgufExportOptions& opt);

}  // namespace shardlm
