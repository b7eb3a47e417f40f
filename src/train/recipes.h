// Built-in training configurations ("recipes", in torchtune's spirit): full fine-tunes, LoRA and
// QLoRA of the Llama 2 / Llama 3 / 3.1 / 3.2, Mistral and Qwen2 models, on one rank or many.
// Their YAML texts live in the binary (`shardlm recipes`, `shardlm recipes cp NAME FILE`); each
// names a model directory the user fills (models/Llama-3.1-8B-Instruct, ...) and the preset of the
// same shape, so `shardlm validate --recipe NAME` can check it without the weights.
#pragma once

#include <string>
#include <vector>

namespace shardlm::train {

struct Recipe {
  std::string name;       // llama3_1-8b-lora-single-device
  std::string model;      // the model, as people name it: Llama-3.1-8B-Instruct
  std::string preset;     // the built-in shape it has (model/config.h presets): llama3.1-8b
  std::string method;     // full, lora or qlora; dpo-full, dpo-lora or dpo-qlora (preference tuning)
  int ranks = 1;          // the world size it is written for (and validated at)
  std::string budget;     // its max_memory_per_rank, as written (80GB)
  std::string yaml;       // the configuration
};

// Every recipe, in listing order.
const std::vector<Recipe>& recipes();
// The recipe called `name`, or an Error naming the close names (or all, when none is close).
const Recipe& find_recipe(const std::string& name);

}  // namespace shardlm::train
