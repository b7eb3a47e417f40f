// Sharded training checkpoints: every rank writes its own shard in parallel; any world size and
// strategy can resume from it; `shardlm convert` streams it into a Hugging Face model.
//
// A checkpoint is a directory (docs/checkpoints.md has the full format):
//
//   step_00000120/
//     rank_00000.safetensors ...  one per writing rank: for each engine unit k with elements on
//                                 that rank, f32 tensors "unit<k>.master", "unit<k>.exp_avg",
//                                 "unit<k>.exp_avg_sq" holding flat elements [begin, begin + n)
//                                 of unit k's buffer; the header's metadata records each begin and
//                                 CRC-32s of every 4 MiB block of every tensor.
//     metadata.json               rank 0, after every rank's file is in place: the format version,
//                                 the model config, every tensor's unit, offset and shape, every
//                                 file's size, ranges and checksums, the world size, strategy and
//                                 mesh, and the trainer's state (step, sampler position, schedule ...)
//     config.json, tokenizer files  so the directory converts without the base model
//     COMPLETE                    written last: a directory without it is an interrupted save
//
// Every file is written to a temporary name, fsynced and renamed (io/atomic_file.h), so a save
// killed at any moment leaves either a complete checkpoint or a directory without COMPLETE, which
// resume_from: auto skips with a warning, and earlier checkpoints are never touched.
//
// Readers map the files and copy only the byte ranges they need; before using a range they verify
// the checksums of the blocks it touches, so a flipped byte is reported (file, tensor, block)
// instead of being trained on.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "io/staged_dir.h"
#include "model/config.h"

namespace shardlm::shard {
class ShardedModel;
}

namespace shardlm::ckpt {

// 1: every field f32. 2: the moments may be bf16 (optimizer_state_dtype: bf16); written only then.
inline constexpr int kFormatVersion = 2;
inline constexpr const char* kMetadataName = "metadata.json";
inline constexpr const char* kCompleteName = "COMPLETE";
inline constexpr uint64_t kChecksumBlockBytes = 4u << 20;

// "step_00000120": checkpoint directories sort by step.
std::string step_dir_name(int64_t step);

struct SaveOptions {
  std::string dir;               // the checkpoint directory to create (replaced if incomplete)
  int64_t step = 0;
  nlohmann::json training;       // the trainer's state, stored verbatim (metadata "training")
  nlohmann::json run;            // world size, strategy, config ... stored verbatim (metadata "run")
  std::string tokenizer_source;  // a model directory whose tokenizer files are copied ("" for none)
};

struct SaveReport {
  std::string dir;
  int64_t step = 0;
  uint64_t rank_bytes = 0;   // what this rank wrote
  double rank_seconds = 0;   // its write time (serialize, checksum, write, fsync)
  uint64_t total_bytes = 0;  // all ranks (rank 0 only; 0 elsewhere)
  double seconds = 0;        // from the start of the save until COMPLETE was written
  double blocked_seconds = 0;  // of those, the time the caller was held (start + finish)
};

// Saving, in two collective halves, as torch.distributed.checkpoint's async_save does:
//
//   start:  rank 0 prepares the directory; every rank stages its state and writes its shard file.
//           Async: the state (what the rank writes: master, exp_avg, exp_avg_sq ranges) is copied
//           into a host staging buffer kept between saves — the only stall — and a background
//           thread checksums, serializes, writes and fsyncs the file while training goes on.
//           Sync: the same work on the calling thread, straight from the engine's buffers.
//   finish: waits for this rank's file, then (barrier) rank 0 reads every file's header and writes
//           metadata.json, the config and tokenizer files, and COMPLETE last.
//
// The background thread does file I/O only, never MPI (communicators are not thread-safe), which is
// why completion is a second collective call, made at the next save, at the end of training or at a
// stop. A process killed while a file is being written leaves this step's directory without
// COMPLETE, and every earlier checkpoint as it was.
class CheckpointSaver {
 public:
  explicit CheckpointSaver(bool async);
  // Waits for a write in flight (without completing the checkpoint: it stays incomplete).
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Collective. A save still in flight must have been finished first. `engine` and `cfg` must
  // live until finish returns.
  void start(const SaveOptions& opt, shard::ShardedModel& engine, const ModelConfig& cfg, comm::Communicator& world);
  bool in_flight() const { return pending_ != nullptr; }
  // Collective: completes the save in flight (throws this rank's write error, naming the file).
  SaveReport finish(comm::Communicator& world);

