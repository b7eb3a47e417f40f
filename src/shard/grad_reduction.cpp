#include "shard/grad_reduction.h"

#include "core/device.h"
#include "ops/ops.h"

namespace shardlm::shard {

GradReduction::GradReduction(const ReduceContext& c, const Tensor& full, FlatBuffer handed_over, int64_t shard_numel)
    : grad_(std::move(handed_over)) {
  const bool low = c.wire != DType::F32;
  if (low) {
    wire_ = c.make(BufferRole::Staging, c.wire, full.numel(), false);
    ops::cast(wire_.view(), full);
  }
  const Tensor send = low ? wire_.view() : full;
  if (c.all_reduce) {
    request_ = c.shard->all_reduce_async(send, comm::ReduceOp::Sum);
    return;
  }
  reduced_ = c.make(BufferRole::Staging, DType::F32, shard_numel, false);
  if (low) wire_part_ = c.make(BufferRole::Staging, c.wire, shard_numel, false);
  request_ = c.shard->reduce_scatter_async(low ? wire_part_.view() : reduced_.view(), send, comm::ReduceOp::Sum);
}

bool GradReduction::advance(const ReduceContext& c) {
  if (request_) {
    request_->wait();
    request_.reset();
  }
  if (c.all_reduce || !c.replicate || across_replicas_) return true;
  // Across replicas in the reduce dtype, as the shard group reduced (its part of the wire buffer).
  across_replicas_ = true;
  request_ = c.replicate->all_reduce_async(wire_part_.live() ? wire_part_.view() : reduced_.view(), comm::ReduceOp::Sum);
  return false;
}

void GradReduction::finish(const ReduceContext& c, const Tensor& full, const Tensor& grad_shard) {
  while (!advance(c)) {
  }
  if (c.all_reduce) {
    if (wire_.live()) ops::cast(full, wire_.view());
  } else {
    if (wire_part_.live()) ops::cast(reduced_.view(), wire_part_.view());
    if (grad_shard.device != reduced_.view().device) {
      // Offload: the reduced part comes down into the reused pinned staging buffer and is added
      // to the host shard, where the optimizer step reads it.
      const Tensor host = c.host_staging.slice(0, reduced_.view().numel());
      device::copy(host, reduced_.view());
      ops::add_inplace(grad_shard, host);
    } else {
      ops::add_inplace(grad_shard, reduced_.view());
    }
  }
  wire_part_.reset();
  wire_.reset();
  reduced_.reset();
  grad_.reset();
}

}  // namespace shardlm::shard
