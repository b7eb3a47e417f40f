#include "shard/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/device.h"
#include "io/model_files.h"
#include "shard/wrap.h"

namespace shardlm::shard {

// One engine unit: consecutive model units (the root and/or decoder layers) in one flat buffer.
struct ShardedModel::Unit {
  std::vector<int> model_units;  // 0 = root, 1 + l = layer l
  FlatLayout layout;             // padded to a multiple of the shard group size
  int64_t shard_numel = 0;       // padded / shard group size
  int64_t own_begin = 0;         // first flat element this rank stores (0 when unsharded)
  int64_t own_numel = 0;         // elements this rank stores: shard_numel, or padded when unsharded
  bool has_root = false;
  std::vector<int64_t> layers;   // decoder layers, in order
  // Optimizer side (pinned host memory under offload, else the engine's device):
  OwnedTensor master, m, v;      // f32 [own_numel]: what this rank optimizes
  OwnedTensor grad_shard;        // f32 [shard_numel]: reduced gradients (sharded strategies and ZeRO-1)
  // Compute side (always the engine's device):
  OwnedTensor full_params;       // param_dtype [padded] while gathered (persistent for NO_SHARD / ZERO1)
  OwnedTensor full_grad;         // f32 [padded] while the backward accumulates into it
  OwnedTensor send;              // param_dtype [shard_numel] while a bf16 (or offloaded) all-gather is in flight
  std::unique_ptr<comm::Request> pending;
  bool gathered = false;
  // A shard group of one rank (one process, not hybrid): the shard is the whole buffer, so the
  // parameters are the master weights (or one bf16 copy of them) and gradients accumulate straight
  // into the shard: no gathers, no reductions, no per-step buffers. FULL_SHARD on one process then
  // does the work of NO_SHARD. Never under offload: there the shard is in host memory and the
  // backward needs its gradients on the GPU, so the one-rank gathers and reductions do the copies.
  bool solo = false;
};


ShardedModel::ShardedModel(const ModelConfig& cfg, const ShardingConfig& sharding, Mesh& mesh, Mesh* scalar_mesh)
    : cfg_(cfg),
      sharding_(sharding),
      mesh_(mesh),
      scalars_(scalar_mesh ? *scalar_mesh : mesh),
      device_(mesh.shard->device()),
      offload_(sharding.offload_params) {
  SHARDLM_CHECK(!offload_ || (device_ == Device::CUDA && sharding.shard_gradients()),
                "CPU offload needs CUDA communicators and a strategy that shards gradients (got {} on {})",
                strategy_name(sharding.strategy), device_name(device_));
  SHARDLM_CHECK(scalars_.shard->device() == Device::CPU, "the scalar mesh must be CPU communicators");
  const std::vector<model::UnitLayout> parts = model::llama_units(cfg);
  const std::vector<std::vector<int>> groups = wrap_units(parts, sharding);
  const int S = mesh.shard->size(), r = mesh.shard->rank();
  for (const std::vector<int>& g : groups) {
    auto u = std::make_unique<Unit>();
    u->model_units = g;
    model::UnitLayout merged{parts[size_t(g[0])].name, {}};
    for (int part : g) {
      if (part == 0) u->has_root = true;
      else u->layers.push_back(part - 1);
      for (const model::ParamInfo& p : parts[size_t(part)].params) merged.params.push_back(p);
    }
    u->layout = make_flat_layout(merged, S);
    u->shard_numel = u->layout.padded_numel / S;
    const bool sharded = sharding.shard_optimizer();
    u->own_begin = sharded ? r * u->shard_numel : 0;
    u->own_numel = sharded ? u->shard_numel : u->layout.padded_numel;
    u->master = state_tensor(DType::F32, u->own_numel, MemCategory::Parameters);
    u->m = state_tensor(DType::F32, u->own_numel, MemCategory::Optimizer);
    u->v = state_tensor(DType::F32, u->own_numel, MemCategory::Optimizer);
    u->solo = sharded && S == 1 && !sharding.hybrid() && !offload_;
    if (u->solo) {
      u->grad_shard = state_tensor(DType::F32, u->shard_numel, MemCategory::Gradients);
      u->full_grad.t = u->grad_shard.t;  // a view: the backward accumulates into the shard itself
      if (sharding.param_dtype == DType::F32) u->full_params.t = u->master.t;
      else
        u->full_params =
            OwnedTensor(sharding.param_dtype, {u->layout.padded_numel}, MemCategory::Parameters, true, device_);
      u->gathered = true;
    } else if (sharded) {
      u->grad_shard = state_tensor(DType::F32, u->shard_numel, MemCategory::Gradients);
    }
    units_.push_back(std::move(u));
  }
}

ShardedModel::~ShardedModel() = default;

OwnedTensor ShardedModel::state_tensor(DType dtype, int64_t n, MemCategory category) const {
  if (!offload_) return OwnedTensor(dtype, {n}, category, true, device_);
  OwnedTensor t;
  t.buffer = Buffer::pinned_host(size_t(n) * dtype_size(dtype), category);
  t.t = Tensor::of(t.buffer, dtype, {n});
  return t;
}

// Initialization and loading write host memory; a GPU-resident master is filled through a host
// staging copy (charged to Communication, like the other staging buffers).
template <class Fill>
void ShardedModel::fill_master(Unit& u, Fill fill) {
  if (u.master.t.device == Device::CPU) {
    fill(u.master.t.f32());
    return;
  }
  OwnedTensor host(DType::F32, {u.own_numel}, MemCategory::Communication, false);
  fill(host.t.f32());
  device::copy(u.master.t, host.t);
}

std::vector<std::string> ShardedModel::names() const {
  std::vector<std::string> out;
  for (const auto& u : units_)
    for (const FlatEntry& e : u->layout.entries) out.push_back(e.info.name);
  return out;
}

int64_t ShardedModel::padded_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u->layout.padded_numel;
  return n;
}

