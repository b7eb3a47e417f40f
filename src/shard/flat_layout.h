// Flat buffers: a unit's parameters laid out back to back in one buffer (DESIGN.md).
//
// Each named tensor is a view at an offset. The total is padded up to a multiple of `divisor`
// (the shard group size) so the buffer splits into equal shards; the padding is zero and is
// never part of any tensor.
#pragma once

#include <string>
#include <vector>

#include "model/llama.h"

namespace shardlm::shard {

struct FlatEntry {
  model::ParamInfo info;
  int64_t offset = 0;  // in elements, from the start of the unit's flat buffer
};

struct FlatLayout {
  std::string unit_name;
  std::vector<FlatEntry> entries;
  int64_t numel = 0;         // sum of the entries' sizes
  int64_t padded_numel = 0;  // numel rounded up to a multiple of the divisor
};

FlatLayout make_flat_layout(const model::UnitLayout& unit, int64_t divisor);

}  // namespace shardlm::shard
