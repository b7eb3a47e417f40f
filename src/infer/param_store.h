// ParamStore: a whole model's weights in one process, for what does not train: `init`, `generate`
// and `serve` (an adapter merged in memory), scoring in tests. Training of any size, one process included,
// goes through the sharding engine (shard/engine.h), which owns gradients and optimizer state.
// It lives with inference rather than in model/ because it lays weights out with the engine's own
// flat layouts and range functions (shard/flat_layout.h), and model/ sits below shard/.
//
// Per model part it owns an f32 flat buffer of weights and, when the compute dtype is bf16, a bf16
// copy of them (refreshed by sync_compute). Tensors are views into these buffers by Hugging Face
// name; they stay valid for the ParamStore's lifetime. Generation in bf16 (`--dtype bf16`) loads
// in f32 (NF4 dequantized, an adapter merged, in f32), then keeps only the bf16 weights
// (keep_only_bf16): its compute views change then, and stay valid from then on.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "infer/tensor_parallel.h"
#include "io/staged_dir.h"
#include "model/config.h"
#include "model/llama.h"
#include "ops/ops.h"
#include "shard/flat_layout.h"

namespace shardlm::io {
class ModelWeights;
}

namespace shardlm::infer {

class ParamStore {
 public:
  // Which model parts a store holds: all of them, or a rank's share of a model split over ranks
  // for generation (infer/placement.h). Parts left out have no memory here, are not read by
  // load(), and their slots in compute_weights() are unbound (undefined tensors).
  using PartFilter = std::function<bool(const model::ModelPart&)>;

  // With a tensor split (infer/tensor_parallel.h), the store holds this rank's slices: its tensors
  // have the shapes of sliced_config(cfg), load() reads only their byte ranges from the files of
  // the whole model `cfg` describes, and compute_weights() is a rank's model for a Generator
  // with the same split.
  ParamStore(const ModelConfig& cfg, DType compute_dtype, const PartFilter& keep = {}, const TensorSplit& split = {});

  // Random initialization as transformers does it (normal(0, initializer_range) for linear and
  // embedding weights, ones for norms, zeros for biases), element i of tensor "name" drawn from
  // the counter-based RNG at (seed, name, i): identical for any sharding.
  void init_random(uint64_t seed);
  // Copies every parameter from Hugging Face weights (any float dtype); names and shapes must
  // match the config exactly, and every file tensor must be used (a partial store reads only its
  // parts' byte ranges and does not look at the other tensors).
  void load(const io::ModelWeights& weights, const std::string& source);
  // A split store takes its slices from a whole store of the same model (`whole` holds every part
  // this store holds, unsplit): how a merged adapter or a load_in_4bit rounding, which work on whole
  // tensors, reach a split model (infer/load_weights.h).
  void load_slices(const ParamStore& whole);
  // Writes a Hugging Face model directory: the weights as a safetensors set in `dtype` (sharded above
  // max_shard_bytes), config.json and generation_config.json, and the tokenizer files copied from
  // `tokenizer_source` ("" for none), published as `publish` says (io/staged_dir.h; `role` names
  // `dir` in errors). A whole store only.
  void save(const std::string& dir, DType dtype, uint64_t max_shard_bytes, const std::string& tokenizer_source,
            io::Publish publish = io::Publish::Replace, const std::string& role = "the model directory") const;

  const model::LlamaWeights& compute_weights() const { return compute_; }
  Tensor master(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  bool partial() const { return partial_; }
  const TensorSplit& split() const { return split_; }
  std::vector<std::string> names() const;
  int64_t numel() const;

  // Refreshes the compute copy from the master weights (a no-op for f32 compute).
  void sync_compute();

  // For generation in bf16: rounds the f32 weights to bf16 once and frees them, one part at a time
  // (the peak is the f32 weights plus one part in bf16), leaving the bf16 weights alone (norms
  // included) as compute_weights(), which must be taken again afterwards. master(), init_random(),
  // load(), save() and sync_compute() are errors from then on.
  void keep_only_bf16();
  // For generation in q8_0: as keep_only_bf16, except that the decoder's Linear weights (those QLoRA
  // would quantize, model::quantized_by_qlora) whose rows are whole q8_0 blocks become q8_0
  // (core/q8_0.h): u8 tensors [rows, cols / 32 * 34] that compute_weights() binds, for
  // ops::matmul_q8_0. Every tensor is then held on its own (no flat buffers). Returns how many were
  // quantized; the names of those left in bf16 (rows not whole blocks of 32) go to `left_bf16`.
  int keep_only_q8_0(std::vector<std::string>* left_bf16 = nullptr);
  // For generation on a GPU: moves the compute weights (f32, or bf16 after keep_only_bf16) to
  // `device` one part at a time, freeing each part's host copy once it is there, and binds
  // compute_weights() to them (take them again afterwards). The f32 masters are gone from then on,
  // as after keep_only_bf16. q8_0 weights stay on the CPU (its matmul is a CPU op): an Error.
  void move_to(Device device);
  Device device() const { return device_; }
  // Bytes of weights held now (f32 masters and compute copies), wherever they are.
  int64_t bytes() const;

 private:
  struct Unit {
    shard::FlatLayout layout;
    OwnedTensor master, compute;
    // keep_only_q8_0: every tensor on its own by name (q8_0 u8, or bf16), master and compute freed.
    std::map<std::string, OwnedTensor> own;
  };
  struct Where {
    size_t unit;
    const shard::FlatEntry* entry;
  };
  // Errors once keep_only_bf16, keep_only_q8_0 or move_to has freed the f32 masters.
  void require_masters() const;
  Tensor entry_view(const OwnedTensor& flat, const shard::FlatEntry& e) const;
  const Where& where(const std::string& name) const;
  void bind();

  // The whole tensor's shape of each entry (a split store's entries have their slices' shapes).
  const std::vector<int64_t>& whole_shape(const std::string& name) const;

  ModelConfig cfg_;        // the whole model
  ModelConfig part_cfg_;   // the shapes held: cfg_, or sliced_config(cfg_) with a split
  TensorSplit split_;
  std::map<std::string, std::vector<int64_t>> whole_shapes_;  // with a split
  DType compute_dtype_;
  bool partial_ = false;  // some parts left out (PartFilter)
  bool masters_freed_ = false;  // keep_only_bf16, keep_only_q8_0 or move_to: the compute weights alone
  Device device_ = Device::CPU;  // where the compute weights are (move_to)
  std::vector<model::ModelPart> parts_;  // the parts held, one per unit
  std::vector<Unit> units_;
  std::map<std::string, Where> index_;
  model::LlamaWeights compute_;
};

}  // namespace shardlm::infer
