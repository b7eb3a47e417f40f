// Integers read from JSON files.
//
// nlohmann's get<int64_t>() converts a JSON float by a plain cast, which is undefined behaviour
// when the value does not fit (1e95) and silently truncates 2.5 to 2. Values that come from a file
// go through json_integer instead: only a JSON integer within [lo, hi] is one.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

namespace shardlm::io {

inline std::optional<int64_t> json_integer(const nlohmann::json& v,
                                           int64_t lo = std::numeric_limits<int64_t>::min(),
                                           int64_t hi = std::numeric_limits<int64_t>::max()) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(hi) || (lo > 0 && u < uint64_t(lo))) return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

}  // namespace shardlm::io
