#include "infer/param_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/device.h"
#include "core/q8_0.h"
#include "io/model_files.h"
#include "model/hf_dir.h"
#include "model/nf4_loader.h"

namespace shardlm::infer {

ParamStore::ParamStore(const ModelConfig& cfg, DType compute_dtype, const PartFilter& keep, const TensorSplit& split)
    : cfg_(cfg), part_cfg_(split.active() ? sliced_config(cfg, split.ranks) : cfg), split_(split),
      compute_dtype_(compute_dtype) {
  SHARDLM_CHECK(compute_dtype == DType::F32 || compute_dtype == DType::BF16,
                "compute dtype must be f32 or bf16, got {}", dtype_name(compute_dtype));
  if (split.active())
    for (const model::ModelPart& part : model::llama_parts(cfg))
      for (const model::ParamInfo& info : part.params) whole_shapes_[info.name] = info.shape;
  for (model::ModelPart& part : model::llama_parts(part_cfg_)) {
    if (keep && !keep(part)) {
      partial_ = true;
      continue;
    }
    Unit unit;
    unit.layout = shard::make_flat_layout(part.name, part.params, 1);
    const int64_t n = unit.layout.padded_numel;
    unit.master = OwnedTensor(DType::F32, {n}, MemCategory::Parameters);
    if (compute_dtype == DType::BF16) unit.compute = OwnedTensor(DType::BF16, {n}, MemCategory::Parameters);
    units_.push_back(std::move(unit));
    parts_.push_back(std::move(part));
  }
  for (size_t u = 0; u < units_.size(); ++u)
    for (const shard::FlatEntry& e : units_[u].layout.entries) index_[e.info.name] = {u, &e};
  bind();
}

Tensor ParamStore::entry_view(const OwnedTensor& flat, const shard::FlatEntry& e) const {
  const size_t esize = dtype_size(flat.t.dtype);
  char* base = static_cast<char*>(flat.t.data) + size_t(e.offset) * esize;
  return Tensor::view(base, flat.t.dtype, e.info.shape.data(), int(e.info.shape.size()), flat.t.device);
}

const ParamStore::Where& ParamStore::where(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw Error("no such parameter in this model", {.tensor = name});
  return it->second;
}

void ParamStore::bind() {
  const model::TensorLookup lookup = [&](const std::string& name) {
    const Where& w = where(name);
    const Unit& u = units_[w.unit];
    if (!u.own.empty()) return u.own.at(name).t;
    return entry_view(compute_dtype_ == DType::F32 ? u.master : u.compute, *w.entry);
  };
  compute_ = {};
  compute_.layers.resize(size_t(cfg_.num_hidden_layers));  // a partial store leaves others' layers unbound
  for (const model::ModelPart& part : parts_) model::bind_part(part_cfg_, part, compute_, lookup);
}

void ParamStore::require_masters() const {
  SHARDLM_CHECK(!masters_freed_, "the f32 weights of this store were freed (kept in bf16 or q8_0, or moved to a GPU)");
}

Tensor ParamStore::master(const std::string& name) const {
  require_masters();
  const Where& w = where(name);
  return entry_view(units_[w.unit].master, *w.entry);
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

const std::vector<int64_t>& ParamStore::whole_shape(const std::string& name) const {
  if (!split_.active()) return where(name).entry->info.shape;
  return whole_shapes_.at(name);
}

void ParamStore::init_random(uint64_t seed) {
  SHARDLM_CHECK(!split_.active(), "random initialization of a store split over ranks");
  require_masters();
  for (Unit& u : units_)
    shard::init_flat_range(u.layout, 0, u.layout.padded_numel, seed, float(cfg_.initializer_range), u.master.t.f32());
  sync_compute();
}

void ParamStore::load(const io::ModelWeights& weights, const std::string& source) {
  require_masters();
  // A directory saved by transformers from a bitsandbytes 4-bit model holds its Linear weights as
  // NF4 states: those are read as bitsandbytes dequantizes them, in f32 (as the engine reads them).
  const model::Nf4ModelReader stored(weights, cfg_);
  // A tensor split over ranks is read run by run (tensor_parallel.h's slice_runs), as NF4 states are.
  auto sliced = [&](const shard::FlatEntry& e) { return whole_shape(e.info.name) != e.info.shape; };
  std::vector<const shard::FlatLayout*> layouts;
  Buffer tmp;
  for (Unit& u : units_) {
    shard::FlatLayout plain = u.layout;  // the other entries keep their offsets
    std::erase_if(plain.entries,
                  [&](const shard::FlatEntry& e) { return stored.is_quantized(e.info.name) || sliced(e); });
    shard::load_flat_range(plain, 0, u.layout.padded_numel, weights, source, u.master.t.f32());
    for (const shard::FlatEntry& e : u.layout.entries) {
      const bool nf4 = stored.is_quantized(e.info.name);
      if (!nf4 && !sliced(e)) continue;
      const std::vector<int64_t>& whole = whole_shape(e.info.name);
      float* dst = u.master.t.f32() + e.offset;
      if (nf4) {
        const std::vector<int64_t> shape = stored.state(e.info.name).shape;
        if (shape != whole) {
          const Tensor want = Tensor::view(nullptr, DType::F32, whole.data(), int(whole.size()));
          const Tensor got = Tensor::view(nullptr, DType::F32, shape.data(), int(shape.size()));
          throw Error(fmt::format("NF4 shape {} in the file, but config.json implies {}", got.shape_str(), want.shape_str()),
                      {.file = source, .tensor = e.info.name});
        }
        slice_runs(whole, e.info.shape, split_, [&](int64_t at, int64_t n, int64_t to) {
          stored.dequantize_range(e.info.name, at, at + n, dst + to);
        });
        continue;
      }
      const DType file_dtype = *weights.float_info(e.info.name, whole).dtype;
      slice_runs(whole, e.info.shape, split_, [&](int64_t at, int64_t n, int64_t to) {
        const size_t need = size_t(n) * dtype_size(file_dtype);
        if (tmp.bytes() < need) tmp = Buffer(need, MemCategory::Workspace, false);
        weights.read_range(e.info.name, uint64_t(at), uint64_t(n), tmp.data());
        ops::cast(Tensor::view(dst + to, DType::F32, {n}), Tensor::view(tmp.data(), file_dtype, {n}));
        for (int64_t i = 0; i < n; ++i)  // as load_flat_range checks
          if (!std::isfinite(dst[to + i]))
            throw Error(fmt::format("element {} is {}: the weights hold a non-finite value", at + i, dst[to + i]),
                        {.file = source, .tensor = e.info.name});
      });
    }
    layouts.push_back(&u.layout);
  }
  if (partial_) {
    // A rank's share: the other ranks' tensors are theirs to read and check.
  } else if (stored.quantized_names().empty()) {
    shard::check_no_extra_tensors(layouts, weights, source);
  } else {
    // The same check over the model's tensors, the NF4 states' entries (W.absmax, ...) left out.
    std::set<std::string> known;
    for (const shard::FlatLayout* l : layouts)
      for (const shard::FlatEntry& e : l->entries) known.insert(e.info.name);
    for (const std::string& name : stored.names())
      if (!known.count(name) && name.find("rotary_emb.inv_freq") == std::string::npos)
        throw Error("in the weights but not in the model described by config.json", {.file = source, .tensor = name});
  }
  sync_compute();
}

void ParamStore::load_slices(const ParamStore& whole) {
  SHARDLM_CHECK(!whole.split_.active(), "slices are taken from an unsplit store");
  for (Unit& u : units_)
    for (const shard::FlatEntry& e : u.layout.entries) {
      const Tensor src = whole.master(e.info.name);
      const float* from = src.f32();
      float* dst = u.master.t.f32() + e.offset;
      slice_runs(whole_shape(e.info.name), e.info.shape, split_,
                 [&](int64_t at, int64_t n, int64_t to) { std::copy(from + at, from + at + n, dst + to); });
    }
  sync_compute();
}

void ParamStore::save(const std::string& target, DType dtype, uint64_t max_shard_bytes,
                      const std::string& tokenizer_source, io::Publish publish, const std::string& role) const {
  SHARDLM_CHECK(!partial_ && !split_.active(), "cannot save a model from a store that holds only some of its parts");
  require_masters();
  io::check_publishable(target, publish, role);
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
  io::publish_dir(target, publish, role, [&](const std::string& dir) {
    io::write_model_weights(dir, tensors, max_shard_bytes);
    write_hf_side_files(dir, cfg_, dtype, tokenizer_source);
  });
}

void ParamStore::sync_compute() {
  if (compute_dtype_ == DType::F32) return;
  require_masters();
  for (Unit& u : units_) ops::cast(u.compute.t, u.master.t);
}

void ParamStore::keep_only_bf16() {
  if (masters_freed_) return;
  for (Unit& u : units_) {
    if (!u.compute.t.defined())
      u.compute = OwnedTensor(DType::BF16, {u.layout.padded_numel}, MemCategory::Parameters, false);
    ops::cast(u.compute.t, u.master.t);
    u.master = OwnedTensor();
  }
  compute_dtype_ = DType::BF16;
  masters_freed_ = true;
  bind();
}

int ParamStore::keep_only_q8_0(std::vector<std::string>* left_bf16) {
  require_masters();
  int quantized = 0;
  for (size_t k = 0; k < units_.size(); ++k) {
    Unit& u = units_[k];
    for (const shard::FlatEntry& e : u.layout.entries) {
      const Tensor w = entry_view(u.master, e);
      const int64_t cols = e.info.shape.back();
      if (model::held_in_q8_0(parts_[k], e.info)) {
        const int64_t rows = w.numel() / cols;
        OwnedTensor q(DType::U8, {rows, q8_0_bytes(cols)}, MemCategory::Parameters, false);
        try {
          quantize_q8_0(w.f32(), w.numel(), static_cast<uint8_t*>(q.t.data));
        } catch (Error& err) {
          err.set_tensor(e.info.name);
          throw;
        }
        u.own.emplace(e.info.name, std::move(q));
        ++quantized;
        continue;
      }
      if (model::quantized_by_qlora(parts_[k], e.info) && left_bf16) left_bf16->push_back(e.info.name);
      OwnedTensor h(DType::BF16, e.info.shape.data(), int(e.info.shape.size()), MemCategory::Parameters, false);
      ops::cast(h.t, w);
      u.own.emplace(e.info.name, std::move(h));
    }
    u.master = OwnedTensor();
    u.compute = OwnedTensor();
  }
  compute_dtype_ = DType::BF16;
  masters_freed_ = true;
  bind();
  return quantized;
}

void ParamStore::move_to(Device device) {
  if (device == device_) return;
  for (const Unit& u : units_)
    SHARDLM_CHECK(u.own.empty(), "q8_0 weights stay on the CPU (their matmul is a CPU op); {} is not for them",
                  device_name(device));
  for (Unit& u : units_) {
    OwnedTensor& held = compute_dtype_ == DType::F32 ? u.master : u.compute;
    OwnedTensor there(held.t.dtype, {held.t.numel()}, MemCategory::Parameters, false, device);
    device::copy_bytes(there.t.data, device, held.t.data, held.t.device, held.t.nbytes());
    held = std::move(there);
    if (compute_dtype_ != DType::F32) u.master = OwnedTensor();  // freed already after keep_only_bf16
  }
  device_ = device;
  masters_freed_ = true;
  bind();
}

int64_t ParamStore::bytes() const {
  int64_t n = 0;
  for (const Unit& u : units_) {
    for (const OwnedTensor* t : {&u.master, &u.compute})
      if (t->t.defined()) n += int64_t(t->t.nbytes());
    for (const auto& [name, t] : u.own) n += int64_t(t.t.nbytes());
  }
  return n;
}

}  // namespace shardlm::infer
