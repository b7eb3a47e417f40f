// The training configuration: what `shardlm train --config FILE.yaml [key=value ...]` reads.
// It is read through a table of fields (train_config_fields(), config_fields.h): the defaults are
// the member initializers below, docs/training.md lists every key; unknown keys are errors.
// The data section is owned by the data pipeline (docs/data.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/run_data.h"
#include "io/yaml_config.h"
#include "model/lora_spec.h"
#include "ops/ops.h"
#include "shard/sharding.h"
#include "train/config_fields.h"
#include "train/deepspeed_config.h"
#include "train/dpo_config.h"
#include "train/progress.h"
#include "train/schedule.h"

namespace shardlm::train {

using data::ChatTemplate;
using data::DataType;
// The `data:` section (docs/training.md, docs/data.md).
using data::DataConfig;

// on_nonfinite: what a step whose loss or gradient norm is NaN or Inf does. Stop: end the run with
// an error naming the step and the first tensor whose gradient is non-finite. Skip: leave weights
// and optimizer state untouched, count the step, and stop after max_skipped_steps in a row.
enum class NonFinitePolicy { Stop, Skip };

struct TrainConfig {
  shard::ShardingConfig sharding;  // strategy, wrapping, prefetch, mixed precision (sharding_config.h)
  int activation_checkpointing = 0;  // every k-th decoder layer recomputes its activations (1 = all, 0 = none)
  // The checkpointed layers' saved inputs in host memory between forward and backward (torchtune's
  // enable_activation_offloading; model::LlamaCompute::set_checkpointing). Needs checkpointing.
  bool offload_activations = false;
  std::string source;  // the YAML file, for messages
  std::string model;   // Hugging Face model directory to start from
  std::string output_dir;
  uint64_t seed = 1234;
  // The one compute dtype (f32 or bf16): what gathered parameters and activations are in. The
  // keys compute_dtype and mixed_precision.param_dtype both set it (they must agree when both are
  // given); master weights, gradients and AdamW state stay f32.
  DType compute_dtype() const { return sharding.param_dtype; }
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
  NonFinitePolicy on_nonfinite = NonFinitePolicy::Stop;
  double collective_timeout = 600;  // seconds a rank waits in a collective before naming it and ending the job
  // SIGTERM / SIGINT / SIGUSR1 (Slurm's preemption, a person's Ctrl-C, `shardlm launch` relaying
  // either through mpirun): every rank finishes the step, writes a checkpoint when checkpointing is
  // configured, and exits 0 saying how to resume. A second signal exits at once. false: the
  // signals end the process as usual.
  bool save_on_signal = true;
  int64_t max_skipped_steps = 5;  // on_nonfinite: skip: this many non-finite steps in a row end the run
  int64_t eval_every = 50;     // 0: only at the end
  int64_t eval_batches = 8;
  int64_t accuracy_examples = 200;  // builtin tasks: held-out problems decoded greedily at eval
  int64_t log_every = 10;
  ProgressMode progress = ProgressMode::Auto;
  std::string metrics_file = "metrics.jsonl";  // relative to output_dir
  // [first, last]: steps whose timeline every rank writes as a Chrome trace, output_dir/trace/
  // rank<R>.json (core/timeline.h); empty: none.
  std::vector<int64_t> profile_steps;
  // FLOP/s one rank's device can do at the compute dtype (e.g. 989e12 for an H100 SXM in bf16);
  // given, step records carry mfu = model_flops_per_s / (peak_flops * ranks). 0: no mfu.
  double peak_flops = 0;
  // report_to (docs/reports.md): where else every metrics record goes. tensorboard: event files
  // in logging_dir ("" = <output_dir>/runs), written by rank 0. report.html is always written.
  bool report_tensorboard = false;
  std::string logging_dir;
  DType save_dtype = DType::F32;
  std::string max_shard_size = "5GB";
  int64_t max_memory_per_rank = 0;  // bytes; the budget `sharding_strategy: auto` fits (0 = not given)
  ErrorContext max_memory_per_rank_at;  // where it was written (file, line, key), for errors found later

