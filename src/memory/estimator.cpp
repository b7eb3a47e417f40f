#include "memory/estimator.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/llama.h"
#include "shard/flat_layout.h"
#include "shard/wrap.h"

namespace shardlm::memory {

const char* term_name(Term t) {
  switch (t) {
    case Term::ParamsAtRest: return "parameters at rest (f32 master)";
    case Term::FullParams: return "full parameters (gathered units, prefetch)";
    case Term::GradShard: return "gradients: reduced shard";
    case Term::FullGrads: return "gradients: full-unit accumulators";
    case Term::Optimizer: return "optimizer state (AdamW m, v)";
    case Term::Activations: return "activations";
    case Term::LossWorkspace: return "logits/loss workspace";
    case Term::Communication: return "communication buffers";
    case Term::OtherWorkspace: return "other workspace";
  }
  return "?";
}

MemCategory term_category(Term t) {
  switch (t) {
    case Term::ParamsAtRest:
    case Term::FullParams: return MemCategory::Parameters;
    case Term::GradShard:
    case Term::FullGrads: return MemCategory::Gradients;
    case Term::Optimizer: return MemCategory::Optimizer;
    case Term::Activations: return MemCategory::Activations;
    case Term::Communication: return MemCategory::Communication;
    case Term::LossWorkspace:
    case Term::OtherWorkspace: return MemCategory::Workspace;
  }
  return MemCategory::Other;
}

namespace {

// The MemoryTracker's bookkeeping, per term as well as per category.
struct Tracker {
  std::array<int64_t, kNumTerms> live{}, peak{}, at_peak{};
  std::array<int64_t, kNumMemCategories> clive{}, cpeak{};
  int64_t total = 0, peak_total = 0;

