#include "shard/flat_layout.h"

#include "core/error.h"

namespace shardlm::shard {

FlatLayout make_flat_layout(const model::UnitLayout& unit, int64_t divisor) {
  SHARDLM_CHECK(divisor >= 1, "flat layout divisor must be >= 1, got {}", divisor);
  FlatLayout f;
  f.unit_name = unit.name;
  for (const model::ParamInfo& p : unit.params) {
    f.entries.push_back({p, f.numel});
    f.numel += p.numel();
  }
  f.padded_numel = (f.numel + divisor - 1) / divisor * divisor;
  return f;
}

}  // namespace shardlm::shard
