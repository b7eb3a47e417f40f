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
#include "train/run_setup.h"  // check_run: the setup of a run, without training
#include "train/train_config.h"

namespace shardlm::train {

struct TrainResult {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0;       // training loss of the first and last step
  double initial_eval_loss = 0, eval_loss = 0;  // held-out loss before and after training
  double initial_accuracy = -1, accuracy = -1;  // built-in tasks only; -1 otherwise
  double seconds = 0, tokens_per_s = 0;
  double save_seconds = 0;                 // the final save: the model or adapter (and merge_on_save's merge)
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

}  // namespace shardlm::train
