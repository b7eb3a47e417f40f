// The single-process training loop: data, accumulation, schedule, clipping, evaluation,
// progress and metrics, and the trained model saved as a Hugging Face directory.
// The data side (load_run_data, the sampler integration) is owned by the data pipeline.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
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
  std::vector<double> losses;              // training loss of every step, in order
  int64_t gpu_peak_reserved_bytes = 0;     // device: cuda: the caching allocator's peak reservation
};

// Trains on the ranks of `world` (sharded as cfg.sharding says); rank 0 prints, writes metrics and
// saves. The one-argument form runs in this process alone.
TrainResult run_training(const TrainConfig& cfg, comm::Communicator& world);
TrainResult run_training(const TrainConfig& cfg);

// The training and evaluation data of a run, as `data:` describes it (docs/data.md).
struct RunData {
  std::unique_ptr<data::Dataset> train, eval;
  const data::AdditionTask* task = nullptr;  // the eval set when it is the built-in task
  std::string type;                          // resolved: text, tokens, alpaca, chat, builtin:addition
  int64_t seq_len = 0;                       // row length
  bool packing = false;
  std::vector<std::string> report;           // what loading found, one line each, for the log
};
// Loads (tokenizes, renders, splits) the data of a run. Errors name the file and line at fault.
// Token files (pre-tokenized data) are checked against model_vocab_size, the model's vocab_size:
// the ids index its embedding, whatever tokenizer the directory has (none: the byte-level
// fallback, whose 259 ids say nothing about the data). run_training refuses a tokenizer with
// more ids than the model before it calls this.
RunData load_run_data(const TrainConfig& cfg, const data::Tokenizer& tok, int64_t model_vocab_size);
// Loss sums over the non-ignored targets of up to max_batches global batches of `eval`, rows formed
// in the dataset's order (packed or padded as in training). Rank r of W evaluates rows
// [g B W + r B, + B) of each global batch g, so the ranks together cover what one process with
// batch B W would; the caller sums over ranks.
ops::CrossEntropyResult eval_loss_sums(const std::function<ops::CrossEntropyResult(const model::Batch&)>& forward,
                                       const data::Dataset& eval, bool packing, int64_t B, int64_t T,
                                       int64_t max_batches, int32_t pad, int rank, int world_size);

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