 private:
  struct Pending;
  bool async_;
  OwnedTensor staging_;  // async: this rank's written state, copied at the save step
  std::unique_ptr<Pending> pending_;
};

// A synchronous save: start and finish at once. Throws on any I/O error (the checkpoint is then
// left incomplete).
SaveReport save_checkpoint(const SaveOptions& opt, shard::ShardedModel& engine, const ModelConfig& cfg,
                           comm::Communicator& world);

// The checkpoint directories under `root`, newest first, with whether each is complete.
struct Found {
  std::string dir;
  int64_t step = 0;
  bool complete = false;
};
std::vector<Found> list_checkpoints(const std::string& root);
// The newest complete checkpoint under root, if any. Incomplete ones newer than it are reported
// through warn ("skipping <dir>: no COMPLETE marker (an interrupted save)").
std::optional<std::string> latest_complete(const std::string& root, const std::function<void(const std::string&)>& warn);
// Keeps the newest `keep` complete checkpoints under root and removes the older ones, and removes
// incomplete ones older than the newest complete one. Never touches anything newer.
void prune_checkpoints(const std::string& root, int keep);

// One tensor as the checkpoint stores it.
struct StoredTensor {
  std::string name;
  std::vector<int64_t> shape;
  int unit = 0;        // the saving engine's unit
  int64_t offset = 0;  // in that unit's flat buffer
  int64_t numel() const;
};

enum class Field { Master, ExpAvg, ExpAvgSq };
const char* field_name(Field f);  // "master", "exp_avg", "exp_avg_sq"

// A complete checkpoint opened for reading. The constructor reads and validates metadata.json and
// checks that every listed file exists with its recorded size, so a missing, truncated or
// mislabeled checkpoint is reported (naming the file) before anything is read. Files are mapped
// on first use. Not thread-safe.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string dir);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  const ModelConfig& model() const { return model_; }
  // A LoRA run's checkpoint: its adapters' spec (the checkpoint then holds only the adapters).
  const std::optional<model::LoraSpec>& lora() const { return lora_; }
  const nlohmann::json& metadata() const { return meta_; }
  const std::vector<StoredTensor>& tensors() const { return tensors_; }
  const StoredTensor& tensor(const std::string& name) const;  // throws naming the checkpoint and tensor

  // Elements [begin, begin + count) of one tensor's field, as f32, into dst. Verifies the
  // checksum of every block it touches (once per block); throws naming the file, tensor and block.
  void read(const std::string& tensor, Field field, int64_t begin, int64_t count, float* dst);
  // 8-bit moments as stored: the codes of elements [begin, begin + count) and the absmax of their
  // blocks (begin a multiple of 256), for a resuming run that keeps 8-bit moments too (exact).
  // False, reading nothing, when the checkpoint holds that field in another dtype.
  bool read_blockwise8(const std::string& tensor, Field field, int64_t begin, int64_t count, uint8_t* codes,
                       float* absmax);
  // Drops the mapped pages read so far from this process's resident set (convert's memory bound).
  void drop_resident_pages();

 private:
  struct File;
  File& open_file(size_t i);
  // The bytes of a stored tensor, each checksum block that [lo, hi) touches verified (once).
  const uint8_t* verified_bytes(File& f, const std::string& stored, uint64_t lo, uint64_t hi);
  // Each file's piece of elements [begin, begin + count) of a tensor: piece(file, its range, the
  // piece's first element in that range, its length, its position in [begin, begin + count)).
  // Throws when the files do not cover them exactly.
  struct Range;
  using Piece = std::function<void(File&, const Range&, int64_t first, int64_t n, int64_t at)>;
  void for_each_piece(const std::string& tensor, int64_t begin, int64_t count, const Piece& piece);
  std::string dir_;
  nlohmann::json meta_;
  int64_t step_ = 0;
  ModelConfig model_;
  std::optional<model::LoraSpec> lora_;
  std::vector<StoredTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::vector<std::unique_ptr<File>> files_;
};

// Fills this rank's optimizer state from a checkpoint saved with any world size, strategy or wrap
// policy: each rank reads only the ranges it owns. The checkpoint must hold exactly this model's
// tensors with the same shapes (otherwise: an Error naming the tensor). Not collective except for
// the refresh of ZERO1's gathered parameters. Returns the bytes this rank read.
uint64_t load_checkpoint(CheckpointReader& reader, shard::ShardedModel& engine);

// Writes a Hugging Face model directory from a checkpoint's master weights, tensor by tensor in
// bounded chunks: peak memory stays near a few staging buffers, whatever the model size.
struct ConvertOptions {
  std::string out;
  DType dtype = DType::F32;
  uint64_t max_shard_bytes = 5'000'000'000;
  io::Publish publish = io::Publish::Replace;    // how `out` appears (io/staged_dir.h)
  std::string role = "the output directory";  // names `out` in errors
};
void convert_checkpoint(CheckpointReader& reader, const ConvertOptions& opt);

// Writes a Hugging Face model directory from the engine's master weights (the final save of a run
// without checkpoints). Collective: the ranks gather one unit at a time (ShardedModel::gather_unit)
// and rank 0 streams it into the safetensors files, so no rank holds more than one unit in f32
// beyond its own shard. Tokenizer files are copied from `tokenizer_source`.
void export_model(shard::ShardedModel& engine, const ModelConfig& cfg, const ConvertOptions& opt,
                  const std::string& tokenizer_source, comm::Communicator& world);

}  // namespace shardlm::ckpt
