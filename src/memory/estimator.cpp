#include "memory/estimator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "model/llama.h"
#include "model/lora.h"
#include "ops/ops.h"
#include "shard/flat_layout.h"
#include "shard/engine.h"
#include "shard/load.h"

namespace shardlm::memory {

const char* term_name(Term t) {
  switch (t) {
    case Term::ParamsAtRest: return "parameters at rest (f32 master)";
    case Term::FrozenBase: return "frozen base (LoRA)";
    case Term::FullParams: return "full parameters (gathered units, prefetch)";
    case Term::GradShard: return "gradients: reduced shard";
    case Term::FullGrads: return "gradients: full-unit accumulators";
    case Term::Optimizer: return "optimizer state (AdamW m, v)";
    case Term::Activations: return "activations";
    case Term::OffloadedActivations: return "activations offloaded to host";
    case Term::LossWorkspace: return "logits/loss workspace";
    case Term::Communication: return "communication buffers";
    case Term::OtherWorkspace: return "other workspace";
  }
  return "?";
}

MemCategory term_category(Term t) {
  switch (t) {
    case Term::ParamsAtRest:
    case Term::FrozenBase:
    case Term::FullParams: return MemCategory::Parameters;
    case Term::GradShard:
    case Term::FullGrads: return MemCategory::Gradients;
    case Term::Optimizer: return MemCategory::Optimizer;
    case Term::Activations: return MemCategory::Activations;
    case Term::OffloadedActivations: return MemCategory::OffloadedActivations;
    case Term::Communication: return MemCategory::Communication;
    case Term::LossWorkspace:
    case Term::OtherWorkspace: return MemCategory::Workspace;
  }
  return MemCategory::Other;
}

namespace {


Term role_term(shard::BufferRole r) {
  switch (r) {
    case shard::BufferRole::Master: return Term::ParamsAtRest;
    case shard::BufferRole::Moments: return Term::Optimizer;
    case shard::BufferRole::GradShard: return Term::GradShard;
    case shard::BufferRole::FullParams: return Term::FullParams;
    case shard::BufferRole::FullGrad: return Term::FullGrads;
    case shard::BufferRole::Staging: return Term::Communication;
    case shard::BufferRole::Frozen:
    case shard::BufferRole::Quantized: return Term::FrozenBase;
  }
  return Term::OtherWorkspace;
}

// The MemoryTracker's bookkeeping, per term as well as per category, of every meta buffer the dry
// run allocates and frees: the engine's (tagged with their roles), the model's activation arena
// and its ops' scratch (by category, the loss's by its tag).
struct Tracker final : MetaObserver {
  std::array<int64_t, kNumTerms> live{}, peak{}, at_peak{};
  std::array<int64_t, kNumMemCategories> clive{}, cpeak{};
  int64_t total = 0, peak_total = 0;
  int64_t host = 0, host_at_peak = 0;  // offloaded (pinned host) bytes

