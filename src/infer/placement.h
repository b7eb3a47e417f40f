// Placing a model's parts on ranks for generation (`shardlm generate --device-map`), as Hugging
// Face accelerate places modules on GPUs for `from_pretrained(device_map=...)`.
//
// The parts, in pipeline order: the embedding, decoder layers 0..L-1 (never split), the head
// (final norm + lm_head). Each rank gets a contiguous run of them. Sizes are the bytes a rank
// holds for them, in the dtype generation holds its weights in (`--dtype`: f32 or bf16). With tied embeddings the head's rank needs the
// embedding matrix too; when that is not the embedding's rank it loads its own copy, and the copy
// counts in its bytes.
//
// The choices (accelerate's names and rules; docs/generation.md has the details and an example):
//  - sequential: fill rank 0 up to its max memory, then rank 1, ...
//  - balanced: accelerate's get_balanced_memory: every rank but the last is capped at
//    total / ranks + a buffer (1.25 x the larger of one decoder layer and the mean leaf module),
//    then the ranks are filled in order.
//  - balanced_low_0: the same over ranks 1..N-1, and rank 0 capped at what the others cannot
//    take (often nothing): it is left for the sampling.
//  - auto: balanced (what accelerate's "auto" is with several devices).
// In each, rank 0 also keeps room for the largest part still to place, as accelerate's
// infer_auto_device_map keeps it on its first device.
// max memory per rank: --max-memory-per-rank, the same for every rank; 0 = unlimited. A part
// that fits no rank left is an error naming the caller's role for the limit (accelerate would offload it to
// the CPU or disk; there is nowhere else here). Ranks beyond the last part get nothing and only
// follow along (more ranks than layers is allowed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace shardlm::infer {

enum class DeviceMap { Auto, Balanced, BalancedLow0, Sequential };
// "auto", "balanced", "balanced_low_0", "sequential"; anything else throws (with no key: the
// caller names its option).
DeviceMap parse_device_map(const std::string& text);
const char* device_map_name(DeviceMap m);

// What the placement looks at: part sizes in bytes.
struct PartSizes {
  uint64_t embed = 0;
  std::vector<uint64_t> layers;  // one per decoder layer
  uint64_t head = 0;             // final norm + lm_head (untied), or the final norm alone (tied)
  bool tied = false;             // the head needs the embedding matrix as well (embed bytes)
  uint64_t mean_leaf = 0;        // mean size of the leaf modules (Linear, Embedding, RMSNorm): balanced's buffer
  uint64_t total() const;        // every parameter once (a tied matrix once), as accelerate counts the model
};
// The sizes of `cfg`'s parts with every parameter in `dtype`; with q8_0, those generation holds in
// Q8_0 blocks (model::held_in_q8_0) in their bytes, the others in `dtype`.
PartSizes part_sizes(const ModelConfig& cfg, DType dtype = DType::F32, bool q8_0 = false);

// One rank's share: decoder layers [layer_begin, layer_end), maybe the embedding and the head.
struct RankShare {
  int64_t layer_begin = 0, layer_end = 0;
  bool embed = false, head = false;
  uint64_t bytes = 0;  // what it holds (with tied embeddings, the head's copy of the matrix included)
  bool empty() const { return !embed && !head && layer_begin == layer_end; }
};

// The share of each of `ranks` ranks. max_memory: bytes per rank, 0 = unlimited; `role` is what
// the caller calls that limit (a flag), named when a part fits nowhere.
std::vector<RankShare> place_parts(const PartSizes& sizes, DeviceMap map, int ranks, uint64_t max_memory,
                                   const std::string& role = "max memory per rank");

// "rank 1: layers 4-7, head; 1.2 MB" for the placement log.
std::string describe_share(int rank, const RankShare& s);

}  // namespace shardlm::infer
