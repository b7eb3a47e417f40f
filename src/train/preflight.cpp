#include "train/preflight.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>

#include "comm/hosts.h"
#include "core/tensor.h"

namespace shardlm::train {

namespace {
// "0-3", "0,1", "0-2,5": a host's ranks, runs of three or more as ranges.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    const std::string sep = out.empty() ? "" : ",";
    if (j - i >= 2) {
      out += fmt::format("{}{}-{}", sep, ranks[i], ranks[j]);
    } else {
      for (size_t k = i; k <= j; ++k) out += fmt::format("{}{}", k == i ? sep : ",", ranks[k]);
    }
    i = j + 1;
  }
  return out;
}
}  // namespace

std::string preflight_check(comm::Communicator& world) {
  if (world.size() == 1) return "";
  using Clock = std::chrono::steady_clock;
  // The test hook behind watchdog.sh's pre-flight case: SHARDLM_TEST_STOP_BEFORE_PREFLIGHT=R stops
  // world rank R (SIGSTOP, as a frozen process) here, and the check below must name it.
  if (const char* v = std::getenv("SHARDLM_TEST_STOP_BEFORE_PREFLIGHT"); v && std::atoi(v) == world.rank())
    std::raise(SIGSTOP);
  comm::set_activity({.what = "pre-flight check"});
  // First a collective under the watchdog: a rank that never arrives is named after
  // collective_timeout. (hosts() below uses blocking MPI calls the watchdog does not see.)
  world.all_reduce_sum(1.0);
  const comm::HostLayout layout = comm::hosts(world);
  // The bandwidth figure: an all-reduce of 8 MiB of f32, the fastest of three after two to warm up
  // (measured on 2 ranks: the second call still took ~180 ms where later ones take ~5, as the
  // shared-memory path sets itself up), each between barriers; rank 0's time is the collective's,
  // since no rank leaves before the last one's data arrives.
  constexpr int64_t kElements = int64_t(2) << 20;
  const OwnedTensor buf(DType::F32, {kElements}, MemCategory::Communication, true);
  for (int i = 0; i < 2; ++i) world.all_reduce(buf.t, comm::ReduceOp::Sum);
  double s = 1e30;
  for (int i = 0; i < 3; ++i) {
    world.barrier();
    const auto t0 = Clock::now();
    world.all_reduce(buf.t, comm::ReduceOp::Sum);
    s = std::min(s, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  comm::set_activity({});
  if (world.rank() != 0) return "";
  std::string hosts;
  for (int h = 0; h < int(layout.hosts.size()); ++h) {
    std::vector<int> ranks;
    for (int r = 0; r < int(layout.host_of.size()); ++r)
      if (layout.host_of[size_t(r)] == h) ranks.push_back(r);
    hosts += fmt::format("{}{}: {}", h ? "; " : "", layout.hosts[size_t(h)], rank_list(ranks));
  }
  const double bytes = double(kElements) * 4;
  return fmt::format("pre-flight: {} ranks on {} host{} ({}); all-reduce {:.0f} MB in {:.1f} ms ({:.2f} GB/s)",
                     world.size(), layout.hosts.size(), layout.hosts.size() == 1 ? "" : "s", hosts, bytes / 1e6,
                     s * 1e3, bytes / std::max(s, 1e-9) / 1e9);
}

}  // namespace shardlm::train