  static Term term_of(const Buffer& b) {
    if (const std::optional<shard::BufferRole> role = shard::tag_role(b.tag())) return role_term(*role);
    if (b.tag() == mem_tag::kLossScratch) return Term::LossWorkspace;
    if (b.tag() == mem_tag::kRingScratch) return Term::Communication;
    if (b.category() == MemCategory::Activations) return Term::Activations;
    if (b.category() == MemCategory::OffloadedActivations) return Term::OffloadedActivations;
    SHARDLM_CHECK(b.category() == MemCategory::Workspace, "memory estimate: an untagged {} buffer of {} has no term",
                  mem_category_name(b.category()), format_bytes(int64_t(b.bytes())));
    return Term::OtherWorkspace;
  }
  void on_alloc(const Buffer& b) override {
    const Term t = term_of(b);
    const int64_t bytes = int64_t(b.bytes());
    const size_t i = size_t(t), c = size_t(term_category(t));
    live[i] += bytes;
    peak[i] = std::max(peak[i], live[i]);
    clive[c] += bytes;
    cpeak[c] = std::max(cpeak[c], clive[c]);
    total += bytes;
    if (b.tag() & mem_tag::kHost) host += bytes;
    if (total > peak_total) {
      peak_total = total;
      at_peak = live;
      host_at_peak = host;
    }
  }
  // The work of the step being recorded (record: on), in order.
  bool record = false;
  const void* shard_group = nullptr;
  std::vector<WorkEvent> work;
  int64_t next_id = 1;
  WorkEvent& compute_event() {
    if (work.empty() || work.back().kind != WorkEvent::Kind::Compute) work.push_back({});
    return work.back();
  }
  void on_flops(double flops) override {
    if (record) compute_event().flops += flops;
  }
  void on_traffic(double bytes) override {
    if (record) compute_event().memory_bytes += bytes;
  }
  int64_t on_collective(const void* group, DryCollective kind, int64_t bytes) override {
    if (!record) return 0;
    work.push_back({.kind = WorkEvent::Kind::Issue,
                    .collective = kind,
                    .group = group == shard_group ? WorkEvent::Group::Shard : WorkEvent::Group::Replicate,
                    .bytes = bytes,
                    .id = next_id});
    return next_id++;
  }
  void on_wait(int64_t id) override {
    if (record && id > 0) work.push_back({.kind = WorkEvent::Kind::Wait, .id = id});
  }
  void on_free(const Buffer& b) override {
    const Term t = term_of(b);
    const int64_t bytes = int64_t(b.bytes());
    live[size_t(t)] -= bytes;
    clive[size_t(term_category(t))] -= bytes;
    total -= bytes;
    if (b.tag() & mem_tag::kHost) host -= bytes;
  }
};

// DPO's head as the dry run sees it: every row's loss on its own and a backward (head_rows), with
// the same buffers whatever the weights; the loss's own arithmetic allocates nothing.
class RowHead final : public shard::RowObjective {
 public:
  double local_count(const std::vector<model::Batch>& micro) const override { return double(micro.size()); }
  double head(model::StagedModel& m, const model::Batch& b, size_t, float) override {
    std::vector<double> rows(size_t(b.B));
    m.head_rows(b, rows, [](std::span<const double>, std::span<float>) {});
    return 0;
  }
};

}  // namespace

int ranks_per_node(const EstimateInput& in) {
  return in.ranks_per_node > 0 ? std::min(in.ranks_per_node, in.world_size) : in.world_size;
}

namespace {
int ceil_div(int a, int b) { return (a + b - 1) / b; }
}  // namespace

Estimate estimate(const EstimateInput& in) {
  const ModelConfig& cfg = in.model;
  const model::FinetuneSpec& ft = in.finetune;
  const shard::ShardingConfig& sc = in.sharding;
  SHARDLM_CHECK(in.world_size >= 1, "world size must be >= 1, got {}", in.world_size);
  SHARDLM_CHECK(in.micro_batch_size >= 1 && in.seq_len >= 1 && in.grad_accum >= 1,
                "micro batch, sequence length and accumulation steps must be >= 1");
  const int W = in.world_size;
  const int rpn = ranks_per_node(in);
  const int S = shard::shard_group_size(sc, W, rpn);  // the shard group, as make_mesh forms it
  const bool sharded = sc.shard_optimizer();
  const DType act = sc.param_dtype;  // the trainer computes in the parameter dtype

  Estimate est;
  est.shard_group = S;
  est.parameters = parameter_count(cfg, ft);

  // ---- the engine and the model themselves, run on the meta device on the same plan: rank 0's
  // buffers, allocated and freed in the order a real run allocates and frees them ----
  shard::ShardingConfig dry = sc;
  dry.offload_params = in.offload;
  const bool shard_crosses = shard_group_place(in, est).nodes > 1;
  const bool replicate_crosses = replicate_group_place(in, est).nodes > 1;
  shard::Mesh mesh =
      shard::make_shape_mesh(dry, W, rpn, in.mpi_ring && shard_crosses, in.mpi_ring && replicate_crosses);
  // The batch's host arrays (the engine counts tokens on the host): every target a real token.
  const int64_t N = in.micro_batch_size * in.seq_len;
  const std::vector<int32_t> ids(size_t(N), 0);
  model::Batch batch{.B = in.micro_batch_size, .T = in.seq_len, .ids = ids.data(), .targets = ids.data()};
  if (ft.lora && ft.lora->dropout > 0) batch.dropout_key = 1;  // training draws LoRA dropout masks
  const std::vector<model::Batch> micro(size_t(in.grad_accum), batch);
  Tracker tr;
  {
    const ObserveMeta observe(tr);
    shard::ShardedModel engine(cfg, ft, dry, mesh);
    shard::init_random(engine, 0);
    est.num_units = engine.num_units();
    est.padded_params = engine.plan().padded_numel();
    int64_t largest_unit = 0;
    for (const shard::PlannedUnit& u : engine.plan().units) {
      largest_unit = std::max(largest_unit, u.layout.padded_numel);
      est.trainable_params += u.layout.numel;
    }
    // The final save gathers one unit at a time in f32 (ShardedModel::gather_unit).
    est.save_gather_bytes = largest_unit * 4;
    std::optional<shard::ShardedModel> reference;
    if (in.preference && !ft.lora) {
      reference.emplace(cfg, model::FinetuneSpec{}, dry, mesh, shard::EngineUse::Evaluate);
      shard::init_random(*reference, 0);
    }
    model::LlamaCompute model(cfg, act, engine.device(), ft.lora);  // the trainer computes in the parameter dtype
    model.set_checkpointing(in.checkpoint_every, in.offload_activations);
    // Two steps: NO_SHARD and ZERO1 keep their full gradients from the first step on, so the second
    // step starts with more live memory than the first did; later steps repeat the second, whose
    // communication is counted. DPO's reference forwards come first, as the trainer runs them.
    RowHead rows_head;
    auto step = [&](int64_t k) {
      std::vector<double> rows(size_t(batch.B));
      if (reference)
        for (const model::Batch& b : micro) reference->forward_rows(model, b, rows);
      engine.train_step(model, micro, ops::AdamWConfig{}, k, 1.0, in.preference ? &rows_head : nullptr);
    };
    step(1);
    mesh.shard->reset_stats();
    mesh.replicate->reset_stats();
    tr.shard_group = mesh.shard.get();
    tr.record = true;
    step(2);
    tr.record = false;
  }
  est.step_work = std::move(tr.work);

  est.at_peak = tr.at_peak;
  est.peak = tr.peak;
  est.category_peak = tr.cpeak;
  est.peak_total = tr.peak_total;

  // ---- communication per step, as the dry run's communicators counted it (ring accounting) ----
  {
    const double shard_bytes = double(mesh.shard->stats().total());
    const double replica_bytes = double(mesh.replicate->stats().total());
    est.comm_bytes_per_step = shard_bytes + replica_bytes;
    est.inter_node_bytes_per_step = (shard_crosses ? shard_bytes : 0) + (replicate_crosses ? replica_bytes : 0);
  }
  if (ft.lora) {
    est.notes.push_back(fmt::format("LoRA rank {} on {}: {} trainable parameters ({:.3f}% of {}); the base is frozen in {}{}",
                                    ft.lora->rank, fmt::join(model::expand_lora_targets(ft.lora->target_modules), " "),
                                    est.trainable_params, 100.0 * double(est.trainable_params) / double(est.parameters),
                                    est.parameters, ft.nf4_base ? "NF4 (its Linear weights) and " : "",
                                    dtype_name(sc.param_dtype)));
    if (ft.nf4_base)
      est.notes.push_back(fmt::format("QLoRA: the frozen Linear weights at rest in NF4 ({}); each unit's are "
                                      "dequantized to {} for its visits",
                                      ft.nf4_double_quant ? "double quantization" : "f32 absmax per 64 weights",
                                      dtype_name(sc.param_dtype)));
  }
  // What the dry run allocated in host memory (pinned beside a GPU) at the peak.
  est.host_bytes = tr.host_at_peak;
  est.device_bytes = est.peak_total - est.host_bytes;
  if (in.offload_activations)
    est.notes.push_back("offload_activations: the checkpointed layers' inputs live in host memory between their "
                        "forward and backward; host bytes are in the total, device bytes exclude them");
  if (in.offload) {
    est.notes.push_back(
        "offload (device: cuda): the f32 master shard, the reduced gradient shard and AdamW state live in pinned "
        "host memory and the optimizer steps there; host bytes are in the total, device bytes exclude them");
  }
  if (!sharded && W > 1 && sc.strategy == shard::Strategy::NoShard)
    est.notes.push_back("NO_SHARD: every rank holds the whole model, its gradients and AdamW state");
  return est;
}

std::vector<AccelerateRow> accelerate_table(const ModelConfig& cfg, const model::FinetuneSpec& ft) {
  // accelerate's "largest layer" is its largest residual group: for these models a decoder layer,
  // or the embedding (or the untied lm_head) when the vocabulary is large.
  int64_t largest = 0;
  for (const model::ModelPart& part : model::llama_parts(cfg, ft))
    for (const model::ParamInfo& p : part.params)
      largest = std::max(largest, part.kind == model::PartKind::Layer ? part.numel() : p.numel());
  const int64_t total = parameter_count(cfg, ft);
  struct Kind {
    const char* name;
    double bytes;
    int64_t adam;  // bytes per parameter of model states when training with AdamW here, -1: cannot
  };
  // f32: weights 4 + gradients 4 + m 4 + v 4. bf16 mixed precision: the same f32 states (master
  // weights, gradient accumulators and moments stay f32) plus the bf16 compute copy. Quantized
  // weights cannot be trained with Adam at all (QLoRA trains adapters on a frozen base).
  const Kind kinds[] = {{"float32", 4, 16}, {"float16/bfloat16", 2, 18}, {"int8", 1, -1}, {"int4", 0.5, -1}};
  std::vector<AccelerateRow> rows;
  for (const Kind& k : kinds) {
    AccelerateRow r;
    r.dtype = k.name;
    r.largest_layer = int64_t(double(largest) * k.bytes);
    r.total_size = int64_t(double(total) * k.bytes);
    r.adam_training = k.adam < 0 ? -1 : total * k.adam;
    r.accelerate_says = 4 * r.total_size;
    rows.push_back(r);
  }
  return rows;
}

std::vector<shard::Strategy> auto_candidates(int world_size, int ranks_per_node) {
  using S = shard::Strategy;
  if (ranks_per_node > 0 && world_size > ranks_per_node && world_size % ranks_per_node == 0)
    return {S::NoShard, S::Zero1, S::HybridShardZero2, S::HybridShard, S::ShardGradOp, S::FullShard};
  return {S::NoShard, S::Zero1, S::ShardGradOp, S::FullShard};
}

shard::Strategy choose_strategy(const EstimateInput& base, int64_t budget, std::string* why,
                                const WhatToTry& what_to_try) {
  struct Option {
    shard::Strategy s;
    Estimate e;
    size_t order;
  };
  std::vector<Option> fit, too_big;
  const std::vector<shard::Strategy> cands = auto_candidates(base.world_size, base.ranks_per_node);
  for (size_t i = 0; i < cands.size(); ++i) {
    EstimateInput in = base;
    in.sharding.strategy = cands[i];
    Option o{cands[i], estimate(in), i};
    (o.e.device_bytes <= budget ? fit : too_big).push_back(std::move(o));
  }
  const std::string budget_s = format_bytes(budget);
  if (fit.empty()) {
    const Option& best = *std::min_element(too_big.begin(), too_big.end(), [](const Option& x, const Option& y) {
      return x.e.device_bytes < y.e.device_bytes;
    });
    EstimateInput smallest = base;
    smallest.sharding.strategy = best.s;
    // No key: the caller names where the budget came from.
    throw Error(fmt::format("sharding_strategy auto: nothing fits a budget of {} per rank: the smallest, {}, needs {} "
                            "per rank; {}",
                            budget_s, shard::strategy_name(best.s), format_bytes(best.e.device_bytes),
                            what_to_try ? what_to_try(smallest)
                                        : "try activation checkpointing, a smaller micro-batch or more ranks"));
  }
  // Least traffic over the slow links first, then least in all, then least sharding.
  auto cheaper = [](const Option& x, const Option& y) {
    if (x.e.inter_node_bytes_per_step != y.e.inter_node_bytes_per_step)
      return x.e.inter_node_bytes_per_step < y.e.inter_node_bytes_per_step;
    if (x.e.comm_bytes_per_step != y.e.comm_bytes_per_step) return x.e.comm_bytes_per_step < y.e.comm_bytes_per_step;
    return x.order < y.order;
  };
  const Option& pick = *std::min_element(fit.begin(), fit.end(), cheaper);
  if (why) {
    std::string ruled;
    for (const Option& o : too_big)
      if (cheaper(o, pick))
        ruled += fmt::format("{}{} needs {}", ruled.empty() ? "" : ", ", shard::strategy_name(o.s),
                             format_bytes(o.e.device_bytes));
    *why = fmt::format("auto: {} (estimated peak {} per rank, budget {}; {} communicated per rank per step){}",
                       shard::strategy_name(pick.s), format_bytes(pick.e.device_bytes), budget_s,
                       format_bytes(int64_t(pick.e.comm_bytes_per_step)),
                       ruled.empty() ? " — the least communication of all strategies"
                                     : " — " + ruled + " > " + budget_s + " budget");
  }
  return pick.s;
}

GroupPlace shard_group_place(const EstimateInput& in, const Estimate& e) {
  const int S = e.shard_group, per_node = std::min(S, ranks_per_node(in));
  return {.size = S, .nodes = ceil_div(S, per_node), .per_node = per_node};
}

GroupPlace replicate_group_place(const EstimateInput& in, const Estimate& e) {
  const int S = e.shard_group, R = in.world_size / S, rpn = ranks_per_node(in);
  // Rank 0's replicate group is ranks 0, S, 2S, ...: one per node once a shard group fills a node.
  const int per_node = S >= rpn ? 1 : std::min(R, rpn / S);
  return {.size = R, .nodes = ceil_div(R, per_node), .per_node = per_node};
}

}  // namespace shardlm::memory
