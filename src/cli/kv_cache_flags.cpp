#include "cli/kv_cache_flags.h"

#include <fmt/format.h>

#include "core/error.h"
#include "io/model_files.h"

namespace shardlm::cli {

namespace {
constexpr int64_t kMaxBlockSize = int64_t(1) << 20;
}

void add_kv_cache_flags(CLI::App* cmd, KvCacheFlags& f) {
  cmd->add_option("--kv-block-size", f.block_size,
                  "Positions per block of the paged KV cache: a sequence takes blocks as it grows and gives them "
                  "back when it ends; a size of the longest length or more is one block per sequence (no paging)")
      ->check(CLI::Range(int64_t(1), kMaxBlockSize))
      ->capture_default_str();
  cmd->add_option("--kv-cache-memory", f.memory,
                  "The most the KV cache may take on one rank, e.g. 2GiB (default: what a whole batch of sequences "
                  "of the longest length needs). When its blocks run out, the newest requests are preempted and "
                  "recomputed later, with the same tokens; it must hold one sequence of the longest length");
}

infer::KvCacheOptions kv_cache_options(const KvCacheFlags& f, DType dtype) {
  infer::KvCacheOptions kv{.dtype = dtype, .block_size = f.block_size, .max_bytes = 0, .limit_key = "--kv-cache-memory"};
  if (f.block_size < 1 || f.block_size > kMaxBlockSize)
    throw Error(fmt::format("--kv-block-size {}: must be between 1 and {}", f.block_size, kMaxBlockSize),
                {.key = "--kv-block-size"});
  if (!f.memory.empty()) {
    uint64_t bytes = 0;
    try {
      bytes = io::parse_size(f.memory);
    } catch (const Error& e) {
      throw Error(e.message(), {.key = "--kv-cache-memory"});
    }
    if (bytes < 1 || bytes > (uint64_t(1) << 50))
      throw Error(fmt::format("--kv-cache-memory {}: must be between 1B and 1PiB", f.memory),
                  {.key = "--kv-cache-memory"});
    kv.max_bytes = int64_t(bytes);
  }
  return kv;
}

}  // namespace shardlm::cli
