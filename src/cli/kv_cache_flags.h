// The KV cache's flags, the same on `generate` and `serve`: --kv-block-size and --kv-cache-memory
// (infer/kv_cache.h).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "infer/kv_cache.h"

namespace shardlm::cli {

struct KvCacheFlags {
  int64_t block_size = infer::kDefaultKvBlockSize;
  std::string memory;  // empty: no limit but a whole batch of sequences of the longest length
};
void add_kv_cache_flags(CLI::App* cmd, KvCacheFlags& f);
// The cache's options in `dtype`; a bad size is an Error naming its flag.
infer::KvCacheOptions kv_cache_options(const KvCacheFlags& f, DType dtype);

}  // namespace shardlm::cli
