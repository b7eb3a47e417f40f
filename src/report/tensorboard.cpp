#include "report/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/platform.h"
#include "report/crc32c.h"
#include "report/event_codec.h"

namespace shardlm::report {

namespace fs = std::filesystem;

std::string tfrecord(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  const auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(char((v >> (8 * i)) & 0xFF));
  };
  const uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) out.push_back(char((n >> (8 * i)) & 0xFF));
  put32(masked_crc32c(std::string_view(out.data(), 8)));
  out += data;
  put32(masked_crc32c(data));
  return out;
}

std::vector<std::pair<std::string, double>> record_scalars(const nlohmann::json& record) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [key, v] : record.items()) {
    if (key == "step" || !v.is_number()) continue;  // is_number is false for booleans
    std::string tag;
    if (key.starts_with("eval_")) tag = "eval/" + key.substr(5);
    else if (key.starts_with("mem_") || key.starts_with("rss_") || key.starts_with("gpu_")) tag = "memory/" + key;
    else if (key.starts_with("checkpoint_")) tag = "checkpoint/" + key;
    else tag = "train/" + key;
    out.emplace_back(std::move(tag), v.get<double>());
  }
  return out;
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create the TensorBoard log directory: {}", ec.message()), {.file = dir});
  // The counter keeps two writers of one process in one second apart (tests make several).
  static std::atomic<int> counter{0};
  const double now = wall_time_now();
  path_ = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}.{}.{}", int64_t(now), host_name(), getpid(), counter++))
              .string();
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw Error(fmt::format("cannot write TensorBoard events: {}", std::strerror(errno)), {.file = path_});
  EventFields version;
  version.wall_time = now;
  version.file_version = "brain.Event:2";
  write_event(encode_event(version));
}

EventWriter::~EventWriter() {
  if (f_) std::fclose(f_);
}

void EventWriter::write_event(const std::string& serialized) {
  const std::string rec = tfrecord(serialized);
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size() || std::fflush(f_) != 0)
    throw Error(fmt::format("cannot write TensorBoard events: {}", std::strerror(errno)), {.file = path_});
}

void EventWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values, double wall_time) {
  if (values.empty()) return;
  EventFields e;
  e.wall_time = wall_time;
  e.step = step;
  for (const auto& [tag, v] : values) e.scalars.emplace_back(tag, float(v));  // simple_value is a float
  write_event(encode_event(e));
}

void EventWriter::record(const nlohmann::json& rec) {
  const auto step = rec.find("step");
  if (step == rec.end() || !step->is_number_integer()) return;
  scalars(step->get<int64_t>(), record_scalars(rec), wall_time_now());
}

}  // namespace shardlm::report