int64_t ShardedModel::padded_numel(int unit) const { return units_[size_t(unit)]->layout.padded_numel; }

// ---- initialization and loading: only this rank's elements -----------------------------------

void ShardedModel::init_random(uint64_t seed) {
  for (auto& up : units_) {
    Unit& u = *up;
    fill_master(u, [&](float* out) {
      init_flat_range(u.layout, u.own_begin, u.own_begin + u.own_numel, seed, float(cfg_.initializer_range), out);
    });
    refresh_full_params(u);
  }
}

void ShardedModel::load(const io::ModelWeights& weights, const std::string& source) {
  std::vector<const FlatLayout*> layouts;
  for (auto& up : units_) {
    Unit& u = *up;
    fill_master(u, [&](float* out) {
      load_flat_range(u.layout, u.own_begin, u.own_begin + u.own_numel, weights, source, out);
    });
    layouts.push_back(&u.layout);
    refresh_full_params(u);
  }
  check_no_extra_tensors(layouts, weights, source);
}

// ---- parameters: gather, bind, release ---------------------------------------------------------

// Strategies that keep full parameters between steps (NO_SHARD, ZERO1) refresh them here after
// the master weights change; the others gather on demand.
void ShardedModel::refresh_full_params(Unit& u) {
  if (u.solo) {
    if (sharding_.param_dtype != DType::F32) ops::cast(u.full_params.t, u.master.t);
    return;
  }
  const bool persistent = !sharding_.shard_gradients();
  if (!persistent) return;
  const int64_t padded = u.layout.padded_numel;
  if (!u.full_params.buffer.data() && !(sharding_.strategy == Strategy::NoShard && sharding_.param_dtype == DType::F32))
    u.full_params = OwnedTensor(sharding_.param_dtype, {padded}, MemCategory::Parameters, true, device_);
  if (sharding_.strategy == Strategy::NoShard) {
    if (sharding_.param_dtype == DType::F32)
      u.full_params.t = u.master.t;  // the master weights are the full parameters
    else
      ops::cast(u.full_params.t, u.master.t);
  } else {  // ZERO1: every rank owns a shard; gather them
    mesh_.shard->all_gather(u.full_params.t, gather_source(u));
    u.send = OwnedTensor();
  }
  u.gathered = true;
}

