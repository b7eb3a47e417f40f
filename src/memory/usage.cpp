#include "memory/usage.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>

namespace shardlm::memory {

ProcessMemory process_memory() {
  ProcessMemory p;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return p;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) p.rss = kb * 1024;
    else if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) p.rss_peak = kb * 1024;
  }
  std::fclose(f);
  return p;
}

std::string short_bytes(int64_t bytes) {
  if (bytes < 0) return "?";
  const char* units = "BKMGT";
  double v = double(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{}", bytes);
  return v < 10 ? fmt::format("{:.2f}{}", v, units[u]) : v < 100 ? fmt::format("{:.1f}{}", v, units[u])
                                                                  : fmt::format("{:.0f}{}", v, units[u]);
}

namespace {
// Short names for the progress line, in MemCategory order.
constexpr const char* kShort[kNumMemCategories] = {"par", "grad", "opt", "act", "comm", "ws", "other", "act_off"};
}  // namespace

std::string memory_brief(const MemStats& m, const ProcessMemory& p) {
  std::string cats;
  for (int i = 0; i < kNumMemCategories; ++i)
    if (m.peak[size_t(i)] > 0)
      cats += fmt::format("{}{} {}/{}", cats.empty() ? "" : " ", kShort[i], short_bytes(m.live[size_t(i)]),
                          short_bytes(m.peak[size_t(i)]));
  return fmt::format("mem {}/{} ({}) rss {}/{}", short_bytes(m.live_total), short_bytes(m.peak_total), cats,
                     short_bytes(p.rss), short_bytes(p.rss_peak));
}

void add_memory_fields(nlohmann::json& r, const MemStats& m, const ProcessMemory& p) {
  r["mem_live_bytes"] = m.live_total;
  r["mem_peak_bytes"] = m.peak_total;
  for (int i = 0; i < kNumMemCategories; ++i) {
    const std::string name = mem_category_name(MemCategory(i));
    r["mem_live_" + name] = m.live[size_t(i)];
    r["mem_peak_" + name] = m.peak[size_t(i)];
  }
  r["rss_bytes"] = p.rss;
  r["rss_peak_bytes"] = p.rss_peak;
}

std::vector<std::string> memory_summary(const MemStats& m, const ProcessMemory& p, comm::Communicator& world,
                                        const MemStats* estimate) {
  // Every figure of this rank, in a fixed order: live and peak per category, the totals, RSS.
  std::vector<int64_t> mine;
  for (int i = 0; i < kNumMemCategories; ++i) {
    mine.push_back(m.live[size_t(i)]);
    mine.push_back(m.peak[size_t(i)]);
  }
  mine.insert(mine.end(), {m.live_total, m.peak_total, p.rss, p.rss_peak});
  // Max over ranks and its rank. The communicator reduces doubles by sum, so each rank's value
  // travels in its own slot (a sum of one non-zero term is exact below 2^53 bytes). The table is
  // printed once per run: a few dozen small reductions are nothing.
  const int W = world.size();
  std::vector<int64_t> best(mine.size(), -1);
  std::vector<int> at(mine.size(), 0);
  for (size_t q = 0; q < mine.size(); ++q)
    for (int r = 0; r < W; ++r) {
      const int64_t v = W == 1 ? mine[q] : int64_t(world.all_reduce_sum(world.rank() == r ? double(mine[q]) : 0.0));
      if (v > best[q]) {
        best[q] = v;
        at[q] = r;
      }
    }
  auto cell = [&](size_t q) {
    return W == 1 ? format_bytes(best[q]) : fmt::format("{} [rank {}]", format_bytes(best[q]), at[q]);
  };
  std::vector<std::string> lines;
  lines.push_back(W == 1 ? "memory (tracked bytes by category; RSS from /proc):"
                         : fmt::format("memory (the largest of {} ranks, [rank] that has it):", W));
  const char* est_head = estimate ? "  estimate (steps)" : "";
  lines.push_back(fmt::format("  {:<14} {:>24} {:>24}{}", "category", "current", "peak", est_head));
  const size_t tot = 2 * kNumMemCategories;
  for (int i = 0; i < kNumMemCategories; ++i) {
    const size_t q = 2 * size_t(i);
    if (best[q + 1] <= 0 && !(estimate && estimate->peak[size_t(i)] > 0)) continue;
    lines.push_back(fmt::format("  {:<14} {:>24} {:>24}{}", mem_category_name(MemCategory(i)), cell(q), cell(q + 1),
                                estimate ? fmt::format("  {:>16}", format_bytes(estimate->peak[size_t(i)])) : ""));
  }
  lines.push_back(fmt::format("  {:<14} {:>24} {:>24}{}", "tracked total", cell(tot), cell(tot + 1),
                              estimate ? fmt::format("  {:>16}", format_bytes(estimate->peak_total)) : ""));
  if (best[tot + 3] >= 0)
    lines.push_back(fmt::format("  {:<14} {:>24} {:>24}", "process RSS", cell(tot + 2), cell(tot + 3)));
  return lines;
}

}  // namespace shardlm::memory
