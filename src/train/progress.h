// What a training run shows while it runs: a progress bar on a terminal, plain lines otherwise,
// and metrics as JSON lines in a file.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace shardlm::train {

struct ProgressLine {
  int64_t step = 0, total_steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, elapsed_s = 0;
  std::string mem;  // memory::memory_brief: tracked bytes by category and RSS
};

// Bar: redraw one line on stderr; Lines: a line every log_every steps; None: quiet;
// Auto: a bar when stderr is a terminal, else lines.
enum class ProgressMode { Auto, Bar, Lines, None };

class Progress {
 public:
  Progress(ProgressMode mode, int64_t log_every);
  void step(const ProgressLine& s);
  // A line of its own (evaluation results, messages), printed above the bar.
  void print(const std::string& line);
  void finish();

 private:
  void clear_bar();
  bool bar_ = false, quiet_ = false, bar_shown_ = false;
  int64_t log_every_;
};

// Appends one JSON object per line, flushed each time (a crash keeps what was written).
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path);
  ~MetricsFile();
  void write(const nlohmann::json& record);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

std::string format_duration(double seconds);  // "1:02:03" or "02:03"

}  // namespace shardlm::train
