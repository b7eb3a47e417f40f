// LoRA adapters (Hu et al., 2021) as Hugging Face PEFT defines them: for an adapted Linear layer
// y = x W^T, PEFT adds scale * B(A(x)) with A [r, in] and B [out, r], i.e. W' = W + scale * B A,
// where scale = lora_alpha / r (or lora_alpha / sqrt(r) with rsLoRA, Kalajdzievski 2023).
//
// This file is the adapter's shape and math, in the model's terms: which Llama weights a LoRA
// spec adapts (HF target module names q_proj ... down_proj, or "all-linear"), their in/out
// features from the ModelConfig, the PEFT tensor names of A and B, and the merge W += scale * B A.
// The files (adapter_config.json, adapter_model.safetensors) are in model/peft_adapter.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/lora_spec.h"

namespace shardlm::model {

// The Linear layers of a Llama decoder layer a LoRA adapter may target, by their Hugging Face
// module names, in the order of the layer's tensor table (kLayerTensors). "all-linear" means all
// seven (PEFT's "all-linear" on a causal LM: every Linear but the output head).
inline constexpr const char* kLoraModules[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                               "gate_proj", "up_proj", "down_proj"};
inline constexpr const char* kLoraAllLinear = "all-linear";



// target_modules with "all-linear" expanded, duplicates removed, in kLoraModules order. Throws an
// Error naming the unknown module (and listing the known ones) for anything else, or when empty.
std::vector<std::string> expand_lora_targets(const std::vector<std::string>& target_modules);

// Checks rank > 0, alpha finite and > 0, 0 <= dropout < 1 and the target modules. Errors name the
// PEFT key (r, lora_alpha, lora_dropout, target_modules).
void validate_lora_spec(const LoraSpec& spec);

// One adapted weight.
struct LoraTarget {
  int64_t layer = 0;
  std::string module;        // "q_proj"
  std::string module_path;   // "self_attn.q_proj" (the kLayerTensors name without ".weight")
  std::string weight_name;   // "model.layers.3.self_attn.q_proj.weight" (the base model's tensor)
  std::string a_name;        // "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
  std::string b_name;        // "base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight"
  std::string m_name;        // DoRA only: "base_model.model.model.layers.3.self_attn.q_proj.lora_magnitude_vector"
  int64_t in_features = 0;   // columns of the weight; A is [rank, in_features]
  int64_t out_features = 0;  // rows of the weight; B is [out_features, rank]
};

// Every adapted weight of `cfg` under `spec`: layer by layer, modules in kLoraModules order.
std::vector<LoraTarget> lora_targets(const ModelConfig& cfg, const LoraSpec& spec);

// PEFT's name of a LoRA tensor: "base_model.model.model.layers.{layer}.{module_path}.lora_{A|B}.weight".
std::string peft_lora_name(int64_t layer, const std::string& module_path, char a_or_b);

// PEFT's name of a DoRA magnitude vector: "base_model.model.model.layers.{layer}.{module_path}.lora_magnitude_vector"
// (PEFT's state dict has ".lora_magnitude_vector.default.weight"; its save_pretrained drops the
// adapter name and the ".weight").
std::string peft_magnitude_name(int64_t layer, const std::string& module_path);
// The base weight a magnitude vector of that name belongs to: "model.layers.3.self_attn.q_proj.weight".
std::string dora_base_weight_name(const std::string& magnitude_name);

struct LoraTensorInfo {
  std::string name;            // PEFT name
  std::vector<int64_t> shape;  // A: [rank, in]; B: [out, rank]; DoRA's magnitude: [out]
};
// The tensors of an adapter file: for each target of lora_targets(), A then B (then, with DoRA,
// the magnitude vector).
std::vector<LoraTensorInfo> lora_adapter_tensors(const ModelConfig& cfg, const LoraSpec& spec);
// Total number of LoRA parameters (DoRA's magnitude vectors included).
int64_t lora_parameter_count(const ModelConfig& cfg, const LoraSpec& spec);

// W += scale * B @ A, in f32; with a DoRA magnitude m [out] (defined), then each row j of the sum
// is scaled to norm m_j: W = m / ||W + scale B A||_row * (W + scale B A), PEFT's DoRA merge.
// W: f32 [out, in] (CPU, contiguous); A [r, in], B [out, r] and m f32 or bf16. Shapes are checked
// (Error naming the mismatch).
void lora_merge_into(const Tensor& W, const Tensor& A, const Tensor& B, double scale, const Tensor& m = {});

}  // namespace shardlm::model