void ShardedModel::gather_start(Unit& u) {
  if (u.gathered || u.pending) return;
  u.full_params = OwnedTensor(sharding_.param_dtype, {u.layout.padded_numel}, MemCategory::Parameters, false, device_);
  u.pending = mesh_.shard->all_gather_async(u.full_params.t, gather_source(u));
}

// This rank's slice for an all-gather: the f32 master itself, or a param_dtype copy that lives only
// until the gather completes (a persistent copy per unit would cost param_dtype bytes of the whole
// shard, as much as 1/8 of a bf16 run's model states).
//
// Under offload the master is in host memory: the compute-dtype shard is made on the CPU (a pinned
// staging copy when it needs a cast) and copied to the GPU, where the all-gather reads it. The copy
// is synchronous, so the staging buffer may go at once.
const Tensor& ShardedModel::gather_source(Unit& u) {
  if (offload_) {
    u.send = OwnedTensor(sharding_.param_dtype, {u.shard_numel}, MemCategory::Communication, false, device_);
    if (sharding_.param_dtype == DType::F32) {
      device::copy(u.send.t, u.master.t);
    } else {
      OwnedTensor host = state_tensor(sharding_.param_dtype, u.shard_numel, MemCategory::Communication);
      ops::cast(host.t, u.master.t);
      device::copy(u.send.t, host.t);
    }
    return u.send.t;
  }
  if (sharding_.param_dtype == DType::F32) return u.master.t;
  u.send = OwnedTensor(sharding_.param_dtype, {u.shard_numel}, MemCategory::Communication, false, device_);
  ops::cast(u.send.t, u.master.t);
  return u.send.t;
}

void ShardedModel::ensure_gathered(Unit& u, model::LlamaCompute& c) {
  if (!u.gathered) {
    gather_start(u);
    u.pending->wait();
    u.pending.reset();
    u.send = OwnedTensor();
    u.gathered = true;
  }
  bind(u, c, false);
}

void ShardedModel::release(Unit& u, model::LlamaCompute& c) {
  if (!sharding_.shard_gradients() || u.solo || !u.gathered) return;  // NO_SHARD / ZERO1 / solo keep them
  u.full_params = OwnedTensor();
  u.gathered = false;
  // Unbind, so that any use of a freed unit fails loudly instead of reading freed memory.
  auto none = [](const std::string&) { return Tensor{}; };
  for (int64_t l : u.layers) c.weights().layers[size_t(l)] = model::bind_layer(cfg_, l, none);
  if (u.has_root) model::bind_root(cfg_, c.weights(), none);
}

void ShardedModel::bind(Unit& u, model::LlamaCompute& c, bool grads) {
  const OwnedTensor& flat = grads ? u.full_grad : u.full_params;
  auto lookup = [&](const std::string& name) -> Tensor {
    for (const FlatEntry& e : u.layout.entries) {
      if (e.info.name != name) continue;
      char* base = static_cast<char*>(flat.t.data) + size_t(e.offset) * dtype_size(flat.t.dtype);
      // The view must carry the buffer's device: ops dispatch on it.
      return Tensor::view(base, flat.t.dtype, e.info.shape.data(), int(e.info.shape.size()), flat.t.device);
    }
    throw Error("not in this unit", {.tensor = name});
  };
  model::LlamaWeights& w = grads ? c.grads() : c.weights();
  if (w.layers.size() != size_t(cfg_.num_hidden_layers)) w.layers.resize(size_t(cfg_.num_hidden_layers));
  for (int64_t l : u.layers) w.layers[size_t(l)] = model::bind_layer(cfg_, l, lookup);
  if (u.has_root) model::bind_root(cfg_, w, lookup);
}

// ---- gradients -----------------------------------------------------------------------------

void ShardedModel::ensure_grad(Unit& u, model::LlamaCompute& c) {
  if (!u.full_grad.t.defined())
    u.full_grad = OwnedTensor(DType::F32, {u.layout.padded_numel}, MemCategory::Gradients, true, device_);  // zeroed
  bind(u, c, true);
}

