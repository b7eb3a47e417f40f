// "It does not fit: try X." The levers users reach for when a run does not fit its memory, each
// estimated exactly: applied to the run one after another, the estimator (estimator.h) run again
// for each, until the peak per rank fits the budget. estimate-memory, validate and train all ask
// here and name the levers in their own terms (flags or config keys): this layer names none.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memory/estimator.h"

namespace shardlm::memory {

// In order of what each costs in speed, least first; each is tried only where the run does not
// use it already.
enum class Lever : uint8_t {
  StateBf16,                // AdamW's moments in bf16: a cast in the optimizer step
  State8bit,                // ... or in 8 bits (blockwise), where bf16 is not enough: a quantization per step
  ComputeBf16,              // parameters, activations and compute in bf16 (mixed precision): faster on GPUs
  FullShard,                // every unit sharded over all ranks: all-gathers over every link
  ActivationCheckpointing,  // every layer recomputed in its backward: about a third more compute
  OffloadActivations,       // GPU runs, with checkpointing: the layers' inputs to host and back, overlapped
  SmallerMicroBatch,        // fewer rows per micro-batch, more accumulation: the same global batch, smaller matmuls
  Offload,                  // GPU runs: master, gradient shard and moments in host memory, AdamW on the CPU
};

struct LeverStep {
  Lever lever;
  EstimateInput input;   // the run with this lever and every one before it
  int64_t device_bytes;  // its estimated peak per rank (device memory)
};

// The levers `in` does not use yet, applied cumulatively until the estimate fits `budget` (bytes
// per rank, > 0). Empty when `in` fits already; when every lever together still does not fit, the
// last step's device_bytes is above the budget. The moments go to bf16 where the sequence then
// fits, to 8 bits only where it does not (the two are one lever: a run has one state dtype).
// SmallerMicroBatch takes the largest divisor of the micro-batch that fits (or 1), multiplying the
// accumulation steps by the same factor. Offload and OffloadActivations are tried only where
// `offload_possible` (a GPU run: on a CPU rank host memory is the rank's own), the latter only with
// activation checkpointing on.
std::vector<LeverStep> levers_to_fit(const EstimateInput& in, int64_t budget, bool offload_possible);

// One line: "A → 61.2 GiB; + B → 44.0 GiB (fits)", or, when the last step still does not fit,
// "...; still above the budget". `name` spells a step's lever as the caller's user writes it.
std::string describe_levers(const std::vector<LeverStep>& steps, int64_t budget,
                            const std::function<std::string(const LeverStep&)>& name);

}  // namespace shardlm::memory
