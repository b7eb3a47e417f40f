// A training run's setup, before any step: the model, its tokenizer and the data, checked against
// each other (load_inputs), and the strategy and memory per rank (plan_memory). The trainer
// (trainer.h) starts from them, and `shardlm validate` runs them without training (check_run), so
// what validate accepts is what training reads. Owner: the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/run_data.h"
#include "data/tokenizer.h"
#include "memory/estimator.h"
#include "model/config.h"
#include "shard/sharding.h"
#include "train/train_config.h"

namespace shardlm::train {

// The model, its tokenizer and the data, checked against each other.
struct RunInputs {
  ModelConfig model;
  model::FinetuneSpec finetune;  // the run's LoRA / QLoRA (QLoRA's double quantization as the base stores it)
  std::unique_ptr<data::Tokenizer> tok;
  data::RunData data;
  int64_t B = 0, T = 0;  // micro-batch rows (rows_per_micro_batch) and row length
  std::string base_note;  // how a bitsandbytes 4-bit model directory's base is read ("" otherwise)
};

// The rows of a micro-batch: micro_batch_size, or under DPO twice that (micro_batch_size counts
// pairs, as TRL's per_device_train_batch_size does; each pair is two rows).
inline int64_t rows_per_micro_batch(const TrainConfig& c) { return c.preference ? 2 * c.micro_batch_size : c.micro_batch_size; }

// Reads config.json, the tokenizer and every data file as training reads them; an Error names
// what does not fit (a tokenizer for another vocabulary, rows beyond the model's positions, ...).
// load_inputs first refuses a run whose output directories are its model directory;
// read_inputs, for `shardlm eval`, which writes no run directory, does not look at output_dir.
RunInputs load_inputs(const TrainConfig& c);
RunInputs read_inputs(const TrainConfig& c);

// The strategy (`sharding_strategy: auto` picks it by memory) and what the estimator expects this
// run to hold per rank (docs/memory.md). With enforce_budget, a training run whose estimate is above
// max_memory_per_rank is refused in one line naming that key and the levers that would make it
// fit, each with its peak (memory/levers.h); `shardlm eval`, whose engine holds less, does not ask.
struct MemoryPlan {
  shard::ShardingConfig sharding;
  memory::EstimateInput input;  // what was estimated (the strategy auto chose included)
  memory::Estimate estimate;
  std::string auto_why;
};

MemoryPlan plan_memory(const TrainConfig& c, const RunInputs& in, int world_size, int node_ranks,
                       bool enforce_budget = true);

// What `shardlm validate` checks without training, through the code training runs: the batch
// against world_size, the model's config.json, tokenizer and every data file (as loading reads
// them), and the memory estimate per rank against max_memory_per_rank (an Error naming the key
// when it does not fit). `shape`, when given, stands in for the model directory's config.json and
// then nothing on disk is read.
// With the data read, the first examples of each instruction file are checked too (sample_check.h):
// an Error when generation would not stop or would prompt in another chat format, a warning when
// seq_len truncates many examples.
struct RunCheck {
  std::vector<std::string> lines;     // what was found, one line each
  std::vector<std::string> warnings;  // what may be wrong, one line each
  std::string sample;                 // the first training example as training sees it ("" without data)
  int64_t memory_per_rank = 0;        // the estimated peak per rank (device memory), bytes
};
RunCheck check_run(const TrainConfig& cfg, int world_size, int ranks_per_node, const ModelConfig* shape = nullptr);

}  // namespace shardlm::train