// After a unit's backward: hand its gradients to their owners. Unsharded gradients (NO_SHARD,
// ZERO1) accumulate in the full buffer over all micro-batches and are reduced once, at the last;
// sharded ones are reduce-scattered every micro-batch (or at the last, with no_sync) and the
// full buffer is freed.
void ShardedModel::reduce_grad(Unit& u, model::LlamaCompute& c, bool last_micro) {
  if (u.solo) return;  // the gradients are already in the shard
  const bool sharded = sharding_.shard_gradients();
  if (!last_micro && (!sharded || !sharding_.reduce_every_microbatch)) return;
  comm::Communicator& group = *mesh_.shard;
  const DType rd = sharding_.reduce_dtype;
  if (sharding_.strategy == Strategy::NoShard) {
    // Sum, not average: each rank's gradients are already scaled by 1 / (global batch tokens).
    if (rd == DType::F32) {
      group.all_reduce(u.full_grad.t, comm::ReduceOp::Sum);
    } else {
      OwnedTensor low(rd, {u.layout.padded_numel}, MemCategory::Communication, false, device_);
      ops::cast(low.t, u.full_grad.t);
      group.all_reduce(low.t, comm::ReduceOp::Sum);
      ops::cast(u.full_grad.t, low.t);
    }
    return;
  }
  OwnedTensor part(DType::F32, {u.shard_numel}, MemCategory::Communication, false, device_);
  if (rd == DType::F32) {
    group.reduce_scatter(part.t, u.full_grad.t, comm::ReduceOp::Sum);
  } else {
    OwnedTensor low(rd, {u.layout.padded_numel}, MemCategory::Communication, false, device_);
    OwnedTensor low_part(rd, {u.shard_numel}, MemCategory::Communication, false, device_);
    ops::cast(low.t, u.full_grad.t);
    group.reduce_scatter(low_part.t, low.t, comm::ReduceOp::Sum);
    ops::cast(part.t, low_part.t);
  }
  if (sharding_.hybrid()) mesh_.replicate->all_reduce(part.t, comm::ReduceOp::Sum);
  if (offload_) {
    // The reduced part comes back to the host shard, where the optimizer step will read it. The
    // copy waits for the compute stream, which the collective's wait() ordered after the reduction.
    OwnedTensor host = state_tensor(DType::F32, u.shard_numel, MemCategory::Communication);
    device::copy(host.t, part.t);
    ops::add_inplace(u.grad_shard.t, host.t);
  } else {
    ops::add_inplace(u.grad_shard.t, part.t);
  }
  if (sharded) {
    u.full_grad = OwnedTensor();
    auto none = [](const std::string&) { return Tensor{}; };
    for (int64_t l : u.layers) c.grads().layers[size_t(l)] = model::bind_layer(cfg_, l, none);
    if (u.has_root) model::bind_root(cfg_, c.grads(), none);
  }
}

// ---- the step ------------------------------------------------------------------------------

ops::CrossEntropyResult ShardedModel::run_micro_batch(model::LlamaCompute& c, const model::Batch& b, float grad_scale,
                                                      bool last) {
  const bool reshard = sharding_.reshard_after_forward();
  const int n = int(units_.size());
  // Forward, unit by unit; the root (embedding, head) stays gathered until its backward ends.
  for (int i = 0; i < n; ++i) {
    Unit& u = *units_[size_t(i)];
    ensure_gathered(u, c);
    if (sharding_.forward_prefetch && i + 1 < n) gather_start(*units_[size_t(i) + 1]);
    if (u.has_root) c.embed_forward(b);
    for (int64_t l : u.layers) c.block_forward(int(l));
    if (reshard && !u.has_root) release(u, c);
  }
  Unit& root = *units_[0];
  ensure_grad(root, c);
  const ops::CrossEntropyResult loss = c.head_loss(b, grad_scale, true);
  // Backward in reverse; BACKWARD_PRE issues the next unit's gather before this unit's compute,
  // BACKWARD_POST after it (FSDP's meanings).
  for (int i = n - 1; i >= 0; --i) {
    Unit& u = *units_[size_t(i)];
    ensure_gathered(u, c);
    if (sharding_.backward_prefetch == BackwardPrefetch::Pre && i > 0) gather_start(*units_[size_t(i) - 1]);
    ensure_grad(u, c);
    for (auto it = u.layers.rbegin(); it != u.layers.rend(); ++it) c.block_backward(int(*it));
    if (u.has_root) c.embed_backward(b);
    if (sharding_.backward_prefetch == BackwardPrefetch::Post && i > 0) gather_start(*units_[size_t(i) - 1]);
    reduce_grad(u, c, last);
    if (sharding_.shard_gradients()) release(u, c);
  }
  return loss;
}

