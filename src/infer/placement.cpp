#include "infer/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>

#include "core/alloc.h"
#include "core/error.h"
#include "core/q8_0.h"
#include "model/llama.h"

namespace shardlm::infer {

DeviceMap parse_device_map(const std::string& text) {
  if (text == "auto") return DeviceMap::Auto;
  if (text == "balanced") return DeviceMap::Balanced;
  if (text == "balanced_low_0") return DeviceMap::BalancedLow0;
  if (text == "sequential") return DeviceMap::Sequential;
  throw Error(fmt::format("unknown device map '{}' (choices: auto, balanced, balanced_low_0, sequential)", text));
}

const char* device_map_name(DeviceMap m) {
  switch (m) {
    case DeviceMap::Auto: return "auto";
    case DeviceMap::Balanced: return "balanced";
    case DeviceMap::BalancedLow0: return "balanced_low_0";
    case DeviceMap::Sequential: return "sequential";
  }
  return "?";
}

uint64_t PartSizes::total() const {
  uint64_t n = embed + head;
  for (uint64_t l : layers) n += l;
  return n;
}

PartSizes part_sizes(const ModelConfig& cfg, DType dtype, bool q8_0) {
  const uint64_t esize = dtype_size(dtype);
  PartSizes s;
  s.tied = cfg.tie_word_embeddings;
  // accelerate's leaf modules: each Linear (weight and bias), Embedding and RMSNorm, by module name.
  std::map<std::string, uint64_t> leaves;
  for (const model::ModelPart& part : model::llama_parts(cfg)) {
    uint64_t bytes = 0;
    for (const model::ParamInfo& p : part.params) {
      const int64_t n = p.numel();
      const uint64_t held = q8_0 && model::held_in_q8_0(part, p)
                                ? uint64_t(n / p.shape.back()) * uint64_t(q8_0_bytes(p.shape.back()))
                                : uint64_t(n) * esize;
      leaves[p.name.substr(0, p.name.rfind('.'))] += held;
      bytes += held;
    }
    switch (part.kind) {
      case model::PartKind::Embedding: s.embed = bytes; break;
      case model::PartKind::Layer: s.layers.push_back(bytes); break;
      case model::PartKind::Head: s.head = bytes; break;
    }
  }
  uint64_t sum = 0;
  for (const auto& [name, bytes] : leaves) sum += bytes;
  s.mean_leaf = leaves.empty() ? 0 : sum / leaves.size();
  return s;
}

std::vector<RankShare> place_parts(const PartSizes& sizes, DeviceMap map, int ranks, uint64_t max_memory,
                                   const std::string& role) {
  SHARDLM_CHECK(ranks >= 1, "a placement needs at least one rank, got {}", ranks);
  constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> cap(size_t(ranks), max_memory == 0 ? kUnlimited : max_memory);
  const uint64_t total = sizes.total();
  if (map != DeviceMap::Sequential && ranks > 1) {
    // accelerate's get_balanced_memory: an even share plus a buffer of 1.25 x the larger of a
    // decoder layer and the mean leaf module, so rounding to whole layers does not push the last
    // layers off the end; the last rank keeps its whole max memory for what remains.
    const bool low0 = map == DeviceMap::BalancedLow0;
    const uint64_t layer = sizes.layers.empty() ? 0 : sizes.layers.front();
    const uint64_t per_rank = total / uint64_t(low0 ? ranks - 1 : ranks) + std::max(layer, sizes.mean_leaf) * 5 / 4;
    for (int r = 0; r + 1 < ranks; ++r)
      cap[size_t(r)] = std::min(low0 && r == 0 ? cap[0] : per_rank, cap[size_t(r)]);
    if (low0) {  // rank 0 takes only what ranks 1..N-1 cannot
      uint64_t others = 0;
      for (int r = 1; r < ranks; ++r) others = cap[size_t(r)] > kUnlimited - others ? kUnlimited : others + cap[size_t(r)];
      cap[0] = std::min(total > others ? total - others : 0, cap[0]);
    }
  }

  // Fill the ranks in order with the parts in pipeline order; a part that does not fit in what is
  // left of a rank goes to the next one (whole: a decoder layer is never split). As accelerate's
  // infer_auto_device_map does, rank 0 (its "main device") keeps room for the largest part still
  // to place after the current one; accelerate keeps it to bring back offloaded layers, and it is
  // kept here so that the split is accelerate's.
  std::vector<RankShare> shares(static_cast<size_t>(ranks));
  const int64_t L = int64_t(sizes.layers.size());
  // Items: -1 the embedding, 0..L-1 the layers, L the head. largest_after[item + 1]: the largest
  // part after `item` (the head counted with its own matrix).
  std::vector<uint64_t> largest_after(size_t(L + 2), 0);
  largest_after[size_t(L)] = sizes.head + (sizes.tied ? sizes.embed : 0);
  for (int64_t item = L - 2; item >= -1; --item)
    largest_after[size_t(item + 1)] = std::max(largest_after[size_t(item + 2)], sizes.layers[size_t(item + 1)]);
  int r = 0, embed_rank = -1;
  uint64_t used = 0;
  for (int64_t item = -1; item <= L; ++item) {  // -1: the embedding, L: the head
    std::string name = item < 0 ? "the embedding" : item == L ? "the head" : fmt::format("model.layers.{}", item);
    auto need = [&] {
      if (item < 0) return sizes.embed;
      if (item < L) return sizes.layers[size_t(item)];
      // Tied embeddings: the head's matrix is the embedding's, shared on its rank, a copy elsewhere.
      return sizes.head + (sizes.tied && r != embed_rank ? sizes.embed : 0);
    };
    auto fits = [&] {
      const uint64_t reserved = r == 0 ? largest_after[size_t(item + 1)] : 0;
      const uint64_t c = cap[size_t(r)];
      return c >= reserved && c - reserved >= need() && c - reserved - need() >= used;
    };
    while (!fits()) {
      if (r + 1 == ranks)
        throw Error(fmt::format("{} needs {} and no rank has that much left (device map {}, {} rank{}, {} per rank)",
                                name, format_bytes(int64_t(need())), device_map_name(map), ranks, ranks == 1 ? "" : "s",
                                max_memory ? format_bytes(int64_t(max_memory)) : std::string("unlimited")),
                    {.key = role});
      ++r;
      used = 0;
    }
    RankShare& s = shares[size_t(r)];
    used += need();
    s.bytes += need();
    if (item < 0) {
      s.embed = true;
      embed_rank = r;
    } else if (item == L) {
      s.head = true;
    } else {
      if (s.layer_begin == s.layer_end) s.layer_begin = item;  // its first layer
      s.layer_end = item + 1;
    }
  }
  return shares;
}

std::string describe_share(int rank, const RankShare& s) {
  std::vector<std::string> what;
  if (s.embed) what.push_back("embedding");
  if (s.layer_end - s.layer_begin == 1) what.push_back(fmt::format("layer {}", s.layer_begin));
  else if (s.layer_end > s.layer_begin) what.push_back(fmt::format("layers {}-{}", s.layer_begin, s.layer_end - 1));
  if (s.head) what.push_back("head");
  if (what.empty()) return fmt::format("rank {}: nothing", rank);
  return fmt::format("rank {}: {}; {} ({} bytes)", rank, fmt::join(what, ", "), format_bytes(int64_t(s.bytes)), s.bytes);
}

}  // namespace shardlm::infer
