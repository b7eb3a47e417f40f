// `shardlm merge --verify`: a merged model checked against the computation it replaces. The base
// with the adapter unmerged (LoRA's path x A^T B^T scaled beside each frozen weight, as training
// computes it: model::decoder_block_forward with the adapters bound) and the merged directory (plain
// weights) each compute the logits of every position of a few prompts, in f32; the largest
// difference says whether the merge is the model the adapter was trained as. docs/lora.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/peft_adapter.h"

namespace shardlm::infer {

struct MergeCheckOptions {
  std::string base, adapter, merged;  // directories
  MergeInto merge_into = MergeInto::AsStored;  // which base the reference computes from (as merge takes it)
  std::vector<std::vector<int32_t>> prompts;   // token ids, each non-empty and within the model's positions
};

struct MergeCheck {
  int64_t prompts = 0, positions = 0;
  double max_abs_diff = 0;   // the largest |merged - unmerged| over every logit
  double max_abs_logit = 0;  // the largest |unmerged logit|
  int64_t at_prompt = 0, at_position = 0, at_token = 0;  // where max_abs_diff is (0-based)
  DType merged_dtype = DType::F32;  // how the merged directory stores its weights
  std::string reference;            // what the unmerged computation used as the base, in words
  double relative() const { return max_abs_logit > 0 ? max_abs_diff / max_abs_logit : max_abs_diff; }
};

// The default tolerance of relative() for a merged model stored in `dtype`: what rounding the merged
// weights to it may cost, with margin (f32: 1e-4, f16: 4e-3, bf16: 3e-2).
double default_merge_tolerance(DType dtype);

// Both computations, one model in memory at a time (the base in f32, then the merged model in f32).
// Errors name the directory at fault (a merged model of another shape, a missing tensor, ...).
MergeCheck check_merge(const MergeCheckOptions& opt);

}  // namespace shardlm::infer
