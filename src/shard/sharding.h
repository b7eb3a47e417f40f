// How a model is sharded: FSDP's strategies as three switches plus a mesh (DESIGN.md).
//
//   strategy            shard optimizer  shard gradients  reshard after forward
//   NO_SHARD (DDP)      no               no               no (parameters always full)
//   ZERO1               yes              no               no (all-gather after the step)
//   SHARD_GRAD_OP       yes              yes              no (gathered in forward, kept to backward end)
//   FULL_SHARD          yes              yes              yes (freed after forward, re-gathered)
//   HYBRID_SHARD        as FULL_SHARD inside a shard group, gradients all-reduced across replicas
//   _HYBRID_SHARD_ZERO2 as SHARD_GRAD_OP inside a shard group, likewise
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/dtype.h"

namespace shardlm::shard {

enum class Strategy { NoShard, Zero1, ShardGradOp, FullShard, HybridShard, HybridShardZero2 };
enum class WrapPolicy { TransformerBased, SizeBased, NoWrap };
enum class BackwardPrefetch { None, Pre, Post };

// FSDP's names ("FULL_SHARD"), accelerate's numbers ("1" = FULL_SHARD ... "5" = _HYBRID_SHARD_ZERO2)
// and "ZERO1". Unknown names throw an Error listing the accepted ones.
Strategy parse_strategy(const std::string& name);
const char* strategy_name(Strategy s);
WrapPolicy parse_wrap_policy(const std::string& name);  // TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP
BackwardPrefetch parse_backward_prefetch(const std::string& name);  // BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH

struct ShardingConfig {
  Strategy strategy = Strategy::FullShard;
  WrapPolicy wrap = WrapPolicy::TransformerBased;
  int64_t min_num_params = 100000000;  // SIZE_BASED_WRAP: decoder layers per unit until this many
  bool forward_prefetch = false;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::Pre;
  int shard_group_size = 0;           // hybrid: ranks per shard group; 0 = ranks per node
  DType param_dtype = DType::F32;     // gathered parameters and compute
  DType reduce_dtype = DType::F32;    // gradient communication
  // AdamW's moments at rest: f32, bf16 stored with stochastic rounding (optimizer_state_dtype:
  // bf16; ops::adamw_step), or U8: 8-bit blockwise as bitsandbytes' AdamW8bit keeps them (optim:
  // adamw_8bit; ops::quantize_blockwise8). The master weights stay f32 either way.
  DType state_dtype = DType::F32;
  bool reduce_every_microbatch = true;  // false: defer gradient reduction to the last micro-batch (no_sync)
  bool auto_strategy = false;  // sharding_strategy: auto: the trainer picks `strategy` by memory (docs/memory.md)
  // CPU offload (device: cuda only): the f32 master shard, the reduced gradient shard and AdamW's
  // moments live in pinned host memory and the step runs on the CPU (docs/sharding.md, "GPU runs").
  bool offload_params = false;

  bool shard_optimizer() const { return strategy != Strategy::NoShard; }
  bool shard_gradients() const;
  bool reshard_after_forward() const {
    return strategy == Strategy::FullShard || strategy == Strategy::HybridShard;
  }
  bool hybrid() const { return strategy == Strategy::HybridShard || strategy == Strategy::HybridShardZero2; }
};

// Ranks as replicate groups x shard groups. Plain strategies: one shard group of all ranks (for
// NO_SHARD the "shard group" is the data-parallel group over which gradients are all-reduced).
// One object holds the host process groups and, on GPU runs, the device groups over the same ranks.
struct Mesh {
  // Host process groups (local or MPI): scalar sums, barriers, and the tensors of CPU runs.
  std::unique_ptr<comm::Communicator> shard;      // parameters are split over these ranks
  std::unique_ptr<comm::Communicator> replicate;  // hybrid: gradients are all-reduced over these
  // GPU runs: the same groups over NCCL for device tensors (split from device_world, which this
  // mesh owns); null on CPU runs, where the host groups carry the tensors too.
  std::unique_ptr<comm::Communicator> device_world, device_shard, device_replicate;
  int world_rank = 0, world_size = 1;

  Device device() const { return device_shard ? device_shard->device() : shard->device(); }
  comm::Communicator& tensor_shard() const { return device_shard ? *device_shard : *shard; }
  comm::Communicator& tensor_replicate() const { return device_replicate ? *device_replicate : *replicate; }
};
// The shard group size of a strategy on this world (hybrid: shard_group_size, or the ranks of a
// node). Refuses impossible layouts, e.g. a shard group size that does not divide the world.
int shard_group_size(const ShardingConfig& cfg, int world_size, int ranks_per_node);
// device CUDA also builds the NCCL groups (bootstrapped over `world`; the NCCL world picks the
// GPU, so make the mesh before any CUDA allocation).
Mesh make_mesh(comm::Communicator& world, const ShardingConfig& cfg, int ranks_per_node, Device device = Device::CPU);
// Rank 0's view of a mesh with shape-only communicators (comm::make_shape_communicator) on the
// meta device: what a dry run of the engine (the memory estimator) needs. ring_shard,
// ring_replicate: the group's real counterpart takes the ring collectives and holds their scratch
// (CPU ranks over MPI, a group across nodes: memory::shard_group_place says which).
Mesh make_shape_mesh(const ShardingConfig& cfg, int world_size, int ranks_per_node, bool ring_shard = false,
                     bool ring_replicate = false);

}  // namespace shardlm::shard