  void alloc(Term t, int64_t bytes) {
    if (bytes <= 0) return;  // Buffer(0) charges nothing
    const size_t i = size_t(t), c = size_t(term_category(t));
    live[i] += bytes;
    peak[i] = std::max(peak[i], live[i]);
    clive[c] += bytes;
    cpeak[c] = std::max(cpeak[c], clive[c]);
    total += bytes;
    if (total > peak_total) {
      peak_total = total;
      at_peak = live;
    }
  }
  void free(Term t, int64_t bytes) {
    if (bytes <= 0) return;
    live[size_t(t)] -= bytes;
    clive[size_t(term_category(t))] -= bytes;
    total -= bytes;
  }
  // A buffer that lives only inside one op.
  void spike(Term t, int64_t bytes) {
    alloc(t, bytes);
    free(t, bytes);
  }
};

// One engine unit, as ShardedModel::Unit, reduced to sizes and state.
struct SimUnit {
  int64_t padded = 0, shard = 0, own = 0;
  bool has_root = false, solo = false;
  std::vector<int64_t> layers;
  bool gathered = false, pending = false;
  bool grad_defined = false;  // full_grad exists (or is a view, for solo)
};

int64_t dsize(DType d) { return int64_t(dtype_size(d)); }

// Temporaries of one op: the CPU matmul widens each bf16 operand (and a bf16 output) to an f32
// copy; all of one call's copies are alive together. Arguments: element counts and whether that
// operand is bf16.
int64_t widen(int64_t a, bool a16, int64_t b, bool b16, int64_t c, bool c16) {
  return 4 * ((a16 ? a : 0) + (b16 ? b : 0) + (c16 ? c : 0));
}

// The largest matmul temporary of a decoder block's forward and of its backward (model/llama.cpp,
// in call order). Activations are bf16 when act16, gathered weights when w16; gradients and the
// backward's d* buffers are always f32.
struct BlockTemps {
  int64_t fwd = 0, bwd = 0;
};
BlockTemps block_temps(const ModelConfig& c, int64_t N, bool act16, bool w16) {
  const int64_t D = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const bool a = act16, w = w16;
  BlockTemps t;
  for (int64_t v : {widen(N * D, a, qd * D, w, N * qd, a), widen(N * D, a, kvd * D, w, N * kvd, a),
                    widen(N * qd, a, D * qd, w, N * D, a), widen(N * D, a, F * D, w, N * F, a),
                    widen(N * F, a, D * F, w, N * D, a)})
    t.fwd = std::max(t.fwd, v);
  for (int64_t v : {widen(0, false, D * F, w, 0, false), widen(0, false, N * F, a, 0, false),
                    widen(0, false, F * D, w, 0, false), widen(0, false, N * D, a, 0, false),
                    widen(0, false, D * qd, w, 0, false), widen(0, false, N * qd, a, 0, false),
                    widen(0, false, qd * D, w, 0, false), widen(0, false, kvd * D, w, 0, false)})
    t.bwd = std::max(t.bwd, v);
  return t;
}

// Ring accounting, as CommStats: (n-1)/n of the buffer per all-gather or reduce-scatter.
double ring(double bytes, int n) { return n > 1 ? bytes * (n - 1) / n : 0.0; }

// The engine's own rows per cross-entropy chunk (ops.h: linear_cross_entropy's default).
constexpr int64_t kCeChunkRows = 256;

// NF4 with double quantization (QLoRA): 4 bits per weight, an 8-bit absmax per block of 64 and an
// f32 scale per 256 of those blocks.
constexpr double kNf4BytesPerParam = 0.5 + 1.0 / 64 + 4.0 / (64 * 256);

bool checkpointed(int every, int64_t layer) { return every > 0 && layer % every == 0; }

}  // namespace

Estimate estimate(const EstimateInput& in) {
  const ModelConfig& cfg = in.model;
  const shard::ShardingConfig& sc = in.sharding;
  SHARDLM_CHECK(in.world_size >= 1, "world size must be >= 1, got {}", in.world_size);
  SHARDLM_CHECK(in.micro_batch_size >= 1 && in.seq_len >= 1 && in.grad_accum >= 1,
                "micro batch, sequence length and accumulation steps must be >= 1");
  const int W = in.world_size;
  const int rpn = in.ranks_per_node > 0 ? std::min(in.ranks_per_node, W) : W;
  // The shard group, as make_mesh forms it.
  int S = W;
  if (sc.hybrid()) {
    S = sc.shard_group_size > 0 ? sc.shard_group_size : rpn;
    if (S < 1 || W % S != 0)
      throw Error(fmt::format("{}: a shard group of {} ranks does not divide the world of {} ranks",
                              shard::strategy_name(sc.strategy), S, W),
                  {.key = "shard_group_size"});
  }
  const bool sharded = sc.shard_optimizer(), shard_grads = sc.shard_gradients();
  const int64_t pd = dsize(sc.param_dtype), rd = dsize(sc.reduce_dtype);
  const DType act = sc.param_dtype;  // the trainer computes in the parameter dtype

  Estimate est;
  est.shard_group = S;
  est.parameters = parameter_count(cfg);

  // ---- the units, as the engine's constructor lays them out ----
  const std::vector<model::UnitLayout> parts = model::llama_units(cfg);
  std::vector<SimUnit> units;
  for (const std::vector<int>& g : shard::wrap_units(parts, sc)) {
    SimUnit u;
    model::UnitLayout merged{parts[size_t(g[0])].name, {}};
    for (int part : g) {
      if (part == 0) u.has_root = true;
      else u.layers.push_back(part - 1);
      for (const model::ParamInfo& p : parts[size_t(part)].params) merged.params.push_back(p);
    }
    u.padded = shard::make_flat_layout(merged, S).padded_numel;
    u.shard = u.padded / S;
    u.own = sharded ? u.shard : u.padded;
    u.solo = sharded && S == 1 && !sc.hybrid();
    units.push_back(std::move(u));
    est.padded_params += units.back().padded;
  }
  const int n = int(units.size());
  est.num_units = n;

  Tracker tr;
  for (SimUnit& u : units) {
    tr.alloc(Term::ParamsAtRest, u.own * 4);
    tr.alloc(Term::Optimizer, u.own * 4);
    tr.alloc(Term::Optimizer, u.own * 4);
    if (u.solo) {
      tr.alloc(Term::GradShard, u.shard * 4);
      u.grad_defined = true;  // a view of the shard
      if (sc.param_dtype != DType::F32) {
        tr.alloc(Term::FullParams, u.padded * pd);
      }
      u.gathered = true;
    } else if (sharded) {
      tr.alloc(Term::GradShard, u.shard * 4);
    }
  }
  // An all-gather sends the f32 master itself, or a param_dtype copy of it that lives until the
  // gather completes (ShardedModel::gather_source).
  const int64_t send_bytes_per_elem = sc.param_dtype == DType::F32 ? 0 : pd;
  // ZERO1's refresh_full_params: a blocking all-gather into the persistent full parameters.
  auto zero1_refresh = [&](SimUnit& u) {
    if (sc.strategy == shard::Strategy::Zero1 && !u.solo) tr.spike(Term::Communication, u.shard * send_bytes_per_elem);
  };
  // Loading / init: refresh_full_params keeps full parameters for NO_SHARD (unless they are the
  // f32 master itself) and ZERO1.
  for (SimUnit& u : units) {
    if (u.solo || shard_grads) continue;
    if (!(sc.strategy == shard::Strategy::NoShard && sc.param_dtype == DType::F32)) {
      tr.alloc(Term::FullParams, u.padded * pd);
    }
    zero1_refresh(u);
    u.gathered = true;
  }

  // ---- LlamaCompute::reserve: the arena, kept for the run ----
  const int64_t N = in.micro_batch_size * in.seq_len;
  const int64_t D = cfg.hidden_size, F = cfg.intermediate_size, H = cfg.num_attention_heads, V = cfg.vocab_size;
  const int64_t qd = cfg.q_dim(), kvd = cfg.kv_dim(), a = dsize(act);
  const int64_t layer_bytes = N * (a * (4 * D + 2 * qd + 2 * kvd + 3 * F) + 4 * (2 + H));  // the 14 buffers
  bool any_ckpt = false;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const bool ck = checkpointed(in.checkpoint_every, l);
    any_ckpt = any_ckpt || ck;
    tr.alloc(Term::Activations, ck ? N * a * D : layer_bytes);  // a checkpointed layer keeps its input
  }
  if (any_ckpt) tr.alloc(Term::Activations, layer_bytes - N * a * D);  // the shared recompute set
  tr.alloc(Term::Activations, 2 * N * D * a + N * 4 + 3 * N * 4);       // h_final, xnf, rstdf, ids, positions, segments
  tr.alloc(Term::OtherWorkspace, 4 * N * (3 * D + 2 * qd + 2 * kvd + 3 * F));  // dh dtmp dxn datt dq dk dv d_act dgate dup

