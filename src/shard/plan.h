// The unit plan: what each unit holds, how its flat buffer is split over the shard group, what this
// rank stores, and in which order a micro-batch visits the units.
//
// make_plan is a pure function of (model config, sharding config, shard rank, shard group size).
// The engine (engine.h) allocates and communicates by it; the memory estimator
// (memory/estimator.h) runs the same engine on it without memory, so the two cannot drift.
//
// Units come from the model's parts (model::llama_parts: embedding, layers, head) by the wrap
// policy: TRANSFORMER_BASED_WRAP makes every part a unit of its own (torchtitan's wrapping: the
// embedding and the head are units, so neither stays gathered beyond its own forward and
// backward); SIZE_BASED_WRAP groups consecutive decoder layers until min_num_params; NO_WRAP puts
// everything in one unit. A model with tied embeddings keeps the embedding and the head in one
// unit, since they share a tensor; that unit is visited three times per micro-batch.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/llama.h"
#include "ops/nf4.h"
#include "shard/flat_layout.h"
#include "shard/sharding.h"

namespace shardlm::shard {

// FSDP's MixedPrecision: parameters are gathered and computed in `param`, gradients communicated
// in `reduce`; master weights, gradient accumulators and optimizer state are always f32.
struct MixedPrecision {
  DType param = DType::F32;
  DType reduce = DType::F32;
};

// ZeRO-Offload: the f32 master shard, the reduced gradient shard and AdamW's moments live in pinned
// host memory and the optimizer steps there (device: cuda only).
struct OffloadPolicy {
  bool params = false;
};

// What each of the engine's buffers is for: the memory tracker's category and the estimator's
// finer terms follow from it.
enum class BufferRole : uint8_t {
  Master,      // f32 [own]: the weights this rank optimizes
  Moments,     // f32 [own] x 2: AdamW's m and v
  GradShard,   // f32 [shard]: reduced gradients of this rank's shard
  FullParams,  // param dtype [padded]: the gathered unit (or the persistent copy)
  FullGrad,    // f32 [padded]: the unit's gradient accumulator during the backward
  Staging,     // communication staging: casts for a gather or a reduction, host/device copies
  Frozen,      // param dtype [frozen shard] or [frozen padded]: a LoRA run's base weights
  Quantized,   // u8 [NF4 store]: a QLoRA run's base Linear weights at rest
};

// QLoRA: one NF4 tensor of a unit, split into chunks of whole groups of 256 blocks of 64
// (ops/nf4.h's sharding rule): chunk c holds elements [c * chunk_elems, min((c + 1) * chunk_elems,
// n)) of the weight, as packed codes and their (double-quantized) absmax state, laid out as
// `chunk` says at byte `offset` of a rank's NF4 store. There is one chunk per rank of the shard
// group where parameters are sharded, else one (the whole tensor, on every rank).
struct Nf4Piece {
  FlatEntry entry;           // its place in the unit's `quantized` layout (the dequantized weight)
  int64_t chunk_elems = 0;   // a multiple of 16384, or n for a single chunk
  ops::Nf4Layout chunk{};    // the layout of the largest chunk
  size_t offset = 0;         // bytes, in a rank's NF4 store
  // Elements [lo, hi) of chunk c (empty when the weight is shorter).
  int64_t lo(int c) const { return std::min(entry.info.numel(), c * chunk_elems); }
  int64_t hi(int c) const { return std::min(entry.info.numel(), (c + 1) * chunk_elems); }
};
MemCategory role_category(BufferRole r);

// What a unit gathers for its visits, as one all-gather (FSDP2's foreach_all_gather): the trained
// parameters (cast from the f32 master to the param dtype), a LoRA run's frozen base, QLoRA's NF4
// store. Each rank contributes one part of each segment, back to back in a block of 16-byte
// aligned parts; the gathered [shard size x block] is rearranged in place into each segment
// whole, one after another (sharded_buffer.h).
enum class SegmentKind : uint8_t { Trained, Frozen, Nf4 };
struct GatherSegment {
  SegmentKind kind = SegmentKind::Trained;
  int64_t part_bytes = 0;    // one rank's part
  int64_t block_offset = 0;  // where the part sits in a rank's block (and in the at-rest buffer)
  int64_t whole_offset = 0;  // where the whole segment sits in the rearranged gathered buffer
};

struct PlannedUnit {
  std::string name;        // the parts' names joined: "model.layers.3", "model.layers.0..1", ...
  std::vector<int> parts;  // indices into model::llama_parts, consecutive
  FlatLayout layout;       // the trained parameters, padded to a multiple of the shard group size
                           // (a LoRA run: the unit's adapters only; may be empty)
  // A LoRA run's frozen base weights (model::ParamInfo::trainable false), a flat buffer of their own
  // as fsdp_qlora keeps them: no gradient, no master copy, no optimizer state, stored in the param
  // dtype. Whole on every rank where parameters persist (persistent below), else sharded like
  // `layout` and gathered beside it. Empty for full fine-tuning.
  FlatLayout frozen;
  int64_t frozen_shard_numel = 0;  // frozen.padded_numel / shard group size
  // QLoRA: the frozen Linear weights are not in `frozen` but NF4 pieces, dequantized for each
  // visit into a param-dtype buffer laid out as `quantized` (no padding) and freed after it.
  FlatLayout quantized;
  std::vector<Nf4Piece> nf4;
  int nf4_chunks = 1;            // chunks per weight: the shard group size where parameters are sharded
  int64_t nf4_store_bytes = 0;   // a rank's NF4 store: one chunk of every piece
  int64_t shard_numel = 0; // padded / shard group size
  int64_t own_begin = 0;   // first flat element this rank optimizes (0 when the optimizer is replicated)
  int64_t own_numel = 0;   // shard_numel, or padded when the optimizer is replicated (NO_SHARD)
  // AdamW's moments at rest: ShardingConfig::state_dtype, except that with 8-bit state a unit of the
  // token embedding alone (and the tied head) keeps f32 moments, as Hugging Face's Trainer keeps
  // an nn.Embedding's state 32-bit under bitsandbytes' optimizers: 8-bit moments of rows whose
  // gradient comes and goes (a token seen, then not) destabilize training (bench/RESULTS.md).
  DType state_dtype = DType::F32;
  // A shard group of one rank (one process, not hybrid, no offload): the shard is the whole
  // buffer, so the parameters are the master weights (or one param-dtype copy of them) and the
  // backward accumulates straight into the gradient shard: no gathers, no reductions.
  bool solo = false;
  // NO_SHARD, ZERO1 and solo units keep their full parameters between steps.
  bool persistent = false;
  // The gather of a unit that is not persistent: its segments, the largest part first (the one
  // that stays in place when the gathered buffer is rearranged). Empty for persistent units, whose
  // frozen base and NF4 store are whole on every rank (ZERO1 gathers only its trained parameters
  // after each step, refreshing them).
  std::vector<GatherSegment> gather;
  int64_t gather_block_bytes = 0;  // one rank's block: its parts, each 16-byte aligned
  // This rank's frozen base and NF4 store at rest, in one buffer of rest_bytes: where the unit
  // gathers two or more segments this is the gather's block itself, the trained parameters' part
  // included (cast into it before each gather), so the block is sent as it lies; else
  // [frozen | NF4 store], each 16-byte aligned. -1: none.
  int64_t rest_bytes = 0;
  int64_t rest_frozen_offset = -1, rest_nf4_offset = -1, rest_trained_offset = -1;
  bool trains() const { return layout.numel > 0; }
};

enum class StageKind : uint8_t { EmbedForward, BlockForward, Head, BlockBackward, EmbedBackward };
struct Stage {
  StageKind kind;
  int layer = -1;  // BlockForward / BlockBackward
};

// One turn of a unit: consecutive stages computed with its parameters gathered.
struct Visit {
  int unit = 0;
  std::vector<Stage> stages;
  bool backward = false;       // computes gradients (Head in training, BlockBackward, EmbedBackward)
  bool last_backward = false;  // the unit's last gradient-computing visit of the micro-batch
  // False when no stage reads the unit's parameters: the embedding's backward only scatters rows
  // of the output gradient into its gradient, so that visit neither gathers nor is prefetched (a
  // tied embedding's 0.5-1 GB gather saved every step).
  bool needs_params = true;
  bool free_after = false;     // reshard: release the gathered parameters afterwards
  int prefetch = -1;           // the next visit's unit (for forward / backward prefetch), or -1
};

struct UnitPlan {
  ShardingConfig sharding;
  MixedPrecision precision;
  OffloadPolicy offload;
  int shard_rank = 0, shard_size = 1;
  std::vector<model::ModelPart> parts;
  std::vector<PlannedUnit> units;
  std::vector<Visit> train;  // one training micro-batch: forward, head (loss and its backward), backward
  std::vector<Visit> eval;   // forward and loss only; every unit released after its visit
  int64_t padded_numel() const;
};

// Throws an Error for impossible layouts (a shard rank outside the group).
// The parts are model::llama_parts(cfg, finetune): a LoRA fine-tune's units carry its adapters.
UnitPlan make_plan(const ModelConfig& cfg, const model::FinetuneSpec& finetune, const ShardingConfig& sharding,
                   int shard_rank, int shard_size);

}  // namespace shardlm::shard
