// Packing and padding of rows (see packing.h). Owner: the data pipeline.
#include "data/packing.h"

#include <algorithm>

#include "core/error.h"
#include "ops/ops.h"

namespace shardlm::data {

std::vector<std::vector<int64_t>> pack_greedy(const std::vector<int64_t>& order,
                                              const std::function<int64_t(int64_t)>& length, int64_t T,
                                              int64_t* truncated) {
  SHARDLM_CHECK(T >= 1, "row length must be >= 1, got {}", T);
  std::vector<std::vector<int64_t>> rows;
  int64_t used = T;  // no open row yet
  for (const int64_t i : order) {
    int64_t n = length(i);
    if (n > T) {
      if (truncated) ++*truncated;
      n = T;
    }
    if (used + n > T) {
      rows.emplace_back();
      used = 0;
    }
    rows.back().push_back(i);
    used += n;
  }
  return rows;
}

BatchBuffers make_packed_batch(const std::vector<std::vector<Example>>& rows, int64_t T, int32_t pad_id) {
  BatchBuffers out;
  out.B = int64_t(rows.size());
  out.T = T;
  const size_t n = size_t(out.B * T);
  out.ids.assign(n, pad_id);
  out.targets.assign(n, ops::kIgnoreIndex);
  out.positions.assign(n, 0);
  out.segments.assign(n, 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t base = int64_t(r) * T;
    int64_t used = 0;
    int32_t seg = 0;
    for (const Example& e : rows[r]) {
      const int64_t len = std::min<int64_t>(int64_t(e.ids.size()), T - used);
      if (len <= 0) break;
      for (int64_t t = 0; t < len; ++t) {
        out.ids[size_t(base + used + t)] = e.ids[size_t(t)];
        out.targets[size_t(base + used + t)] = e.targets[size_t(t)];
        out.positions[size_t(base + used + t)] = int32_t(t);
        out.segments[size_t(base + used + t)] = seg;
      }
      used += len;
      ++seg;
    }
    // The padded tail: a segment of its own (so no real token attends to it), positions from 0.
    for (int64_t t = used; t < T; ++t) {
      out.positions[size_t(base + t)] = int32_t(t - used);
      out.segments[size_t(base + t)] = seg;
    }
  }
  return out;
}

BatchBuffers make_padded_batch(const std::vector<Example>& rows, int64_t max_T, int32_t pad_id) {
  int64_t T = 1;
  for (const Example& e : rows) T = std::max<int64_t>(T, int64_t(e.ids.size()));
  return make_batch(rows, std::min(T, max_T), pad_id);
}

}  // namespace shardlm::data
