// Resuming a run: the checkpoint to continue from, and what a checkpoint records beside the
// weights so that a run continues where it stopped (checkpoint metadata's "training" and "run"
// objects; the checkpoint layer stores them verbatim). Their keys are those of every checkpoint
// written so far, so older checkpoints load. Owner: the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "data/sampler.h"
#include "model/config.h"
#include "shard/sharding.h"
#include "train/train_config.h"

namespace shardlm::train {

// The checkpoint's "training" object: {"step", "sampler": {"epoch", "step"}, "rows_per_step",
// "seed", "lr"}. Reading takes counters only as non-negative JSON integers (a float is refused,
// never cast) and throws an Error naming the malformed key.
struct TrainingState {
  int64_t step = 0;            // the last step trained
  data::SamplerState sampler;  // the data the next step reads (the step's StepBatch::next)
  int64_t rows_per_step = 0;   // the global batch the sampler's steps count
  uint64_t seed = 0;           // the run's seed: the data order depends on it
  double lr = 0;               // the learning rate of `step` (for people; a resumed run follows its config)
};
void to_json(nlohmann::json& j, const TrainingState& s);
void from_json(const nlohmann::json& j, TrainingState& s);

// The checkpoint to resume from (resume_from: a directory, or auto: the latest complete one under
// the checkpoint root), opened and checked against this run's model, or null to start from the
// model. Notes for the log (skipped incomplete checkpoints, "nothing to resume") go to `notes`.
std::unique_ptr<ckpt::CheckpointReader> open_resume_checkpoint(const TrainConfig& c, const ModelConfig& mcfg,
                                                               std::vector<std::string>& notes);

// Reads the checkpoint's training state, checks it against this run (the seed), puts the sampler
// where the checkpointed run would have read next (data::DistributedSampler::load_state) and
// returns the checkpoint's step.
int64_t load_training_state(const ckpt::CheckpointReader& r, const TrainConfig& c, data::DistributedSampler& sampler);

// What a checkpoint records about the run that wrote it ("run": for people and for checks on resume).
nlohmann::json run_description(const TrainConfig& c, const shard::ShardingConfig& sharding, int world_size,
                               const shard::Mesh& mesh);

}  // namespace shardlm::train
