// Memory estimate of a training run, per rank, from a model config alone (no weights).
//
// This is not a textbook formula: it runs the sharding engine (shard/engine.h) and the model
// (model::LlamaCompute) themselves on the meta device (core/alloc.h), on the same unit plan a real
// run uses, over shape-only communicators. Every buffer they would allocate and free, the model's
// activation arena and its ops' scratch (the CPU matmul's bf16 widening copies, the cross-entropy
// chunk of logits) included, is counted in order, as the MemoryTracker counts it (live and peak
// bytes per category, and the peak of their sum), and per finer term from its tag. For the
// tracked categories the result is the byte count the tracker reports (tests/mpi/memory_test.cpp
// checks it at 1, 2 and 4 ranks); what the tracker cannot see (allocator slack, BLAS/MPI/OpenMP
// internals, per-thread attention scratch, the data pipeline) is outside it, and docs/memory.md
// says how large that usually is. Communication per step is what the dry run's communicators
// counted. The meta device stands for a CPU rank: activations and scratch are a CPU rank's.
//
// LoRA and QLoRA (EstimateInput::finetune) are the engine's own too: the
// frozen base (in the param dtype or NF4), the adapters and their optimizer state are what the dry
// run allocates. Offload (device: cuda) is the engine's own: its host bytes are counted.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "model/config.h"
#include "shard/sharding.h"

