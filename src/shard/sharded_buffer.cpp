#include "shard/sharded_buffer.h"

#include <algorithm>

#include "core/device.h"
#include "ops/ops.h"

namespace shardlm::shard {

// ---- flat buffers ------------------------------------------------------------------------------

MemTag role_tag(BufferRole role, bool host) {
  return MemTag(mem_tag::kEngineRole + int(role)) | (host ? mem_tag::kHost : 0);
}

std::optional<BufferRole> tag_role(MemTag tag) {
  const int r = int(tag & ~mem_tag::kHost) - mem_tag::kEngineRole;
  if (r < 0 || r > int(BufferRole::Quantized)) return std::nullopt;
  return BufferRole(r);
}

FlatBuffer::FlatBuffer(BufferRole role, DType dtype, int64_t numel, bool zero, bool pinned_host, Device device)
    : live_(true) {
  const size_t bytes = size_t(numel) * dtype_size(dtype);
  const MemTag tag = role_tag(role, pinned_host);
  // Pinned host memory beside a GPU; on the meta device, a meta buffer tagged as host memory.
  if (pinned_host && device != Device::Meta)
    mem_ = Buffer::pinned_host(bytes, role_category(role), zero, tag);
  else
    mem_ = Buffer(bytes, role_category(role), zero, device, tag);
  view_ = Tensor::view(mem_.data(), dtype, {numel}, device == Device::Meta ? device : pinned_host ? Device::CPU : device);
}

FlatBuffer& FlatBuffer::operator=(FlatBuffer&& o) noexcept {
  if (this == &o) return *this;
  mem_ = std::move(o.mem_);  // frees this buffer's memory first
  view_ = o.view_;
  live_ = o.live_;
  o.view_ = Tensor{};
  o.live_ = false;
  return *this;
}

Tensor as_f32_words(const Tensor& bytes) {
  return Tensor::view(bytes.data, DType::F32, {int64_t(bytes.nbytes() / 4)}, bytes.device);
}

ops::Nf4Tensor nf4_chunk(void* base, const ops::Nf4Layout& chunk, int64_t m, Device device) {
  char* b = static_cast<char*>(base);
  auto at = [&](size_t offset) { return b ? b + offset : nullptr; };
  ops::Nf4Tensor q;
  q.shape = {m};
  q.nested = chunk.nested;
  const int64_t blocks = (m + ops::kNf4BlockSize - 1) / ops::kNf4BlockSize;
  q.packed = Tensor::view(at(chunk.packed_offset), DType::U8, {(m + 1) / 2}, device);
  q.absmax = Tensor::view(at(chunk.absmax_offset), chunk.nested ? DType::U8 : DType::F32, {blocks}, device);
  if (chunk.nested) {
    q.nested_absmax = Tensor::view(at(chunk.nested_absmax_offset), DType::F32,
                                   {(blocks + ops::kNf4NestedBlockSize - 1) / ops::kNf4NestedBlockSize}, device);
    q.offset = Tensor::view(at(chunk.offset_offset), DType::F32, {1}, device);
  }
  return q;
}

// ---- a unit's gathered data ---------------------------------------------------------------------

namespace {
char* byte_at(const Tensor& t, int64_t offset) { return t.data ? static_cast<char*>(t.data) + offset : nullptr; }
}  // namespace

ShardedBuffer::ShardedBuffer(const PlannedUnit& plan, DType param_dtype, const BufferMaker& make)
    : plan_(&plan), param_dtype_(param_dtype), make_(make) {
  if (plan.rest_bytes > 0) rest_ = make_(BufferRole::Frozen, DType::U8, plan.rest_bytes, true);
  if (plan.persistent) {
    state_ = GatherState::Gathered;
    frozen_ = frozen_rest();
  }
}

Tensor ShardedBuffer::rest_part(int64_t offset, int64_t numel, DType dtype) const {
  if (offset < 0 || numel == 0) return Tensor{};
  return Tensor::view(byte_at(rest_.view(), offset), dtype, {numel}, rest_.view().device);
}

Tensor ShardedBuffer::whole(const GatherSegment& g, DType dtype, int64_t numel) const {
  return Tensor::view(byte_at(gathered_.view(), g.whole_offset), dtype, {numel}, gathered_.view().device);
}

void ShardedBuffer::cast_master(const Tensor& dst, const Tensor& master, const Tensor& host_staging) const {
  if (master.device == dst.device) {
    ops::cast(dst, master);
    return;
  }
  // Offload: the master is host memory. The compute-dtype part is made on the CPU (in the reused
  // pinned staging buffer when it needs a cast) and copied up, synchronously.
  if (dst.dtype == DType::F32) {
    device::copy(dst, master);
    return;
  }
  const Tensor host = Tensor::view(host_staging.data, dst.dtype, {dst.numel()}, host_staging.device);
  ops::cast(host, master);
  device::copy(dst, host);
}

void ShardedBuffer::start(comm::Communicator& comm, const Tensor& master, const Tensor& host_staging) {
  if (state_ != GatherState::Sharded) return;
  const std::vector<GatherSegment>& segs = plan_->gather;
  const int64_t S = comm.size();
  gathered_ = make_(BufferRole::FullParams, DType::U8, S * plan_->gather_block_bytes, false);
  Tensor in, out;
  if (segs.size() >= 2) {  // the block as it lies at rest, its trained part cast in first
    if (plan_->rest_trained_offset >= 0)
      cast_master(rest_part(plan_->rest_trained_offset, plan_->shard_numel, param_dtype_), master, host_staging);
    in = as_f32_words(rest_.view());
    out = as_f32_words(gathered_.view());
  } else if (segs[0].kind == SegmentKind::Trained) {
    // This rank's slice: the f32 master itself, or a param-dtype copy that lives only until the
    // gather completes (a persistent copy would cost param-dtype bytes of the whole shard).
    if (param_dtype_ == DType::F32 && master.device == make_.device) {
      in = master;
    } else {
      send_ = make_(BufferRole::Staging, param_dtype_, plan_->shard_numel, false);
      cast_master(send_.view(), master, host_staging);
      in = send_.view();
    }
    out = whole(segs[0], param_dtype_, plan_->layout.padded_numel);
  } else if (segs[0].kind == SegmentKind::Frozen) {
    in = frozen_rest();
    out = whole(segs[0], param_dtype_, plan_->frozen.padded_numel);
  } else {  // the NF4 store: packed bytes and their state, as stored
    in = as_f32_words(nf4_rest());
    out = as_f32_words(gathered_.view());
  }
  pending_ = comm.all_gather_async(out, in);
  state_ = GatherState::Gathering;
}

// [S x block] -> [segment 0 whole | segment 1 whole | ...]. Segment 0, the largest, moves within
// the buffer (its rank-0 part is already in place); the others go through a staging copy first,
// since segment 0's moves overwrite where they lay.
void ShardedBuffer::rearrange() {
  const std::vector<GatherSegment>& segs = plan_->gather;
  if (segs.size() < 2) return;
  const int64_t block = plan_->gather_block_bytes, S = gathered_.view().numel() / block;
  const int64_t rest_begin = segs[1].whole_offset;
  const Device dev = gathered_.view().device;
  const FlatBuffer others = make_(BufferRole::Staging, DType::U8, gathered_.view().numel() - rest_begin, false);
  FlatBuffer bounce;  // CUDA copies must not overlap: an overlapping move goes through it
  char* base = byte_at(gathered_.view(), 0);
  for (size_t s = 1; s < segs.size(); ++s)
    for (int64_t r = 0; r < S; ++r)
      device::copy_bytes(byte_at(others.view(), segs[s].whole_offset - rest_begin + r * segs[s].part_bytes), dev,
                         base + r * block + segs[s].block_offset, dev, size_t(segs[s].part_bytes));
  const int64_t part = segs[0].part_bytes;
  for (int64_t r = 1; r < S; ++r) {
    const int64_t from = r * block, to = r * part;
    if (dev == Device::CUDA && from - to < part) {
      if (!bounce.live()) bounce = make_(BufferRole::Staging, DType::U8, part, false);
      device::copy_bytes(byte_at(bounce.view(), 0), dev, base + from, dev, size_t(part));
      device::copy_bytes(base + to, dev, byte_at(bounce.view(), 0), dev, size_t(part));
    } else {
      device::copy_bytes(base + to, dev, base + from, dev, size_t(part));  // memmove on the host
    }
  }
  device::copy_bytes(base + rest_begin, dev, byte_at(others.view(), 0), dev, size_t(others.view().numel()));
}

void ShardedBuffer::wait() {
  if (state_ != GatherState::Gathering) return;
  pending_->wait();
  pending_.reset();
  send_.reset();
  rearrange();
  for (const GatherSegment& g : plan_->gather) {
    if (g.kind == SegmentKind::Trained) trained_ = whole(g, param_dtype_, plan_->layout.padded_numel);
    if (g.kind == SegmentKind::Frozen) frozen_ = whole(g, param_dtype_, plan_->frozen.padded_numel);
  }
  state_ = GatherState::Gathered;
}

void ShardedBuffer::release() {
  if (plan_->persistent || state_ != GatherState::Gathered) return;
  gathered_.reset();
  trained_ = frozen_ = Tensor{};
  state_ = GatherState::Sharded;
}

void ShardedBuffer::refresh(comm::Communicator& comm, const Tensor& master, const Tensor& host_staging) {
  if (!plan_->persistent || !plan_->trains()) return;
  const int64_t padded = plan_->layout.padded_numel;
  if (master.numel() == padded && param_dtype_ == DType::F32) {
    trained_ = master;  // NO_SHARD and solo units in f32: the master weights are the full parameters
    return;
  }
  if (!full_.live()) full_ = make_(BufferRole::FullParams, param_dtype_, padded, true);
  trained_ = full_.view();
  if (master.numel() == padded) {  // NO_SHARD and solo: a cast of the whole master
    ops::cast(full_.view(), master);
    return;
  }
  // ZERO1: every rank owns a shard; gather them.
  if (param_dtype_ == DType::F32) {
    comm.all_gather(full_.view(), master);
    return;
  }
  send_ = make_(BufferRole::Staging, param_dtype_, plan_->shard_numel, false);
  cast_master(send_.view(), master, host_staging);
  comm.all_gather(full_.view(), send_.view());
  send_.reset();
}

void ShardedBuffer::dequantize() {
  const PlannedUnit& p = *plan_;
  if (p.nf4.empty() || dequantized_.live()) return;
  dequantized_ = make_(BufferRole::FullParams, param_dtype_, p.quantized.padded_numel, false);
  Tensor store = nf4_rest();  // every chunk's store, back to back
  for (const GatherSegment& g : p.gather)
    if (g.kind == SegmentKind::Nf4) store = whole(g, DType::U8, p.nf4_chunks * p.nf4_store_bytes);
  for (const Nf4Piece& piece : p.nf4)
    for (int c = 0; c < p.nf4_chunks; ++c) {
      const int64_t lo = piece.lo(c), hi = piece.hi(c);
      if (lo >= hi) continue;
      char* chunk = byte_at(store, c * p.nf4_store_bytes + int64_t(piece.offset));
      const ops::Nf4Tensor q = nf4_chunk(chunk, piece.chunk, hi - lo, store.device);
      const Tensor out = dequantized_.view().slice(piece.entry.offset + lo, piece.entry.offset + hi);
      if (q.nested)
        ops::nf4_dequantize_nested(out, q.packed, q.absmax, q.nested_absmax, q.offset);
      else
        ops::nf4_dequantize(out, q.packed, q.absmax);
    }
}

}  // namespace shardlm::shard
