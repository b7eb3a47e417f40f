// Evaluation during training, through the sharding engine: the held-out loss and, for a built-in
// task, the accuracy of greedy answers, decoded by infer::Generator over the engine (no rank ever
// holds more than one gathered unit beyond its shards). Owner: the trainer. Collective: every rank
// calls evaluate() at the same step.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/llama.h"
#include "shard/engine.h"
#include "train/run_setup.h"
#include "train/train_config.h"

namespace shardlm::train {

struct EvalResult {
  double loss = NAN;       // mean over the held-out targets of up to eval_batches global batches
  int64_t tokens = 0;      // targets in that mean, over every rank
  int64_t rows = 0;        // rows (of at most seq_len positions) they came from, over every rank
  double accuracy = -1;    // built-in tasks with accuracy_examples > 0; -1 otherwise
  int64_t correct = 0;     // answers that matched,
  int64_t problems = 0;    // of this many held-out problems
  // DPO: eval_rewards/..., eval_logps/... (train/preference.h), recorded beside eval_loss.
  std::vector<std::pair<std::string, double>> metrics;
};

// The mean loss over the first max_rows rows of the run's evaluation data (all of them when
// max_rows < 0), the same rows for any world size (each rank evaluates its slice of each global
// batch): the trainer's held-out loss and `shardlm eval` both. Collective.
EvalResult eval_loss(shard::ShardedModel& engine, model::LlamaCompute& m, const RunInputs& in, int64_t max_rows,
                     comm::Communicator& world);

// The held-out loss of up to eval_batches global batches, the same rows for any world size (each rank evaluates its slice of each global
// batch), and the task accuracy where the run has a task.
EvalResult evaluate(shard::ShardedModel& engine, model::LlamaCompute& m, const RunInputs& in, const TrainConfig& c,
                    comm::Communicator& world);

// Exact-match accuracy of greedy answers to the first n held-out problems (at most the task's),
// sequences of at most T positions decoded up to B rows per rank at a time. Every rank decodes
// every problem in lockstep with the others, each forward split over the ranks.
EvalResult task_accuracy(shard::ShardedModel& engine, model::LlamaCompute& m, const data::AdditionTask& task,
                         const data::Tokenizer& tok, int64_t n, int64_t B, int64_t T, comm::Communicator& world);

}  // namespace shardlm::train