namespace shardlm::memory {

// Finer than the tracker's categories, so the table can say what the bytes are for.
enum class Term : uint8_t {
  ParamsAtRest,    // f32 master weights (this rank's shard, or all of them for NO_SHARD)
  FrozenBase,      // a LoRA run's frozen base at rest: param_dtype, or NF4 for QLoRA (a shard, or all of it)
  FullParams,      // parameters in param_dtype: gathered units incl. prefetch, or the persistent copy
  GradShard,       // reduced f32 gradient shard
  FullGrads,       // f32 full-unit gradient accumulators
  Optimizer,       // AdamW m and v
  Activations,     // what forward keeps for backward (the arena)
  OffloadedActivations,  // the checkpointed layers' inputs in host memory (offload_activations)
  LossWorkspace,   // the cross-entropy chunk of logits and its bf16 widening copies
  Communication,   // all-gather send buffers, reduce-scatter / all-reduce staging, the ring's scratch
  OtherWorkspace,  // backward gradient buffers of the arena, bf16 widening in matmuls
};
constexpr int kNumTerms = 11;
const char* term_name(Term t);
MemCategory term_category(Term t);

struct EstimateInput {
  ModelConfig model;
  model::FinetuneSpec finetune;  // a full fine-tune ({}), LoRA (finetune.lora) or QLoRA (with nf4_base)
  shard::ShardingConfig sharding;  // strategy, wrap, prefetch, param/reduce dtype, shard group, no_sync
  int world_size = 1;
  int ranks_per_node = 0;  // 0: every rank on one node. Hybrid shard groups default to this.
  int64_t micro_batch_size = 1;
  int64_t seq_len = 2048;
  int64_t grad_accum = 1;  // micro-batches per step (matters with no_sync)
  int checkpoint_every = 0;  // activation checkpointing: every k-th layer (1 = all, 0 = none)
  bool offload_activations = false;  // the checkpointed layers' inputs in host memory (needs checkpoint_every)
  bool offload = false;      // master, gradient shard and AdamW state in pinned host memory (device: cuda)
  // DPO (train/preference.h): the head computes each row's loss on its own (head_rows), and a full
  // fine-tune's frozen reference is a second engine, built for evaluation over the same mesh, whose
  // forward precedes each micro-batch's training visit (LoRA's is the base with adapters off).
  // micro_batch_size counts rows: a pair is two.
  bool preference = false;
  // CPU ranks over MPI (false: GPUs, whose gradients go over NCCL): a group across nodes passes its
  // reductions around the ring (comm/ring_collectives.h), whose scratch the dry run then holds.
  bool mpi_ring = false;
};

// One piece of a training step's work, in the order the engine did it on rank 0 in the dry run:
// arithmetic (consecutive ops merged), a collective issued on one of the mesh's groups, or the
// wait for one. The step-time model (memory/step_time.h) replays them.
struct WorkEvent {
  enum class Kind : uint8_t { Compute, Issue, Wait };
  enum class Group : uint8_t { Shard, Replicate };
  Kind kind = Kind::Compute;
  double flops = 0;                                      // Compute: matmuls and attention
  double memory_bytes = 0;  // Compute: what the memory-bound ops (elementwise, norms, optimizer) read and write
  DryCollective collective = DryCollective::AllGather;  // Issue
  Group group = Group::Shard;                            // Issue
  int64_t bytes = 0;                                     // Issue: what this rank sends (ring accounting)
  int64_t id = 0;                                        // Issue and its Wait
};

struct Estimate {
  // Bytes of each term live at the moment the total peaks (they add up to peak_total), and each
  // term's own highest value (which may be reached at another moment).
  std::array<int64_t, kNumTerms> at_peak{}, peak{};
  std::array<int64_t, kNumMemCategories> category_peak{};  // what MemoryTracker's peak[] reports
  int64_t peak_total = 0;                                   // what MemoryTracker's peak_total reports
  int64_t host_bytes = 0;    // with either offload: what lives in host memory at the peak
  int64_t device_bytes = 0;  // peak_total - host_bytes (all of it without offload)
  int shard_group = 1;       // ranks a unit's parameters are split over
  int num_units = 0;
  int64_t padded_params = 0;      // Psi: elements of all flat buffers, padding included
  int64_t parameters = 0;         // the model's parameter count
  double comm_bytes_per_step = 0;        // per rank, ring accounting (as CommStats)
  double inter_node_bytes_per_step = 0;  // of that, what crosses nodes
  int64_t save_gather_bytes = 0;  // the final save gathers one unit at a time in f32: the largest unit
  int64_t trainable_params = 0;   // what the optimizer steps (the adapters under LoRA)
  std::vector<WorkEvent> step_work;  // the second step's work, in order (later steps repeat it)
  std::vector<std::string> notes;
};

// Throws an Error for impossible layouts (a hybrid shard group that does not divide the world).
Estimate estimate(const EstimateInput& in);

// Ranks per node of `in`: its ranks_per_node, at most the world; 0 (unknown) is every rank on one node.
int ranks_per_node(const EstimateInput& in);

// Where a group's ranks are: `size` ranks, `per_node` of them on each of `nodes` nodes.
struct GroupPlace {
  int size = 1, nodes = 1, per_node = 1;
};
// The shard group and the replicate group of rank 0 of `in` (their sizes from e.shard_group), ranks
// placed node by node as make_mesh places them: which groups cross nodes, for the dry run's mesh
// (the ring's scratch), the bytes that cross and the step-time model (step_time.h).
GroupPlace shard_group_place(const EstimateInput& in, const Estimate& e);
GroupPlace replicate_group_place(const EstimateInput& in, const Estimate& e);

// The table accelerate estimate-memory prints, computed correctly (see docs/memory.md).
struct AccelerateRow {
  std::string dtype;          // "float32", "float16/bfloat16", "int8", "int4"
  int64_t largest_layer = 0;  // bytes of the largest of: a decoder layer, the embedding, the lm_head
  int64_t total_size = 0;     // bytes of all parameters in that dtype
  int64_t adam_training = -1; // model states for Adam training in this engine; -1: not trainable so
  int64_t accelerate_says = 0;  // what accelerate prints: 4 x total_size
};
// Of the model with a fine-tune's adapters, when it has them (their parameters count as the model's).
std::vector<AccelerateRow> accelerate_table(const ModelConfig& cfg, const model::FinetuneSpec& finetune = {});

// Strategies `auto` may choose for this world, in the order that breaks ties in communication
// volume (least sharding first). Hybrid ones only when the world spans several nodes.
std::vector<shard::Strategy> auto_candidates(int world_size, int ranks_per_node);

// The auto choice: among the candidates whose estimated per-rank peak fits `budget` bytes, the
// one with the least inter-node, then total, communication per step. `why` gets one line naming
// the choice and what ruled out the cheaper ones; throws an Error (one line, with no key: the
// caller names where the budget came from) when none fits. Its advice then is `what_to_try` of the
// smallest candidate's run (the levers, memory/levers.h, in the caller's words), or a generic line.
using WhatToTry = std::function<std::string(const EstimateInput& smallest)>;
shard::Strategy choose_strategy(const EstimateInput& base, int64_t budget, std::string* why,
                                const WhatToTry& what_to_try = {});

}  // namespace shardlm::memory
