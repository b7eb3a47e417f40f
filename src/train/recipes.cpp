#include "train/recipes.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "io/yaml_config.h"

namespace shardlm::train {

namespace {

// The models: what torchtune calls them in recipe names (3.1 -> 3_1), the Hugging Face directory
// a user downloads, the preset of the same shape, and a size class that decides which recipes make
// sense (a 70B model has no single-device full fine-tune).
enum class Size { Small, Mid, Large };  // <= 3B, 7-13B, 70B
struct ModelRow {
  const char* family;
  const char* hf_dir;
  const char* preset;
  Size size;
  const char* adapter_budget = "24GB";  // single-device LoRA/QLoRA: a 13B bf16 base alone is 26 GB
};
constexpr ModelRow kModels[] = {
    {"llama2-7b", "Llama-2-7b-hf", "llama2-7b", Size::Mid},
    {"llama2-13b", "Llama-2-13b-hf", "llama2-13b", Size::Mid, "40GB"},
    {"llama2-70b", "Llama-2-70b-hf", "llama2-70b", Size::Large},
    {"llama3-8b", "Meta-Llama-3-8B-Instruct", "llama3-8b", Size::Mid},
    {"llama3-70b", "Meta-Llama-3-70B-Instruct", "llama3-70b", Size::Large},
    {"llama3_1-8b", "Llama-3.1-8B-Instruct", "llama3.1-8b", Size::Mid},
    {"llama3_1-70b", "Llama-3.1-70B-Instruct", "llama3.1-70b", Size::Large},
    {"llama3_2-1b", "Llama-3.2-1B-Instruct", "llama3.2-1b", Size::Small},
    {"llama3_2-3b", "Llama-3.2-3B-Instruct", "llama3.2-3b", Size::Small},
    {"mistral-7b", "Mistral-7B-v0.1", "mistral-7b", Size::Mid},
    {"qwen2-0_5b", "Qwen2-0.5B-Instruct", "qwen2-0.5b", Size::Small},
};

struct Variant {
  const char* method;  // full, lora, qlora; dpo-full, dpo-lora, dpo-qlora (preference tuning)
  bool distributed;
};

// Which fine-tunes each size gets. Full fine-tunes keep f32 master weights and AdamW state
// (16 bytes per parameter before sharding), so beyond 3B they need several ranks; a 70B model needs
// four nodes of 8 for a full fine-tune (16 ranks would need 76 GiB each) and a node of 8 for LoRA
// and QLoRA.
std::vector<Variant> variants(Size s) {
  switch (s) {
    // DPO (docs/preference.md) where its reference fits: adapters' is the base itself, a full
    // fine-tune's a second (sharded, f32) copy, so no full DPO at 70B.
    case Size::Small:
      return {{"full", false}, {"full", true}, {"lora", false}, {"lora", true}, {"qlora", false},
              {"dpo-full", true}, {"dpo-lora", false}, {"dpo-qlora", false}};
    case Size::Mid:
      return {{"full", true}, {"lora", false}, {"lora", true}, {"qlora", false},
              {"dpo-full", true}, {"dpo-lora", false}, {"dpo-qlora", false}};
    case Size::Large:
      return {{"full", true}, {"lora", true}, {"qlora", true}, {"dpo-lora", true}, {"dpo-qlora", true}};
  }
  return {};
}

Recipe make(const ModelRow& m, const Variant& v) {
  Recipe r;
  r.name = fmt::format("{}-{}-{}", m.family, v.method, v.distributed ? "distributed" : "single-device");
  r.model = m.hf_dir;
  r.preset = m.preset;
  r.method = v.method;
  const bool dpo = r.method.starts_with("dpo-");
  const std::string tune = dpo ? r.method.substr(4) : r.method;  // full, lora or qlora
  const bool large = m.size == Size::Large, full = tune == "full";
  r.ranks = !v.distributed ? 1 : large && full ? 32 : 8;
  // One rank accumulates 8 micro-batches of 2 rows; 8 or 32 ranks take 2 (or, at 70B, 1) each.
  // DPO's micro-batch is pairs of two rows: 1 pair, 2 rows, as much memory as SFT's 2 rows.
  const int micro = large || dpo ? 1 : 2, accum = v.distributed ? 1 : 8;
  // A budget of 80 GB per rank (an A100/H100 80GB), 24 GB for single-device adapters (a
  // consumer GPU; 40 GB at 13B), as torchtune's recipes are sized; `shardlm validate` checks the
  // estimate fits.
  const char* budget = !v.distributed && !full && m.size != Size::Large ? m.adapter_budget : "80GB";
  r.budget = budget;
  const std::string launch =
      !v.distributed  ? std::string("shardlm train --config FILE")
      : r.ranks <= 8 ? fmt::format("shardlm launch --nproc-per-node {} -- train --config FILE", r.ranks)
                     : fmt::format("shardlm launch --nproc-per-node 8 --nnodes {} --hostfile hosts -- train --config FILE",
                                   r.ranks / 8);
  std::string text = fmt::format(
      "# {name}: {what} of {model} on {ranks} rank{s} (a shardlm recipe).\n"
      "#   shardlm recipes cp {name} FILE     writes this file to edit\n"
      "# Fill `model` with the Hugging Face directory (config.json, safetensors, tokenizer) and\n"
      "# `data.train` with your data, check it with `shardlm validate --config FILE`, then run\n"
      "#   {launch}\n"
      "# Every key is in docs/training.md.\n"
      "model: models/{model}\n"
      "output_dir: runs/{name}\n"
      "{data}"
      "micro_batch_size: {micro}\n"
      "gradient_accumulation_steps: {accum}\n"
      "max_steps: 1000\n"
      "compute_dtype: bf16\n"
      "optimizer: {{lr: {lr}, weight_decay: 0.01}}\n"
      "lr_scheduler: {{type: cosine, warmup_steps: 100}}\n"
      "max_grad_norm: 1.0\n"
      "sharding_strategy: FULL_SHARD\n"
      "activation_checkpointing: true\n"
      "max_memory_per_rank: {budget}      # one rank's memory; validate checks the estimate against it\n"
      "# device: cuda                     # on GPUs (the CUDA path has not yet run on a GPU: docs/ops.md)\n"
      "eval_every: 100\n"
      "save_every: 200\n"
      "keep_last_n: 2\n",
      fmt::arg("name", r.name),
      fmt::arg("what", fmt::format("{}{}", dpo ? "DPO, " : "",
                                   full ? "full fine-tune" : tune == "lora" ? "LoRA fine-tune" : "QLoRA (NF4 base) fine-tune")),
      fmt::arg("data", dpo ? "data:\n"
                             "  train: data/pairs.jsonl   # {\"prompt\", \"chosen\", \"rejected\"} JSONL (docs/preference.md)\n"
                             "  type: preference\n"
                             "seq_len: 1024\n"
                           : "data:\n"
                             "  train: data/alpaca_data.json   # Alpaca JSON/JSONL; chat JSONL, text and token files too "
                             "(docs/data.md)\n"
                             "  type: alpaca\n"
                             "seq_len: 2048\n"),
      fmt::arg("model", m.hf_dir), fmt::arg("ranks", r.ranks), fmt::arg("s", r.ranks == 1 ? "" : "s"),
      fmt::arg("launch", launch), fmt::arg("micro", micro), fmt::arg("accum", accum),
      fmt::arg("lr", dpo ? (full ? "5e-7" : "5e-6") : full ? "2e-5" : "3e-4"), fmt::arg("budget", budget));
  if (!full) {
    // torchtune's LoRA arguments (shardlm reads them as they are): attention and MLP adapted.
    text += fmt::format(
        "lora:\n"
        "  lora_attn_modules: [q_proj, v_proj, output_proj]\n"
        "  apply_lora_to_mlp: true\n"
        "  lora_rank: {rank}\n"
        "  lora_alpha: {alpha}\n"
        "  lora_dropout: 0.0\n"
        "{quant}",
        fmt::arg("rank", large ? 16 : 8), fmt::arg("alpha", large ? 32 : 16),
        fmt::arg("quant", tune == "qlora" ? "  quantize_base: nf4        # QLoRA: the frozen base in 4-bit NormalFloat\n"
                                          : ""));
  }
  if (dpo)
    text += fmt::format(
        "dpo:                          # the reference: {}\n"
        "  beta: 0.1\n"
        "  loss_type: sigmoid\n",
        full ? "a frozen, sharded copy of `model`" : "the base with the adapters off");
  r.yaml = std::move(text);
  return r;
}

std::vector<Recipe> make_all() {
  std::vector<Recipe> out;
  for (const ModelRow& m : kModels)
    for (const Variant& v : variants(m.size)) out.push_back(make(m, v));
  return out;
}

}  // namespace

const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> all = make_all();
  return all;
}

const Recipe& find_recipe(const std::string& name) {
  for (const Recipe& r : recipes())
    if (r.name == name) return r;
  // Close names: the same family (llama3_1-8b-...), or a few edits away.
  std::vector<std::string> close;
  const std::string family = name.substr(0, name.find('-', name.find('-') + 1));
  for (const Recipe& r : recipes())
    if (r.name.rfind(family, 0) == 0 || edit_distance(name, r.name) <= 4) close.push_back(r.name);
  if (close.size() > 8) close.resize(8);
  throw Error(fmt::format("unknown recipe '{}'; {} (`shardlm recipes` lists all {})", name,
                          close.empty() ? std::string("no recipe has a close name")
                                        : fmt::format("close: {}", fmt::join(close, ", ")),
                          recipes().size()));
}

}  // namespace shardlm::train
