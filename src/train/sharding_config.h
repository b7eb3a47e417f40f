// Reading the sharding section of a training configuration.
//
// shardlm's own keys use FSDP's vocabulary:
//   sharding_strategy: FULL_SHARD        # NO_SHARD | ZERO1 | SHARD_GRAD_OP | FULL_SHARD | HYBRID_SHARD | _HYBRID_SHARD_ZERO2 | auto
//   auto_wrap_policy: TRANSFORMER_BASED_WRAP   # | SIZE_BASED_WRAP | NO_WRAP
//   min_num_params: 100000000            # SIZE_BASED_WRAP
//   forward_prefetch: false
//   backward_prefetch: BACKWARD_PRE      # | BACKWARD_POST | NO_PREFETCH
//   shard_group_size: 0                  # hybrid: ranks per shard group (0 = ranks per node)
//   no_sync: false                       # defer gradient reduction to the last micro-batch
//   mixed_precision: {param_dtype: bf16, reduce_dtype: f32}
//   offload_params: false                # device: cuda only: optimizer state in pinned host memory
// An accelerate config's fsdp_config block is accepted as written (fsdp_sharding_strategy,
// fsdp_auto_wrap_policy, fsdp_backward_prefetch, fsdp_forward_prefetch, fsdp_min_num_params, ...),
// as is its top-level mixed_precision: bf16 | fp16 | no.
//
// The keys are a table of fields (config_fields.h), which the training config's table includes.
#pragma once

#include <vector>

#include "core/alloc.h"
#include "io/yaml_config.h"
#include "shard/sharding.h"
#include "train/config_fields.h"

namespace shardlm::train {

// Reads and validates the keys above (recording them as known to the tree). `device` is the
// training device (the `device` key): offload_params is refused unless it is CUDA.
shard::ShardingConfig read_sharding_config(ConfigTree& tree, Device device = Device::CPU);

// The sharding keys, in reading order (the top of a training config; accelerate's names are aliases).
const std::vector<ConfigField<shard::ShardingConfig>>& sharding_config_fields();
// The rules between sharding keys and the device, checked once all of them are read.
void check_sharding_config(const ConfigTree& tree, const shard::ShardingConfig& c, Device device);

}  // namespace shardlm::train
