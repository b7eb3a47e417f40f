// Tensor parallelism for generation (`shardlm generate/serve --tensor-parallel N`): every rank
// holds a slice of every decoder block and all of them compute each step at once, as Megatron-LM
// splits a transformer:
//  - q/k/v projections by output rows along attention heads (rank r holds query heads
//    [r H/N, (r+1) H/N) and key-value heads [r Hkv/N, (r+1) Hkv/N): GQA's groups stay whole), and
//    o_proj by input columns (the same heads); gate/up by output rows, down_proj by input columns.
//    o_proj and down_proj then give partial sums, all-reduced over the ranks
//    (model::decoder_block_forward's PartialSums); each rank's KV cache holds only its heads.
//  - the embedding and lm_head by vocabulary rows (with tied embeddings one matrix does both): a
//    token's row lives on one rank, the others contribute zeros to an all-reduce; each rank computes
//    its logits' columns and an all-gather gives every rank all of them, bit for bit the same, so
//    every rank samples the same tokens.
//  - norms (and o_proj's bias, added on one rank) replicated.
// A rank's slices are a model of its own shape: sliced_config() divides the heads, the
// intermediate size and the vocabulary by N, and ParamStore (infer/param_store.h) lays out and
// loads exactly those slices from the files (slice_runs, below).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"

namespace shardlm::infer {

// Which slice a rank holds: `rank` of `ranks`. One rank (the default) holds whole tensors.
struct TensorSplit {
  int rank = 0, ranks = 1;
  bool active() const { return ranks > 1; }
};

// The config one rank's slices form: num_attention_heads, num_key_value_heads, intermediate_size and
// vocab_size divided by `ranks` (head_dim, hidden size and the rest unchanged). A dimension that does
// not divide is an error naming its config.json key and `flag` (what the caller calls N), in one line.
ModelConfig sliced_config(const ModelConfig& cfg, int ranks, const std::string& flag = "--tensor-parallel");

// `--tensor-parallel N` (flag) on `ranks` ranks, this one `rank`: N must be the number of ranks,
// and the model's dimensions must divide by it (sliced_config). Errors are one line naming the flag
// or the config key, the same on every rank.
TensorSplit tensor_parallel_split(const ModelConfig& cfg, int64_t n, int rank, int ranks,
                                  const std::string& flag = "--tensor-parallel");

// The slice `split` holds of a tensor whose whole shape is `whole` and whose slice has shape `part`
// (at most 2-D; the dimension where they differ is the split one, none: the whole tensor), as
// contiguous runs in row-major order: fn(begin in the whole tensor, count, begin in the slice), in
// elements. Rows split: one run; columns split: one run per row.
using SliceRun = std::function<void(int64_t whole_begin, int64_t count, int64_t part_begin)>;
void slice_runs(const std::vector<int64_t>& whole, const std::vector<int64_t>& part, const TensorSplit& split,
                const SliceRun& fn);

}  // namespace shardlm::infer
