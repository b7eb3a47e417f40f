#include "shard/load.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "core/device.h"
#include "io/model_files.h"
#include "model/lora.h"
#include "model/nf4_loader.h"
#include "ops/nf4.h"
#include "shard/engine.h"

namespace shardlm::shard {

namespace {

int64_t nf4_blocks(int64_t n) { return (n + ops::kNf4BlockSize - 1) / ops::kNf4BlockSize; }

// Writes one unit's elements on this rank. Values are made in f32 in host memory by a fill
// function fill(begin, end, out) over flat elements [begin, end) of a layout; what lives on a GPU
// or in the param dtype is staged and converted once. The staging buffers are the engine's, so a
// dry run counts them too; on the meta device there are no values, and nothing is filled.
class UnitFiller {
 public:
  UnitFiller(ShardedModel& engine, int unit)
      : e_(engine), p_(engine.plan().units.at(size_t(unit))), t_(engine.load_targets(unit)),
        gpu_(engine.device() == Device::CUDA), values_(engine.device() != Device::Meta) {}

  // The f32 master; a GPU-resident one through a host staging copy (charged to Communication,
  // like the other staging buffers).
  template <class Fill>
  void master(Fill fill) const {
    const Tensor& m = t_.master;
    if (!p_.trains() || !values_) return;
    if (m.device == Device::CPU) {
      fill(p_.own_begin, p_.own_begin + p_.own_numel, m.f32());
      return;
    }
    OwnedTensor host(DType::F32, {m.numel()}, MemCategory::Communication, false);
    fill(p_.own_begin, p_.own_begin + p_.own_numel, host.t.f32());
    device::copy(m, host.t);
  }

  // The frozen base, stored in the param dtype: made in f32 on the host, then cast (on the
  // device, after an upload, for a GPU) into place once.
  template <class Fill>
  void frozen(Fill fill) const {
    const Tensor& dst = t_.frozen;
    if (p_.rest_frozen_offset < 0) return;
    const BufferMaker& make = e_.buffers();
    const int64_t n = dst.numel(), begin = p_.persistent ? 0 : e_.plan().shard_rank * p_.frozen_shard_numel;
    if (dst.dtype == DType::F32 && !gpu_) {
      if (values_) fill(begin, begin + n, dst.f32());
      return;
    }
    const FlatBuffer host = make(BufferRole::Staging, DType::F32, n, true, gpu_);
    if (values_) fill(begin, begin + n, host.view().f32());
    if (!gpu_) {
      ops::cast(dst, host.view());
      return;
    }
    const FlatBuffer up = make(BufferRole::Staging, DType::F32, n, false);
    device::copy(up.view(), host.view());
    ops::cast(dst, up.view());
  }

