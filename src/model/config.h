// The shape of a Llama-family decoder, as read from (and written to) a Hugging Face config.json.
//
// Supported architectures are the ones whose decoder layer is Llama's: RMSNorm, rotary
// position embedding, grouped-query attention and a SwiGLU MLP. They differ only in details
// this struct carries: Qwen2 has biases on the q, k and v projections, Mistral may use a
// sliding window, Llama 3.x rescales RoPE frequencies ("llama3" rope_scaling).
//
// Reading is strict where a mistake would silently train the wrong model (wrong JSON types,
// unsupported activation, rope scaling or architecture) and lenient about the many keys HF
// configs carry that do not change the model (use_cache, transformers_version, ...). Every
// failure is an Error naming the key, e.g.
//   "llama/config.json: key 'num_key_value_heads': num_attention_heads (32) must be divisible by
//    num_key_value_heads (5)"
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/lora_spec.h"
#include "ops/ops.h"

namespace shardlm {

enum class Architecture { Llama, Mistral, Qwen2 };

// config.json's "quantization_config", as transformers writes it for a model loaded with
// bitsandbytes (BitsAndBytesConfig). Read and reported, never required: a config without it reads
// as before. Keys other than these are ignored; a wrong JSON type of one of these is an Error.
// to_hf_json() does not write it back (what shardlm saves is a dequantized or trained model).
// model/nf4_loader.h reads the quantized weights such a directory holds.
struct QuantizationConfig {
  std::string quant_method;          // "bitsandbytes" (others are reported, not understood)
  bool load_in_4bit = false;
  bool load_in_8bit = false;
  std::string quant_type;            // bnb_4bit_quant_type: "nf4" or "fp4"
  bool double_quant = false;         // bnb_4bit_use_double_quant (compress_statistics)
  std::string compute_dtype;         // bnb_4bit_compute_dtype, e.g. "bfloat16" ("" if absent)
  std::string quant_storage = "uint8";  // bnb_4bit_quant_storage
  std::vector<std::string> skip_modules;  // llm_int8_skip_modules
  // True for what model/nf4_loader.h reads: bitsandbytes, 4-bit, NF4.
  bool is_bnb_nf4() const { return quant_method == "bitsandbytes" && load_in_4bit && quant_type == "nf4"; }
  // One line for logs: "bitsandbytes 4-bit nf4, double quant, compute bfloat16, storage uint8".
  std::string describe() const;
  bool operator==(const QuantizationConfig&) const = default;
};

// The Hugging Face class name: "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM".
const char* architecture_name(Architecture arch);
// The Hugging Face model_type: "llama", "mistral", "qwen2".
const char* architecture_model_type(Architecture arch);

struct ModelConfig {
  Architecture architecture = Architecture::Llama;
  std::string model_type = "llama";

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // grouped-query attention; == num_attention_heads for MHA
  int64_t head_dim = 0;             // usually hidden_size / num_attention_heads

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  ops::RopeScaling rope_scaling;  // Kind::None, or Kind::Llama3 for Llama 3.1+
  int64_t max_position_embeddings = 2048;

  bool tie_word_embeddings = false;  // lm_head shares the embedding matrix
  bool qkv_bias = false;             // biases on q_proj, k_proj, v_proj (Qwen2; Llama attention_bias)
  bool o_bias = false;               // bias on o_proj (Llama attention_bias only)
  int64_t sliding_window = 0;        // Mistral's attention window; 0 = full causal attention

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // HF allows one id or a list (Llama 3.1 Instruct)
  std::optional<int64_t> pad_token_id;

  std::string torch_dtype = "float32";  // the dtype the checkpoint is stored in
  double initializer_range = 0.02;      // std of the normal init of new weights

  std::optional<QuantizationConfig> quantization;  // "quantization_config", when present

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Field-by-field equality of the model's shape (ops::RopeScaling has no operator==, so it cannot be
// defaulted). `quantization` is not compared: it describes how a checkpoint stores the weights, and
// to_hf_json does not write it, so a saved config must equal the quantized one it came from.
bool operator==(const ModelConfig& a, const ModelConfig& b);

// Throws an Error naming the offending key when sizes are not positive, heads do not divide,
// head_dim is odd (RoPE rotates pairs), eps <= 0, the rope scaling is malformed, ...
void validate_model_config(const ModelConfig& config);

// `path` is a config.json or a directory that contains one. Errors carry the file.
ModelConfig load_model_config(const std::string& path);
ModelConfig model_config_from_json(const nlohmann::json& json);
// An eos_token_id value as transformers writes it (config.json, generation_config.json): one id,
// a list of ids, or null (none), each in [0, vocab_size). Errors name the key (without a file).
std::vector<int64_t> eos_token_ids_from_json(const nlohmann::json& value, int64_t vocab_size);
// The "quantization_config" object alone (key names in errors are prefixed "quantization_config.").
QuantizationConfig quantization_config_from_json(const nlohmann::json& json);
// A config.json that transformers loads into the same model (AutoConfig / AutoModelForCausalLM).
nlohmann::json to_hf_json(const ModelConfig& config);

// Built-in shapes of published models (their config.json values) and a "tiny" test model.
std::vector<std::string> preset_names();
ModelConfig preset(const std::string& name);  // unknown name: Error listing the presets

// Number of parameters: the sum over model::llama_parts (defined in model/llama.cpp, from the one
// table of Llama tensors), with a fine-tune's adapters when it has them. Matches
// sum(p.numel() for p in model.parameters()) (of the PEFT model with adapters).
int64_t parameter_count(const ModelConfig& config, const model::FinetuneSpec& finetune = {});

// Model FLOPs of one trained token in rows of seq_len tokens, the numerator of MFU (PaLM's
// accounting, its appendix B): 6 per matmul weight that trains (forward, input and weight
// gradients), 4 per frozen one the backward passes through (a LoRA base: forward and input
// gradient), 6 per adapter parameter, and 12 * layers * q_dim * seq_len for attention's two matmuls.
// The embedding lookup is no matmul; the head is (tied or not). Norms and element-wise ops are left out.
double training_flops_per_token(const ModelConfig& config, const model::FinetuneSpec& finetune, int64_t seq_len);

}  // namespace shardlm
