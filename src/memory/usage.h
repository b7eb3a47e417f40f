// Measured memory of a training run: the tracker's bytes by category, the process's resident set
// size, and how they are shown (progress line, metrics records, the end-of-run table).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/alloc.h"

namespace shardlm::memory {

// VmRSS and VmHWM (the RSS high-water mark) of this process from /proc/self/status, in bytes;
// -1 where that file is missing (not Linux).
struct ProcessMemory {
  int64_t rss = -1, rss_peak = -1;
};
ProcessMemory process_memory();

// "1.2G", "340M", "12K", "0": three significant figures at most, for the progress line.
std::string short_bytes(int64_t bytes);

// One compact progress-line field: live/peak tracked total, then live/peak per category that has
// been used, then RSS/high-water mark, e.g.
//   "mem 1.20G/1.50G (par 400M/400M grad 12M/50M opt 800M/800M act 300M/300M ws 0/40M) rss 2.1G/2.3G"
std::string memory_brief(const MemStats& m, const ProcessMemory& p);

// Adds the same figures to a metrics record: mem_live_bytes, mem_peak_bytes, mem_live_<category>,
// mem_peak_<category> for every category, rss_bytes and rss_peak_bytes.
void add_memory_fields(nlohmann::json& record, const MemStats& m, const ProcessMemory& p);

// The end-of-run table: per category current and peak, the tracked peak total and the RSS peak.
// On several ranks each figure is the maximum over ranks, with the rank that has it. A collective:
// every rank calls it; the lines are meant for rank 0 to print. `estimate` (may be null) adds the
// estimator's per-category peaks as a column.
std::vector<std::string> memory_summary(const MemStats& m, const ProcessMemory& p, comm::Communicator& world,
                                        const MemStats* estimate = nullptr);

}  // namespace shardlm::memory
