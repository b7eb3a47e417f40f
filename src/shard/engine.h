// The sharding engine: one code path for every strategy (sharding.h) and every world size, one
// process included, driving a model's stages unit by unit as the unit plan (plan.h) says:
// gathering each unit's parameters before its visit, freeing them as the strategy says, reducing
// its gradients to their owners, and stepping AdamW on this rank's shard only.
//
// Ownership: the engine owns every parameter, gradient and optimizer buffer (tracked under their
// categories). It rebinds the StagedModel's weight and gradient views to gathered buffers as it
// goes, so the model object must not be used with other weights while the engine drives it.
// Views into the engine's buffers (owned_state) live as long as the engine.
//
// Devices: the engine's buffers live where the mesh's tensor communicators want them (CPU for
// local/MPI, CUDA for NCCL); the model must be on the same device. Scalar sums (token counts,
// losses, squared norms) go over the mesh's host groups, which never wait on a GPU stream. With
// offload the f32 master shard, the reduced gradient shard and AdamW's moments are pinned host
// memory and the optimizer step runs on the CPU (docs/sharding.md).
//
// A dry run (the memory estimator, memory/estimator.h) is the same engine on the meta device
// (core/alloc.h) over shape-only communicators (make_shape_mesh): buffers have sizes but no
// memory, ops and communication do nothing, and every allocation and release is seen in order.
//
// Pieces: the unit's gathered data is a ShardedBuffer (sharded_buffer.h), its gradients go to
// their owners through a GradReduction (grad_reduction.h), and filling the buffers from weights or
// a seed is shard/load.h's. Checkpoint state is sliced in checkpoint/.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/config.h"
#include "model/llama.h"
#include "ops/ops.h"
#include "shard/flat_layout.h"
#include "shard/grad_reduction.h"
#include "shard/plan.h"
#include "shard/sharded_buffer.h"
#include "shard/sharding.h"

namespace shardlm::shard {

// One optimizer step's results, global over all ranks.
struct StepStats {
  double loss = 0;      // mean over the global batch's non-ignored targets
  int64_t tokens = 0;   // those targets, all ranks together
  double grad_norm = 0; // global L2 norm before clipping
  // A NaN or Inf in the loss or the gradient norm (every rank sees the same): the optimizer step
  // was not taken, weights and AdamW state are untouched, and `nonfinite` names the first tensor
  // (in unit order) whose gradient holds one, on any rank ("" when the gradients are finite).
  bool finite = true;
  std::string nonfinite;
  // The loss and gradients were finite, but the optimizer step made a weight NaN or Inf (then
  // finite is false and `nonfinite` names the first such weight). The step cannot be undone.
  bool weights_nonfinite = false;
};

// A loss over whole rows in place of the mean token cross-entropy (preference tuning: DPO's loss is
// a function of each sequence's summed log-probability; train/preference.h). The engine runs its
// head stage through it and scales gradients by 1 / the global batch's count of it.
class RowObjective {
 public:
  virtual ~RowObjective() = default;
  // This rank's share of what the loss is a mean over (DPO: its pairs in these micro-batches).
  virtual double local_count(const std::vector<model::Batch>& micro) const = 0;
  // The head's forward and backward of micro-batch i (m.head_rows), each row's gradient scaled so
  // that the sum over every rank's rows is grad_scale x the sum of the losses; returns this rank's
  // loss sum of the micro-batch.
  virtual double head(model::StagedModel& m, const model::Batch& b, size_t i, float grad_scale) = 0;
};

// What an engine is built for. Evaluate: forward passes only (`shardlm eval`), so no optimizer
// state (AdamW moments) or gradient shards are allocated, which leaves a rank the f32 master shard
// and the units it gathers; train_step is refused.
enum class EngineUse { Train, Evaluate };

class ShardedModel {
 public:
  // finetune: a full fine-tune ({}), LoRA or QLoRA (model/lora_spec.h); the engine keeps the run's one copy.
  ShardedModel(const ModelConfig& cfg, const model::FinetuneSpec& finetune, const ShardingConfig& sharding, Mesh& mesh,
               EngineUse use = EngineUse::Train);
  ~ShardedModel();

  // One optimizer step over this rank's micro-batches of the global batch. The loss is normalized
  // over the non-ignored targets of the whole global batch (all micro-batches of all ranks).
  // With an objective, the loss is its mean over its global count instead (StepStats::loss), and
  // StepStats::tokens still counts the targets.
  StepStats train_step(model::StagedModel& model, const std::vector<model::Batch>& micro, const ops::AdamWConfig& opt,
                       int64_t step, double max_grad_norm, RowObjective* objective = nullptr);
  // Forward and loss of this rank's batch (evaluation); returns the local sum and count.
  ops::CrossEntropyResult forward_loss(model::StagedModel& model, const model::Batch& batch);
  // Forward to each row's summed -log p(target) (model::StagedModel::head_rows): row_loss[b], b < B.
  void forward_rows(model::StagedModel& model, const model::Batch& batch, std::span<double> row_loss);
  // Forward to the logits of every position of this rank's batch: out [B*T, V] f32 (greedy decoding).
  void forward_logits(model::StagedModel& model, const model::Batch& batch, const Tensor& out);

