#include "shard/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "core/rng.h"
#include "core/timeline.h"

namespace shardlm::shard {

namespace {

// "forward layer 3" / "head" ...: a compute span's name in the timeline.
std::string stage_label(const Stage& s) {
  switch (s.kind) {
    case StageKind::EmbedForward: return "embed forward";
    case StageKind::BlockForward: return fmt::format("forward layer {}", s.layer);
    case StageKind::Head: return "head and loss";
    case StageKind::BlockBackward: return fmt::format("backward layer {}", s.layer);
    case StageKind::EmbedBackward: return "embed backward";
  }
  return "stage";
}

}  // namespace

// ---- units ---------------------------------------------------------------------------------------

// AdamW's m and v; absmax only for 8-bit state ([own_numel / 256] f32 each).
struct Moments {
  FlatBuffer m, v, m_absmax, v_absmax;
};

struct ShardedModel::Unit {
  Unit(const PlannedUnit& p, ShardedBuffer buffer) : plan(&p), params(std::move(buffer)) {}
  const PlannedUnit* plan;
  ShardedBuffer params;  // what a visit gathers: trained parameters, frozen base, NF4 store
  // Optimizer side (pinned host memory under offload, else the engine's device):
  // What this rank optimizes, [own_numel]: the f32 master, and AdamW's moments in the state dtype
  // (PlannedUnit::state_dtype: f32 or bf16, or u8 codes with an f32 absmax per 256 elements).
  FlatBuffer master;
  Moments moments;
  FlatBuffer grad_shard;                   // f32 [shard_numel]: reduced gradients (sharded optimizer)
  FlatBuffer full_grad;                    // f32 [padded]: the backward's accumulator
  // What the model binds as gradients: full_grad or, for a solo unit, the gradient shard.
  Tensor grads;
  // The gradient reduction in flight: started after the unit's backward visit, finished after the
  // next visit's compute (or before the unit's next use of its gradients), so the two overlap as
  // FSDP's post-backward stream does.
  std::unique_ptr<GradReduction> reducing;
};

ShardedModel::ShardedModel(const ModelConfig& cfg, const model::FinetuneSpec& finetune, const ShardingConfig& sharding,
                           Mesh& mesh, EngineUse use)
    : cfg_(cfg),
      finetune_(finetune),
      plan_(make_plan(cfg, finetune, sharding, mesh.tensor_shard().rank(), mesh.tensor_shard().size())),
      mesh_(mesh),
      device_(mesh.device()),
      make_{device_},
      shard_comm_(mesh.tensor_shard()),
      use_(use) {
  // A dry run (the meta device) may plan offload for a GPU it does not have.
  const DType state = sharding.state_dtype;
  SHARDLM_CHECK(state == DType::F32 || state == DType::BF16 || state == DType::U8,
                "optimizer state must be f32, bf16 or u8 (8-bit blockwise), got {}", dtype_name(state));
  SHARDLM_CHECK(!plan_.offload.params || (device_ != Device::CPU && sharding.shard_gradients()),
                "CPU offload needs CUDA communicators and a strategy that shards gradients (got {} on {})",
                strategy_name(sharding.strategy), device_name(device_));
  const bool sharded = sharding.shard_optimizer();
  const bool offload = plan_.offload.params;
  // Optimizer-side state: pinned host memory under offload, else on the engine's device.
  auto state_buffer = [&](BufferRole role, int64_t numel, DType dtype = DType::F32) {
    return make_(role, dtype, numel, true, offload);
  };
  int64_t largest_shard = 0, largest_8bit = 0;
  for (const PlannedUnit& p : plan_.units) {
    auto u = std::make_unique<Unit>(p, ShardedBuffer(p, plan_.precision.param, make_));
    if (p.trains()) {  // a frozen unit (LoRA) has no master, no optimizer state, no gradients
      u->master = state_buffer(BufferRole::Master, p.own_numel);
      if (use == EngineUse::Train) {  // an evaluation engine takes no step and makes no gradients
        Moments& mo = u->moments;
        mo.m = state_buffer(BufferRole::Moments, p.own_numel, p.state_dtype);
        mo.v = state_buffer(BufferRole::Moments, p.own_numel, p.state_dtype);
        if (p.state_dtype == DType::U8) {  // own_numel is a whole number of blocks (the plan aligns it)
          mo.m_absmax = state_buffer(BufferRole::Moments, p.own_numel / ops::kQuant8Block);
          mo.v_absmax = state_buffer(BufferRole::Moments, p.own_numel / ops::kQuant8Block);
          largest_8bit = std::max(largest_8bit, p.own_numel);
        }
        if (sharded) u->grad_shard = state_buffer(BufferRole::GradShard, p.shard_numel);
        if (p.solo) u->grads = u->grad_shard.view();  // the backward accumulates into the shard itself
      }
      largest_shard = std::max(largest_shard, p.shard_numel);
    }
    units_.push_back(std::move(u));
  }
  if (offload) host_staging_ = make_(BufferRole::Staging, DType::F32, largest_shard, false, true);
  // 8-bit state: the f32 m and v of one chunk of blocks at a time (optimizer_step).
  if (largest_8bit > 0) state_scratch_ = state_buffer(BufferRole::Moments, 2 * std::min(largest_8bit, kQuant8Chunk));
  reduce_ = {&shard_comm_, sharding.hybrid() ? &mesh.tensor_replicate() : nullptr, plan_.precision.reduce,
             sharding.strategy == Strategy::NoShard, make_, host_staging()};
}

ShardedModel::~ShardedModel() { comm::set_activity({0, "after training"}); }  // it named this engine's units

std::vector<std::string> ShardedModel::names() const {
  std::vector<std::string> out;
  for (const PlannedUnit& p : plan_.units)
    for (const FlatEntry& e : p.layout.entries) out.push_back(e.info.name);
  return out;
}

ShardedModel::LoadTargets ShardedModel::load_targets(int k) {
  const Unit& u = *units_.at(size_t(k));
  return {u.master.view(), u.params.frozen_rest(), u.params.nf4_rest()};  // a released buffer's view is undefined
}

// ---- parameters: gather, bind, release -----------------------------------------------------------

void ShardedModel::master_weights_changed() {
  for (auto& u : units_) u->params.refresh(shard_comm_, u->master.view(), host_staging());
}

void ShardedModel::gather_start(Unit& u) { u.params.start(shard_comm_, u.master.view(), host_staging()); }

void ShardedModel::wait_gathered(Unit& u, model::StagedModel& m) {
  if (u.params.state() == GatherState::Sharded) gather_start(u);
  if (u.params.state() == GatherState::Gathering) {
    const timeline::Span span([&] { return "gather wait " + u.plan->name; }, "wait");
    u.params.wait();
  }
  u.params.dequantize();
  bind(u, m.weights(), u.params.trained(), true);
}

// QLoRA: the dequantized weights last one visit; the next one dequantizes again.
void ShardedModel::end_visit(Unit& u, model::StagedModel& m) {
  if (!u.params.dequantized_live()) return;
  u.params.end_visit();
  unbind(u, m.weights());
}

void ShardedModel::release(Unit& u, model::StagedModel& m) {
  if (u.plan->persistent || u.params.state() != GatherState::Gathered) return;
  u.params.release();
  unbind(u, m.weights());  // any use of a freed unit fails loudly instead of reading freed memory
}

// Binds the unit's tensors to views of `flat` (its trained layout) and, with_frozen, its frozen
// ones (the frozen buffer and QLoRA's dequantized weights). Without, the frozen tensors stay
// unbound: that is how gradients are bound, since a frozen weight has none.
void ShardedModel::bind(const Unit& u, model::LlamaWeights& w, const Tensor& flat, bool with_frozen) const {
  const Tensor frozen = with_frozen ? u.params.frozen() : Tensor{};
  const Tensor dequantized = with_frozen ? u.params.dequantized() : Tensor{};
  auto lookup = [&](const std::string& name) -> Tensor {
    for (const auto& [layout, buf] : {std::pair{&u.plan->layout, &flat}, std::pair{&u.plan->frozen, &frozen},
                                      std::pair{&u.plan->quantized, &dequantized}})
      for (const FlatEntry& e : layout->entries) {
        if (e.info.name != name) continue;
        if (!buf->defined() && layout != &u.plan->layout) return Tensor{};
        char* base = buf->data ? static_cast<char*>(buf->data) + size_t(e.offset) * dtype_size(buf->dtype) : nullptr;
        // The view carries the buffer's device: ops dispatch on it.
        return Tensor::view(base, buf->dtype, e.info.shape.data(), int(e.info.shape.size()), buf->device);
      }
    throw Error("not in this unit", {.tensor = name});
  };
  for (int part : u.plan->parts) model::bind_part(cfg_, plan_.parts[size_t(part)], w, lookup);
}

void ShardedModel::unbind(const Unit& u, model::LlamaWeights& w) const {
  for (int part : u.plan->parts) model::bind_part(cfg_, plan_.parts[size_t(part)], w, {});
}

// ---- gradients -------------------------------------------------------------------------------------

void ShardedModel::acquire_grad(Unit& u, model::StagedModel& m) {
  if (!u.plan->trains()) return;
  reduce_finish(u);  // NO_SHARD and ZERO1 accumulate into the buffer their reduction reads
  if (!u.plan->solo && !u.full_grad.live()) {
    u.full_grad = make_(BufferRole::FullGrad, DType::F32, u.plan->layout.padded_numel, true);  // zeroed
    u.grads = u.full_grad.view();
  }
  bind(u, m.grads(), u.grads, false);
}

// Starts handing a unit's accumulated gradients to their owners (grad_reduction.h). NO_SHARD
// all-reduces the full buffer in place (it stays, accumulating over micro-batches and steps);
// ZERO1 reduce-scatters it and keeps it; sharded-gradient strategies hand the full buffer to the
// reduction and unbind it.
void ShardedModel::reduce_start(Unit& u, model::StagedModel& m) {
  const PlannedUnit& p = *u.plan;
  if (p.solo || !p.trains()) return;  // the gradients are already in the shard, or there are none
  reduce_finish(u);                   // one reduction per unit in flight
  const Tensor full = u.full_grad.view();
  FlatBuffer handed_over;
  if (plan_.sharding.strategy != Strategy::NoShard && plan_.sharding.shard_gradients()) {
    handed_over = std::move(u.full_grad);
    u.grads = Tensor{};
    unbind(u, m.grads());
  }
  u.reducing = std::make_unique<GradReduction>(reduce_, full, std::move(handed_over), p.shard_numel);
  reducing_.push_back(&u);
}

void ShardedModel::reduce_finish(Unit& u) {
  while (u.reducing && !reduce_advance(u)) {
  }
}

bool ShardedModel::reduce_advance(Unit& u) {
  if (!u.reducing) return true;
  {
    const timeline::Span span([&] { return "reduce wait " + u.plan->name; }, "wait");
    if (!u.reducing->advance(reduce_)) return false;  // hybrid: its all-reduce across replicas now runs
  }
  u.reducing->finish(reduce_, u.full_grad.view(), u.grad_shard.view());
  u.reducing.reset();
  std::erase(reducing_, &u);
  return true;
}

// ---- the step ------------------------------------------------------------------------------------

template <class Compute>
void ShardedModel::run_visits(const std::vector<Visit>& visits, model::StagedModel& m, Pass pass, int64_t step,
                              bool last_micro, Compute compute) {
  const ShardingConfig& sc = plan_.sharding;
  for (const Visit& v : visits) {
    Unit& u = *units_[size_t(v.unit)];
    // For the collective watchdog's message, should this visit's collectives hang.
    if (pass == Pass::Training)
      comm::set_activity({step, nullptr, &u.plan->name});
    else
      comm::set_activity({0, "evaluation", &u.plan->name});
    if (v.needs_params) wait_gathered(u, m);
    // Forward prefetch, and BACKWARD_PRE, issue the next unit's gather before this visit's
    // compute; BACKWARD_POST after it (FSDP's meanings).
    const bool post = v.backward && sc.backward_prefetch == BackwardPrefetch::Post;
    if (v.prefetch >= 0 && !post) gather_start(*units_[size_t(v.prefetch)]);
    if (v.backward) acquire_grad(u, m);
    // The reductions started before this visit run behind its compute; they advance after it
    // (finish, or under hybrid sharding go on to their all-reduce across replicas, which runs
    // behind the next visit's compute).
    const std::vector<Unit*> earlier = reducing_;
    for (const Stage& s : v.stages) {
      const timeline::Span span([&] { return stage_label(s); }, "compute");
      compute(s);
    }
    if (v.prefetch >= 0 && post) gather_start(*units_[size_t(v.prefetch)]);
    if (v.backward) {
      // A unit's gradients are reduced once per backward, after its last visit (a tied embedding
      // and head accumulate both uses first, as FSDP's post-backward does): sharded ones in every
      // micro-batch (or, with no_sync, only the last), replicated ones in the last.
      const bool due = v.last_backward && (last_micro || (sc.shard_gradients() && sc.reduce_every_microbatch));
      if (due) reduce_start(u, m);
    }
    for (Unit* r : earlier) reduce_advance(*r);
    end_visit(u, m);
    if (v.free_after) release(u, m);
  }
  while (!reducing_.empty()) reduce_finish(*reducing_.front());  // the step reads every gradient
}

double ShardedModel::host_sum(double v, bool over_replicas) {
  v = mesh_.shard->all_reduce_sum(v);
  if (over_replicas && plan_.sharding.hybrid()) v = mesh_.replicate->all_reduce_sum(v);
  return v;
}

StepStats ShardedModel::train_step(model::StagedModel& m, const std::vector<model::Batch>& micro,
                                   const ops::AdamWConfig& opt, int64_t step, double max_grad_norm,
                                   RowObjective* objective) {
  SHARDLM_CHECK(use_ == EngineUse::Train, "an engine built for evaluation (EngineUse::Evaluate) takes no optimizer step");
  comm::set_activity({step, "token count"});
  // The global batch's token count, so every rank scales its gradients by the same 1 / tokens.
  int64_t local_tokens = 0;
  for (const model::Batch& b : micro)
    if (b.targets)
      for (int64_t i = 0; i < b.B * b.T; ++i) local_tokens += b.targets[i] != ops::kIgnoreIndex;
  const double world_tokens = host_sum(double(local_tokens), true);
  // What the loss is a mean over: the targets, or the objective's count (DPO's pairs).
  const double world_count = objective ? host_sum(objective->local_count(micro), true) : world_tokens;
  const float grad_scale = world_count > 0 ? float(1.0 / world_count) : 0.0f;

  for (auto& u : units_) {
    if (u->grad_shard.live()) ops::zero(u->grad_shard.view());
    if (u->full_grad.live()) ops::zero(u->full_grad.view());  // NO_SHARD / ZERO1 keep theirs between steps
  }
  double loss_sum = 0.0;
  for (size_t i = 0; i < micro.size(); ++i) {
    const model::Batch& b = micro[i];
    m.reserve(b.B, b.T);
    run_visits(plan_.train, m, Pass::Training, step, i + 1 == micro.size(), [&](const Stage& s) {
      switch (s.kind) {
        case StageKind::EmbedForward: m.embed_forward(b); break;
        case StageKind::BlockForward: m.block_forward(s.layer); break;
        case StageKind::Head:
          loss_sum += objective ? objective->head(m, b, i, grad_scale) : m.head_loss(b, grad_scale, true).loss_sum;
          break;
        case StageKind::BlockBackward: m.block_backward(s.layer); break;
        case StageKind::EmbedBackward: m.embed_backward(b); break;
      }
    });
  }
  comm::set_activity({step, "loss and gradient norm"});
  StepStats st;
  st.tokens = int64_t(world_tokens);
  loss_sum = host_sum(loss_sum, true);
  st.loss = world_count > 0 ? loss_sum / world_count : 0.0;

  // Global gradient norm. Sharded optimizer: each shard group holds every element once (replicas
  // hold copies), so sum over the shard group. NO_SHARD: every rank holds all of it.
  const bool sharded = plan_.sharding.shard_optimizer();
  double sumsq = 0.0;
  for (auto& u : units_)
    if (u->plan->trains()) sumsq += ops::sum_squares(sharded ? u->grad_shard.view() : u->full_grad.view());
  if (sharded) sumsq = host_sum(sumsq, false);
  st.grad_norm = std::sqrt(sumsq);
  if (!(std::isfinite(st.loss) && std::isfinite(st.grad_norm))) {
    st.finite = false;
    st.nonfinite = first_nonfinite(Checked::Gradients);
    return st;  // no optimizer step: weights and moments stay as they were
  }
  const timeline::Span span("optimizer step", "compute");
  optimizer_step(opt, step, ops::clip_coefficient(st.grad_norm, float(max_grad_norm)));
  // The update itself can overflow (a learning rate far too large) with a finite loss and gradient,
  // so the updated weights are checked too: one more pass over what this rank owns.
  double weights_sumsq = 0.0;
  for (auto& u : units_)
    if (u->plan->trains()) weights_sumsq += ops::sum_squares(u->master.view());
  weights_sumsq = host_sum(weights_sumsq, false);
  if (!std::isfinite(weights_sumsq)) {
    st.finite = false;
    st.weights_nonfinite = true;
    st.nonfinite = first_nonfinite(Checked::Weights);
  }
  return st;
}

// The first tensor, in unit order, whose reduced gradient (or updated master weight) holds a NaN or
// Inf on any rank of the shard group (collective over the host groups; only called after a
// non-finite step).
std::string ShardedModel::first_nonfinite(Checked what) {
  const bool sharded = plan_.sharding.shard_optimizer() || what == Checked::Weights;
  std::vector<std::pair<int, const FlatEntry*>> tensors;
  std::vector<float> bad;
  for (size_t k = 0; k < units_.size(); ++k) {
    const PlannedUnit& p = *units_[k]->plan;
    const Tensor& g = what == Checked::Weights ? units_[k]->master.view()
                      : sharded                ? units_[k]->grad_shard.view()
                                               : units_[k]->full_grad.view();
    for (const FlatEntry& e : p.layout.entries) {
      tensors.emplace_back(int(k), &e);
      bad.push_back(0.0f);
      const int64_t lo = std::max(p.own_begin, e.offset), hi = std::min(p.own_begin + p.own_numel, e.offset + e.info.numel());
      // A sum of squares is NaN or Inf exactly when an element is (or overflows, which is as bad).
      if (lo < hi && g.defined() && !std::isfinite(ops::sum_squares(g.slice(lo - p.own_begin, hi - p.own_begin))))
        bad.back() = 1.0f;
    }
  }
  mesh_.shard->all_reduce(Tensor::view(bad.data(), DType::F32, {int64_t(bad.size())}), comm::ReduceOp::Sum);
  for (size_t i = 0; i < bad.size(); ++i)
    if (bad[i] > 0) return fmt::format("{} (unit {})", tensors[i].second->info.name, units_[size_t(tensors[i].first)]->plan->name);
  return "";
}

// AdamW on what this rank owns, tensor by tensor (norms and biases without weight decay). Under
// offload master, gradient shard and moments are host tensors, so this runs on the CPU. 8-bit
// state goes chunk by chunk of whole blocks: dequantized into f32 scratch, stepped as f32
// moments are, quantized back with each block's new absmax (bitsandbytes' blockwise AdamW8bit,
// with torch's AdamW update).
void ShardedModel::optimizer_step(const ops::AdamWConfig& opt, int64_t step, float clip) {
  ops::AdamWConfig no_decay = opt;
  no_decay.weight_decay = 0.0;
  for (auto& up : units_) {
    Unit& u = *up;
    const PlannedUnit& p = *u.plan;
    if (!p.trains()) continue;
    const Tensor& g = plan_.sharding.shard_optimizer() ? u.grad_shard.view() : u.full_grad.view();
    // Owned elements [a0, a1) with their moments m, v, whose element 0 is owned element a0.
    auto adamw = [&](int64_t a0, int64_t a1, const Tensor& m, const Tensor& v) {
      const int64_t begin = p.own_begin + a0, end = p.own_begin + a1;
      for_each_overlap(p.layout, begin, end, [&](const FlatEntry& e, int64_t lo, int64_t hi) {
        const int64_t a = lo - p.own_begin, z = hi - p.own_begin;
        ops::adamw_step(u.master.view().slice(a, z), g.slice(a, z), m.slice(a - a0, z - a0), v.slice(a - a0, z - a0),
                        e.info.weight_decay ? opt : no_decay, step, clip, {stream_id(e.info.name), lo - e.offset});
      });
    };
    const Moments& mo = u.moments;
    if (p.state_dtype != DType::U8) {
      adamw(0, p.own_numel, mo.m.view(), mo.v.view());
      continue;
    }
    const int64_t chunk = state_scratch_.view().numel() / 2, B = ops::kQuant8Block;
    for (int64_t c0 = 0; c0 < p.own_numel; c0 += chunk) {
      const int64_t c1 = std::min(p.own_numel, c0 + chunk);
      const Tensor m = state_scratch_.view().slice(0, c1 - c0), v = state_scratch_.view().slice(chunk, chunk + c1 - c0);
      const Tensor mq = mo.m.view().slice(c0, c1), vq = mo.v.view().slice(c0, c1);
      const Tensor ma = mo.m_absmax.view().slice(c0 / B, c1 / B), va = mo.v_absmax.view().slice(c0 / B, c1 / B);
      ops::dequantize_blockwise8(m, mq, ma, true);
      ops::dequantize_blockwise8(v, vq, va, false);
      adamw(c0, c1, m, v);
      ops::quantize_blockwise8(mq, ma, m, true);
      ops::quantize_blockwise8(vq, va, v, false);
    }
  }
  master_weights_changed();
}

// An evaluation pass of batch b: embedding and blocks forward, then `head` at the head stage.
template <class Head>
void ShardedModel::forward(model::StagedModel& m, const model::Batch& b, Head head) {
  m.reserve(b.B, b.T);
  run_visits(plan_.eval, m, Pass::Evaluation, 0, false, [&](const Stage& s) {
    switch (s.kind) {
      case StageKind::EmbedForward: m.embed_forward(b); break;
      case StageKind::BlockForward: m.block_forward(s.layer); break;
      case StageKind::Head: head(); break;
      default: break;  // no backward stages in evaluation
    }
  });
}

ops::CrossEntropyResult ShardedModel::forward_loss(model::StagedModel& m, const model::Batch& b) {
  ops::CrossEntropyResult r;
  forward(m, b, [&] { r = m.head_loss(b, 1.0f, false); });
  return r;
}

void ShardedModel::forward_rows(model::StagedModel& m, const model::Batch& b, std::span<double> row_loss) {
  forward(m, b, [&] { m.head_rows(b, row_loss, {}); });
}

void ShardedModel::forward_logits(model::StagedModel& m, const model::Batch& b, const Tensor& out) {
  forward(m, b, [&] { m.head_logits(out); });
}

// ---- whole units and checkpoints -------------------------------------------------------------------

void ShardedModel::gather_unit(int k, const Tensor& out) {
  Unit& u = *units_.at(size_t(k));
  const PlannedUnit& p = *u.plan;
  if (!p.trains()) return;  // nothing trained in it (a LoRA run's frozen unit)
  SHARDLM_CHECK(out.dtype == DType::F32 && out.numel() == p.layout.padded_numel && out.device == Device::CPU,
                "gather_unit {}: expected host f32[{}], got {}", p.name, p.layout.padded_numel, out.describe());
  if (!plan_.sharding.shard_optimizer()) {  // every rank holds all of it
    device::copy_bytes(out.data, Device::CPU, u.master.view().data, u.master.view().device, out.nbytes());
    return;
  }
  if (device_ != Device::CUDA) {
    shard_comm_.all_gather(out, u.master.view());
    return;
  }
  // GPU communicators read device memory: the shard goes up (from offloaded host memory) or is
  // read in place, the gathered unit comes down.
  FlatBuffer full = make_(BufferRole::Staging, DType::F32, p.layout.padded_numel, false);
  FlatBuffer up;
  if (u.master.view().device != device_) {
    up = make_(BufferRole::Staging, DType::F32, p.shard_numel, false);
    device::copy(up.view(), u.master.view());
  }
  shard_comm_.all_gather(full.view(), up.live() ? up.view() : u.master.view());
  device::copy(out, full.view());
}

ShardedModel::StateRange ShardedModel::owned_state(int k) {
  Unit& u = *units_.at(size_t(k));
  if (!u.plan->trains()) return {};
  // Checkpoints read and write these views as host memory.
  SHARDLM_CHECK(u.master.view().device == Device::CPU,
                "checkpoints of GPU-resident optimizer state are not implemented yet");
  const Moments& mo = u.moments;
  return {u.plan->own_begin, u.plan->own_numel, u.master.view(), mo.m.view(), mo.v.view(),
          mo.m_absmax.live() ? mo.m_absmax.view() : Tensor{}, mo.v_absmax.live() ? mo.v_absmax.view() : Tensor{}};
}

Tensor ShardedModel::owned_grad(int k) const {
  const Unit& u = *units_.at(size_t(k));
  return plan_.sharding.shard_optimizer() ? u.grad_shard.view() : u.full_grad.view();
}

comm::Communicator* ShardedModel::state_copies() const {
  if (plan_.sharding.strategy == Strategy::NoShard) return mesh_.shard.get();  // the data-parallel group
  if (plan_.sharding.hybrid()) return mesh_.replicate.get();
  return nullptr;
}

}  // namespace shardlm::shard
