// The `dpo:` section of a training config (TRL's DPOConfig names; docs/preference.md). Its
// presence makes the run preference tuning (train/preference.h).
#pragma once

#include <string>
#include <utility>

#include "core/enum_names.h"

namespace shardlm::train {

enum class DpoLossType { Sigmoid, Ipo, Hinge };

struct DpoConfig {
  double beta = 0.1;
  DpoLossType loss_type = DpoLossType::Sigmoid;
  double label_smoothing = 0;   // sigmoid only: the probability that a pair's labels are flipped (cDPO)
  std::string reference_model;  // full fine-tunes: the reference's directory ("": the run's model)
};

}  // namespace shardlm::train

namespace shardlm {
template <>
struct EnumNames<train::DpoLossType> {
  static constexpr std::pair<train::DpoLossType, const char*> values[] = {
      {train::DpoLossType::Sigmoid, "sigmoid"}, {train::DpoLossType::Ipo, "ipo"}, {train::DpoLossType::Hinge, "hinge"}};
};
}  // namespace shardlm
