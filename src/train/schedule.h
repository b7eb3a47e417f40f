// Learning-rate schedules: Hugging Face's get_*_schedule_with_warmup, and the shapes DeepSpeed's
// WarmupLR / WarmupDecayLR / WarmupCosineLR define (log warmup, a warmup that starts above 0,
// WarmupCosineLR's own step count), so that a DeepSpeed config runs the schedule it names.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/enum_names.h"

namespace shardlm::train {

struct LrSchedule {
  // deepspeed_cosine: DeepSpeed's WarmupCosineLR after warmup. It counts the first step after
  // warmup as already one step into the decay, and does not hold the floor past total_steps
  // (the cosine rises again there, as DeepSpeed's does).
  enum class Kind { Constant, Linear, Cosine, DeepSpeedCosine } kind = Kind::Cosine;
  // linear: s / warmup_steps; log (DeepSpeed's default): ln(s + 1) / ln(warmup_steps).
  enum class Warmup { Linear, Log } warmup = Warmup::Linear;
  double lr = 3e-4;               // peak learning rate
  int64_t warmup_steps = 0;       // the ramp's length
  double warmup_min_ratio = 0.0;  // the ramp starts at this fraction of lr
  int64_t total_steps = 1;        // decay reaches its end here
  double min_lr_ratio = 0.0;      // the floor, as a fraction of lr (cosine and linear)

  // Learning rate for optimizer step `step` (1-based: the first update uses step 1).
  double at(int64_t step) const;
  // The schedule as a checkpoint's run description records it ("lr_scheduler": kind, warmup_steps,
  // warmup_type, warmup_min_ratio, total_steps, min_lr_ratio; the peak rate is the optimizer's lr).
  // Nothing reads it back: the schedule is a function of the step, and a resumed run follows its
  // own config's schedule from the checkpoint's step (a longer max_steps stretches the decay).
  nlohmann::json state() const;
};

LrSchedule::Kind parse_schedule_kind(const std::string& name);  // constant | linear | cosine | deepspeed_cosine

}  // namespace shardlm::train

namespace shardlm {
template <>
struct EnumNames<train::LrSchedule::Warmup> {
  static constexpr std::pair<train::LrSchedule::Warmup, const char*> values[] = {
      {train::LrSchedule::Warmup::Linear, "linear"}, {train::LrSchedule::Warmup::Log, "log"}};
};
}  // namespace shardlm
