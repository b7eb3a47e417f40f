// The paged KV cache of a Generator (infer/generator.h): keys and values in blocks of a fixed
// number of positions, as vLLM's PagedAttention keeps them, so that the memory a running batch
// holds follows the tokens its sequences hold, not max_len times the batch.
//
// A block holds `block_size` positions of every layer this rank runs, keys and values:
// [layers, 2, block_size, Hkv * Dh] in the cache's dtype, one Buffer charged to Activations (on
// the CPU or the GPU, where the Generator runs).
// Blocks are made when a sequence first needs one and kept on a free list when it lets them go,
// for the next sequence, up to `capacity` blocks in all: memory grows with the positions in use,
// up to the most a batch has held at once, and never past the capacity.
//
// A sequence's BlockTable names its blocks in position order and holds, per layer, the views of
// their keys and values that paged attention reads (ops::attention_forward_paged). The KvCache
// owns every block; the tables and views it fills in stay valid until it is destroyed. A table's
// owner (a Generator slot) gives its blocks back with shrink(); a table must not outlive its cache.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/tensor.h"

namespace shardlm::infer {

// How a Generator keeps its KV cache.
struct KvCacheOptions {
  DType dtype = DType::F32;                  // f32 or bf16 (rounded once, as the keys are written)
  int64_t block_size = 16;                   // positions per block (at most max_len: one block a sequence)
  int64_t max_bytes = 0;                     // the most its blocks may take on one rank; 0: no limit but the
                                             // batch's (max_batch sequences of max_len)
  std::string limit_key = {};                // what errors about max_bytes name (a flag), if anything
};
constexpr int64_t kDefaultKvBlockSize = 16;  // vLLM's default

struct BlockTable {
  std::vector<int32_t> ids;                 // block ids, in position order
  std::vector<std::vector<Tensor>> k, v;    // [layer][block]: views [block_size, Hkv, Dh]
};

class KvCache {
 public:
  // layers: the layers this rank runs (0: none; its blocks are counted, and hold nothing);
  // kv_heads x head_dim: one position's keys (or values) of one layer on this rank.
  // device: where the blocks live (the Generator's: the CPU, or the GPU its weights are on).
  KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, DType dtype, int64_t block_size, int64_t capacity,
          Device device = Device::CPU);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int64_t block_size() const { return block_size_; }
  int64_t bytes_per_block() const { return block_bytes_; }
  int64_t capacity() const { return capacity_; }             // blocks at most
  int64_t in_use() const { return made() - int64_t(free_.size()); }  // blocks held by tables
  int64_t made() const { return int64_t(blocks_.size()); }   // blocks allocated: in use + free
  int64_t blocks_for(int64_t positions) const { return (positions + block_size_ - 1) / block_size_; }

  // Grows `table` to hold `positions`. False, taking nothing, when the blocks it needs are more
  // than the free ones plus those still to be made within the capacity.
  bool grow(BlockTable& table, int64_t positions);
  // Shrinks `table` to the blocks of `positions` (0: empty), the rest back to the free list.
  void shrink(BlockTable& table, int64_t positions);

 private:
  int64_t layers_, kv_heads_, head_dim_;
  DType dtype_;
  int64_t block_size_, block_bytes_, capacity_;
  Device device_;
  std::vector<Buffer> blocks_;  // by id; empty buffers when this rank runs no layer
  std::vector<int32_t> free_;   // ids of made blocks no table holds (the last freed is reused first)
};

}  // namespace shardlm::infer
