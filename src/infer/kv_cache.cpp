#include "infer/kv_cache.h"

#include <cstddef>
#include <limits>

#include "core/error.h"

namespace shardlm::infer {

KvCache::KvCache(int64_t layers, int64_t kv_heads, int64_t head_dim, DType dtype, int64_t block_size,
                 int64_t capacity, Device device)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), dtype_(dtype), block_size_(block_size),
      block_bytes_(2 * layers * block_size * kv_heads * head_dim * int64_t(dtype_size(dtype))), capacity_(capacity),
      device_(device) {
  SHARDLM_CHECK(dtype == DType::F32 || dtype == DType::BF16, "a KV cache in f32 or bf16, not {}", dtype_name(dtype));
  SHARDLM_CHECK(layers >= 0 && kv_heads >= 1 && head_dim >= 1 && block_size >= 1 && capacity >= 1,
                "a KV cache of {} layers, {} x {} per position, blocks of {} positions, at most {} blocks", layers,
                kv_heads, head_dim, block_size, capacity);
  SHARDLM_CHECK(capacity <= std::numeric_limits<int32_t>::max(), "a KV cache of {} blocks", capacity);
}

bool KvCache::grow(BlockTable& table, int64_t positions) {
  const int64_t have = int64_t(table.ids.size()), need = blocks_for(positions) - have;
  if (need <= 0) return true;
  if (need > int64_t(free_.size()) + (capacity_ - made())) return false;
  if (table.k.empty()) {
    table.k.resize(size_t(layers_));
    table.v.resize(size_t(layers_));
  }
  const int64_t kvd = kv_heads_ * head_dim_, half = block_size_ * kvd * int64_t(dtype_size(dtype_));
  for (int64_t i = 0; i < need; ++i) {
    int32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = int32_t(blocks_.size());
      // Not zeroed: attention reads a block's positions only once they are written.
      blocks_.push_back(layers_ > 0 ? Buffer(size_t(block_bytes_), MemCategory::Activations, false, device_) : Buffer());
    }
    table.ids.push_back(id);
    auto* base = static_cast<std::byte*>(blocks_[size_t(id)].data());
    for (int64_t l = 0; l < layers_; ++l) {  // layer l's keys, then its values
      table.k[size_t(l)].push_back(
          Tensor::view(base + 2 * l * half, dtype_, {block_size_, kv_heads_, head_dim_}, device_));
      table.v[size_t(l)].push_back(
          Tensor::view(base + (2 * l + 1) * half, dtype_, {block_size_, kv_heads_, head_dim_}, device_));
    }
  }
  return true;
}

void KvCache::shrink(BlockTable& table, int64_t positions) {
  const size_t keep = size_t(blocks_for(positions));
  while (table.ids.size() > keep) {
    free_.push_back(table.ids.back());
    table.ids.pop_back();
    for (auto& views : table.k) views.pop_back();
    for (auto& views : table.v) views.pop_back();
  }
}

}  // namespace shardlm::infer
