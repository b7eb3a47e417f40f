// The weights of a Hugging Face model directory: one model.safetensors, or shards
// model-00001-of-0000N.safetensors listed by model.safetensors.index.json.
//
// Reading follows transformers: a directory holding model.safetensors is read from that file
// alone; otherwise model.safetensors.index.json names, in its "weight_map", the shard file of
// every tensor. Writing follows transformers' save_pretrained: shards are filled greedily in the
// given order up to max_shard_bytes, a single shard is saved as model.safetensors, and every file
// gets the metadata {"format": "pt"} that transformers checks when loading.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace shardlm::io {

inline constexpr const char* kSafetensorsSingleName = "model.safetensors";
inline constexpr const char* kSafetensorsIndexName = "model.safetensors.index.json";

// All weights of a model directory, each shard file opened (mapped and validated) once.
//
// Ownership and lifetime: the object owns every mapping. Tensor views from tensor() and the
// TensorInfo references from info() stay valid while this object (or the one it was moved into)
// lives. Thread-safe for concurrent reads.
class ModelWeights {
 public:
  // Throws Error naming the directory when it holds neither file, the index file (and tensor and
  // shard) when the index does not match the shards, or the shard file when a shard is corrupt or
  // belongs to another save than the index (see write_model_weights).
  explicit ModelWeights(std::string dir);
  ModelWeights(ModelWeights&&) noexcept = default;
  ModelWeights& operator=(ModelWeights&&) noexcept = default;

  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }  // read through the index
  const std::vector<SafetensorsFile>& files() const { return files_; }

  // Tensor names, sorted. In a sharded model only the tensors listed in the index are visible.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // The following throw Error naming the directory and the tensor when there is no such tensor.
  const TensorInfo& info(const std::string& name) const;
  Tensor tensor(const std::string& name) const;  // see SafetensorsFile::tensor
  void read_range(const std::string& name, uint64_t elem_begin, uint64_t elem_count, void* dst) const;
  const std::string& file_of(const std::string& name) const;  // path of the file holding it
  // info() of a float tensor (F32, BF16, F16) of exactly `shape`, as config.json implies it; else an
  // Error naming the file and the tensor (missing, another shape, not a float type).
  const TensorInfo& float_info(const std::string& name, const std::vector<int64_t>& shape) const;
  const SafetensorsFile& file_holding(const std::string& name) const;

 private:
  const SafetensorsFile& lookup(const std::string& name) const;
  std::string dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Save `tensors` (CPU, contiguous, F32/BF16/F16/I32, unique names) into directory `dir` (created
// if missing) as transformers does: model.safetensors if they fit one shard of max_shard_bytes,
// else model-0000i-of-0000N.safetensors plus model.safetensors.index.json holding
// {"metadata": {"total_size": <bytes>}, "weight_map": {name: shard file}}. A tensor larger than
// max_shard_bytes gets a shard of its own.
//
// Publishing: every file is written to a temporary name and synced first; then the shards are
// renamed into place, then the single file or index; only then are the model files of an earlier
// save that the new one does not use (an old index, old shards, an old model.safetensors) removed.
// A sharded save's files all carry one save id ("shardlm_save" in each shard's metadata and the
// index's), which ModelWeights checks, so a death among the final renames is reported on load
// rather than read as a mix of two models. A directory that must appear whole (convert, merge,
// init) is written through io/staged_dir.h around this.
void write_model_weights(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         uint64_t max_shard_bytes);

// The same, streaming: `plan` gives every tensor's name, dtype and shape (in save order), and
// fill(name, sink) is called once per tensor, in that order, to supply exactly its bytes through
// sink(bytes, n) in one or more chunks. Only what the filler stages is ever in memory, so a model
// larger than RAM can be written (shardlm convert).
using TensorSink = std::function<void(const void* bytes, size_t n)>;
using TensorFiller = std::function<void(const std::string& name, const TensorSink& sink)>;
void write_model_weights_streaming(const std::string& dir, const std::vector<PlannedTensor>& plan,
                                   uint64_t max_shard_bytes, const TensorFiller& fill);

// "5GB" -> 5e9, "500MB", "2GiB" -> 2^31, "1000" -> 1000, "1.5GB"; units B, KB, MB, GB, TB (powers
// of 1000, like Hugging Face) and KiB, MiB, GiB, TiB (powers of 1024), case-insensitive. Throws
// Error for anything else, a fraction of a byte, or a value above 2^64 - 1.
uint64_t parse_size(const std::string& text);

}  // namespace shardlm::io
