#include "shard/plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace shardlm::shard {

MemCategory role_category(BufferRole r) {
  switch (r) {
    case BufferRole::Master:
    case BufferRole::Frozen:
    case BufferRole::Quantized:
    case BufferRole::FullParams: return MemCategory::Parameters;
    case BufferRole::GradShard:
    case BufferRole::FullGrad: return MemCategory::Gradients;
    case BufferRole::Moments: return MemCategory::Optimizer;
    case BufferRole::Staging: return MemCategory::Communication;
  }
  return MemCategory::Other;
}

int64_t UnitPlan::padded_numel() const {
  int64_t n = 0;
  for (const PlannedUnit& u : units) n += u.layout.padded_numel;
  return n;
}

namespace {

// Groups of part indices by the wrap policy (see plan.h).
std::vector<std::vector<int>> wrap_parts(const std::vector<model::ModelPart>& parts, const ModelConfig& cfg,
                                         const ShardingConfig& sc) {
  const int n = int(parts.size()), head = n - 1;
  std::vector<std::vector<int>> groups;
  if (sc.wrap == WrapPolicy::NoWrap) {
    groups.emplace_back();
    for (int i = 0; i < n; ++i) groups.back().push_back(i);
    return groups;
  }
  groups.push_back({0});
  if (cfg.tie_word_embeddings) groups.back().push_back(head);  // they share the embedding tensor
  int64_t acc = 0;
  bool open = false;  // a SIZE_BASED_WRAP group of layers still taking more
  for (int i = 1; i < head; ++i) {
    if (!open || sc.wrap == WrapPolicy::TransformerBased || acc >= sc.min_num_params) {
      groups.emplace_back();
      acc = 0;
      open = true;
    }
    groups.back().push_back(i);
    acc += parts[size_t(i)].numel();
  }
  if (!cfg.tie_word_embeddings) groups.push_back({head});
  return groups;
}

bool is_backward(StageKind k, bool training) {
  return k == StageKind::BlockBackward || k == StageKind::EmbedBackward || (training && k == StageKind::Head);
}

// The stages of a micro-batch, grouped into visits: maximal runs of stages of one unit.
std::vector<Visit> make_visits(const std::vector<Stage>& stages, const std::vector<int>& part_unit, int layers,
                               const ShardingConfig& sc, bool training, int num_units) {
  auto part_of = [&](const Stage& s) {
    switch (s.kind) {
      case StageKind::EmbedForward:
      case StageKind::EmbedBackward: return 0;
      case StageKind::BlockForward:
      case StageKind::BlockBackward: return 1 + s.layer;
      case StageKind::Head: return 1 + layers;
    }
    return 0;
  };
  std::vector<Visit> visits;
  for (const Stage& s : stages) {
    const int unit = part_unit[size_t(part_of(s))];
    if (visits.empty() || visits.back().unit != unit) {
      visits.emplace_back();
      visits.back().unit = unit;
    }
    visits.back().stages.push_back(s);
    visits.back().backward = visits.back().backward || is_backward(s.kind, training);
  }
  for (Visit& v : visits)
    v.needs_params = std::any_of(v.stages.begin(), v.stages.end(),
                                 [](const Stage& s) { return s.kind != StageKind::EmbedBackward; });
  std::vector<int> last(size_t(num_units), -1);
  for (size_t i = 0; i < visits.size(); ++i) {
    Visit& v = visits[i];
    if (v.backward) last[size_t(v.unit)] = int(i);
    // FSDP's resharding: after the forward as the strategy says, after the backward whenever
    // gradients are sharded; evaluation keeps nothing gathered.
    v.free_after = !training || (v.backward ? sc.shard_gradients() : sc.reshard_after_forward());
    const bool prefetch = v.backward ? sc.backward_prefetch != BackwardPrefetch::None : sc.forward_prefetch;
    if (prefetch && i + 1 < visits.size() && visits[i + 1].needs_params) v.prefetch = visits[i + 1].unit;
  }
  for (int u = 0; u < num_units; ++u)
    if (last[size_t(u)] >= 0) visits[size_t(last[size_t(u)])].last_backward = true;
  return visits;
}

int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// The gather's segments and the at-rest buffer's layout (plan.h GatherSegment, rest_*).
void plan_segments(PlannedUnit& u, DType param_dtype, int64_t S) {
  const int64_t pd = int64_t(dtype_size(param_dtype));
  const int64_t frozen_bytes = (u.persistent ? u.frozen.padded_numel : u.frozen_shard_numel) * pd;
  if (u.persistent) {
    int64_t at = 0;
    if (frozen_bytes > 0) u.rest_frozen_offset = 0, at = align16(frozen_bytes);
    if (u.nf4_store_bytes > 0) u.rest_nf4_offset = at, at += align16(u.nf4_store_bytes);
    u.rest_bytes = at;
    return;
  }
  if (u.trains()) u.gather.push_back({SegmentKind::Trained, u.shard_numel * pd});
  if (frozen_bytes > 0) u.gather.push_back({SegmentKind::Frozen, frozen_bytes});
  if (u.nf4_store_bytes > 0) u.gather.push_back({SegmentKind::Nf4, u.nf4_store_bytes});
  std::stable_sort(u.gather.begin(), u.gather.end(),
                   [](const GatherSegment& a, const GatherSegment& b) { return a.part_bytes > b.part_bytes; });
  if (u.gather.empty()) return;
  const bool one = u.gather.size() == 1;  // gathered as it lies: no alignment, nothing to rearrange
  int64_t block = 0, whole = 0;
  for (GatherSegment& g : u.gather) {
    g.block_offset = block;
    g.whole_offset = whole;
    block += one ? g.part_bytes : align16(g.part_bytes);
    whole += one ? S * g.part_bytes : align16(S * g.part_bytes);
    // The at-rest buffer: the block itself when it holds several segments, else the one part
    // (none for trained parameters alone, which are cast from the master for each gather).
    const int64_t rest = one ? 0 : g.block_offset;
    if (g.kind == SegmentKind::Frozen) u.rest_frozen_offset = rest;
    if (g.kind == SegmentKind::Nf4) u.rest_nf4_offset = rest;
    if (g.kind == SegmentKind::Trained && !one) u.rest_trained_offset = rest;
  }
  u.gather_block_bytes = block;
  u.rest_bytes = one ? (u.gather[0].kind == SegmentKind::Trained ? 0 : block) : block;
}

}  // namespace

