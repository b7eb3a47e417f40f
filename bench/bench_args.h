// Command-line options shared by the training benchmarks: a Llama shape and a run length.
//   --preset NAME                                     start from a preset's shape (default: "tiny")
//   --dim --layers --heads --kv-heads --ffn --vocab   the model (the rest of the preset)
//   --seq --batch --steps --warmup --rounds --dtype   the run
//   --lora-rank R [--qlora 1]                         LoRA adapters of rank R (alpha 2R) on every
//                                                     Linear layer, on a frozen base (NF4 with --qlora)
//   --state-dtype f32|bf16|8bit                       AdamW's moments (optimizer_state_dtype / adamw_8bit)
//   --ckpt K [--offload-activations 1]                every K-th layer checkpointed (its input offloaded)
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "model/config.h"

namespace shardlm::bench {

struct BenchArgs {
  ModelConfig cfg;
  int64_t seq, batch, steps, warmup, rounds = 1;
  DType dtype = DType::F32;
  model::FinetuneSpec finetune = {};  // --lora-rank, --qlora
  DType state_dtype = DType::F32;     // --state-dtype (8bit: U8)
  int checkpoint_every = 0;           // --ckpt
  bool offload_activations = false;   // --offload-activations
};

// Defaults in `d`; exits with a usage line on an unknown option.
inline BenchArgs parse_bench_args(int argc, char** argv, BenchArgs d) {
  for (int i = 1; i + 1 < argc; i += 2)  // the preset first: the other options change it
    if (std::string(argv[i]) == "--preset") d.cfg = preset(argv[i + 1]);
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--dim") d.cfg.hidden_size = v;
    else if (k == "--layers") d.cfg.num_hidden_layers = v;
    else if (k == "--heads") d.cfg.num_attention_heads = v;
    else if (k == "--kv-heads") d.cfg.num_key_value_heads = v;
    else if (k == "--ffn") d.cfg.intermediate_size = v;
    else if (k == "--vocab") d.cfg.vocab_size = v;
    else if (k == "--seq") d.seq = v;
    else if (k == "--batch") d.batch = v;
    else if (k == "--steps") d.steps = v;
    else if (k == "--warmup") d.warmup = v;
    else if (k == "--rounds") d.rounds = v;
    else if (k == "--dtype") d.dtype = parse_dtype(argv[i + 1]);
    else if (k == "--lora-rank") d.finetune.lora = model::LoraSpec{.rank = v, .alpha = 2.0 * double(v), .target_modules = {"all-linear"}};
    else if (k == "--qlora") d.finetune.nf4_base = v != 0;
    else if (k == "--preset") continue;
    else if (k == "--state-dtype") d.state_dtype = std::string(argv[i + 1]) == "8bit" ? DType::U8 : parse_dtype(argv[i + 1]);
    else if (k == "--ckpt") d.checkpoint_every = int(v);
    else if (k == "--offload-activations") d.offload_activations = v != 0;
    else {
      fmt::print(stderr, "unknown option {} (see the comment at the top of bench/bench_args.h)\n", k);
      std::exit(2);
    }
  }
  if (d.finetune.nf4_base && !d.finetune.lora) {
    fmt::print(stderr, "--qlora needs --lora-rank\n");
    std::exit(2);
  }
  d.cfg.head_dim = d.cfg.hidden_size / d.cfg.num_attention_heads;
  d.cfg.max_position_embeddings = std::max<int64_t>(d.cfg.max_position_embeddings, d.seq);
  validate_model_config(d.cfg);
  return d;
}

}  // namespace shardlm::bench
