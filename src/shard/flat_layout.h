// Flat buffers: a unit's parameters laid out back to back in one buffer (DESIGN.md).
//
// Each named tensor is a view at an offset. The total is padded up to a multiple of `divisor`
// (the shard group size) so the buffer splits into equal shards; the padding is zero and is
// never part of any tensor. With `align` > 1 every tensor starts at a multiple of it, the gaps
// zero padding too (8-bit optimizer state: no quantization block spans two tensors).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "model/llama.h"

namespace shardlm::io {
class ModelWeights;
}

namespace shardlm::shard {

struct FlatEntry {
  model::ParamInfo info;
  int64_t offset = 0;  // in elements, from the start of the unit's flat buffer
};

struct FlatLayout {
  std::string unit_name;
  std::vector<FlatEntry> entries;
  int64_t numel = 0;         // sum of the entries' sizes (gaps between aligned entries not counted)
  int64_t padded_numel = 0;  // the end of the last entry rounded up to a multiple of the divisor
};

FlatLayout make_flat_layout(const std::string& name, const std::vector<model::ParamInfo>& params, int64_t divisor,
                            int64_t align = 1);

// Calls fn(entry, lo, hi) for each tensor with elements in [begin, end) of the flat buffer; [lo, hi)
// is that part, in flat offsets.
template <class Fn>
void for_each_overlap(const FlatLayout& layout, int64_t begin, int64_t end, Fn fn) {
  for (const FlatEntry& e : layout.entries) {
    const int64_t lo = std::max(begin, e.offset), hi = std::min(end, e.offset + e.info.numel());
    if (lo < hi) fn(e, lo, hi);
  }
}

// Elements [begin, end) of a unit's flat buffer, written to out[0 .. end - begin). Padding is
// left untouched. These serve a whole model in one process (begin 0, end padded_numel) and a
// rank's shard alike, which is what keeps every world size starting from the same weights.

// Random initialization as transformers does it: normal(0, std) for linear and embedding weights,
// drawn from the counter-based RNG at (seed, tensor name, element index); ones for norms; zeros
// for biases.
void init_flat_range(const FlatLayout& layout, int64_t begin, int64_t end, uint64_t seed, float std, float* out);
// Reads those elements from Hugging Face weights (only their byte ranges) and widens them to f32.
// Every tensor of the layout, in the range or not, must be in the file with the layout's shape and
// a float dtype; errors name the source and the tensor.
void load_flat_range(const FlatLayout& layout, int64_t begin, int64_t end, const io::ModelWeights& weights,
                     const std::string& source, float* out);
// A file tensor that no layout has means config.json and the weights disagree (e.g. an lm_head in
// the file of a tied model). Rotary caches some exporters write are allowed.
void check_no_extra_tensors(const std::vector<const FlatLayout*>& layouts, const io::ModelWeights& weights,
                            const std::string& source);

}  // namespace shardlm::shard