UnitPlan make_plan(const ModelConfig& cfg, const model::FinetuneSpec& ft, const ShardingConfig& sc, int shard_rank,
                   int shard_size) {
  SHARDLM_CHECK(shard_size >= 1 && shard_rank >= 0 && shard_rank < shard_size, "shard rank {} of a group of {}",
                shard_rank, shard_size);
  UnitPlan p;
  p.sharding = sc;
  p.precision = {sc.param_dtype, sc.reduce_dtype};
  p.offload = {sc.offload_params};
  p.shard_rank = shard_rank;
  p.shard_size = shard_size;
  p.parts = model::llama_parts(cfg, ft);
  const int S = shard_size;
  std::vector<int> part_unit(p.parts.size(), 0);
  for (const std::vector<int>& g : wrap_parts(p.parts, cfg, sc)) {
    PlannedUnit u;
    u.parts = g;
    std::vector<model::ParamInfo> params, frozen, quantized;
    for (int part : g) {
      part_unit[size_t(part)] = int(p.units.size());
      const model::ModelPart& mp = p.parts[size_t(part)];
      u.name += (u.name.empty() ? "" : "+") + mp.name;
      for (const model::ParamInfo& info : mp.params)
        (info.trainable ? params : info.nf4 ? quantized : frozen).push_back(info);
    }
    if (g.size() >= 2 && p.parts[size_t(g[0])].kind == model::PartKind::Layer)
      u.name = fmt::format("model.layers.{}..{}", p.parts[size_t(g.front())].layer, p.parts[size_t(g.back())].layer);
    // 8-bit optimizer state quantizes blocks of 256 elements: every tensor and every rank's shard
    // starts a block, so a block is one tensor's on one rank however the group is split.
    const int64_t block = sc.state_dtype == DType::U8 ? ops::kQuant8Block : 1;
    u.layout = make_flat_layout(u.name, params, S * block, block);
    u.shard_numel = u.layout.padded_numel / S;
    u.frozen = make_flat_layout(u.name, frozen, S);
    u.frozen_shard_numel = u.frozen.padded_numel / S;
    const bool sharded = sc.shard_optimizer();
    u.own_begin = sharded ? shard_rank * u.shard_numel : 0;
    u.own_numel = sharded ? u.shard_numel : u.layout.padded_numel;
    const bool embedding_unit = p.parts[size_t(g.front())].kind == model::PartKind::Embedding &&
                                (g.size() == 1 || p.parts[size_t(g[1])].kind != model::PartKind::Layer);
    u.state_dtype = sc.state_dtype == DType::U8 && embedding_unit ? DType::F32 : sc.state_dtype;
    u.solo = sharded && S == 1 && !sc.hybrid() && !sc.offload_params;
    u.persistent = u.solo || !sc.shard_gradients();
    u.quantized = make_flat_layout(u.name, quantized, 1);
    u.nf4_chunks = u.persistent ? 1 : S;
    for (const FlatEntry& e : u.quantized.entries) {
      constexpr int64_t kGroup = ops::kNf4BlockSize * ops::kNf4NestedBlockSize;
      const int64_t n = e.info.numel(), groups = (n + kGroup - 1) / kGroup;
      Nf4Piece piece{e, u.nf4_chunks == 1 ? n : (groups + u.nf4_chunks - 1) / u.nf4_chunks * kGroup};
      piece.chunk = ops::Nf4Layout::of(std::min(n, piece.chunk_elems), ft.nf4_double_quant);
      piece.offset = size_t(u.nf4_store_bytes);
      u.nf4_store_bytes += int64_t(piece.chunk.total_bytes);
      u.nf4.push_back(piece);
    }
    plan_segments(u, sc.param_dtype, S);
    p.units.push_back(std::move(u));
  }
  const int L = cfg.num_hidden_layers;
  std::vector<Stage> train{{StageKind::EmbedForward}}, eval{{StageKind::EmbedForward}};
  for (int l = 0; l < L; ++l) train.push_back({StageKind::BlockForward, l}), eval.push_back({StageKind::BlockForward, l});
  train.push_back({StageKind::Head});
  eval.push_back({StageKind::Head});
  for (int l = L - 1; l >= 0; --l) train.push_back({StageKind::BlockBackward, l});
  // A frozen embedding (LoRA) needs no backward: nothing flows further.
  bool embedding_trains = false;
  for (const model::ParamInfo& info : p.parts[0].params) embedding_trains = embedding_trains || info.trainable;
  if (embedding_trains) train.push_back({StageKind::EmbedBackward});
  p.train = make_visits(train, part_unit, L, sc, true, int(p.units.size()));
  p.eval = make_visits(eval, part_unit, L, sc, false, int(p.units.size()));
  return p;
}

}  // namespace shardlm::shard
