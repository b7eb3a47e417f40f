#include "train/param_store.h"

#include <fmt/format.h>

#include "io/model_files.h"

namespace shardlm::train {

ParamStore::ParamStore(const ModelConfig& cfg, DType compute_dtype, Mode mode)
    : cfg_(cfg), compute_dtype_(compute_dtype), mode_(mode) {
  SHARDLM_CHECK(compute_dtype == DType::F32 || compute_dtype == DType::BF16,
                "compute dtype must be f32 or bf16, got {}", dtype_name(compute_dtype));
  for (const model::UnitLayout& u : model::llama_units(cfg)) {
    Unit unit;
    unit.layout = shard::make_flat_layout(u, 1);
    const int64_t n = unit.layout.padded_numel;
    unit.master = OwnedTensor(DType::F32, {n}, MemCategory::Parameters);
    if (mode == Mode::Trainable) {
      unit.grad = OwnedTensor(DType::F32, {n}, MemCategory::Gradients);
      unit.m = OwnedTensor(DType::F32, {n}, MemCategory::Optimizer);
      unit.v = OwnedTensor(DType::F32, {n}, MemCategory::Optimizer);
    }
    if (compute_dtype == DType::BF16) unit.compute = OwnedTensor(DType::BF16, {n}, MemCategory::Parameters);
    units_.push_back(std::move(unit));
  }
  for (size_t u = 0; u < units_.size(); ++u)
    for (const shard::FlatEntry& e : units_[u].layout.entries) index_[e.info.name] = {u, &e};
  bind();
}

Tensor ParamStore::entry_view(const OwnedTensor& flat, const shard::FlatEntry& e) const {
  const size_t esize = dtype_size(flat.t.dtype);
  char* base = static_cast<char*>(flat.t.data) + size_t(e.offset) * esize;
  return Tensor::view(base, flat.t.dtype, e.info.shape.data(), int(e.info.shape.size()));
}

const ParamStore::Where& ParamStore::where(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error("no such parameter in this model", {.tensor = name});
  return it->second;
}

void ParamStore::bind() {
  compute_ = model::bind_weights(cfg_, [&](const std::string& name) {
    const Where& w = where(name);
    const Unit& u = units_[w.unit];
    return entry_view(compute_dtype_ == DType::F32 ? u.master : u.compute, *w.entry);
  });
  if (mode_ == Mode::Trainable) grads_ = model::bind_weights(cfg_, [&](const std::string& name) { return grad(name); });
}

Tensor ParamStore::master(const std::string& name) const {
  const Where& w = where(name);
  return entry_view(units_[w.unit].master, *w.entry);
}

Tensor ParamStore::grad(const std::string& name) const {
  SHARDLM_CHECK(mode_ == Mode::Trainable, "a weights-only parameter store has no gradients");
  const Where& w = where(name);
  return entry_view(units_[w.unit].grad, *w.entry);
}

std::vector<std::string> ParamStore::names() const {
  std::vector<std::string> out;
  for (const Unit& u : units_)
    for (const shard::FlatEntry& e : u.layout.entries) out.push_back(e.info.name);
  return out;
}

int64_t ParamStore::numel() const {
  int64_t n = 0;
  for (const Unit& u : units_) n += u.layout.numel;
  return n;
}

void ParamStore::init_random(uint64_t seed) {
  for (Unit& u : units_)
    shard::init_flat_range(u.layout, 0, u.layout.padded_numel, seed, float(cfg_.initializer_range), u.master.t.f32());
  sync_compute();
}

void ParamStore::load(const io::ModelWeights& weights, const std::string& source) {
  std::vector<const shard::FlatLayout*> layouts;
  for (Unit& u : units_) {
    shard::load_flat_range(u.layout, 0, u.layout.padded_numel, weights, source, u.master.t.f32());
    layouts.push_back(&u.layout);
  }
  shard::check_no_extra_tensors(layouts, weights, source);
  sync_compute();
}

void ParamStore::save(const std::string& dir, DType dtype, uint64_t max_shard_bytes) const {
  // Convert unit by unit into one staging buffer per tensor so peak memory stays near the
  // model size in the target dtype (the master weights are already resident).
  std::vector<OwnedTensor> staged;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const Unit& u : units_) {
    for (const shard::FlatEntry& e : u.layout.entries) {
      const Tensor src = entry_view(u.master, e);
      if (dtype == DType::F32) {
        tensors.emplace_back(e.info.name, src);
        continue;
      }
      OwnedTensor& t = staged.emplace_back(dtype, std::initializer_list<int64_t>{src.numel()}, MemCategory::Workspace, false);
      Tensor dst = Tensor::view(t.t.data, dtype, e.info.shape.data(), int(e.info.shape.size()));
      ops::cast(dst, src);
      tensors.emplace_back(e.info.name, dst);
    }
  }
  io::write_model_weights(dir, tensors, max_shard_bytes);
}

void ParamStore::zero_grads() {
  SHARDLM_CHECK(mode_ == Mode::Trainable, "a weights-only parameter store has no gradients");
  for (Unit& u : units_) ops::zero(u.grad.t);
}

double ParamStore::grad_sum_squares() const {
  SHARDLM_CHECK(mode_ == Mode::Trainable, "a weights-only parameter store has no gradients");
  double s = 0.0;
  for (const Unit& u : units_) s += ops::sum_squares(u.grad.t);
  return s;
}

void ParamStore::adamw_step(const ops::AdamWConfig& cfg, int64_t step, float grad_scale) {
  SHARDLM_CHECK(mode_ == Mode::Trainable, "a weights-only parameter store cannot take an optimizer step");
  ops::AdamWConfig no_decay = cfg;
  no_decay.weight_decay = 0.0;
  for (Unit& u : units_) {
    for (const shard::FlatEntry& e : u.layout.entries) {
      const int64_t n = e.info.numel();
      auto part = [&](OwnedTensor& t) { return t.t.slice(e.offset, e.offset + n); };
      ops::adamw_step(part(u.master), part(u.grad), part(u.m), part(u.v), e.info.weight_decay ? cfg : no_decay, step,
                      grad_scale);
    }
  }
  sync_compute();
}

void ParamStore::sync_compute() {
  if (compute_dtype_ == DType::F32) return;
  for (Unit& u : units_) ops::cast(u.compute.t, u.master.t);
}

}  // namespace shardlm::train
