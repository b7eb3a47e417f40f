// Timeline: spans of what each thread of a rank did, recorded during the profile window
// (`profile_steps`) and written as Chrome trace-event JSON (opens in Perfetto or chrome://tracing).
//
// Two tracks per rank: the main thread (the engine's per-unit gather waits, forward and backward
// compute, gradient reductions, the optimizer step, data waits) and the communication progress
// thread (each collective from issue to completion). A collective's span on the comm track that
// lies beside compute on the main track is communication hidden behind compute.
//
// Recording is off unless start() was called; record() is then a single relaxed atomic load, so
// the spans can stay in hot paths. Thread-safe. Spans are kept in memory until chrome_trace_json
// (a few per unit per step: kilobytes per step).
// The caller writes the JSON (the trainer: atomically, one file per rank).
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <type_traits>

namespace shardlm::timeline {

using Clock = std::chrono::steady_clock;

// Chrome trace thread ids of the two tracks.
constexpr int kMainTrack = 1;
constexpr int kCommTrack = 2;

void start();  // clears what was recorded and starts recording
void stop();
bool recording();

// One finished span. `category` is a short fixed string ("compute", "comm", "wait", "data").
void record(std::string_view name, const char* category, int track, Clock::time_point begin, Clock::time_point end);

// A span of the main track from construction to destruction (only when recording).
class Span {
 public:
  Span(std::string_view name, const char* category) : on_(recording()) {
    if (on_) name_ = name, category_ = category, begin_ = Clock::now();
  }
  // A name made only when recording: Span([&] { return "gather wait " + unit; }, "wait").
  template <class MakeName>
    requires std::is_invocable_r_v<std::string, MakeName&>
  Span(MakeName&& make_name, const char* category) : on_(recording()) {
    if (on_) name_ = make_name(), category_ = category, begin_ = Clock::now();
  }
  ~Span() {
    if (on_) record(name_, category_, kMainTrack, begin_, Clock::now());
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  std::string name_;
  const char* category_ = "";
  Clock::time_point begin_;
};

// Every span recorded since start() as Chrome trace-event JSON, {"traceEvents": [...]}, with
// pid = rank, times in microseconds from start(), and names for the process and its tracks.
std::string chrome_trace_json(int rank);

}  // namespace shardlm::timeline
