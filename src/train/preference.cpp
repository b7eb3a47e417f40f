#include "train/preference.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "data/packing.h"
#include "io/model_files.h"
#include "shard/load.h"

namespace shardlm::train {

namespace {

// log sigmoid(x) and sigmoid(x) without overflow for either sign.
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }

}  // namespace

PairLoss dpo_pair_loss(const DpoConfig& c, double pc, double pr, double rc, double rr) {
  const double z = (pc - pr) - (rc - rr), b = c.beta;
  PairLoss out;
  double dz = 0;  // dLoss/dz; z rises with the chosen side and falls with the rejected
  switch (c.loss_type) {
    case DpoLossType::Sigmoid: {
      const double ls = c.label_smoothing;
      out.loss = -(1 - ls) * log_sigmoid(b * z) - ls * log_sigmoid(-b * z);
      dz = -(1 - ls) * b * sigmoid(-b * z) + ls * b * sigmoid(b * z);
      break;
    }
    case DpoLossType::Ipo: {
      const double d = z - 1 / (2 * b);
      out.loss = d * d;
      dz = 2 * d;
      break;
    }
    case DpoLossType::Hinge:
      out.loss = std::max(0.0, 1 - b * z);
      dz = 1 - b * z > 0 ? -b : 0;
      break;
  }
  out.d_chosen = dz;
  out.d_rejected = -dz;
  return out;
}

void PreferenceSums::add(const DpoConfig& c, double pc, double pr, double rc, double rr) {
  const double reward_c = c.beta * (pc - rc), reward_r = c.beta * (pr - rr);
  pairs += 1;
  loss += dpo_pair_loss(c, pc, pr, rc, rr).loss;
  chosen_reward += reward_c;
  rejected_reward += reward_r;
  correct += reward_c > reward_r;
  chosen_logp += pc;
  rejected_logp += pr;
}

void PreferenceSums::all_reduce(comm::Communicator& world) {
  // Doubles, one by one (host scalars; a handful per step).
  for (double* x : {&pairs, &loss, &chosen_reward, &rejected_reward, &correct, &chosen_logp, &rejected_logp})
    *x = world.all_reduce_sum(*x);
}

double PreferenceSums::mean_loss() const { return pairs > 0 ? loss / pairs : NAN; }

Metrics PreferenceSums::means(const std::string& p) const {
  const double n = pairs > 0 ? pairs : NAN;  // no pairs: no figures (null in the records)
  return {{p + "rewards/chosen", chosen_reward / n},
          {p + "rewards/rejected", rejected_reward / n},
          {p + "rewards/margins", (chosen_reward - rejected_reward) / n},
          {p + "rewards/accuracies", correct / n},
          {p + "logps/chosen", chosen_logp / n},
          {p + "logps/rejected", rejected_logp / n}};
}

namespace {

// What a row's summed -log p is divided by for DPO's log-probability: 1, or for ipo its targets.
double row_divisor(const DpoConfig& c, const model::Batch& b, int64_t r) {
  if (c.loss_type != DpoLossType::Ipo) return 1;
  const auto n = std::count_if(b.targets + r * b.T, b.targets + (r + 1) * b.T,
                               [](int32_t t) { return t != ops::kIgnoreIndex; });
  return double(std::max<int64_t>(n, 1));
}

// Every row's divisor, once per micro-batch.
std::vector<double> row_divisors(const DpoConfig& c, const model::Batch& b) {
  std::vector<double> out(size_t(b.B));
  for (int64_t r = 0; r < b.B; ++r) out[size_t(r)] = row_divisor(c, b, r);
  return out;
}

// DPO's log-probability of each row: -row_loss / divisor.
std::vector<double> logps_of(std::span<const double> row_loss, const std::vector<double>& divisors) {
  std::vector<double> out(divisors.size());
  for (size_t r = 0; r < out.size(); ++r) out[r] = -row_loss[r] / divisors[r];
  return out;
}

}  // namespace

// ---- the reference model ------------------------------------------------------------------------

ReferenceModel::ReferenceModel(shard::ShardedModel& policy, model::LlamaCompute& m, bool lora, const std::string& dir,
                               uint64_t seed)
    : policy_(policy), m_(m), dir_(dir) {
  if (lora) return;
  frozen_ = std::make_unique<shard::ShardedModel>(policy.config(), model::FinetuneSpec{}, policy.sharding(),
                                                  policy.mesh(), shard::EngineUse::Evaluate);
  shard::load_weights(*frozen_, io::ModelWeights(dir), dir, seed);
}

ReferenceModel::~ReferenceModel() = default;