StepStats ShardedModel::train_step(model::LlamaCompute& c, const std::vector<model::Batch>& micro,
                                   const ops::AdamWConfig& opt, int64_t step, double max_grad_norm) {
  // The global batch's token count, so every rank scales its gradients by the same 1 / tokens.
  int64_t local_tokens = 0;
  for (const model::Batch& b : micro)
    for (int64_t i = 0; i < b.B * b.T; ++i) local_tokens += b.targets[i] != ops::kIgnoreIndex;
  double world_tokens = scalars_.shard->all_reduce_sum(double(local_tokens));
  if (sharding_.hybrid()) world_tokens = scalars_.replicate->all_reduce_sum(world_tokens);
  const float grad_scale = world_tokens > 0 ? float(1.0 / world_tokens) : 0.0f;

  for (auto& u : units_) {
    if (u->grad_shard.buffer.data()) ops::zero(u->grad_shard.t);
    if (u->full_grad.buffer.data()) ops::zero(u->full_grad.t);
  }
  double loss_sum = 0.0;
  for (size_t m = 0; m < micro.size(); ++m) {
    c.reserve(micro[m].B, micro[m].T);
    loss_sum += run_micro_batch(c, micro[m], grad_scale, m + 1 == micro.size()).loss_sum;
  }
  StepStats st;
  st.tokens = int64_t(world_tokens);
  loss_sum = scalars_.shard->all_reduce_sum(loss_sum);
  if (sharding_.hybrid()) loss_sum = scalars_.replicate->all_reduce_sum(loss_sum);
  st.loss = world_tokens > 0 ? loss_sum / world_tokens : 0.0;

  // Global gradient norm. Sharded gradients: each shard group holds every element once (replicas
  // hold copies), so sum over the shard group. NO_SHARD: every rank holds all of it.
  double sumsq = 0.0;
  for (auto& u : units_) sumsq += ops::sum_squares(sharding_.shard_optimizer() ? u->grad_shard.t : u->full_grad.t);
  if (sharding_.shard_optimizer()) sumsq = scalars_.shard->all_reduce_sum(sumsq);
  st.grad_norm = std::sqrt(sumsq);
  const float clip = ops::clip_coefficient(st.grad_norm, float(max_grad_norm));

  // AdamW on what this rank owns, tensor by tensor (norms and biases without weight decay). Under
  // offload master, gradient shard and moments are host tensors, so this runs on the CPU.
  ops::AdamWConfig no_decay = opt;
  no_decay.weight_decay = 0.0;
  for (auto& up : units_) {
    Unit& u = *up;
    const Tensor& g = sharding_.shard_optimizer() ? u.grad_shard.t : u.full_grad.t;
    for_each_overlap(u.layout, u.own_begin, u.own_begin + u.own_numel, [&](const FlatEntry& e, int64_t lo, int64_t hi) {
      const int64_t a = lo - u.own_begin, z = hi - u.own_begin;
      ops::adamw_step(u.master.t.slice(a, z), g.slice(a, z), u.m.t.slice(a, z), u.v.t.slice(a, z),
                      e.info.weight_decay ? opt : no_decay, step, clip);
    });
    refresh_full_params(u);
  }
  return st;
}

