// One gradient reduction of a unit (FSDP2's post-backward reduce-scatter), the only way the
// engine hands gradients to their owners: the unit's full f32 gradient is cast to the reduce
// dtype and reduce-scattered over the shard group (all-reduced in place for NO_SHARD); once
// complete, hybrid strategies all-reduce the reduced part across replicas, still in the reduce
// dtype and without blocking (the second stage: HSDP's all-reduce, over the links between nodes,
// runs behind the next visit's compute too); the result is brought down to pinned host memory
// (offload) and added to this rank's gradient shard. Sums, not averages: every rank's gradients
// are already scaled by 1 / (global batch tokens).
//
// Ownership: a reduction owns its staging buffers and, for strategies that shard gradients, the
// full gradient buffer handed over to it; it frees them when finished. Gradients that stay with
// the unit (NO_SHARD, ZERO1) must stay alive until finish().
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "shard/sharded_buffer.h"

namespace shardlm::shard {

// What every reduction of an engine shares.
struct ReduceContext {
  comm::Communicator* shard = nullptr;      // the shard group's tensor communicator
  comm::Communicator* replicate = nullptr;  // across replicas (hybrid), else null
  DType wire = DType::F32;                  // the reduce dtype
  bool all_reduce = false;                  // NO_SHARD: every rank keeps the whole reduced gradient
  BufferMaker make;
  Tensor host_staging;  // offload: pinned f32 [largest shard], where reduced shards come down; else undefined
};

class GradReduction {
 public:
  // Starts reducing `full` (f32 [padded]). `handed_over` is the buffer behind `full` when the unit
  // gives it up (sharded gradients; a later visit takes a fresh one), else empty.
  GradReduction(const ReduceContext& c, const Tensor& full, FlatBuffer handed_over, int64_t shard_numel);
  // Waits for the collective in flight (the part that overlaps compute). After a hybrid
  // reduce-scatter it starts the all-reduce across replicas and returns false: call again (later,
  // to overlap it) until it returns true, then finish().
  bool advance(const ReduceContext& c);
  // Completes it (advancing it first if need be): the reduced gradient lands in `full` (all-reduce)
  // or is added to `grad_shard` (f32 [shard], host memory under offload). Frees the reduction's buffers.
  void finish(const ReduceContext& c, const Tensor& full, const Tensor& grad_shard);

 private:
  std::unique_ptr<comm::Request> request_;
  bool across_replicas_ = false;  // the all-reduce across replicas has been started
  FlatBuffer grad_;       // f32 [padded]: the handed-over full gradient
  FlatBuffer wire_;       // reduce dtype [padded]: the cast full gradient (reduce dtype not f32)
  FlatBuffer wire_part_;  // reduce dtype [shard]: its reduced part
  FlatBuffer reduced_;    // f32 [shard]: the reduced part
};

}  // namespace shardlm::shard