std::vector<double> ReferenceModel::row_losses(const model::Batch& b) {
  std::vector<double> out(size_t(b.B));
  if (frozen_) {
    frozen_->forward_rows(m_, b, out);
    return out;
  }
  // The adapters come back on however the forward ends.
  struct BaseOnly {
    model::LlamaCompute& m;
    explicit BaseOnly(model::LlamaCompute& c) : m(c) { m.set_adapters_enabled(false); }
    ~BaseOnly() { m.set_adapters_enabled(true); }
  } const base_only(m_);
  policy_.forward_rows(m_, b, out);
  return out;
}

std::string ReferenceModel::describe() const {
  return frozen_ ? fmt::format("a frozen copy of {} (sharded like the policy, held for evaluation only)", dir_)
                 : "the base model with the adapters turned off (no second copy)";
}

// ---- the objective ------------------------------------------------------------------------------

void DpoObjective::set_reference(std::vector<std::vector<double>> ref_row_losses) {
  ref_ = std::move(ref_row_losses);
  sums_ = {};
}

double DpoObjective::local_count(const std::vector<model::Batch>& micro) const {
  double pairs = 0;
  for (const model::Batch& b : micro) pairs += double(b.B / 2);
  return pairs;
}

double DpoObjective::head(model::StagedModel& m, const model::Batch& b, size_t i, float grad_scale) {
  SHARDLM_CHECK(i < ref_.size() && int64_t(ref_[i].size()) == b.B && b.B % 2 == 0,
                "DPO: micro-batch {} has {} rows and {} reference row losses (pairs: chosen, rejected)", i, b.B,
                i < ref_.size() ? ref_[i].size() : 0);
  const std::vector<double> div = row_divisors(c_, b), ref = logps_of(ref_[i], div);
  std::vector<double> row_loss(size_t(b.B));
  double loss = 0;
  m.head_rows(b, row_loss, [&](std::span<const double> losses, std::span<float> scale) {
    const std::vector<double> pi = logps_of(losses, div);
    for (int64_t k = 0; k < b.B / 2; ++k) {
      const size_t c = size_t(2 * k), r = c + 1;
      const PairLoss p = dpo_pair_loss(c_, pi[c], pi[r], ref[c], ref[r]);
      loss += p.loss;
      sums_.add(c_, pi[c], pi[r], ref[c], ref[r]);
      // dLoss/d row_loss = dLoss/d logp x d logp/d row_loss, the latter -1 / the row's divisor.
      scale[c] = float(-grad_scale * p.d_chosen / div[c]);
      scale[r] = float(-grad_scale * p.d_rejected / div[r]);
    }
  });
  return loss;
}

// ---- evaluation ---------------------------------------------------------------------------------

PreferenceSums evaluate_preference(shard::ShardedModel& engine, model::LlamaCompute& m, ReferenceModel& ref,
                            const DpoConfig& c, const data::Dataset& eval, int64_t B, int64_t T, int64_t max_pairs,
                            int32_t pad, comm::Communicator& world) {
  const int64_t n_pairs = max_pairs < 0 ? eval.size() / 2 : std::min(eval.size() / 2, max_pairs);
  const int64_t W = world.size(), G = B * W;
  PreferenceSums sums;
  // Global batch g holds pairs [g G, (g + 1) G); rank r takes its B of them. Every rank runs the same
  // forwards (they hold collectives): a rank whose share is empty runs one ignored pair.
  for (int64_t g = 0; g * G < n_pairs; ++g) {
    const int64_t begin = std::min(n_pairs, g * G + world.rank() * B), end = std::min(n_pairs, begin + B);
    std::vector<data::Example> rows;
    for (int64_t p = begin; p < end; ++p) {
      rows.push_back(eval.get(2 * p));
      rows.push_back(eval.get(2 * p + 1));
    }
    if (rows.empty()) rows.assign(2, data::Example{{pad}, {ops::kIgnoreIndex}});
    const data::BatchBuffers buf = data::make_padded_batch(rows, T, pad);
    const model::Batch b = buf.batch();
    std::vector<double> policy_loss(size_t(b.B));
    engine.forward_rows(m, b, policy_loss);
    const std::vector<double> ref_loss = ref.row_losses(b);
    if (begin == end) continue;
    const std::vector<double> div = row_divisors(c, b), pi = logps_of(policy_loss, div), rf = logps_of(ref_loss, div);
    for (int64_t k = 0; k < b.B / 2; ++k)
      sums.add(c, pi[size_t(2 * k)], pi[size_t(2 * k + 1)], rf[size_t(2 * k)], rf[size_t(2 * k + 1)]);
  }
  sums.all_reduce(world);
  return sums;
}

}  // namespace shardlm::train