  const bool act16 = act == DType::BF16, w16 = sc.param_dtype == DType::BF16;
  const BlockTemps temps = block_temps(cfg, N, act16, w16);
  const int64_t C = std::min(kCeChunkRows, N);
  const int64_t ce_bytes = C * V * 4 + (w16 ? V * D * 4 : 0) + (act16 ? C * D * 4 : 0);

  // ---- the step, as ShardedModel::run_micro_batch and its helpers ----
  auto gather_start = [&](SimUnit& u) {
    if (u.gathered || u.pending) return;
    tr.alloc(Term::FullParams, u.padded * pd);
    tr.alloc(Term::Communication, u.shard * send_bytes_per_elem);
    u.pending = true;
  };
  auto ensure_gathered = [&](SimUnit& u) {
    if (u.gathered) return;
    gather_start(u);
    tr.free(Term::Communication, u.shard * send_bytes_per_elem);
    u.pending = false;
    u.gathered = true;
  };
  auto release = [&](SimUnit& u) {
    if (!shard_grads || u.solo || !u.gathered) return;
    tr.free(Term::FullParams, u.padded * pd);
    u.gathered = false;
  };
  auto ensure_grad = [&](SimUnit& u) {
    if (u.grad_defined) return;
    tr.alloc(Term::FullGrads, u.padded * 4);
    u.grad_defined = true;
  };
  auto reduce_grad = [&](SimUnit& u, bool last) {
    if (u.solo) return;
    if (!last && (!shard_grads || !sc.reduce_every_microbatch)) return;
    if (sc.strategy == shard::Strategy::NoShard) {
      if (sc.reduce_dtype != DType::F32) tr.spike(Term::Communication, u.padded * rd);
      return;
    }
    tr.alloc(Term::Communication, u.shard * 4);  // part
    if (sc.reduce_dtype != DType::F32) {
      tr.alloc(Term::Communication, u.padded * rd);  // low
      tr.alloc(Term::Communication, u.shard * rd);   // low_part
      tr.free(Term::Communication, u.shard * rd);
      tr.free(Term::Communication, u.padded * rd);
    }
    if (shard_grads) {
      tr.free(Term::FullGrads, u.padded * 4);
      u.grad_defined = false;
    }
    tr.free(Term::Communication, u.shard * 4);
  };
  auto micro_batch = [&](bool last) {
    const bool reshard = sc.reshard_after_forward();
    for (int i = 0; i < n; ++i) {
      SimUnit& u = units[size_t(i)];
      ensure_gathered(u);
      if (sc.forward_prefetch && i + 1 < n) gather_start(units[size_t(i) + 1]);
      for (size_t k = 0; k < u.layers.size(); ++k) tr.spike(Term::OtherWorkspace, temps.fwd);
      if (reshard && !u.has_root) release(u);
    }
    ensure_grad(units[0]);
    tr.spike(Term::LossWorkspace, ce_bytes);
    for (int i = n - 1; i >= 0; --i) {
      SimUnit& u = units[size_t(i)];
      ensure_gathered(u);
      if (sc.backward_prefetch == shard::BackwardPrefetch::Pre && i > 0) gather_start(units[size_t(i) - 1]);
      ensure_grad(u);
      for (int64_t l : u.layers)
        tr.spike(Term::OtherWorkspace, checkpointed(in.checkpoint_every, l) ? std::max(temps.fwd, temps.bwd) : temps.bwd);
      if (sc.backward_prefetch == shard::BackwardPrefetch::Post && i > 0) gather_start(units[size_t(i) - 1]);
      reduce_grad(u, last);
      if (shard_grads) release(u);
    }
  };
  // Two steps: NO_SHARD and ZERO1 keep their full gradients from the first step on, so the second
  // step starts with more live memory than the first did; later steps repeat the second.
  for (int step = 0; step < 2; ++step) {
    for (int64_t m = 0; m < in.grad_accum; ++m) micro_batch(m + 1 == in.grad_accum);
    for (SimUnit& u : units) zero1_refresh(u);  // after AdamW
  }

