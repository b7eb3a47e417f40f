#include "shard/sharding.h"

#include "comm/hosts.h"
#include "comm/nccl_communicator.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/platform.h"

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

namespace {

// Each rank's place in a hybrid mesh: shard groups are `group` consecutive ranks in host order (the
// ranks of the first host, then the second's, ...), so that a shard group is a node, or a part of
// one, or whole nodes, wherever the launcher put the ranks (mpirun --map-by node puts ranks 0,2 on
// one node and 1,3 on the other). Replica groups take the same position in every shard group.
struct Placement {
  std::vector<int> shard_color, replicate_color;  // [world rank]
};

std::string describe_hosts(const comm::HostLayout& hl) {
  std::string out;
  for (int h = 0; h < int(hl.hosts.size()); ++h)
    out += fmt::format("{}{} {} rank{}", h ? ", " : "", hl.hosts[size_t(h)], hl.ranks_on(h), hl.ranks_on(h) == 1 ? "" : "s");
  return out;
}

Placement place_hybrid(const comm::HostLayout& hl, const ShardingConfig& cfg, int group) {
  const int world = int(hl.host_of.size()), nhosts = int(hl.hosts.size());
  // The default shard group is a node: it needs every node to have as many ranks (a smaller node
  // would make a smaller shard group, whose shards no replica group could match).
  bool equal = true;
  for (int h = 1; h < nhosts; ++h) equal = equal && hl.ranks_on(h) == hl.ranks_on(0);
  if (cfg.shard_group_size <= 0 && !equal)
    throw Error(fmt::format("{}: the shard group is a node, but the nodes have different numbers of ranks ({}); "
                            "start as many ranks on every node, or set shard_group_size to a size that divides "
                            "every node's count",
                            strategy_name(cfg.strategy), describe_hosts(hl)),
                {.key = "shard_group_size"});
  std::vector<int> order;  // world ranks in host order
  for (int h = 0; h < nhosts; ++h)
    for (int r = 0; r < world; ++r)
      if (hl.host_of[size_t(r)] == h) order.push_back(r);
  Placement p{std::vector<int>(size_t(world)), std::vector<int>(size_t(world))};
  for (int i = 0; i < world; ++i) {
    p.shard_color[size_t(order[size_t(i)])] = i / group;
    p.replicate_color[size_t(order[size_t(i)])] = i % group;
  }
  // Each shard group lies within one host or is made of whole hosts: never part of a host with
  // part of another, which would put the group's traffic on the slow link and split a node.
  for (int g = 0; g < world / group; ++g) {
    std::vector<int> touched;
    for (int i = g * group; i < (g + 1) * group; ++i)
      if (const int h = hl.host_of[size_t(order[size_t(i)])]; std::find(touched.begin(), touched.end(), h) == touched.end())
        touched.push_back(h);
    if (touched.size() == 1) continue;
    int whole = 0;
    for (int h : touched) whole += hl.ranks_on(h);
    if (whole != group)
      throw Error(fmt::format("{}: shard groups of {} ranks would split nodes ({}); choose a shard_group_size that "
                              "divides every node's rank count, or a multiple of it made of whole nodes",
                              strategy_name(cfg.strategy), group, describe_hosts(hl)),
                  {.key = "shard_group_size"});
  }
  return p;
}

std::string members(const std::vector<int>& color, int c, const comm::HostLayout& hl) {
  std::string out;
  for (int r = 0; r < int(color.size()); ++r)
    if (color[size_t(r)] == c) out += fmt::format("{}{}@{}", out.empty() ? "" : " ", r, hl.hosts[size_t(hl.host_of[size_t(r)])]);
  return out;
}

}  // namespace

Mesh make_mesh(comm::Communicator& world, const ShardingConfig& cfg, int ranks_per_node, Device device) {
  Mesh m;
  m.world_rank = world.rank();
  m.world_size = world.size();
  const int group = shard_group_size(cfg, world.size(), ranks_per_node);
  const int r = world.rank();
  int shard_color = 0, replicate_color = r;  // plain strategies: one shard group of all ranks
  comm::HostLayout hl;
  Placement p;
  if (cfg.hybrid()) {
    hl = comm::hosts(world);
    // Every rank has the same host layout (exchanged above), and so the same verdict on it.
    p = on_every_rank([&] { return place_hybrid(hl, cfg, group); });
    shard_color = p.shard_color[size_t(r)];
    replicate_color = p.replicate_color[size_t(r)];
  }
  m.shard = world.split(shard_color, r);
  m.replicate = world.split(replicate_color, r);
  if (device == Device::CUDA) {
    m.device_world = comm::make_nccl_communicator(world, comm::local_rank_from_environment());
    m.device_shard = m.device_world->split(shard_color, r);
    m.device_replicate = m.device_world->split(replicate_color, r);
  }
  // SHARDLM_PRINT_MESH=1: each rank prints its groups, their hosts and whether they use shared
  // memory or the ring (tests/scripts/multinode.sh checks that a hybrid shard group is a node, and
  // which groups take which path).
  // No collective here: the setting may reach some ranks only (plain mpirun without -x).
  if (const char* e = std::getenv("SHARDLM_PRINT_MESH"); e && std::string(e) == "1") {
    auto path = [](const comm::Communicator& c) {
      return comm::uses_shared_memory(c) ? " shared memory" : comm::uses_ring(c) ? " ring" : "";
    };
    std::fprintf(stderr, "mesh: rank %d on %s: shard group [%s]%s, replicate group [%s]%s\n", r, host_name().c_str(),
                 cfg.hybrid() ? members(p.shard_color, shard_color, hl).c_str() : "all", path(*m.shard),
                 cfg.hybrid() ? members(p.replicate_color, replicate_color, hl).c_str() : "self", path(*m.replicate));
    std::fflush(stderr);
  }
  return m;
}

Mesh make_shape_mesh(const ShardingConfig& cfg, int world_size, int ranks_per_node, bool ring_shard,
                     bool ring_replicate) {
  Mesh m;
  m.world_size = world_size;
  const int group = shard_group_size(cfg, world_size, ranks_per_node);
  m.shard = comm::make_shape_communicator(0, group, ring_shard);
  m.replicate = comm::make_shape_communicator(0, world_size / group, ring_replicate);
  return m;
}

}  // namespace shardlm::shard
