// Filling an engine's buffers with this rank's elements only: random initialization, or Hugging
// Face weights (each rank copies only the byte ranges of what it keeps; DESIGN.md). A LoRA run
// reads its frozen base from the weights and initializes the new adapters from `seed` (A as PEFT
// does, B zero), or copies them from an adapter already trained.
//
// Weights saved by transformers from a bitsandbytes 4-bit model (model/nf4_loader.h: a packed NF4
// state per Linear weight) are read without re-quantizing: QLoRA copies each rank's chunk of
// codes, absmax and nested absmax as stored, so it trains on exactly bitsandbytes' base (with a
// double-quantized layout, every such weight must be double-quantized in the file with the
// standard nested map, else an Error says so, naming the tensor; a plain layout takes either, as
// exact f32 absmax values). Every other layout (LoRA's dense base, full fine-tuning) reads such a
// weight as bitsandbytes dequantizes it, in f32.
//
// Both are collective over the engine's shard group (QLoRA's double quantization sums each
// weight's absmax values over it) and end with the engine's full parameters refreshed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"

namespace shardlm::io {
class ModelWeights;
}

namespace shardlm::shard {

class ShardedModel;

void init_random(ShardedModel& engine, uint64_t seed);
// A LoRA run's adapters, by PEFT name (f32, CPU, contiguous): what `shardlm eval --adapter` reads
// from a PEFT directory instead of initializing new ones.
using AdapterLookup = std::function<Tensor(const std::string& name)>;
void load_weights(ShardedModel& engine, const io::ModelWeights& weights, const std::string& source, uint64_t seed = 0,
                  const AdapterLookup& adapter = {});

}  // namespace shardlm::shard
