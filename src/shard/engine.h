// The sharding engine: one code path for every strategy (sharding.h), driving a LlamaCompute
// unit by unit — gathering each unit's parameters before its forward and backward, freeing them
// as the strategy says, reducing its gradients to their owners, and stepping AdamW on this rank's
// shard only.
//
// Ownership: the engine owns every parameter, gradient and optimizer buffer (tracked under their
// categories); it rebinds the LlamaCompute's weight and gradient views to gathered buffers as it
// goes, so the compute object must not be used with other weights while the engine drives it.
//
// Devices: the engine's buffers live where the mesh's communicators want their tensors
// (Communicator::device(): CPU for local/MPI, CUDA for NCCL), and the LlamaCompute must be on the
// same device. A GPU run passes the NCCL mesh for tensors and the CPU mesh over the same ranks for
// the scalar sums (token counts, losses, squared norms), which then never wait on a GPU stream.
// With sharding.offload_params the f32 master shard, the reduced gradient shard and AdamW's moments
// are pinned host memory instead and the optimizer step runs on the CPU (docs/sharding.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/config.h"
#include "model/llama.h"
#include "ops/ops.h"
#include "shard/flat_layout.h"
#include "shard/sharding.h"

namespace shardlm::io {
class ModelWeights;
}

namespace shardlm::shard {

// One optimizer step's results, global over all ranks.
struct StepStats {
  double loss = 0;      // mean over the global batch's non-ignored targets
  int64_t tokens = 0;   // those targets, all ranks together
  double grad_norm = 0; // global L2 norm before clipping
};

class ShardedModel {
 public:
  // scalar_mesh: the same ranks on CPU communicators, for the double all_reduce_sum calls; null
  // uses `mesh` (CPU runs).
  ShardedModel(const ModelConfig& cfg, const ShardingConfig& sharding, Mesh& mesh, Mesh* scalar_mesh = nullptr);
  ~ShardedModel();

  // Each rank initializes / reads only the elements of its own shard (or everything for NO_SHARD).
  void init_random(uint64_t seed);
  void load(const io::ModelWeights& weights, const std::string& source);

  // One optimizer step over this rank's micro-batches of the global batch. The loss is normalized
  // over the non-ignored targets of the whole global batch (all micro-batches of all ranks).
  StepStats train_step(model::LlamaCompute& compute, const std::vector<model::Batch>& micro,
                       const ops::AdamWConfig& opt, int64_t step, double max_grad_norm);
  // Forward and loss of this rank's batch (evaluation); returns the local sum and count.
  ops::CrossEntropyResult forward_loss(model::LlamaCompute& compute, const model::Batch& batch);

  // The f32 master values of one tensor, gathered from its shards (collective: every rank calls).
  std::vector<float> gather_tensor(const std::string& name);
  // The same into `out` (f32, the tensor's element count), staged in a tracked buffer.
  void gather_tensor(const std::string& name, const Tensor& out);
  std::vector<std::string> names() const;
  int num_units() const { return int(units_.size()); }
  // Elements of all units' flat buffers (padding included), or of one unit.
  int64_t padded_numel() const;
  int64_t padded_numel(int unit) const;
  const ShardingConfig& sharding() const { return sharding_; }
  // Where gathered parameters and gradients live (what the LlamaCompute must be built for).
  Device device() const { return device_; }

  // ---- checkpoints (checkpoint/checkpoint.h) ------------------------------------------------
  // A unit's flat layout (tensor names, shapes and offsets; the padding depends on the shard group).
  const FlatLayout& layout(int unit) const;
  // This rank's optimizer state of a unit: flat elements [begin, begin + numel) of the unit's
  // buffer, as f32 views into the engine's own buffers (valid while the engine lives).
  struct StateRange {
    int64_t begin = 0, numel = 0;
    Tensor master, exp_avg, exp_avg_sq;
  };
  // Everything this rank optimizes (what a checkpoint load fills).
  StateRange owned_state(int unit);
  // The part of it this rank writes to a checkpoint. Ranks that hold identical copies (every rank
  // under NO_SHARD, the replicas of a hybrid mesh) split their copy between them, so each element
  // is written exactly once and every rank writes in parallel. May be empty.
  StateRange checkpoint_state(int unit);
  // Call after the master weights were changed outside train_step (a checkpoint was loaded): the
  // compute-dtype copies kept between steps are refreshed (collective for ZERO1).
  void master_weights_changed();

 private:
  struct Unit;
  void gather_start(Unit& u);
  const Tensor& gather_source(Unit& u);
  void ensure_gathered(Unit& u, model::LlamaCompute& c);
  void release(Unit& u, model::LlamaCompute& c);
  void ensure_grad(Unit& u, model::LlamaCompute& c);
  void reduce_grad(Unit& u, model::LlamaCompute& c, bool last_micro);
  void bind(Unit& u, model::LlamaCompute& c, bool grads);
  void refresh_full_params(Unit& u);
  // An f32/param_dtype buffer for optimizer-side state: pinned host memory under offload, else on device_.
  OwnedTensor state_tensor(DType dtype, int64_t n, MemCategory category) const;
  // Writes this rank's master elements through a host f32 view (init and load produce host data).
  template <class Fill>
  void fill_master(Unit& u, Fill fill);
  ops::CrossEntropyResult run_micro_batch(model::LlamaCompute& c, const model::Batch& b, float grad_scale,
                                          bool last_micro);

  ModelConfig cfg_;
  ShardingConfig sharding_;
  Mesh& mesh_;
  Mesh& scalars_;           // the mesh whose communicators sum doubles (mesh_ on CPU runs)
  Device device_;           // mesh_.shard->device()
  bool offload_ = false;    // sharding_.offload_params
  std::vector<std::unique_ptr<Unit>> units_;
};

}  // namespace shardlm::shard
