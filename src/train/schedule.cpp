#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace shardlm::train {

nlohmann::json LrSchedule::state() const {
  return {{"kind", int(kind)},
          {"warmup_steps", warmup_steps},
          {"warmup_type", enum_name(warmup)},
          {"warmup_min_ratio", warmup_min_ratio},
          {"total_steps", total_steps},
          {"min_lr_ratio", min_lr_ratio}};
}

double LrSchedule::at(int64_t step) const {
  // Hugging Face evaluates its lambda at the number of completed steps (0 for the first update),
  // so the first update runs at lr * 0 / warmup when warming up; DeepSpeed's schedulers count
  // their iterations the same way (the first update uses iteration 0). The same convention here
  // keeps schedules comparable step for step.
  const int64_t s = step - 1;
  if (s < warmup_steps) {
    // DeepSpeed's log ramp: ln(s + 1) / ln(W), 0 at the first step and 1 at step W.
    const double w = warmup == Warmup::Log ? std::log(double(s + 1)) / std::log(double(std::max<int64_t>(2, warmup_steps)))
                                           : double(s) / double(std::max<int64_t>(1, warmup_steps));
    return lr * (warmup_min_ratio + (1.0 - warmup_min_ratio) * w);
  }
  if (kind == Kind::Constant) return lr;
  if (kind == Kind::DeepSpeedCosine) {
    // WarmupCosineLR: the decay's step count starts at 1 at the first step after warmup, and
    // nothing clamps it at total_steps (past it the cosine rises again, as DeepSpeed's does).
    const double p = double(s - warmup_steps + 1) / double(std::max<int64_t>(1, total_steps - warmup_steps));
    return lr * std::max(0.0, min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * p)));
  }
  const double progress = double(s - warmup_steps) / double(std::max<int64_t>(1, total_steps - warmup_steps));
  const double p = std::clamp(progress, 0.0, 1.0);
  const double shape = kind == Kind::Linear ? 1.0 - p : 0.5 * (1.0 + std::cos(M_PI * p));
  return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * shape);
}

LrSchedule::Kind parse_schedule_kind(const std::string& name) {
  if (name == "constant") return LrSchedule::Kind::Constant;
  if (name == "linear") return LrSchedule::Kind::Linear;
  if (name == "cosine") return LrSchedule::Kind::Cosine;
  if (name == "deepspeed_cosine") return LrSchedule::Kind::DeepSpeedCosine;
  throw Error(fmt::format("unknown schedule '{}' (expected constant, linear, cosine or deepspeed_cosine)", name));
}

}  // namespace shardlm::train
