// The single-process training loop: data, accumulation, schedule, clipping, evaluation,
// progress and metrics, and the trained model saved as a Hugging Face directory.
#pragma once

#include <cstdint>

#include "data/dataset.h"
#include "model/llama.h"
#include "train/param_store.h"
#include "train/train_config.h"

namespace shardlm::train {

struct TrainResult {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0;       // training loss of the first and last step
  double initial_eval_loss = 0, eval_loss = 0;  // held-out loss before and after training
  double initial_accuracy = -1, accuracy = -1;  // built-in tasks only; -1 otherwise
  double seconds = 0, tokens_per_s = 0;
};

TrainResult run_training(const TrainConfig& cfg);

struct StepResult {
  double loss = 0;        // mean over the non-ignored targets of all micro-batches
  int64_t tokens = 0;     // those targets
  double grad_norm = 0;   // global L2 norm before clipping
};
// One optimizer step over the micro-batches of a global batch: zero gradients, forward and
// backward of each micro-batch with the loss normalized over the whole global batch, gradient
// clipping by the global norm (max_grad_norm 0 = off), AdamW at learning rate opt.lr.
StepResult train_step(ParamStore& params, model::LlamaCompute& model, const std::vector<data::BatchBuffers>& micro,
                      const ops::AdamWConfig& opt, int64_t step, double max_grad_norm);

}  // namespace shardlm::train
