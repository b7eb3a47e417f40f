// A LoRA adapter's hyperparameters, as Hugging Face PEFT's LoraConfig names them, and the
// FinetuneSpec that the model builder takes beside the ModelConfig. Kept apart from model/lora.h
// (the adapter's math and names) so that headers naming a fine-tune need not include that.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardlm::model {

// How A is initialized (B is always zero, so a fresh adapter leaves the model unchanged):
// Kaiming: PEFT's default (init_lora_weights=True), kaiming-uniform with a = sqrt(5), i.e.
//          U(-1/sqrt(in), 1/sqrt(in)); Gaussian: init_lora_weights="gaussian", N(0, (1/r)^2).
enum class LoraInit : uint8_t { Kaiming, Gaussian };

struct LoraSpec {
  int64_t rank = 8;              // PEFT's r
  double alpha = 16;             // PEFT's lora_alpha
  double dropout = 0.0;          // PEFT's lora_dropout (training only; no effect on merge or inference)
  std::vector<std::string> target_modules;  // HF names (kLoraModules) or "all-linear"
  bool use_rslora = false;       // scale alpha / sqrt(r) instead of alpha / r
  // DoRA (Liu et al., 2024; PEFT's use_dora): each adapted weight also has a trainable magnitude
  // vector m [out], and the layer computes with m / ||W + scale B A|| (row-wise) * (W + scale B A).
  bool use_dora = false;
  LoraInit init = LoraInit::Kaiming;  // PEFT's init_lora_weights: true (kaiming) or "gaussian"
  std::string base_model_name_or_path = "";  // informative: where the base model came from
  std::string task_type = "CAUSAL_LM";      // written to adapter_config.json

  // alpha / rank, or alpha / sqrt(rank) with use_rslora.
  double scale() const;
};

// How a fine-tune changes the model that config.json describes (a ModelConfig, which stays exactly
// config.json's): nothing (a full fine-tune, the default), LoRA adapters on the decoder's Linear
// layers, or LoRA over a frozen base kept in NF4 (QLoRA). A model with LoRA is a different model,
// with more parameters and a different forward, as torchtune's lora_llama2_* builders make it: so
// the spec goes to what builds and runs the model (llama_parts, LlamaCompute, the engine's plan,
// the estimator) beside the ModelConfig, and the engine keeps the one copy a run has.
struct FinetuneSpec {
  // With adapters, the model's parameters are the frozen base weights plus the adapters' A and B
  // (model::llama_parts), and only the adapters train.
  std::optional<LoraSpec> lora;
  // QLoRA (with lora): the frozen base's Linear weights (q/k/v/o/gate/up/down of every layer) kept
  // in NF4 as bitsandbytes stores them (ops/nf4.h), with double quantization of the absmax values
  // when nf4_double_quant, dequantized to the compute dtype around each use.
  bool nf4_base = false;
  bool nf4_double_quant = true;
};

}  // namespace shardlm::model