  est.at_peak = tr.at_peak;
  est.peak = tr.peak;
  est.category_peak = tr.cpeak;
  est.peak_total = tr.peak_total;

  // ---- communication per step (per rank, ring accounting; docs/sharding.md) ----
  {
    const double psi = double(est.padded_params);
    double gathered = 0;  // elements all-gathered per micro-batch by the sharded-gradient strategies
    for (const SimUnit& u : units) gathered += double(u.padded) * (sc.reshard_after_forward() && !u.has_root ? 2 : 1);
    const double M = double(in.grad_accum);
    const double reductions = sc.reduce_every_microbatch ? M : 1;  // reduce-scatters per step
    const bool multi_node = W > rpn;
    const bool shard_spans = S > rpn;  // consecutive ranks: a group larger than a node crosses nodes
    double intra = 0, inter = 0;
    auto add = [&](double bytes, bool crosses) { (crosses ? inter : intra) += bytes; };
    switch (sc.strategy) {
      case shard::Strategy::NoShard: add(2 * ring(psi * rd, W), multi_node); break;
      case shard::Strategy::Zero1: add(ring(psi * rd, W) + ring(psi * pd, W), multi_node); break;
      default:
        if (S > 1) add(M * ring(gathered * pd, S) + reductions * ring(psi * rd, S), shard_spans);
        if (sc.hybrid() && W / S > 1) add(reductions * 2 * ring(psi / S * 4, W / S), multi_node);
    }
    est.comm_bytes_per_step = intra + inter;
    est.inter_node_bytes_per_step = inter;
  }
  int64_t largest_unit = 0;
  for (const SimUnit& u : units) largest_unit = std::max(largest_unit, u.padded);
  est.save_gather_bytes = est.parameters * 4 + largest_unit * 4;