  // The f32 master values of unit k's whole flat buffer, gathered from its shards into `out`
  // (f32 [padded], host). Collective: every rank calls it, one unit at a time, so no rank ever
  // holds more than one unit beyond its shard (evaluation, the final save).
  void gather_unit(int unit, const Tensor& out);

  const UnitPlan& plan() const { return plan_; }
  int num_units() const { return int(plan_.units.size()); }
  const FlatLayout& layout(int unit) const { return plan_.units.at(size_t(unit)).layout; }
  std::vector<std::string> names() const;
  const ShardingConfig& sharding() const { return plan_.sharding; }
  // Where gathered parameters and gradients live (what the model must be built for).
  Device device() const { return device_; }

  // ---- checkpoints (checkpoint/checkpoint.h) and loading (load.h) ----------------------------
  // This rank's optimizer state of a unit: flat elements [begin, begin + numel) of the unit's
  // buffer, as views into the engine's own buffers (valid while the engine lives): the f32 master
  // and the moments in the state dtype (f32, bf16, or u8 codes with their f32 absmax per 256
  // elements, undefined otherwise).
  struct StateRange {
    int64_t begin = 0, numel = 0;
    Tensor master, exp_avg, exp_avg_sq;
    Tensor exp_avg_absmax = {}, exp_avg_sq_absmax = {};
  };
  // Everything this rank optimizes (what a checkpoint load fills).
  StateRange owned_state(int unit);
  // The reduced gradients of those elements from the last step (f32 [own_numel], before clipping;
  // valid until the next step).
  Tensor owned_grad(int unit) const;
  // The host group of the ranks that hold identical copies of this rank's optimizer state (every
  // rank of the shard group under NO_SHARD, the replicas of a hybrid mesh), or null when none does.
  comm::Communicator* state_copies() const;
  // Where loading writes this rank's elements of a unit: its f32 master (undefined for a frozen
  // unit; pinned host memory under offload), its frozen base and NF4 store at rest (undefined
  // when it has none).
  struct LoadTargets {
    Tensor master, frozen, nf4_store;
  };
  LoadTargets load_targets(int unit);
  const BufferMaker& buffers() const { return make_; }
  Mesh& mesh() const { return mesh_; }
  const ModelConfig& config() const { return cfg_; }
  const model::FinetuneSpec& finetune() const { return finetune_; }
  // Call after the master weights were changed outside train_step (loaded, or a checkpoint was
  // read): the persistent full parameters are refreshed (collective for ZERO1).
  void master_weights_changed();

 private:
  struct Unit;
  // Training visits compute gradients and name their step to the watchdog; evaluation visits do
  // neither.
  enum class Pass : uint8_t { Training, Evaluation };
  Tensor host_staging() const { return host_staging_.live() ? host_staging_.view() : Tensor{}; }
  void gather_start(Unit& u);
  void wait_gathered(Unit& u, model::StagedModel& m);
  void end_visit(Unit& u, model::StagedModel& m);
  void release(Unit& u, model::StagedModel& m);
  void acquire_grad(Unit& u, model::StagedModel& m);
  void reduce_start(Unit& u, model::StagedModel& m);
  void reduce_finish(Unit& u);
  bool reduce_advance(Unit& u);  // one stage of u's reduction; true once it has finished
  void bind(const Unit& u, model::LlamaWeights& w, const Tensor& flat, bool with_frozen) const;
  void unbind(const Unit& u, model::LlamaWeights& w) const;
  // Runs the visits of a micro-batch: compute(stage) between gathers, reductions and releases.
  template <class Compute>
  void run_visits(const std::vector<Visit>& visits, model::StagedModel& m, Pass pass, int64_t step, bool last_micro,
                  Compute compute);
  template <class Head>
  void forward(model::StagedModel& m, const model::Batch& b, Head head);
  void optimizer_step(const ops::AdamWConfig& opt, int64_t step, float clip);
  enum class Checked { Gradients, Weights };
  std::string first_nonfinite(Checked what);
  double host_sum(double v, bool over_replicas);

  ModelConfig cfg_;
  model::FinetuneSpec finetune_;
  UnitPlan plan_;
  Mesh& mesh_;
  Device device_;
  BufferMaker make_;        // the engine's buffers, on device_
  ReduceContext reduce_;    // what every gradient reduction shares
  comm::Communicator& shard_comm_;  // tensors: mesh's device shard group, or its host one
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<Unit*> reducing_;  // units whose gradient reduction is in flight, oldest first
  FlatBuffer host_staging_;  // offload: pinned f32 [largest shard], reused by every host/device copy
  // 8-bit optimizer state: f32 [2 x chunk], one chunk's dequantized m and v during the step.
  FlatBuffer state_scratch_;
  static constexpr int64_t kQuant8Chunk = int64_t(1) << 16;  // elements: 256 blocks
  EngineUse use_ = EngineUse::Train;
};

}  // namespace shardlm::shard
