#include "core/timeline.h"

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace shardlm::timeline {

namespace {

struct Event {
  std::string name;
  const char* category;
  int track;
  Clock::time_point begin, end;
};

std::atomic<bool> g_recording{false};
std::mutex g_mu;
std::vector<Event> g_events;  // guarded by g_mu
Clock::time_point g_origin;   // guarded by g_mu

// JSON string contents: unit names are plain, but a name is never trusted to be.
std::string escaped(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", int(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void start() {
  std::lock_guard lock(g_mu);
  g_events.clear();
  g_origin = Clock::now();
  g_recording.store(true, std::memory_order_relaxed);
}

void stop() { g_recording.store(false, std::memory_order_relaxed); }

bool recording() { return g_recording.load(std::memory_order_relaxed); }

void record(std::string_view name, const char* category, int track, Clock::time_point begin, Clock::time_point end) {
  if (!recording()) return;
  std::lock_guard lock(g_mu);
  g_events.push_back({std::string(name), category, track, begin, end});
}

std::string chrome_trace_json(int rank) {
  std::lock_guard lock(g_mu);
  auto us = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  out += fmt::format(R"({{"ph": "M", "name": "process_name", "pid": {0}, "args": {{"name": "rank {0}"}}}})", rank);
  out += fmt::format(",\n" R"({{"ph": "M", "name": "thread_name", "pid": {}, "tid": {}, "args": {{"name": "main"}}}})",
                     rank, kMainTrack);
  out += fmt::format(",\n" R"({{"ph": "M", "name": "thread_name", "pid": {}, "tid": {}, "args": {{"name": "communication"}}}})",
                     rank, kCommTrack);
  for (const Event& e : g_events)
    out += fmt::format(",\n" R"({{"ph": "X", "name": "{}", "cat": "{}", "pid": {}, "tid": {}, "ts": {:.1f}, "dur": {:.1f}}})",
                       escaped(e.name), e.category, rank, e.track, us(e.begin - g_origin), us(e.end - e.begin));
  out += "\n]}\n";
  return out;
}

}  // namespace shardlm::timeline
