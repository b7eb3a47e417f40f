#include "train/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace shardlm::train {

double LrSchedule::at(int64_t step) const {
  // Hugging Face evaluates its lambda at the number of completed steps (0 for the first update),
  // so the first update runs at lr * 0 / warmup when warming up. The same convention here keeps
  // schedules comparable step for step.
  const int64_t s = step - 1;
  if (s < warmup_steps) return lr * double(s) / double(std::max<int64_t>(1, warmup_steps));
  if (kind == Kind::Constant) return lr;
  const double progress = double(s - warmup_steps) / double(std::max<int64_t>(1, total_steps - warmup_steps));
  const double p = std::clamp(progress, 0.0, 1.0);
  const double shape = kind == Kind::Linear ? 1.0 - p : 0.5 * (1.0 + std::cos(M_PI * p));
  return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * shape);
}

LrSchedule::Kind parse_schedule_kind(const std::string& name) {
  if (name == "constant") return LrSchedule::Kind::Constant;
  if (name == "linear") return LrSchedule::Kind::Linear;
  if (name == "cosine") return LrSchedule::Kind::Cosine;
  throw Error(fmt::format("unknown schedule '{}' (expected constant, linear or cosine)", name));
}

}  // namespace shardlm::train