  // QLoRA: this rank quantizes only its own chunk of each weight (f32 values from `fill`, in host
  // memory, then copied to the device). With double quantization the offset is the mean of the
  // absmax values of the whole weight: one sum over the shard group per weight. A weight that
  // `stored` (a bitsandbytes directory) holds in NF4 is not quantized again: its chunk is copied
  // from the file as stored (load_weights checked that the layouts agree).
  template <class Fill>
  void nf4(Fill fill, const model::Nf4ModelReader* stored = nullptr) const {
    if (p_.rest_nf4_offset < 0) return;
    const BufferMaker& make = e_.buffers();
    const int c = p_.nf4_chunks > 1 ? e_.plan().shard_rank : 0;
    FlatBuffer host_store;  // staging in pinned host memory for a GPU store
    Tensor store = t_.nf4_store;
    if (gpu_) {
      host_store = make(BufferRole::Staging, DType::U8, p_.nf4_store_bytes, true, true);
      store = host_store.view();
    }
    for (const Nf4Piece& piece : p_.nf4) {
      const int64_t lo = piece.lo(c), hi = piece.hi(c), m = hi - lo;
      const bool nested = piece.chunk.nested;
      ops::Nf4Tensor q;
      if (m > 0) q = nf4_chunk(static_cast<char*>(store.data) + piece.offset, piece.chunk, m, store.device);
      // Every rank takes the same branch (the file decides), so the sums below stay collective.
      if (stored && stored->is_quantized(piece.entry.info.name)) {
        if (m > 0 && values_) stored->read_chunk(piece.entry.info.name, lo / ops::kNf4BlockSize, nf4_blocks(hi), q);
        continue;
      }
      FlatBuffer absmax;  // nested: the f32 absmax values before their own quantization
      double sum = 0;
      if (m > 0) {
        const FlatBuffer x = make(BufferRole::Staging, DType::F32, m, false, gpu_);
        if (nested) absmax = make(BufferRole::Staging, DType::F32, nf4_blocks(m), false, gpu_);
        if (values_) fill(piece.entry.offset + lo, piece.entry.offset + hi, x.view().f32());
        ops::nf4_quantize(q.packed, nested ? absmax.view() : q.absmax, x.view());
        if (nested) sum = ops::nf4_absmax_sum(absmax.view());
      }
      if (!nested) continue;
      if (p_.nf4_chunks > 1) sum = e_.mesh().shard->all_reduce_sum(sum);
      if (m == 0) continue;
      const float offset = ops::nf4_offset_from_sum(sum, nf4_blocks(piece.entry.info.numel()));
      device::copy_bytes(q.offset.data, q.offset.device, &offset, Device::CPU, sizeof offset);
      ops::nf4_quantize_absmax(q.absmax, q.nested_absmax, absmax.view(), q.offset);
    }
    if (gpu_) device::copy(t_.nf4_store, store);
  }

