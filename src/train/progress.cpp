#include "train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/alloc.h"
#include "core/error.h"

namespace shardlm::train {

std::string format_duration(double seconds) {
  const int64_t s = int64_t(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

Progress::Progress(ProgressMode mode, int64_t log_every) : log_every_(log_every) {
  quiet_ = mode == ProgressMode::None;
  bar_ = mode == ProgressMode::Bar || (mode == ProgressMode::Auto && isatty(STDERR_FILENO));
}

void Progress::clear_bar() {
  if (bar_shown_) std::fprintf(stderr, "\r\033[K");
  bar_shown_ = false;
}

void Progress::step(const ProgressLine& s) {
  if (quiet_) return;
  const double eta = s.step > 0 ? s.elapsed_s / double(s.step) * double(s.total_steps - s.step) : 0.0;
  const std::string stats =
      fmt::format("loss {:.4f} | lr {:.2e} | grad {:.3f} | {:.0f} tok/s | {} < {} | {}", s.loss, s.lr,
                  s.grad_norm, s.tokens_per_s, format_duration(s.elapsed_s), format_duration(eta), s.mem);
  if (bar_) {
    constexpr int kWidth = 24;
    const int filled = int(kWidth * s.step / std::max<int64_t>(1, s.total_steps));
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[Kstep %lld/%lld [%s] %s", (long long)s.step, (long long)s.total_steps, bar.c_str(),
                 stats.c_str());
    std::fflush(stderr);
    bar_shown_ = true;
  } else if (s.step % log_every_ == 0 || s.step == s.total_steps || s.step == 1) {
    std::fprintf(stderr, "step %lld/%lld | %s\n", (long long)s.step, (long long)s.total_steps, stats.c_str());
  }
}

void Progress::print(const std::string& line) {
  if (quiet_) return;
  clear_bar();
  std::fprintf(stderr, "%s\n", line.c_str());
}

void Progress::finish() {
  if (bar_shown_) std::fprintf(stderr, "\n");
  bar_shown_ = false;
}

MetricsFile::MetricsFile(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) throw Error(fmt::format("cannot write metrics: {}", std::strerror(errno)), {.file = path});
}

MetricsFile::~MetricsFile() {
  if (f_) std::fclose(f_);
}

void MetricsFile::write(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    throw Error(fmt::format("cannot write metrics: {}", std::strerror(errno)), {.file = path_});
}

}  // namespace shardlm::train