ops::CrossEntropyResult ShardedModel::forward_loss(model::LlamaCompute& c, const model::Batch& b) {
  c.reserve(b.B, b.T);
  for (auto& up : units_) {
    Unit& u = *up;
    ensure_gathered(u, c);
    if (u.has_root) c.embed_forward(b);
    for (int64_t l : u.layers) c.block_forward(int(l));
    if (!u.has_root) release(u, c);
  }
  const ops::CrossEntropyResult r = c.head_loss(b, 1.0f, false);
  release(*units_[0], c);
  return r;
}

// ---- checkpoints -------------------------------------------------------------------------------

const FlatLayout& ShardedModel::layout(int unit) const { return units_.at(size_t(unit))->layout; }

ShardedModel::StateRange ShardedModel::owned_state(int unit) {
  Unit& u = *units_.at(size_t(unit));
  // Checkpoints read and write these views as host memory.
  SHARDLM_CHECK(u.master.t.device == Device::CPU, "checkpoints of GPU-resident optimizer state are not implemented yet");
  return {u.own_begin, u.own_numel, u.master.t, u.m.t, u.v.t};
}

ShardedModel::StateRange ShardedModel::checkpoint_state(int unit) {
  StateRange s = owned_state(unit);
  int copies = 1, index = 0;
  if (sharding_.strategy == Strategy::NoShard) {
    copies = mesh_.shard->size();  // the data-parallel group: every rank holds everything
    index = mesh_.shard->rank();
  } else if (sharding_.hybrid()) {
    copies = mesh_.replicate->size();
    index = mesh_.replicate->rank();
  }
  if (copies == 1) return s;
  const int64_t part = (s.numel + copies - 1) / copies;
  const int64_t lo = std::min(s.numel, index * part), hi = std::min(s.numel, lo + part);
  return {s.begin + lo, hi - lo, s.master.slice(lo, hi), s.exp_avg.slice(lo, hi), s.exp_avg_sq.slice(lo, hi)};
}

void ShardedModel::master_weights_changed() {
  for (auto& u : units_) refresh_full_params(*u);
}

std::vector<float> ShardedModel::gather_tensor(const std::string& name) {
  for (const auto& up : units_)
    for (const FlatEntry& e : up->layout.entries)
      if (e.info.name == name) {
        std::vector<float> out(size_t(e.info.numel()));
        gather_tensor(name, Tensor::view(out.data(), DType::F32, {e.info.numel()}));
        return out;
      }
  throw Error("no such parameter in this model", {.tensor = name});
}

void ShardedModel::gather_tensor(const std::string& name, const Tensor& out) {
  for (auto& up : units_) {
    Unit& u = *up;
    for (const FlatEntry& e : u.layout.entries) {
      if (e.info.name != name) continue;
      SHARDLM_CHECK(out.dtype == DType::F32 && out.numel() == e.info.numel(), "gather_tensor {}: expected f32[{}], got {}",
                    name, e.info.numel(), out.describe());
      // The whole unit is staged (the gather works on whole flat buffers), in a tracked buffer:
      // for the root of a large model this is hundreds of MiB.
      OwnedTensor full(DType::F32, {u.layout.padded_numel}, MemCategory::Communication, false, device_);
      if (sharding_.shard_optimizer()) {
        // The all-gather reads device memory: an offloaded (host) master shard goes up first.
        OwnedTensor up;
        if (u.master.t.device != device_) up = device::copy_to_device(u.master.t, MemCategory::Communication, device_);
        mesh_.shard->all_gather(full.t, up.t.defined() ? up.t : u.master.t);
      } else {
        device::copy_bytes(full.t.data, device_, u.master.t.data, u.master.t.device, size_t(u.layout.padded_numel) * 4);
      }
      device::copy_bytes(out.data, out.device, static_cast<const float*>(full.t.data) + e.offset, device_,
                         size_t(e.info.numel()) * 4);
      return;
    }
  }
  throw Error("no such parameter in this model", {.tensor = name});
}

}  // namespace shardlm::shard
