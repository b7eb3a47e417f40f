#include "memory/levers.h"

#include <fmt/format.h>

#include "core/alloc.h"
#include "core/error.h"

namespace shardlm::memory {

namespace {

// `in` with lever applied, or false when the run uses it already (or it cannot apply).
bool apply(Lever lever, EstimateInput& in, bool offload_possible) {
  shard::ShardingConfig& sc = in.sharding;
  switch (lever) {
    case Lever::StateBf16:
      if (sc.state_dtype != DType::F32) return false;
      sc.state_dtype = DType::BF16;
      return true;
    case Lever::State8bit:
      if (sc.state_dtype == DType::U8) return false;
      sc.state_dtype = DType::U8;
      return true;
    case Lever::ComputeBf16:
      if (sc.param_dtype != DType::F32) return false;
      sc.param_dtype = DType::BF16;
      return true;
    case Lever::FullShard:
      if (in.world_size < 2 || sc.strategy == shard::Strategy::FullShard) return false;
      sc.strategy = shard::Strategy::FullShard;
      return true;
    case Lever::ActivationCheckpointing:
      if (in.checkpoint_every == 1) return false;
      in.checkpoint_every = 1;
      return true;
    case Lever::OffloadActivations:
      if (!offload_possible || in.offload_activations || in.checkpoint_every == 0) return false;
      in.offload_activations = true;
      return true;
    case Lever::SmallerMicroBatch:
      return in.micro_batch_size > 1;  // levers_to_fit picks the size
    case Lever::Offload:
      if (!offload_possible || in.offload || !sc.shard_gradients()) return false;
      in.offload = sc.offload_params = true;
      return true;
  }
  return false;
}

// The largest proper divisor of the micro-batch whose estimate fits, or 1: the global batch stays
// the same (accumulation grows by the same factor).
LeverStep smaller_micro_batch(const EstimateInput& in, int64_t budget) {
  LeverStep last{Lever::SmallerMicroBatch, in, 0};
  for (int64_t b = in.micro_batch_size - 1; b >= 1; --b) {
    if (in.micro_batch_size % b != 0) continue;
    EstimateInput x = in;
    x.micro_batch_size = b;
    x.grad_accum = in.grad_accum * (in.micro_batch_size / b);
    last = {Lever::SmallerMicroBatch, x, estimate(x).device_bytes};
    if (last.device_bytes <= budget) break;
  }
  return last;
}

}  // namespace

namespace {
// The levers in order, the moments' one being `state` (StateBf16 or State8bit); `bytes`: in's peak.
std::vector<LeverStep> apply_in_order(const EstimateInput& in, int64_t bytes, int64_t budget, bool offload_possible,
                                      Lever state) {
  std::vector<LeverStep> steps;
  EstimateInput now = in;
  for (Lever lever : {state, Lever::ComputeBf16, Lever::FullShard, Lever::ActivationCheckpointing,
                      Lever::OffloadActivations, Lever::SmallerMicroBatch, Lever::Offload}) {
    if (bytes <= budget) break;
    EstimateInput next = now;
    if (!apply(lever, next, offload_possible)) continue;
    const LeverStep step = lever == Lever::SmallerMicroBatch ? smaller_micro_batch(next, budget)
                                                             : LeverStep{lever, next, estimate(next).device_bytes};
    if (step.device_bytes >= bytes) continue;  // no help here: not worth its cost
    steps.push_back(step);
    now = step.input;
    bytes = step.device_bytes;
  }
  return steps;
}
bool fits(const std::vector<LeverStep>& steps, int64_t budget) {
  return !steps.empty() && steps.back().device_bytes <= budget;
}
}  // namespace

std::vector<LeverStep> levers_to_fit(const EstimateInput& in, int64_t budget, bool offload_possible) {
  SHARDLM_CHECK(budget > 0, "a memory budget must be > 0, got {}", budget);
  const int64_t bytes = estimate(in).device_bytes;  // once: both sequences start from it
  if (bytes <= budget) return {};
  // bf16 moments where the whole sequence then fits; 8-bit ones only where it does not.
  std::vector<LeverStep> bf16 = apply_in_order(in, bytes, budget, offload_possible, Lever::StateBf16);
  if (fits(bf16, budget)) return bf16;
  std::vector<LeverStep> q8 = apply_in_order(in, bytes, budget, offload_possible, Lever::State8bit);
  if (fits(q8, budget) || bf16.empty()) return q8;
  return q8.empty() || q8.back().device_bytes >= bf16.back().device_bytes ? bf16 : q8;
}

std::string describe_levers(const std::vector<LeverStep>& steps, int64_t budget,
                            const std::function<std::string(const LeverStep&)>& name) {
  std::string out;
  for (size_t i = 0; i < steps.size(); ++i)
    out += fmt::format("{}{} → {}", i == 0 ? "" : "; + ", name(steps[i]), format_bytes(steps[i].device_bytes));
  if (steps.empty()) return "no lever shrinks it";
  out += steps.back().device_bytes <= budget ? " (fits)" : "; still above the budget";
  return out;
}

}  // namespace shardlm::memory
