#include "shard/wrap.h"

namespace shardlm::shard {

std::vector<std::vector<int>> wrap_units(const std::vector<model::UnitLayout>& parts, const ShardingConfig& cfg) {
  std::vector<std::vector<int>> groups;
  if (cfg.wrap == WrapPolicy::NoWrap) {
    groups.emplace_back();
    for (size_t i = 0; i < parts.size(); ++i) groups.back().push_back(int(i));
    return groups;
  }
  groups.push_back({0});
  int64_t acc = 0;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (cfg.wrap == WrapPolicy::TransformerBased || groups.size() == 1 || acc >= cfg.min_num_params) {
      groups.emplace_back();
      acc = 0;
    }
    groups.back().push_back(int(i));
    acc += parts[i].numel();
  }
  return groups;
}

}  // namespace shardlm::shard
