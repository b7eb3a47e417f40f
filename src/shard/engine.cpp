#include "shard/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/device.h"
#include "core/timeline.h"
#include "io/model_files.h"
#include "model/nf4_loader.h"

namespace shardlm::shard {

// ---- flat buffers ------------------------------------------------------------------------------

FlatBuffer::FlatBuffer(BufferRole role, DType dtype, int64_t numel, bool zero, bool pinned_host, Device device,
                       BufferLedger* ledger)
    : role_(role), host_(pinned_host), live_(true), bytes_(numel * int64_t(dtype_size(dtype))), ledger_(ledger) {
  const Device where = pinned_host ? Device::CPU : device;
  if (ledger_) {  // a dry run: a shape without memory
    view_ = Tensor::view(nullptr, dtype, {numel}, where);
    ledger_->on_alloc(role_, host_, bytes_);
    return;
  }
  if (pinned_host) {
    mem_.buffer = Buffer::pinned_host(size_t(bytes_), role_category(role), zero);
    mem_.t = Tensor::of(mem_.buffer, dtype, {numel});
  } else {
    mem_ = OwnedTensor(dtype, {numel}, role_category(role), zero, device);
  }
  view_ = mem_.t;
}

FlatBuffer::FlatBuffer(FlatBuffer&& o) noexcept { *this = std::move(o); }

FlatBuffer& FlatBuffer::operator=(FlatBuffer&& o) noexcept {
  if (this == &o) return *this;
  reset();
  mem_ = std::move(o.mem_);
  view_ = o.view_;
  role_ = o.role_;
  host_ = o.host_;
  live_ = o.live_;
  bytes_ = o.bytes_;
  ledger_ = o.ledger_;
  o.live_ = false;
  o.view_ = Tensor{};
  return *this;
}

void FlatBuffer::reset() {
  if (!live_) return;
  if (ledger_) ledger_->on_free(role_, host_, bytes_);
  mem_ = OwnedTensor();
  view_ = Tensor{};
  live_ = false;
}

namespace {

// ---- arithmetic and collectives over flat buffers ------------------------------------------------
// Free functions, so the strategy logic below reads as what moves where. In a dry run (`dry`) they
// touch no memory; the shape-only communicators count bytes and complete at once.

struct Arith {
  bool dry = false;
  void cast(const Tensor& dst, const Tensor& src) const {
    if (!dry) ops::cast(dst, src);
  }
  void zero(const Tensor& t) const {
    if (!dry) ops::zero(t);
  }
  void add(const Tensor& dst, const Tensor& src) const {
    if (!dry) ops::add_inplace(dst, src);
  }
  void copy(const Tensor& dst, const Tensor& src) const {  // across devices, same dtype
    if (!dry) device::copy(dst, src);
  }
  double sum_squares(const Tensor& t) const { return dry ? 0.0 : ops::sum_squares(t); }
};

// "forward layer 3" / "head" ...: a compute span's name in the timeline.
std::string stage_label(const Stage& s) {
  switch (s.kind) {
    case StageKind::EmbedForward: return "embed forward";
    case StageKind::BlockForward: return fmt::format("forward layer {}", s.layer);
    case StageKind::Head: return "head and loss";
    case StageKind::BlockBackward: return fmt::format("backward layer {}", s.layer);
    case StageKind::EmbedBackward: return "embed backward";
  }
  return "stage";
}

}  // namespace

// ---- units ---------------------------------------------------------------------------------------

// A unit's parameters between visits (FSDP2's sharded / unsharded states).
enum class ParamState : uint8_t { Sharded, Gathering, Gathered };

struct ShardedModel::Unit {
  const PlannedUnit* plan = nullptr;
  ParamState state = ParamState::Sharded;
  // Optimizer side (pinned host memory under offload, else the engine's device):
  FlatBuffer master, exp_avg, exp_avg_sq;  // f32 [own_numel]: what this rank optimizes
  FlatBuffer grad_shard;                   // f32 [shard_numel]: reduced gradients (sharded optimizer)
  // Compute side (the engine's device):
  FlatBuffer full_params;  // param dtype [padded]: gathered, or the persistent copy
  FlatBuffer full_grad;    // f32 [padded]: the backward's accumulator
  FlatBuffer send;         // param dtype [shard]: the cast or uploaded shard of a gather in flight
  std::unique_ptr<comm::Request> pending;  // the gather in flight (Gathering)
  // A LoRA run's frozen base (plan.h PlannedUnit::frozen), param dtype: [frozen padded] where
  // parameters persist, else [frozen shard], gathered into frozen_full beside full_params.
  FlatBuffer frozen, frozen_full;
  std::unique_ptr<comm::Request> frozen_pending;
  // QLoRA (plan.h Nf4Piece): u8 [NF4 store] at rest, [chunks x store] gathered; the dequantized
  // weights (param dtype [quantized numel]) live only during a visit.
  FlatBuffer nf4, nf4_full, dequantized;
  std::unique_ptr<comm::Request> nf4_pending;
  // The gradient reduction in flight: started after the unit's backward visit, finished after the
  // next visit's compute (or before the unit's next use of its gradients), so the two overlap as
  // FSDP's post-backward stream does. NO_SHARD reduces full_grad in place; the others reduce into
  // reduced (f32 [shard]) from reducing_grad, the full gradient handed over by sharded-gradient
  // strategies (a later visit takes a fresh full_grad) or a view of the one that stays. wire and
  // wire_part are reduce-dtype staging ([padded], [shard]) when reduce_dtype is not f32.
  std::unique_ptr<comm::Request> reducing;
  FlatBuffer reduced, reducing_grad, wire, wire_part;
  // What the model binds: views of full_params or, where no copy is needed, of the master
  // (f32 NO_SHARD, f32 solo); of full_grad or, for a solo unit, of the gradient shard; of the
  // frozen base (frozen or frozen_full).
  Tensor params, grads, frozen_params;
};

namespace {
// A tensor's bytes seen as f32 for the communicators (a gather copies bits; sizes are multiples of 16).
Tensor as_f32(const Tensor& bytes) { return Tensor::view(bytes.data, DType::F32, {int64_t(bytes.nbytes() / 4)}, bytes.device); }

int64_t nf4_blocks(int64_t n) { return (n + ops::kNf4BlockSize - 1) / ops::kNf4BlockSize; }

// Views of the m-element chunk at `base`, laid out as `chunk` (the piece's largest chunk).
ops::Nf4Tensor nf4_chunk(void* base, const ops::Nf4Layout& chunk, int64_t m, Device device) {
  char* b = static_cast<char*>(base);
  auto at = [&](size_t offset) { return b ? b + offset : nullptr; };
  ops::Nf4Tensor q;
  q.shape = {m};
  q.nested = chunk.nested;
  const int64_t blocks = nf4_blocks(m);
  q.packed = Tensor::view(at(chunk.packed_offset), DType::U8, {(m + 1) / 2}, device);
  q.absmax = Tensor::view(at(chunk.absmax_offset), chunk.nested ? DType::U8 : DType::F32, {blocks}, device);
  if (chunk.nested) {
    q.nested_absmax = Tensor::view(at(chunk.nested_absmax_offset), DType::F32,
                                   {(blocks + ops::kNf4NestedBlockSize - 1) / ops::kNf4NestedBlockSize}, device);
    q.offset = Tensor::view(at(chunk.offset_offset), DType::F32, {1}, device);
  }
  return q;
}
}  // namespace

ShardedModel::ShardedModel(const ModelConfig& cfg, const ShardingConfig& sharding, Mesh& mesh)
    : ShardedModel(cfg, sharding, mesh, nullptr) {}

ShardedModel::ShardedModel(const ModelConfig& cfg, const ShardingConfig& sharding, Mesh& mesh, BufferLedger& ledger)
    : ShardedModel(cfg, sharding, mesh, &ledger) {}

ShardedModel::ShardedModel(const ModelConfig& cfg, const ShardingConfig& sharding, Mesh& mesh, BufferLedger* ledger)
    : cfg_(cfg),
      plan_(make_plan(cfg, sharding, mesh.tensor_shard().rank(), mesh.tensor_shard().size())),
      mesh_(mesh),
      shard_comm_(mesh.tensor_shard()),
      replicate_comm_(sharding.hybrid() ? &mesh.tensor_replicate() : nullptr),
      device_(mesh.device()),
      ledger_(ledger) {
  // A dry run may plan offload for a GPU it does not have.
  SHARDLM_CHECK(!plan_.offload.params || ((ledger_ || device_ == Device::CUDA) && sharding.shard_gradients()),
                "CPU offload needs CUDA communicators and a strategy that shards gradients (got {} on {})",
                strategy_name(sharding.strategy), device_name(device_));
  const bool sharded = sharding.shard_optimizer();
  int64_t largest_shard = 0;
  for (const PlannedUnit& p : plan_.units) {
    auto u = std::make_unique<Unit>();
    u->plan = &p;
    if (p.frozen.numel > 0) {
      u->frozen = buffer(BufferRole::Frozen, plan_.precision.param,
                         p.persistent ? p.frozen.padded_numel : p.frozen_shard_numel, true);
      if (p.persistent) u->frozen_params = u->frozen.view();
    }
    if (!p.nf4.empty()) u->nf4 = buffer(BufferRole::Quantized, DType::U8, p.nf4_store_bytes, true);
    if (!p.trains()) {  // a frozen unit (LoRA): no master, no optimizer state, no gradients
      units_.push_back(std::move(u));
      continue;
    }
    u->master = state_buffer(BufferRole::Master, p.own_numel);
    u->exp_avg = state_buffer(BufferRole::Moments, p.own_numel);
    u->exp_avg_sq = state_buffer(BufferRole::Moments, p.own_numel);
    if (sharded) u->grad_shard = state_buffer(BufferRole::GradShard, p.shard_numel);
    if (p.solo) {
      u->grads = u->grad_shard.view();  // the backward accumulates into the shard itself
      if (plan_.precision.param != DType::F32)
        u->full_params = buffer(BufferRole::FullParams, plan_.precision.param, p.layout.padded_numel, true);
    }
    largest_shard = std::max(largest_shard, p.shard_numel);
    units_.push_back(std::move(u));
  }
  if (plan_.offload.params) host_staging_ = buffer(BufferRole::Staging, DType::F32, largest_shard, false, true);
}

ShardedModel::~ShardedModel() { comm::set_activity({0, "after training"}); }  // it named this engine's units

FlatBuffer ShardedModel::buffer(BufferRole role, DType dtype, int64_t numel, bool zero, bool host) const {
  return FlatBuffer(role, dtype, numel, zero, host, device_, ledger_);
}

std::vector<std::string> ShardedModel::names() const {
  std::vector<std::string> out;
  for (const PlannedUnit& p : plan_.units)
    for (const FlatEntry& e : p.layout.entries) out.push_back(e.info.name);
  return out;
}

// ---- initialization and loading: only this rank's elements -------------------------------------

// Initialization and loading write host memory; a GPU-resident master is filled through a host
// staging copy (charged to Communication, like the other staging buffers).
template <class Fill>
void ShardedModel::fill_master(Unit& u, Fill fill) {
  if (ledger_) return;
  const Tensor& m = u.master.view();
  if (m.device == Device::CPU) {
    fill(m.f32());
    return;
  }
  OwnedTensor host(DType::F32, {m.numel()}, MemCategory::Communication, false);
  fill(host.t.f32());
  device::copy(m, host.t);
}

// The frozen base is stored in the param dtype: what this rank keeps of it is made in f32 on the
// host, then cast (on the device, after an upload, for a GPU) into place once. The staging is an
// engine buffer, so a dry run counts it too.
template <class Fill>
void ShardedModel::fill_frozen(Unit& u, Fill fill) {
  if (!u.frozen.live()) return;
  const Arith a{ledger_ != nullptr};
  const PlannedUnit& p = *u.plan;
  const Tensor& dst = u.frozen.view();
  const int64_t n = dst.numel(), begin = p.persistent ? 0 : plan_.shard_rank * p.frozen_shard_numel;
  if (dst.dtype == DType::F32 && device_ == Device::CPU) {
    if (!ledger_) fill(begin, begin + n, dst.f32());
    return;
  }
  const FlatBuffer host = buffer(BufferRole::Staging, DType::F32, n, true, device_ != Device::CPU);
  if (!ledger_) fill(begin, begin + n, host.view().f32());
  if (device_ == Device::CPU) {
    a.cast(dst, host.view());
    return;
  }
  const FlatBuffer up = buffer(BufferRole::Staging, DType::F32, n, false);
  a.copy(up.view(), host.view());
  a.cast(dst, up.view());
}

// QLoRA: this rank quantizes only its own chunk of each weight (f32 values from `fill`, in host
// memory, then copied to the device). With double quantization the offset is the mean of the
// absmax values of the whole weight: one sum over the shard group per weight. A weight that
// `stored` (a bitsandbytes directory) holds in NF4 is not quantized again: its chunk is copied
// from the file as stored (load checked that the layouts agree).
template <class Fill>
void ShardedModel::fill_nf4(Unit& u, Fill fill, const model::Nf4ModelReader* stored) {
  if (!u.nf4.live()) return;
  const Arith a{ledger_ != nullptr};
  const PlannedUnit& p = *u.plan;
  const int c = p.nf4_chunks > 1 ? plan_.shard_rank : 0;
  const bool host = device_ != Device::CPU;  // staging in (pinned) host memory for a GPU store
  FlatBuffer host_store;
  Tensor store = u.nf4.view();
  if (host) {
    host_store = buffer(BufferRole::Staging, DType::U8, p.nf4_store_bytes, true, true);
    store = host_store.view();
  }
  for (const Nf4Piece& piece : p.nf4) {
    const int64_t lo = piece.lo(c), hi = piece.hi(c), m = hi - lo;
    const bool nested = piece.chunk.nested;
    ops::Nf4Tensor q;
    if (m > 0)
      q = nf4_chunk(store.data ? static_cast<char*>(store.data) + piece.offset : nullptr, piece.chunk, m, Device::CPU);
    // Every rank takes the same branch (the file decides), so the sums below stay collective.
    if (stored && stored->is_quantized(piece.entry.info.name)) {
      if (m > 0 && !ledger_) stored->read_chunk(piece.entry.info.name, lo / ops::kNf4BlockSize, nf4_blocks(hi), q);
      continue;
    }
    FlatBuffer absmax;  // nested: the f32 absmax values before their own quantization
    double sum = 0;
    if (m > 0) {
      const FlatBuffer x = buffer(BufferRole::Staging, DType::F32, m, false, host);
      if (nested) absmax = buffer(BufferRole::Staging, DType::F32, nf4_blocks(m), false, host);
      if (!ledger_) {
        fill(piece.entry.offset + lo, piece.entry.offset + hi, x.view().f32());
        ops::nf4_quantize(q.packed, nested ? absmax.view() : q.absmax, x.view());
        if (nested) sum = ops::nf4_absmax_sum(absmax.view());
      }
    }
    if (!nested) continue;
    if (p.nf4_chunks > 1) sum = mesh_.shard->all_reduce_sum(sum);
    if (m == 0 || ledger_) continue;
    *q.offset.f32() = ops::nf4_offset_from_sum(sum, nf4_blocks(piece.entry.info.numel()));
    ops::nf4_quantize_absmax(q.absmax, q.nested_absmax, absmax.view(), q.offset);
  }
  if (host) a.copy(u.nf4.view(), store);
}

// The unit's NF4 weights, dequantized to the param dtype for one visit (from the gathered chunks,
// or from this rank's store when it holds every chunk).
void ShardedModel::dequantize(Unit& u) {
  const PlannedUnit& p = *u.plan;
  u.dequantized = buffer(BufferRole::FullParams, plan_.precision.param, p.quantized.padded_numel, false);
  if (ledger_) return;
  const Tensor& store = p.nf4_chunks > 1 ? u.nf4_full.view() : u.nf4.view();
  for (const Nf4Piece& piece : p.nf4)
    for (int c = 0; c < p.nf4_chunks; ++c) {
      const int64_t lo = piece.lo(c), hi = piece.hi(c);
      if (lo >= hi) continue;
      char* base = static_cast<char*>(store.data) + size_t(c) * size_t(p.nf4_store_bytes) + piece.offset;
      const ops::Nf4Tensor q = nf4_chunk(base, piece.chunk, hi - lo, store.device);
      const Tensor out = u.dequantized.view().slice(piece.entry.offset + lo, piece.entry.offset + hi);
      if (q.nested)
        ops::nf4_dequantize_nested(out, q.packed, q.absmax, q.nested_absmax, q.offset);
      else
        ops::nf4_dequantize(out, q.packed, q.absmax);
    }
}

void ShardedModel::init_random(uint64_t seed) {
  const float std = float(cfg_.initializer_range);
  for (auto& up : units_) {
    Unit& u = *up;
    const PlannedUnit& p = *u.plan;
    fill_frozen(u, [&](int64_t begin, int64_t end, float* out) { init_flat_range(p.frozen, begin, end, seed, std, out); });
    fill_nf4(u, [&](int64_t begin, int64_t end, float* out) { init_flat_range(p.quantized, begin, end, seed, std, out); });
    if (p.trains())
      fill_master(u, [&](float* out) { init_flat_range(p.layout, p.own_begin, p.own_begin + p.own_numel, seed, std, out); });
    refresh_params(u);
  }
}

namespace {

// A weight the file holds in NF4 must have the shape config.json implies.
void check_stored_shape(const model::Nf4ModelReader& stored, const FlatEntry& e, const std::string& source) {
  const std::vector<int64_t> shape = stored.state(e.info.name).shape;
  if (shape == e.info.shape) return;
  const Tensor want = Tensor::view(nullptr, DType::F32, e.info.shape.data(), int(e.info.shape.size()));
  const Tensor got = Tensor::view(nullptr, DType::F32, shape.data(), int(shape.size()));
  throw Error(fmt::format("NF4 shape {} in the file, but config.json implies {}", got.shape_str(), want.shape_str()),
              {.file = source, .tensor = e.info.name});
}

// Elements [begin, end) of `layout` as load_flat_range reads them, except that a weight the file
// holds in NF4 (a bitsandbytes directory) is read as bitsandbytes dequantizes it, in f32: the
// dense base of a LoRA run, or the starting weights of full fine-tuning.
void load_dense_range(const FlatLayout& layout, int64_t begin, int64_t end, const io::ModelWeights& weights,
                      const model::Nf4ModelReader& stored, const std::string& source, float* out) {
  FlatLayout plain = layout;  // the other entries keep their offsets
  std::erase_if(plain.entries, [&](const FlatEntry& e) { return stored.is_quantized(e.info.name); });
  load_flat_range(plain, begin, end, weights, source, out);
  if (plain.entries.size() == layout.entries.size()) return;
  for (const FlatEntry& e : layout.entries)
    if (stored.is_quantized(e.info.name)) check_stored_shape(stored, e, source);
  for_each_overlap(layout, begin, end, [&](const FlatEntry& e, int64_t lo, int64_t hi) {
    if (stored.is_quantized(e.info.name)) stored.dequantize_range(e.info.name, lo - e.offset, hi - e.offset, out + (lo - begin));
  });
}

}  // namespace

void ShardedModel::load(const io::ModelWeights& weights, const std::string& source, uint64_t seed) {
  // A directory saved by transformers from a bitsandbytes 4-bit model holds its Linear weights as
  // NF4 states (none in any other directory). QLoRA keeps them as stored, which needs the chunk
  // layout's double quantization to be the file's: checked for every weight before any reading.
  const model::Nf4ModelReader stored(weights, cfg_);
  std::vector<const FlatLayout*> layouts;
  for (auto& up : units_)
    for (const Nf4Piece& piece : up->plan->nf4) {
      const std::string& name = piece.entry.info.name;
      if (!stored.is_quantized(name)) continue;
      check_stored_shape(stored, piece.entry, source);
      const model::Nf4State st = stored.state(name);
      if (piece.chunk.nested && !st.layout().nested)
        throw Error(fmt::format("lora.double_quant is true, but bitsandbytes stored this weight {}; set "
                                "lora.double_quant: false to train on it as stored",
                                st.nested ? "with a non-standard nested_quant_map" : "without double quantization"),
                    {.file = source, .tensor = name});
    }
  for (auto& up : units_) {
    Unit& u = *up;
    const PlannedUnit& p = *u.plan;
    // A LoRA run: the file holds the frozen base, and the adapters are new.
    fill_frozen(u, [&](int64_t begin, int64_t end, float* out) { load_dense_range(p.frozen, begin, end, weights, stored, source, out); });
    fill_nf4(u, [&](int64_t begin, int64_t end, float* out) { load_dense_range(p.quantized, begin, end, weights, stored, source, out); },
             &stored);
    layouts.push_back(cfg_.lora ? &p.frozen : &p.layout);
    layouts.push_back(&p.quantized);
    if (p.trains())
      fill_master(u, [&](float* out) {
        const int64_t begin = p.own_begin, end = p.own_begin + p.own_numel;
        if (cfg_.lora)
          init_flat_range(p.layout, begin, end, seed, float(cfg_.initializer_range), out);
        else
          load_dense_range(p.layout, begin, end, weights, stored, source, out);
      });
    refresh_params(u);
  }
  if (stored.quantized_names().empty()) {
    check_no_extra_tensors(layouts, weights, source);
    return;
  }
  // The same check over the model's tensors, the NF4 states' entries (W.absmax, ...) left out.
  std::set<std::string> known;
  for (const FlatLayout* l : layouts)
    for (const FlatEntry& e : l->entries) known.insert(e.info.name);
  for (const std::string& name : stored.names())
    if (!known.count(name) && name.find("rotary_emb.inv_freq") == std::string::npos)
      throw Error("in the weights but not in the model described by config.json", {.file = source, .tensor = name});
}

// ---- parameters: gather, bind, release -----------------------------------------------------------

// Persistent units (NO_SHARD, ZERO1, solo) refresh their full parameters here whenever the master
// weights change; the others gather on demand.
void ShardedModel::refresh_params(Unit& u) {
  const PlannedUnit& p = *u.plan;
  if (!p.persistent) return;
  u.state = ParamState::Gathered;
  if (!p.trains()) return;  // only a frozen base, which persists as it is
  const Arith a{ledger_ != nullptr};
  const DType pd = plan_.precision.param;
  if (p.solo || plan_.sharding.strategy == Strategy::NoShard) {
    if (pd == DType::F32) {
      u.params = u.master.view();  // the master weights are the full parameters
    } else {
      if (!u.full_params.live()) u.full_params = buffer(BufferRole::FullParams, pd, p.layout.padded_numel, true);
      a.cast(u.full_params.view(), u.master.view());
      u.params = u.full_params.view();
    }
  } else {  // ZERO1: every rank owns a shard; gather them
    if (!u.full_params.live()) u.full_params = buffer(BufferRole::FullParams, pd, p.layout.padded_numel, true);
    shard_comm_.all_gather(u.full_params.view(), gather_source(u));
    u.send.reset();
    u.params = u.full_params.view();
  }
  u.state = ParamState::Gathered;
}

// This rank's slice for an all-gather: the f32 master itself, or a param-dtype copy that lives
// only until the gather completes (a persistent copy per unit would cost param-dtype bytes of the
// whole shard). Under offload the master is in host memory: the compute-dtype shard is made on the
// CPU (in the reused pinned staging buffer when it needs a cast) and copied up, synchronously.
const Tensor& ShardedModel::gather_source(Unit& u) {
  const Arith a{ledger_ != nullptr};
  const DType pd = plan_.precision.param;
  const int64_t n = u.plan->shard_numel;
  if (plan_.offload.params) {
    u.send = buffer(BufferRole::Staging, pd, n, false);
    if (pd == DType::F32) {
      a.copy(u.send.view(), u.master.view());
    } else {
      const Tensor host = ledger_ ? Tensor{} : Tensor::view(host_staging_.view().data, pd, {n});
      a.cast(host, u.master.view());
      a.copy(u.send.view(), host);
    }
    return u.send.view();
  }
  if (pd == DType::F32) return u.master.view();
  u.send = buffer(BufferRole::Staging, pd, n, false);
  a.cast(u.send.view(), u.master.view());
  return u.send.view();
}

void ShardedModel::gather_start(Unit& u) {
  if (u.state != ParamState::Sharded) return;
  const PlannedUnit& p = *u.plan;
  if (p.trains()) {
    u.full_params = buffer(BufferRole::FullParams, plan_.precision.param, p.layout.padded_numel, false);
    u.pending = shard_comm_.all_gather_async(u.full_params.view(), gather_source(u));
  }
  if (u.frozen.live()) {
    u.frozen_full = buffer(BufferRole::FullParams, plan_.precision.param, p.frozen.padded_numel, false);
    u.frozen_pending = shard_comm_.all_gather_async(u.frozen_full.view(), u.frozen.view());
  }
  if (u.nf4.live() && p.nf4_chunks > 1) {  // the packed bytes and their state, as stored
    u.nf4_full = buffer(BufferRole::FullParams, DType::U8, p.nf4_chunks * p.nf4_store_bytes, false);
    u.nf4_pending = shard_comm_.all_gather_async(as_f32(u.nf4_full.view()), as_f32(u.nf4.view()));
  }
  u.state = ParamState::Gathering;
}

void ShardedModel::wait_gathered(Unit& u, model::StagedModel& m) {
  if (u.state == ParamState::Sharded) gather_start(u);
  if (u.state == ParamState::Gathering) {
    const timeline::Span span([&] { return "gather wait " + u.plan->name; }, "wait");
    if (u.pending) {
      u.pending->wait();
      u.pending.reset();
      u.send.reset();
      u.params = u.full_params.view();
    }
    if (u.frozen_pending) {
      u.frozen_pending->wait();
      u.frozen_pending.reset();
      u.frozen_params = u.frozen_full.view();
    }
    if (u.nf4_pending) {
      u.nf4_pending->wait();
      u.nf4_pending.reset();
    }
    u.state = ParamState::Gathered;
  }
  if (u.nf4.live() && !u.dequantized.live()) dequantize(u);
  bind(u, m.weights(), u.params, true);
}

// QLoRA: the dequantized weights last one visit; the next one dequantizes again.
void ShardedModel::end_visit(Unit& u, model::StagedModel& m) {
  if (!u.dequantized.live()) return;
  u.dequantized.reset();
  unbind(u, m.weights());
}

void ShardedModel::release(Unit& u, model::StagedModel& m) {
  if (u.plan->persistent || u.state != ParamState::Gathered) return;
  u.full_params.reset();
  u.frozen_full.reset();
  u.nf4_full.reset();
  u.params = u.frozen_params = Tensor{};
  u.state = ParamState::Sharded;
  unbind(u, m.weights());  // any use of a freed unit fails loudly instead of reading freed memory
}

// Binds the unit's tensors to views of `flat` (its trained layout) and, with_frozen, its frozen
// ones (the frozen buffer and QLoRA's dequantized weights). Without, the frozen tensors stay
// unbound: that is how gradients are bound, since a frozen weight has none.
void ShardedModel::bind(const Unit& u, model::LlamaWeights& w, const Tensor& flat, bool with_frozen) const {
  const Tensor frozen = with_frozen ? u.frozen_params : Tensor{};
  const Tensor dequantized = with_frozen && u.dequantized.live() ? u.dequantized.view() : Tensor{};
  auto lookup = [&](const std::string& name) -> Tensor {
    for (const auto& [layout, buf] : {std::pair{&u.plan->layout, &flat}, std::pair{&u.plan->frozen, &frozen},
                                      std::pair{&u.plan->quantized, &dequantized}})
      for (const FlatEntry& e : layout->entries) {
        if (e.info.name != name) continue;
        if (!buf->defined() && layout != &u.plan->layout) return Tensor{};
        char* base = buf->data ? static_cast<char*>(buf->data) + size_t(e.offset) * dtype_size(buf->dtype) : nullptr;
        // The view carries the buffer's device: ops dispatch on it.
        return Tensor::view(base, buf->dtype, e.info.shape.data(), int(e.info.shape.size()), buf->device);
      }
    throw Error("not in this unit", {.tensor = name});
  };
  for (int part : u.plan->parts) model::bind_part(cfg_, plan_.parts[size_t(part)], w, lookup);
}

void ShardedModel::unbind(const Unit& u, model::LlamaWeights& w) const {
  for (int part : u.plan->parts) model::bind_part(cfg_, plan_.parts[size_t(part)], w, {});
}

// ---- gradients -------------------------------------------------------------------------------------

void ShardedModel::acquire_grad(Unit& u, model::StagedModel& m) {
  if (!u.plan->trains()) return;
  reduce_finish(u);  // NO_SHARD and ZERO1 accumulate into the buffer their reduction reads
  if (!u.plan->solo && !u.full_grad.live()) {
    u.full_grad = buffer(BufferRole::FullGrad, DType::F32, u.plan->layout.padded_numel, true);  // zeroed
    u.grads = u.full_grad.view();
  }
  bind(u, m.grads(), u.grads, false);
}

// Starts handing a unit's accumulated gradients to their owners. NO_SHARD all-reduces the full
// buffer in place (it stays, accumulating over micro-batches and steps); the others reduce-scatter
// it into this rank's shard; sharded-gradient strategies hand the full buffer to the reduction and
// unbind it. Sums, not averages: every rank's gradients are already scaled by 1 / (global batch
// tokens). reduce_finish completes it.
void ShardedModel::reduce_start(Unit& u, model::StagedModel& m) {
  const PlannedUnit& p = *u.plan;
  if (p.solo || !p.trains()) return;  // the gradients are already in the shard, or there are none
  reduce_finish(u);                   // one reduction per unit in flight
  const Arith a{ledger_ != nullptr};
  const DType wire = plan_.precision.reduce;
  const bool low = wire != DType::F32;
  const Tensor full = u.full_grad.view();
  if (low) {
    u.wire = buffer(BufferRole::Staging, wire, full.numel(), false);
    a.cast(u.wire.view(), full);
  }
  const Tensor send = low ? u.wire.view() : full;
  if (plan_.sharding.strategy == Strategy::NoShard) {
    u.reducing = shard_comm_.all_reduce_async(send, comm::ReduceOp::Sum);
  } else {
    u.reduced = buffer(BufferRole::Staging, DType::F32, p.shard_numel, false);
    if (low) u.wire_part = buffer(BufferRole::Staging, wire, p.shard_numel, false);
    u.reducing = shard_comm_.reduce_scatter_async(low ? u.wire_part.view() : u.reduced.view(), send, comm::ReduceOp::Sum);
    if (plan_.sharding.shard_gradients()) {
      u.reducing_grad = std::move(u.full_grad);
      u.grads = Tensor{};
      unbind(u, m.grads());
    }
  }
  reducing_.push_back(&u);
}

// Completes a unit's reduction, if one is in flight: the result lands in full_grad (NO_SHARD) or
// is added to the gradient shard (after the all-reduce across replicas on a hybrid mesh), and the
// reduction's buffers are freed.
void ShardedModel::reduce_finish(Unit& u) {
  if (!u.reducing) return;
  const Arith a{ledger_ != nullptr};
  {
    const timeline::Span span([&] { return "reduce wait " + u.plan->name; }, "wait");
    u.reducing->wait();
  }
  u.reducing.reset();
  if (plan_.sharding.strategy == Strategy::NoShard) {
    if (u.wire.live()) a.cast(u.full_grad.view(), u.wire.view());
  } else {
    if (u.wire_part.live()) a.cast(u.reduced.view(), u.wire_part.view());
    if (replicate_comm_) replicate_comm_->all_reduce(u.reduced.view(), comm::ReduceOp::Sum);
    if (plan_.offload.params) {
      // The reduced part comes down into the reused pinned staging buffer and is added to the host
      // shard, where the optimizer step reads it.
      const Tensor host = ledger_ ? Tensor{} : host_staging_.view().slice(0, u.plan->shard_numel);
      a.copy(host, u.reduced.view());
      a.add(u.grad_shard.view(), host);
    } else {
      a.add(u.grad_shard.view(), u.reduced.view());
    }
  }
  u.wire_part.reset();
  u.wire.reset();
  u.reduced.reset();
  u.reducing_grad.reset();
  std::erase(reducing_, &u);
}

// ---- the step ------------------------------------------------------------------------------------

template <class Compute>
void ShardedModel::run_visits(const std::vector<Visit>& visits, model::StagedModel& m, bool last_micro,
                              Compute compute) {
  const ShardingConfig& sc = plan_.sharding;
  for (const Visit& v : visits) {
    Unit& u = *units_[size_t(v.unit)];
    // For the collective watchdog's message, should this visit's collectives hang.
    comm::set_activity({step_, step_ > 0 ? nullptr : "evaluation", &u.plan->name});
    if (v.needs_params) wait_gathered(u, m);
    // Forward prefetch, and BACKWARD_PRE, issue the next unit's gather before this visit's
    // compute; BACKWARD_POST after it (FSDP's meanings).
    const bool post = v.backward && sc.backward_prefetch == BackwardPrefetch::Post;
    if (v.prefetch >= 0 && !post) gather_start(*units_[size_t(v.prefetch)]);
    if (v.backward) acquire_grad(u, m);
    // The reductions started before this visit run behind its compute; they finish after it.
    const std::vector<Unit*> earlier = reducing_;
    for (const Stage& s : v.stages) {
      const timeline::Span span([&] { return stage_label(s); }, "compute");
      compute(s);
    }
    if (v.prefetch >= 0 && post) gather_start(*units_[size_t(v.prefetch)]);
    if (v.backward) {
      // A unit's gradients are reduced once per backward, after its last visit (a tied embedding
      // and head accumulate both uses first, as FSDP's post-backward does): sharded ones in every
      // micro-batch (or, with no_sync, only the last), replicated ones in the last.
      const bool due = v.last_backward && (last_micro || (sc.shard_gradients() && sc.reduce_every_microbatch));
      if (due) reduce_start(u, m);
    }
    for (Unit* r : earlier) reduce_finish(*r);
    end_visit(u, m);
    if (v.free_after) release(u, m);
  }
  while (!reducing_.empty()) reduce_finish(*reducing_.front());  // the step reads every gradient
}

double ShardedModel::host_sum(double v, bool over_replicas) {
  v = mesh_.shard->all_reduce_sum(v);
  if (over_replicas && plan_.sharding.hybrid()) v = mesh_.replicate->all_reduce_sum(v);
  return v;
}

StepStats ShardedModel::train_step(model::StagedModel& m, const std::vector<model::Batch>& micro,
                                   const ops::AdamWConfig& opt, int64_t step, double max_grad_norm) {
  const Arith a{ledger_ != nullptr};
  step_ = step;
  comm::set_activity({step, "token count"});
  // The global batch's token count, so every rank scales its gradients by the same 1 / tokens.
  int64_t local_tokens = 0;
  for (const model::Batch& b : micro)
    if (b.targets)
      for (int64_t i = 0; i < b.B * b.T; ++i) local_tokens += b.targets[i] != ops::kIgnoreIndex;
  const double world_tokens = host_sum(double(local_tokens), true);
  const float grad_scale = world_tokens > 0 ? float(1.0 / world_tokens) : 0.0f;

  for (auto& u : units_) {
    if (u->grad_shard.live()) a.zero(u->grad_shard.view());
    if (u->full_grad.live()) a.zero(u->full_grad.view());  // NO_SHARD / ZERO1 keep theirs between steps
  }
  double loss_sum = 0.0;
  for (size_t i = 0; i < micro.size(); ++i) {
    const model::Batch& b = micro[i];
    m.reserve(b.B, b.T);
    run_visits(plan_.train, m, i + 1 == micro.size(), [&](const Stage& s) {
      switch (s.kind) {
        case StageKind::EmbedForward: m.embed_forward(b); break;
        case StageKind::BlockForward: m.block_forward(s.layer); break;
        case StageKind::Head: loss_sum += m.head_loss(b, grad_scale, true).loss_sum; break;
        case StageKind::BlockBackward: m.block_backward(s.layer); break;
        case StageKind::EmbedBackward: m.embed_backward(b); break;
      }
    });
  }
  step_ = 0;  // evaluation visits from here on, unless another step starts
  comm::set_activity({step, "loss and gradient norm"});
  StepStats st;
  st.tokens = int64_t(world_tokens);
  loss_sum = host_sum(loss_sum, true);
  st.loss = world_tokens > 0 ? loss_sum / world_tokens : 0.0;

  // Global gradient norm. Sharded optimizer: each shard group holds every element once (replicas
  // hold copies), so sum over the shard group. NO_SHARD: every rank holds all of it.
  const bool sharded = plan_.sharding.shard_optimizer();
  double sumsq = 0.0;
  for (auto& u : units_)
    if (u->plan->trains()) sumsq += a.sum_squares(sharded ? u->grad_shard.view() : u->full_grad.view());
  if (sharded) sumsq = host_sum(sumsq, false);
  st.grad_norm = std::sqrt(sumsq);
  if (!ledger_ && !(std::isfinite(st.loss) && std::isfinite(st.grad_norm))) {
    st.finite = false;
    st.nonfinite = first_nonfinite_gradient();
    return st;  // no optimizer step: weights and moments stay as they were
  }
  const timeline::Span span("optimizer step", "compute");
  optimizer_step(opt, step, ops::clip_coefficient(st.grad_norm, float(max_grad_norm)));
  return st;
}

// The first tensor, in unit order, whose reduced gradient holds a NaN or Inf on any rank of the
// shard group (collective over the host groups; only called after a non-finite step).
std::string ShardedModel::first_nonfinite_gradient() {
  const bool sharded = plan_.sharding.shard_optimizer();
  std::vector<std::pair<int, const FlatEntry*>> tensors;
  std::vector<float> bad;
  for (size_t k = 0; k < units_.size(); ++k) {
    const PlannedUnit& p = *units_[k]->plan;
    const Tensor& g = sharded ? units_[k]->grad_shard.view() : units_[k]->full_grad.view();
    for (const FlatEntry& e : p.layout.entries) {
      tensors.emplace_back(int(k), &e);
      bad.push_back(0.0f);
      const int64_t lo = std::max(p.own_begin, e.offset), hi = std::min(p.own_begin + p.own_numel, e.offset + e.info.numel());
      // A sum of squares is NaN or Inf exactly when an element is (or overflows, which is as bad).
      if (lo < hi && g.defined() && !std::isfinite(ops::sum_squares(g.slice(lo - p.own_begin, hi - p.own_begin))))
        bad.back() = 1.0f;
    }
  }
  mesh_.shard->all_reduce(Tensor::view(bad.data(), DType::F32, {int64_t(bad.size())}), comm::ReduceOp::Sum);
  for (size_t i = 0; i < bad.size(); ++i)
    if (bad[i] > 0) return fmt::format("{} (unit {})", tensors[i].second->info.name, units_[size_t(tensors[i].first)]->plan->name);
  return "";
}

// AdamW on what this rank owns, tensor by tensor (norms and biases without weight decay). Under
// offload master, gradient shard and moments are host tensors, so this runs on the CPU.
void ShardedModel::optimizer_step(const ops::AdamWConfig& opt, int64_t step, float clip) {
  ops::AdamWConfig no_decay = opt;
  no_decay.weight_decay = 0.0;
  for (auto& up : units_) {
    Unit& u = *up;
    const PlannedUnit& p = *u.plan;
    if (!ledger_) {
      const Tensor& g = plan_.sharding.shard_optimizer() ? u.grad_shard.view() : u.full_grad.view();
      for_each_overlap(p.layout, p.own_begin, p.own_begin + p.own_numel, [&](const FlatEntry& e, int64_t lo, int64_t hi) {
        const int64_t a = lo - p.own_begin, z = hi - p.own_begin;
        ops::adamw_step(u.master.view().slice(a, z), g.slice(a, z), u.exp_avg.view().slice(a, z),
                        u.exp_avg_sq.view().slice(a, z), e.info.weight_decay ? opt : no_decay, step, clip);
      });
    }
    refresh_params(u);
  }
}

ops::CrossEntropyResult ShardedModel::forward_loss(model::StagedModel& m, const model::Batch& b) {
  m.reserve(b.B, b.T);
  ops::CrossEntropyResult r;
  run_visits(plan_.eval, m, false, [&](const Stage& s) {
    switch (s.kind) {
      case StageKind::EmbedForward: m.embed_forward(b); break;
      case StageKind::BlockForward: m.block_forward(s.layer); break;
      case StageKind::Head: r = m.head_loss(b, 1.0f, false); break;
      default: break;  // no backward stages in evaluation
    }
  });
  return r;
}

void ShardedModel::forward_logits(model::StagedModel& m, const model::Batch& b, const Tensor& out) {
  m.reserve(b.B, b.T);
  run_visits(plan_.eval, m, false, [&](const Stage& s) {
    switch (s.kind) {
      case StageKind::EmbedForward: m.embed_forward(b); break;
      case StageKind::BlockForward: m.block_forward(s.layer); break;
      case StageKind::Head: m.head_logits(out); break;
      default: break;
    }
  });
}

// ---- whole units and checkpoints -------------------------------------------------------------------

void ShardedModel::gather_unit(int k, const Tensor& out) {
  Unit& u = *units_.at(size_t(k));
  const PlannedUnit& p = *u.plan;
  if (!p.trains()) return;  // nothing trained in it (a LoRA run's frozen unit)
  SHARDLM_CHECK(out.dtype == DType::F32 && out.numel() == p.layout.padded_numel && out.device == Device::CPU,
                "gather_unit {}: expected host f32[{}], got {}", p.name, p.layout.padded_numel, out.describe());
  const Arith a{ledger_ != nullptr};
  if (!plan_.sharding.shard_optimizer()) {  // every rank holds all of it
    if (!ledger_)
      device::copy_bytes(out.data, Device::CPU, u.master.view().data, u.master.view().device, out.nbytes());
    return;
  }
  if (device_ == Device::CPU) {
    shard_comm_.all_gather(out, u.master.view());
    return;
  }
  // GPU communicators read device memory: the shard goes up (from offloaded host memory) or is
  // read in place, the gathered unit comes down.
  FlatBuffer full = buffer(BufferRole::Staging, DType::F32, p.layout.padded_numel, false);
  FlatBuffer up;
  if (u.master.view().device != device_) {
    up = buffer(BufferRole::Staging, DType::F32, p.shard_numel, false);
    a.copy(up.view(), u.master.view());
  }
  shard_comm_.all_gather(full.view(), up.live() ? up.view() : u.master.view());
  a.copy(out, full.view());
}

ShardedModel::StateRange ShardedModel::owned_state(int k) {
  Unit& u = *units_.at(size_t(k));
  if (!u.plan->trains()) return {};
  // Checkpoints read and write these views as host memory.
  SHARDLM_CHECK(u.master.view().device == Device::CPU,
                "checkpoints of GPU-resident optimizer state are not implemented yet");
  return {u.plan->own_begin, u.plan->own_numel, u.master.view(), u.exp_avg.view(), u.exp_avg_sq.view()};
}

Tensor ShardedModel::owned_grad(int k) const {
  const Unit& u = *units_.at(size_t(k));
  return plan_.sharding.shard_optimizer() ? u.grad_shard.view() : u.full_grad.view();
}

ShardedModel::StateRange ShardedModel::checkpoint_state(int k) {
  StateRange s = owned_state(k);
  if (s.numel == 0) return s;
  int copies = 1, index = 0;
  if (plan_.sharding.strategy == Strategy::NoShard) {
    copies = mesh_.shard->size();  // the data-parallel group: every rank holds everything
    index = mesh_.shard->rank();
  } else if (plan_.sharding.hybrid()) {
    copies = mesh_.replicate->size();
    index = mesh_.replicate->rank();
  }
  if (copies == 1) return s;
  const int64_t part = (s.numel + copies - 1) / copies;
  const int64_t lo = std::min(s.numel, index * part), hi = std::min(s.numel, lo + part);
  return {s.begin + lo, hi - lo, s.master.slice(lo, hi), s.exp_avg.slice(lo, hi), s.exp_avg_sq.slice(lo, hi)};
}

void ShardedModel::master_weights_changed() {
  for (auto& u : units_) refresh_params(*u);
}

}  // namespace shardlm::shard