 private:
  ShardedModel& e_;
  const PlannedUnit& p_;
  ShardedModel::LoadTargets t_;
  bool gpu_;     // the engine's buffers are on a GPU: values are staged in host memory first
  bool values_;  // false on the meta device
};

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

// DoRA: the magnitude vectors among elements [begin, end) of unit p's trained layout, set as PEFT
// initializes them: the row norms of the base weight as the forward will see it (B is zero, so
// W + scale B A = W and the model starts as the base). That is the weight rounded as the run
// keeps it: through NF4 for QLoRA (unless the file holds it in NF4 already: then it is used as
// stored) and to the param dtype. `base(layout, out)` gives a one-weight layout's f32 values, as
// the frozen base is filled; `stored_nf4(name)` says whether the file holds the weight in NF4.
template <class Base, class StoredNf4>
void fill_dora_magnitudes(const ShardedModel& engine, const PlannedUnit& p, int64_t begin, int64_t end, Base base,
                          StoredNf4 stored_nf4, float* out) {
  for_each_overlap(p.layout, begin, end, [&](const FlatEntry& e, int64_t lo, int64_t hi) {
    if (e.info.init != model::Init::DoraMagnitude) return;
    const std::string name = model::dora_base_weight_name(e.info.name);
    const FlatEntry* w = nullptr;
    bool nf4 = false;  // kept in NF4 by this run
    for (const FlatLayout* l : {&p.frozen, &p.quantized})
      for (const FlatEntry& f : l->entries)
        if (f.info.name == name) {
          w = &f;
          nf4 = l == &p.quantized;
        }
    SHARDLM_CHECK(w != nullptr && w->info.shape.size() == 2 && w->info.shape[0] == e.info.numel(),
                  "DoRA magnitude '{}': no base weight '{}' of {} rows in unit {}", e.info.name, name, e.info.numel(),
                  p.name);
    const int64_t rows = w->info.shape[0], cols = w->info.shape[1], n = rows * cols;
    const OwnedTensor values(DType::F32, {n}, MemCategory::Workspace, false);
    base(make_flat_layout(p.name, {w->info}, 1, 1), values.t.f32());
    if (nf4 && !stored_nf4(name)) model::nf4_round_in_place(values.t, engine.finetune().nf4_double_quant);
    if (const DType pd = engine.sharding().param_dtype; pd != DType::F32) {
      const OwnedTensor low(pd, {n}, MemCategory::Workspace, false);
      ops::cast(low.t, values.t);
      ops::cast(values.t, low.t);
    }
    const int64_t r0 = lo - e.offset, r1 = hi - e.offset;
    ops::row_norms(Tensor::view(out + (lo - begin), DType::F32, {r1 - r0}),
                   Tensor::view(values.t.f32() + r0 * cols, DType::F32, {r1 - r0, cols}));
  });
}

}  // namespace

void init_random(ShardedModel& engine, uint64_t seed) {
  const float std = float(engine.config().initializer_range);
  for (int k = 0; k < engine.num_units(); ++k) {
    const PlannedUnit& p = engine.plan().units[size_t(k)];
    const UnitFiller fill(engine, k);
    fill.frozen([&](int64_t begin, int64_t end, float* out) { init_flat_range(p.frozen, begin, end, seed, std, out); });
    fill.nf4([&](int64_t begin, int64_t end, float* out) { init_flat_range(p.quantized, begin, end, seed, std, out); });
    fill.master([&](int64_t begin, int64_t end, float* out) {
      init_flat_range(p.layout, begin, end, seed, std, out);
      fill_dora_magnitudes(
          engine, p, begin, end,
          [&](const FlatLayout& one, float* values) { init_flat_range(one, 0, one.numel, seed, std, values); },
          [](const std::string&) { return false; }, out);
    });
  }
  engine.master_weights_changed();
}

void load_weights(ShardedModel& engine, const io::ModelWeights& weights, const std::string& source, uint64_t seed,
                  const AdapterLookup& adapter) {
  const ModelConfig& cfg = engine.config();
  const bool lora = engine.finetune().lora.has_value();
  // A directory saved by transformers from a bitsandbytes 4-bit model holds its Linear weights as
  // NF4 states (none in any other directory). QLoRA keeps them as stored, which needs the chunk
  // layout's double quantization to be the file's: checked for every weight before any reading.
  const model::Nf4ModelReader stored(weights, cfg);
  for (const PlannedUnit& p : engine.plan().units)
    for (const Nf4Piece& piece : p.nf4) {
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
  std::vector<const FlatLayout*> layouts;
  for (int k = 0; k < engine.num_units(); ++k) {
    const PlannedUnit& p = engine.plan().units[size_t(k)];
    const UnitFiller fill(engine, k);
    // A LoRA run: the file holds the frozen base, and the adapters are new.
    fill.frozen([&](int64_t begin, int64_t end, float* out) { load_dense_range(p.frozen, begin, end, weights, stored, source, out); });
    fill.nf4([&](int64_t begin, int64_t end, float* out) { load_dense_range(p.quantized, begin, end, weights, stored, source, out); },
             &stored);
    layouts.push_back(lora ? &p.frozen : &p.layout);
    layouts.push_back(&p.quantized);
    fill.master([&](int64_t begin, int64_t end, float* out) {
      if (lora && adapter) {
        std::fill(out, out + (end - begin), 0.0f);  // the padding after the tensors stays zero
        for_each_overlap(p.layout, begin, end, [&](const FlatEntry& e, int64_t lo, int64_t hi) {
          const Tensor t = adapter(e.info.name);
          std::copy(t.f32() + (lo - e.offset), t.f32() + (hi - e.offset), out + (lo - begin));
        });
      } else if (lora) {
        init_flat_range(p.layout, begin, end, seed, float(cfg.initializer_range), out);
        fill_dora_magnitudes(
            engine, p, begin, end,
            [&](const FlatLayout& one, float* values) {
              load_dense_range(one, 0, one.numel, weights, stored, source, values);
            },
            [&](const std::string& name) { return stored.is_quantized(name); }, out);
      } else
        load_dense_range(p.layout, begin, end, weights, stored, source, out);
    });
  }
  engine.master_weights_changed();
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

}  // namespace shardlm::shard
