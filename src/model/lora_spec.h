// A LoRA adapter's hyperparameters, as Hugging Face PEFT's LoraConfig names them. Kept apart from
// model/lora.h (the adapter's math and names) so that ModelConfig can carry one: a model with LoRA
// is a different model (more parameters, a different forward), as torchtune's lora_llama2_* builders
// make it.
#pragma once

#include <cstdint>
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
  LoraInit init = LoraInit::Kaiming;  // PEFT's init_lora_weights: true (kaiming) or "gaussian"
  std::string base_model_name_or_path = "";  // informative: where the base model came from
  std::string task_type = "CAUSAL_LM";      // written to adapter_config.json

  // alpha / rank, or alpha / sqrt(rank) with use_rslora.
  double scale() const;
};

}  // namespace shardlm::model
