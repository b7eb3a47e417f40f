// The engine's buffers: FlatBuffer (one owned, accounted flat buffer) and ShardedBuffer (what one
// unit gathers for its visits, communicated by one all-gather).
//
// Ownership: a FlatBuffer owns its memory; a ShardedBuffer owns its at-rest part, its gathered
// buffer and the request in flight, and hands out views of them that are valid until release()
// (gathered data) or its destruction (at-rest data). Neither owns the master weights: the engine
// passes them in where a gather casts from them.
//
// Dry runs (the memory estimator) make the same buffers on the meta device (core/alloc.h): sizes
// without memory, on which ops and copies do nothing, so the same calls in the same order
// allocate and release what a real run would. Each buffer is tagged with its role (role_tag) so
// that the estimator can say what the bytes are for.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "ops/nf4.h"
#include "shard/plan.h"

namespace shardlm::shard {

// The MemTag of an engine buffer (core/alloc.h): its role, and whether it is host memory beside
// a GPU (pinned, under offload). tag_role reads the role back (none for another owner's tag).
MemTag role_tag(BufferRole role, bool host);
std::optional<BufferRole> tag_role(MemTag tag);

// One of the engine's flat buffers: it owns its memory, knows what it is for (its tag), and is
// charged to its role's category. Move-only; view() is valid while it lives.
class FlatBuffer {
 public:
  FlatBuffer() = default;
  FlatBuffer(BufferRole role, DType dtype, int64_t numel, bool zero, bool pinned_host, Device device);
  FlatBuffer(FlatBuffer&& o) noexcept { *this = std::move(o); }
  FlatBuffer& operator=(FlatBuffer&& o) noexcept;
  FlatBuffer(const FlatBuffer&) = delete;
  FlatBuffer& operator=(const FlatBuffer&) = delete;

  bool live() const { return live_; }
  const Tensor& view() const { return view_; }
  void reset() { *this = FlatBuffer(); }

 private:
  Buffer mem_;
  Tensor view_;
  bool live_ = false;
};

// Makes the engine's buffers on its device, or in pinned host memory beside a GPU (offload; a
// meta device stands for both).
struct BufferMaker {
  Device device = Device::CPU;
  FlatBuffer operator()(BufferRole role, DType dtype, int64_t numel, bool zero, bool pinned_host = false) const {
    return FlatBuffer(role, dtype, numel, zero, pinned_host, device);
  }
};

// A tensor's bytes seen as f32 words for the communicators (a gather copies bits).
Tensor as_f32_words(const Tensor& bytes);

// QLoRA: views of the m-element chunk at `base` laid out as `chunk` (a piece's largest chunk).
ops::Nf4Tensor nf4_chunk(void* base, const ops::Nf4Layout& chunk, int64_t m, Device device);

// A gathered unit's state between visits (FSDP2's sharded / unsharded states).
enum class GatherState : uint8_t { Sharded, Gathering, Gathered };

// What one unit gathers for its visits (plan.h GatherSegment): the trained parameters, cast from
// the f32 master into the param dtype; a LoRA run's frozen base; QLoRA's NF4 store, dequantized
// after the gather for each visit (FSDP2's fsdp_post_all_gather). A unit that is not persistent
// moves all of it with one all-gather into one buffer; a persistent one (NO_SHARD, ZERO1, solo)
// keeps everything whole: refresh() recomputes its trained parameters after the master changed.
class ShardedBuffer {
 public:
  ShardedBuffer(const PlannedUnit& plan, DType param_dtype, const BufferMaker& make);

  GatherState state() const { return state_; }
  // This rank's at-rest frozen base and NF4 store (where loading writes; undefined when none).
  Tensor frozen_rest() const { return rest_part(plan_->rest_frozen_offset, frozen_numel_rest(), param_dtype_); }
  Tensor nf4_rest() const { return rest_part(plan_->rest_nf4_offset, plan_->nf4_store_bytes, DType::U8); }

  // Issues the gather (Sharded -> Gathering): this rank's block, its trained part cast from
  // `master` (f32 [shard]). Under offload the master is host memory: the cast happens on the CPU
  // in `host_staging` (pinned, at least [shard] f32) and is copied up.
  void start(comm::Communicator& comm, const Tensor& master, const Tensor& host_staging);
  // Completes it (Gathering -> Gathered): rearranges the gathered block into whole segments.
  void wait();
  // Frees the gathered buffer (Gathered -> Sharded). Persistent units keep theirs.
  void release();
  // Persistent units: the full trained parameters from `master` again (a cast or the master
  // itself for NO_SHARD and solo units, an all-gather of the shards for ZERO1). Collective for
  // ZERO1.
  void refresh(comm::Communicator& comm, const Tensor& master, const Tensor& host_staging);

  // QLoRA's transform after the gather: the NF4 weights dequantized to the param dtype for one
  // visit (from the gathered store, or from this rank's when it holds every chunk); end_visit
  // frees them.
  void dequantize();
  void end_visit() { dequantized_.reset(); }
  bool dequantized_live() const { return dequantized_.live(); }

  // Views for the model (undefined where the unit has no such data or it is not gathered): the
  // trained parameters (param dtype [padded]), the frozen base (param dtype [frozen padded]) and
  // the dequantized NF4 weights (param dtype [quantized numel]).
  const Tensor& trained() const { return trained_; }
  const Tensor& frozen() const { return frozen_; }
  Tensor dequantized() const { return dequantized_.live() ? dequantized_.view() : Tensor{}; }

 private:
  int64_t frozen_numel_rest() const { return plan_->persistent ? plan_->frozen.padded_numel : plan_->frozen_shard_numel; }
  Tensor rest_part(int64_t offset, int64_t numel, DType dtype) const;
  // The trained parameters' part of a gather, param dtype [shard]: cast from the master into
  // `dst` (on the engine's device).
  void cast_master(const Tensor& dst, const Tensor& master, const Tensor& host_staging) const;
  Tensor whole(const GatherSegment& g, DType dtype, int64_t numel) const;
  void rearrange();

  const PlannedUnit* plan_;
  DType param_dtype_;
  BufferMaker make_;
  GatherState state_ = GatherState::Sharded;
  FlatBuffer rest_;      // u8 [rest_bytes]: this rank's frozen base and NF4 store (and trained slot)
  FlatBuffer send_;      // param dtype [shard]: a gather's cast trained part, until it completes
  FlatBuffer gathered_;  // u8 [shard size x block]: the unit's gathered segments, whole
  FlatBuffer full_;      // param dtype [padded]: a persistent unit's trained parameters (a copy)
  std::unique_ptr<comm::Request> pending_;  // the gather in flight
  FlatBuffer dequantized_;                  // QLoRA: param dtype [quantized numel], one visit
  Tensor trained_, frozen_;                 // views of the above (or of the master)
};

}  // namespace shardlm::shard
