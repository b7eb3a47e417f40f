// Learning-rate schedules, as Hugging Face's get_*_schedule_with_warmup define them.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm::train {

struct LrSchedule {
  enum class Kind { Constant, Linear, Cosine } kind = Kind::Cosine;
  double lr = 3e-4;           // peak learning rate
  int64_t warmup_steps = 0;   // linear ramp from 0 over these steps
  int64_t total_steps = 1;    // decay reaches its end here
  double min_lr_ratio = 0.0;  // the floor, as a fraction of lr (cosine and linear)

  // Learning rate for optimizer step `step` (1-based: the first update uses step 1).
  double at(int64_t step) const;
};

LrSchedule::Kind parse_schedule_kind(const std::string& name);  // constant | linear | cosine

}  // namespace shardlm::train
