#include "shard/sharding.h"

#include "comm/nccl_communicator.h"

#include <fmt/format.h>

#include "core/error.h"

namespace shardlm::shard {

Strategy parse_strategy(const std::string& n) {
  if (n == "NO_SHARD" || n == "3" || n == "DDP") return Strategy::NoShard;
  if (n == "ZERO1" || n == "ZERO_1") return Strategy::Zero1;
  if (n == "SHARD_GRAD_OP" || n == "2" || n == "ZERO2") return Strategy::ShardGradOp;
  if (n == "FULL_SHARD" || n == "1" || n == "ZERO3") return Strategy::FullShard;
  if (n == "HYBRID_SHARD" || n == "4") return Strategy::HybridShard;
  if (n == "_HYBRID_SHARD_ZERO2" || n == "HYBRID_SHARD_ZERO2" || n == "5") return Strategy::HybridShardZero2;
  throw Error(fmt::format("unknown sharding strategy '{}' (expected NO_SHARD, ZERO1, SHARD_GRAD_OP, FULL_SHARD, "
                          "HYBRID_SHARD or _HYBRID_SHARD_ZERO2, or accelerate's numbers 1-5)",
                          n));
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::NoShard: return "NO_SHARD";
    case Strategy::Zero1: return "ZERO1";
    case Strategy::ShardGradOp: return "SHARD_GRAD_OP";
    case Strategy::FullShard: return "FULL_SHARD";
    case Strategy::HybridShard: return "HYBRID_SHARD";
    case Strategy::HybridShardZero2: return "_HYBRID_SHARD_ZERO2";
  }
  return "?";
}

WrapPolicy parse_wrap_policy(const std::string& n) {
  if (n == "TRANSFORMER_BASED_WRAP") return WrapPolicy::TransformerBased;
  if (n == "SIZE_BASED_WRAP") return WrapPolicy::SizeBased;
  if (n == "NO_WRAP") return WrapPolicy::NoWrap;
  throw Error(fmt::format("unknown wrap policy '{}' (expected TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP)", n));
}

BackwardPrefetch parse_backward_prefetch(const std::string& n) {
  if (n == "BACKWARD_PRE") return BackwardPrefetch::Pre;
  if (n == "BACKWARD_POST") return BackwardPrefetch::Post;
  if (n == "NO_PREFETCH" || n == "NONE") return BackwardPrefetch::None;
  throw Error(fmt::format("unknown backward prefetch '{}' (expected BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH)", n));
}

bool ShardingConfig::shard_gradients() const {
  return strategy == Strategy::ShardGradOp || strategy == Strategy::FullShard || strategy == Strategy::HybridShard ||
         strategy == Strategy::HybridShardZero2;
}

int shard_group_size(const ShardingConfig& cfg, int world_size, int ranks_per_node) {
  if (!cfg.hybrid()) return world_size;
  const int group = cfg.shard_group_size > 0 ? cfg.shard_group_size : ranks_per_node;
  if (group < 1 || world_size % group != 0)
    throw Error(fmt::format("{}: a shard group of {} ranks does not divide the world of {} ranks",
                            strategy_name(cfg.strategy), group, world_size),
                {.key = "shard_group_size"});
  return group;
}

Mesh make_mesh(comm::Communicator& world, const ShardingConfig& cfg, int ranks_per_node, Device device) {
  Mesh m;
  m.world_rank = world.rank();
  m.world_size = world.size();
  const int group = shard_group_size(cfg, world.size(), ranks_per_node);
  // Shard groups are consecutive ranks (one node each under mpirun's default mapping); replica
  // groups take the same position in every shard group.
  m.shard = world.split(world.rank() / group, world.rank());
  m.replicate = world.split(world.rank() % group, world.rank());
  if (device == Device::CUDA) {
    m.device_world = comm::make_nccl_communicator(world, comm::local_rank_from_environment());
    m.device_shard = m.device_world->split(world.rank() / group, world.rank());
    m.device_replicate = m.device_world->split(world.rank() % group, world.rank());
  }
  return m;
}

Mesh make_shape_mesh(const ShardingConfig& cfg, int world_size, int ranks_per_node) {
  Mesh m;
  m.world_size = world_size;
  const int group = shard_group_size(cfg, world_size, ranks_per_node);
  m.shard = comm::make_shape_communicator(0, group);
  m.replicate = comm::make_shape_communicator(0, world_size / group);
  return m;
}

}  // namespace shardlm::shard