  // LoRA / QLoRA (docs/lora.md): set when the config has a `lora:` section (torchtune's key names
  // accepted in it). The spec's target_modules are expanded (kLoraModules order, no "all-linear")
  // and its base_model_name_or_path is `model`.
  std::optional<model::LoraSpec> lora;
  bool lora_quantize_base = false;  // lora.quantize_base: nf4 (or qlora: true): the frozen base in NF4 (QLoRA)
  bool lora_double_quant = true;    // lora.double_quant: double quantization of the NF4 absmax values
  bool merge_on_save = false;       // lora.merge_on_save: also write the merged model (W + scale B A) at the end

  // Preference tuning (docs/preference.md): a `dpo:` section makes the run DPO on preference pairs.
  bool preference = false;
  DpoConfig dpo;

  // Sharded checkpoints (docs/checkpoints.md). Saving is on when either interval is set; a final
  // checkpoint is then also written at the end.
  int64_t save_every = 0;          // steps between checkpoints; 0: none by step count
  double save_every_minutes = 0;   // minutes between checkpoints; 0: none by time
  int keep_last_n = 0;             // complete checkpoints kept; 0: all
  std::string checkpoint_dir;      // where step_NNNNNNNN/ directories go; "" = <output_dir>/checkpoints
  std::string resume_from;         // "" (start from `model`), "auto" (the newest complete one), or a directory
  // Checkpoints written by a background thread from a staged copy of the state: training waits only
  // for the copy, and each checkpoint is completed at the next save, the end or a stop
  // (ckpt::CheckpointSaver).
  bool async_checkpoint = false;
  // What a deepspeed_config (docs/deepspeed.md) said that is not a key above: its warnings (printed
  // by the commands that read the config) and train_batch_size (applied by with_batch_size).
  DeepSpeedSettings deepspeed;

  bool saves_checkpoints() const { return save_every > 0 || save_every_minutes > 0; }
  std::string checkpoint_root() const;
  std::string tensorboard_dir() const;
};

// Reads and validates; every error names the file, line and key. Unknown keys are errors.
TrainConfig read_train_config(ConfigTree& tree);
// The table read_train_config reads: every key of a training config, in reading order (the
// sharding keys of sharding_config_fields() among them).
const std::vector<ConfigField<TrainConfig>>& train_config_fields();
// A YAML file with `key=value` overrides applied, read as above (what `shardlm train` and
// `shardlm data-preview` take).
TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides);
// The config with a DeepSpeed train_batch_size applied at `world_size` ranks, as DeepSpeed applies
// it (every rank is a data-parallel rank in every strategy): train_batch_size = micro_batch_size x
// gradient_accumulation_steps x ranks. Whichever of the two the configs do not set is derived
// (neither: accumulation 1); an error at the DeepSpeed key when they do not multiply out.
TrainConfig with_batch_size(const TrainConfig& c, int world_size);

}  // namespace shardlm::train

namespace shardlm {
// The spellings of the training config's own enumerations (the data section's are in data/run_data.h).
template <>
struct EnumNames<train::ProgressMode> {
  static constexpr std::pair<train::ProgressMode, const char*> values[] = {{train::ProgressMode::Auto, "auto"},
                                                                           {train::ProgressMode::Bar, "bar"},
                                                                           {train::ProgressMode::Lines, "lines"},
                                                                           {train::ProgressMode::None, "none"}};
};
template <>
struct EnumNames<train::NonFinitePolicy> {
  static constexpr std::pair<train::NonFinitePolicy, const char*> values[] = {{train::NonFinitePolicy::Stop, "stop"},
                                                                              {train::NonFinitePolicy::Skip, "skip"}};
};
template <>
struct EnumNames<Device> {
  static constexpr std::pair<Device, const char*> values[] = {{Device::CPU, "cpu"}, {Device::CUDA, "cuda"}};
};
}  // namespace shardlm
