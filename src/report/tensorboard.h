// TensorBoard event files: what `report_to: tensorboard` writes (docs/reports.md).
//
// A file is a sequence of TFRecords, each an Event protocol buffer (event.proto, encoded by
// libprotobuf): first one with file_version "brain.Event:2", then one per metrics record with its
// numbers as scalar summaries. TFRecord framing: the data's length as a little-endian uint64, the
// masked CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace shardlm::report {

// One TFRecord around `data`.
std::string tfrecord(const std::string& data);

// The scalars of one metrics.jsonl record, as (tag, value) in the record's key order. Every
// number except "step" becomes a scalar (booleans, strings and nulls -- a skipped step's loss --
// do not). Tags group the keys the way TensorBoard's tabs show them: eval_X -> "eval/X",
// mem_*, rss_* and gpu_* -> "memory/<key>", checkpoint_* -> "checkpoint/<key>", the rest
// "train/<key>" (train/loss, train/lr, train/grad_norm, train/tokens_per_s, ...).
std::vector<std::pair<std::string, double>> record_scalars(const nlohmann::json& record);

// Writes one event file. The file is created by the constructor (parent directories included);
// each record is flushed as it is written, so a crash keeps every event before it. Errors name the file.
class EventWriter {
 public:
  // A new file in `dir`, named as TensorBoard's writers name theirs (events.out.tfevents.<seconds>.
  // <host>.<pid>.<n>: TensorBoard finds event files by "tfevents" in the name).
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event at `step` with the given scalars (nothing is written for an empty list).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values, double wall_time);
  // A metrics record's scalars at its "step" (records without one are ignored).
  void record(const nlohmann::json& rec);
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& serialized);
  std::FILE* f_ = nullptr;
  std::string path_;
};

// Seconds since the Unix epoch, as Event.wall_time carries it.
double wall_time_now();

}  // namespace shardlm::report
