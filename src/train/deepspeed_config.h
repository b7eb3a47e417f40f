// DeepSpeed configurations, read into the training config's own keys.
//
// `deepspeed_config: ds.json` (the JSON that HF Trainer's --deepspeed and deepspeed.initialize
// take) and accelerate's `deepspeed_config:` section (zero_stage, offload_*_device, ... or
// deepspeed_config_file) are translated, key by key, into the keys of docs/training.md before the
// table of train_config_fields() is read: zero_optimization.stage 3 becomes `sharding_strategy:
// FULL_SHARD` placed at the JSON's line, so the same reader checks it and its errors name the
// JSON file, line and DeepSpeed key. One way to configure each thing, whichever file says it.
//
// Rules (docs/deepspeed.md has the table):
//   - "auto" (HF Trainer's) leaves shardlm's own value: the YAML's key, else its default.
//   - A DeepSpeed value that disagrees with a key the YAML file sets is an error naming both; the
//     command line (key=value) overrides both files. An absent DeepSpeed parameter takes
//     DeepSpeed's default (WarmupLR's warmup_num_steps 1000, ...) unless the YAML sets that key.
//   - Features that change what is computed and that shardlm lacks (fp16 loss scaling, sparse
//     attention, pipeline, MoE, other optimizers and schedulers, ZeRO++ quantization, ...) are
//     refused by name; any other key (tuning knobs: bucket sizes, overlap_comm, stage3_*, logging)
//     is listed in one warning and has no effect.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/yaml_config.h"

namespace shardlm::train {

struct DeepSpeedSettings {
  bool present = false;               // the config has a deepspeed_config key
  std::vector<std::string> warnings;  // one line each (at most one per DeepSpeed file)
  // train_batch_size: micro-batch x accumulation x ranks, applied once the world size is known.
  int64_t train_batch_size = 0;  // 0: not given (or "auto")
  ErrorContext train_batch_size_at;
  // Whether micro_batch_size / gradient_accumulation_steps were set (by a DeepSpeed key, the YAML
  // or the command line): train_batch_size derives the one that was not, as DeepSpeed does.
  bool micro_batch_set = false, accumulation_set = false;
};

// Translates the tree's `deepspeed_config` (absent: nothing) into shardlm keys of `t`.
DeepSpeedSettings apply_deepspeed_config(ConfigTree& t);

}  // namespace shardlm::train
