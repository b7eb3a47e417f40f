// The training configuration: what `shardlm train --config FILE.yaml [key=value ...]` reads.
// It is read through a table of fields (train_config_fields(), config_fields.h): the defaults are
// the member initializers below, docs/training.md lists every key; unknown keys are errors.
// The data section is owned by the data pipeline (docs/data.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/instruct.h"
#include "io/yaml_config.h"
#include "ops/ops.h"
#include "shard/sharding.h"
#include "train/config_fields.h"
#include "train/progress.h"
#include "train/schedule.h"

namespace shardlm::train {

// data.type. Auto: builtin:addition by name, .bin/.tokens are token files, .json/.jsonl are
// alpaca or chat by their first record, the rest is text.
enum class DataType { Auto, Text, Tokens, Alpaca, Chat, BuiltinAddition };
// data.chat_format. Auto: llama3 when the tokenizer has <|start_header_id|>, else llama2
// (data::resolve_chat_format decides, once the tokenizer is known).
enum class ChatTemplate { Auto, Llama3, Llama2 };

// The `data:` section (docs/training.md, docs/data.md).
struct DataConfig {
  DataType type = DataType::Auto;
  std::string train;            // the training file, or "builtin:addition"
  int token_bytes = 2;          // tokens: 2 (uint16) or 4 (uint32) per id
  std::string eval;             // a separate evaluation file (optional)
  double eval_fraction = 0.05;  // else hold out this fraction (text/tokens: the tail; records: by hash)
  // alpaca / chat
  data::AlpacaColumns columns;  // field names of instruction, input, output
  bool train_on_input = false;  // keep the prompt (and chat non-assistant turns) in the loss
  ChatTemplate chat_format = ChatTemplate::Auto;
  std::optional<bool> packing;  // unset: true for alpaca/chat, false otherwise
  data::BadRowPolicy on_bad_row = data::BadRowPolicy::Fail;
  // builtin:addition
  int digits = 2;
  int64_t train_examples = 20000;
  int64_t eval_examples = 500;
};

struct TrainConfig {
  shard::ShardingConfig sharding;  // strategy, wrapping, prefetch, mixed precision (sharding_config.h)
  int activation_checkpointing = 0;  // every k-th decoder layer recomputes its activations (1 = all, 0 = none)
  std::string source;  // the YAML file, for messages
  std::string model;   // Hugging Face model directory to start from
  std::string output_dir;
  uint64_t seed = 1234;
  DType compute_dtype = DType::F32;
  // cpu | cuda. cuda: activations, gathered parameters and gradients on this rank's GPU (local rank
  // mod GPU count), tensors over NCCL. Refused at read time when this build or machine has no GPU.
  Device device = Device::CPU;
  DataConfig data;
  int64_t seq_len = 256;
  int64_t micro_batch_size = 8;
  int64_t gradient_accumulation_steps = 1;
  int64_t max_steps = 100;
  // AdamW's defaults in a config file (ops::AdamWConfig's are torch's, for code that builds one).
  ops::AdamWConfig optimizer{.lr = 3e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.0};
  LrSchedule schedule;  // lr and total_steps follow optimizer.lr and max_steps
  double max_grad_norm = 1.0;  // 0 disables clipping
  int64_t eval_every = 50;     // 0: only at the end
  int64_t eval_batches = 8;
  int64_t accuracy_examples = 200;  // builtin tasks: held-out problems decoded greedily at eval
  int64_t log_every = 10;
  ProgressMode progress = ProgressMode::Auto;
  std::string metrics_file = "metrics.jsonl";  // relative to output_dir
  DType save_dtype = DType::F32;
  std::string max_shard_size = "5GB";
  int64_t max_memory_per_rank = 0;  // bytes; the budget `sharding_strategy: auto` fits (0 = not given)

  // Sharded checkpoints (docs/checkpoints.md). Saving is on when either interval is set; a final
  // checkpoint is then also written at the end.
  int64_t save_every = 0;          // steps between checkpoints; 0: none by step count
  double save_every_minutes = 0;   // minutes between checkpoints; 0: none by time
  int keep_last_n = 0;             // complete checkpoints kept; 0: all
  std::string checkpoint_dir;      // where step_NNNNNNNN/ directories go; "" = <output_dir>/checkpoints
  std::string resume_from;         // "" (start from `model`), "auto" (the newest complete one), or a directory
  bool saves_checkpoints() const { return save_every > 0 || save_every_minutes > 0; }
  std::string checkpoint_root() const;
};

// Reads and validates; every error names the file, line and key. Unknown keys are errors.
TrainConfig read_train_config(ConfigTree& tree);
// The table read_train_config reads: every key of a training config, in reading order (the
// sharding keys of sharding_config_fields() among them).
const std::vector<ConfigField<TrainConfig>>& train_config_fields();
// A YAML file with `key=value` overrides applied, read as above (what `shardlm train` and
// `shardlm data-preview` take).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);

// The spellings of the enumerations a training config holds.
template <>
struct EnumNames<DataType> {
  static constexpr std::pair<DataType, const char*> values[] = {
      {DataType::Auto, "auto"},     {DataType::Text, "text"}, {DataType::Tokens, "tokens"},
      {DataType::Alpaca, "alpaca"}, {DataType::Chat, "chat"}, {DataType::BuiltinAddition, "builtin:addition"}};
};
template <>
struct EnumNames<ChatTemplate> {
  static constexpr std::pair<ChatTemplate, const char*> values[] = {
      {ChatTemplate::Auto, "auto"}, {ChatTemplate::Llama3, "llama3"}, {ChatTemplate::Llama2, "llama2"}};
};
template <>
struct EnumNames<data::BadRowPolicy> {
  static constexpr std::pair<data::BadRowPolicy, const char*> values[] = {{data::BadRowPolicy::Fail, "fail"},
                                                                          {data::BadRowPolicy::Skip, "skip"}};
};
template <>
struct EnumNames<ProgressMode> {
  static constexpr std::pair<ProgressMode, const char*> values[] = {
      {ProgressMode::Auto, "auto"}, {ProgressMode::Bar, "bar"}, {ProgressMode::Lines, "lines"}, {ProgressMode::None, "none"}};
};
template <>
struct EnumNames<Device> {
  static constexpr std::pair<Device, const char*> values[] = {{Device::CPU, "cpu"}, {Device::CUDA, "cuda"}};
};

}  // namespace shardlm::train

namespace shardlm::data {
// on_bad_row compares with its spelling like the train enums (config_fields.h).
using train::operator==;
}  // namespace shardlm::data
