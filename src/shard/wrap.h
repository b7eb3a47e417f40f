// Which model units (root, decoder layers) form each engine unit, by the wrap policy.
//
// Shared by the engine (which allocates one flat buffer per group) and the memory estimator
// (which must size exactly those buffers), so the two cannot drift apart.
#pragma once

#include <vector>

#include "model/llama.h"
#include "shard/sharding.h"

namespace shardlm::shard {

// Groups of indices into `parts` (llama_units order: 0 = root, 1 + l = layer l). The root stays a
// group of its own unless nothing is wrapped (then everything is one group, as FSDP's NO_WRAP);
// SIZE_BASED_WRAP adds decoder layers to a group until it holds min_num_params.
std::vector<std::vector<int>> wrap_units(const std::vector<model::UnitLayout>& parts, const ShardingConfig& cfg);

}  // namespace shardlm::shard