  // ---- estimate-only variants ----
  if (in.lora_rank > 0) {
    est.approximate = true;
    const int64_t r = in.lora_rank;
    const int64_t L = cfg.num_hidden_layers;
    // Adapters on every linear layer of every block: q, k, v, o, gate, up, down (r x (in + out) each).
    const int64_t lora = L * r * ((D + qd) + 2 * (D + kvd) + (qd + D) + 2 * (D + F) + (F + D));
    const int64_t linear = L * (qd * D + 2 * kvd * D + D * qd + 3 * D * F);
    const double base_bytes = in.qlora ? double(linear) * kNf4BytesPerParam + double(est.parameters - linear) * 2
                                       : double(est.parameters) * 2;
    const bool persistent_full = !shard_grads;  // NO_SHARD, ZERO1: every rank holds the whole base
    const int64_t lora_own = sharded ? (lora + S - 1) / S : lora;
    const double ratio = base_bytes / (double(est.padded_params) * double(pd));
    std::array<int64_t, kNumTerms> t{};
    t[size_t(Term::ParamsAtRest)] = int64_t(persistent_full ? base_bytes : base_bytes / S) + lora_own * 4;
    t[size_t(Term::FullParams)] = persistent_full ? 0 : int64_t(double(est.at_peak[size_t(Term::FullParams)]) * ratio);
    t[size_t(Term::GradShard)] = sharded ? lora_own * 4 : 0;
    t[size_t(Term::FullGrads)] = lora * 4;
    t[size_t(Term::Optimizer)] = lora_own * 8;
    // Each adapter saves its rank-r intermediate (x A) for the backward.
    t[size_t(Term::Activations)] = est.at_peak[size_t(Term::Activations)] + L * 7 * N * r * a;
    t[size_t(Term::LossWorkspace)] = est.at_peak[size_t(Term::LossWorkspace)];
    t[size_t(Term::OtherWorkspace)] = est.at_peak[size_t(Term::OtherWorkspace)];
    // The frozen shard is gathered as stored (no param_dtype send copy); only the adapters'
    // gradients are reduced.
    t[size_t(Term::Communication)] = sharded && S > 1 ? lora_own * 4 : 0;
    est.at_peak = t;
    est.peak = t;
    est.peak_total = 0;
    for (int64_t v : t) est.peak_total += v;
    est.category_peak = {};
    for (int i = 0; i < kNumTerms; ++i) est.category_peak[size_t(term_category(Term(i)))] += t[size_t(i)];
    est.notes.push_back(fmt::format(
        "LoRA{} is an estimate only: shardlm does not train LoRA adapters yet. Rank {} on q/k/v/o/gate/up/down: "
        "{:.2f}M trainable parameters; frozen base in {} ({:.2f} bytes/param on average)",
        in.qlora ? " (QLoRA)" : "", r, double(lora) / 1e6, in.qlora ? "NF4 (linear weights) + bf16 (embeddings, norms)" : "bf16",
        base_bytes / double(est.parameters)));
  }
  est.device_bytes = est.peak_total;
  if (in.offload) {
    est.approximate = true;
    for (Term t : {Term::ParamsAtRest, Term::GradShard, Term::Optimizer}) est.host_bytes += est.at_peak[size_t(t)];
    est.device_bytes = est.peak_total - est.host_bytes;
    est.notes.push_back(
        "offload is an estimate only (the engine refuses fsdp_offload_params on CPU ranks): the f32 master shard, "
        "the reduced gradient shard and AdamW state move to host memory and the optimizer steps there");
  }
  if (!sharded && W > 1 && sc.strategy == shard::Strategy::NoShard)
    est.notes.push_back("NO_SHARD: every rank holds the whole model, its gradients and AdamW state");
  return est;
}

std::vector<AccelerateRow> accelerate_table(const ModelConfig& cfg) {
  const std::vector<model::UnitLayout> parts = model::llama_units(cfg);
  // accelerate's "largest layer" is its largest residual group: for these models a decoder layer,
  // or the embedding (or the untied lm_head) when the vocabulary is large.
  int64_t largest = 0;
  for (size_t i = 1; i < parts.size(); ++i) largest = std::max(largest, parts[i].numel());
  for (const model::ParamInfo& p : parts[0].params) largest = std::max(largest, p.numel());
  const int64_t total = parameter_count(cfg);
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

shard::Strategy choose_strategy(const EstimateInput& base, int64_t budget, std::string* why) {
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
    throw Error(fmt::format("sharding_strategy auto: nothing fits max_memory_per_rank {}: the smallest, {}, needs {} "
                            "per rank (try activation_checkpointing, a smaller micro_batch_size or more ranks)",
                            budget_s, shard::strategy_name(best.s), format_bytes(best.e.device_bytes)),
                {.key = "max_memory_per_rank"});
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

}  // namespace shardlm::memory
