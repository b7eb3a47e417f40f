// Preference tuning: DPO (Rafailov et al., 2023) with the losses and logs of TRL's DPOTrainer
// (docs/preference.md). Owner: the trainer.
//
// A pair is two rows of a micro-batch, chosen then rejected (data/sampler.h's pairs mode). Each
// row's log-probability is the sum of log p(target) over its completion tokens (ipo: their mean),
// computed by the policy (the model being trained) and by the reference model: under LoRA/QLoRA
// the same engine with the adapters turned off, else a frozen copy of the starting weights on an
// engine of its own. With z = (pi_c - pi_r) - (ref_c - ref_r):
//   sigmoid  -(1 - ls) log sigmoid(beta z) - ls log sigmoid(-beta z)   (ls = label_smoothing)
//   ipo      (z - 1 / (2 beta))^2
//   hinge    max(0, 1 - beta z)
// The step's loss is the mean over the global batch's pairs; its gradient reaches the model
// through each row's scale (model::StagedModel::head_rows): the engine runs the head stage
// through DpoObjective (shard::RowObjective), one training step for every objective.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "data/dataset.h"
#include "model/llama.h"
#include "shard/engine.h"
#include "train/dpo_config.h"

namespace shardlm::train {

// Named scalars for the step and eval records, in order.
using Metrics = std::vector<std::pair<std::string, double>>;

// One pair's loss and its derivatives by the policy's chosen and rejected log-probabilities.
struct PairLoss {
  double loss = 0, d_chosen = 0, d_rejected = 0;
};
PairLoss dpo_pair_loss(const DpoConfig& c, double policy_chosen, double policy_rejected, double ref_chosen,
                       double ref_rejected);

// Sums over pairs of what TRL logs; means() after summing over the ranks (all_reduce).
struct PreferenceSums {
  double pairs = 0, loss = 0, chosen_reward = 0, rejected_reward = 0, correct = 0, chosen_logp = 0, rejected_logp = 0;
  void add(const DpoConfig& c, double policy_chosen, double policy_rejected, double ref_chosen, double ref_rejected);
  void all_reduce(comm::Communicator& world);
  double mean_loss() const;  // NaN without pairs
  // rewards/chosen, rewards/rejected, rewards/margins, rewards/accuracies, logps/chosen,
  // logps/rejected (prefix "" or "eval_").
  Metrics means(const std::string& prefix) const;
};

// The reference model's per-row losses: the policy's own engine with the adapters off (LoRA), or a
// frozen copy of the reference weights on an engine of its own built for evaluation (its f32
// master shard and the units it gathers: docs/preference.md). Collective, as the engine's forwards
// are.
class ReferenceModel {
 public:
  // lora: the policy is adapters on a frozen base, which is the reference. Else the reference is
  // loaded from `dir` into a second engine over the policy's mesh and sharding.
  ReferenceModel(shard::ShardedModel& policy, model::LlamaCompute& m, bool lora, const std::string& dir, uint64_t seed);
  ~ReferenceModel();
  std::vector<double> row_losses(const model::Batch& b);
  std::string describe() const;

 private:
  shard::ShardedModel& policy_;
  model::LlamaCompute& m_;
  std::unique_ptr<shard::ShardedModel> frozen_;
  std::string dir_;
};

// DPO's loss at the engine's head stage, for one step: the reference's row losses of each
// micro-batch are given first (set_reference), the step's sums are read after it.
class DpoObjective final : public shard::RowObjective {
 public:
  explicit DpoObjective(const DpoConfig& c) : c_(c) {}
  void set_reference(std::vector<std::vector<double>> ref_row_losses);
  double local_count(const std::vector<model::Batch>& micro) const override;
  double head(model::StagedModel& m, const model::Batch& b, size_t i, float grad_scale) override;
  // This rank's sums since set_reference.
  const PreferenceSums& sums() const { return sums_; }

 private:
  DpoConfig c_;
  std::vector<std::vector<double>> ref_;
  PreferenceSums sums_;
};

// DPO over held-out pairs (up to max_pairs; all when < 0), B pairs per rank per forward, the same
// pairs for any world size: the sums over every rank's pairs. Collective.
PreferenceSums evaluate_preference(shard::ShardedModel& engine, model::LlamaCompute& m, ReferenceModel& ref,
                            const DpoConfig& c, const data::Dataset& eval, int64_t B, int64_t T, int64_t max_pairs,
                            int32_t pad, comm::Communicator& world);

}  // namespace shardlm::train

