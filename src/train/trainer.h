// The training loop: on one process or many, every run goes through the sharding engine
// (shard/engine.h); the loop adds data, accumulation, schedule, clipping, evaluation, checkpoints,
// progress and metrics, and saves the trained model as a Hugging Face directory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/config.h"
#include "train/train_config.h"

namespace shardlm::train {

struct TrainResult {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0;       // training loss of the first and last step
  double initial_eval_loss = 0, eval_loss = 0;  // held-out loss before and after training
  double initial_accuracy = -1, accuracy = -1;  // built-in tasks only; -1 otherwise
  double seconds = 0, tokens_per_s = 0;
  std::vector<double> losses;              // training loss of every step, in order
  std::vector<double> grad_norms;          // global gradient norm of every step (before clipping)
  int64_t skipped_steps = 0;               // on_nonfinite: skip: steps without an optimizer step
  bool stopped_by_signal = false;          // SIGTERM/SIGINT ended the run after `steps` (save_on_signal)
  int64_t gpu_peak_reserved_bytes = 0;     // device: cuda: the caching allocator's peak reservation
};

// Trains on the ranks of `world` (sharded as cfg.sharding says); rank 0 prints, writes metrics and
// saves. The one-argument form runs in this process alone.
TrainResult run_training(const TrainConfig& cfg, comm::Communicator& world);
TrainResult run_training(const TrainConfig& cfg);

// What `shardlm validate` checks without training, through the code training runs: the batch
// against world_size, the model's config.json, tokenizer and every data file (as loading reads
// them), and the memory estimate per rank against max_memory_per_rank (an Error naming the key
// when it does not fit). `shape`, when given, stands in for the model directory's config.json and
// then nothing on disk is read.
struct RunCheck {
  std::vector<std::string> lines;  // what was found, one line each
  int64_t memory_per_rank = 0;     // the estimated peak per rank (device memory), bytes
};
RunCheck check_run(const TrainConfig& cfg, int world_size, int ranks_per_node, const ModelConfig* shape = nullptr);

}  // namespace shardlm::train
