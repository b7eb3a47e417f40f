// The flags of what generation holds and where, the same on `generate` and `serve`: --dtype (the
// weights and the KV cache), --device, and the KV cache's --kv-block-size and --kv-cache-memory
// (infer/kv_cache.h).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "core/alloc.h"
#include "core/dtype.h"
#include "infer/kv_cache.h"

namespace shardlm::cli {

// --dtype: f32, bf16, or q8_0 (the decoder's Linear weights in q8_0, the other weights and the KV
// cache in bf16). Anything else is an Error naming the flag and the choices.
struct GenerationDtype {
  DType dtype = DType::F32;  // the weights' (all but q8_0 ones) and the KV cache's
  bool q8_0 = false;
  const char* name() const { return q8_0 ? "q8_0" : dtype_name(dtype); }
};
GenerationDtype generation_dtype(const std::string& value);
// The flag's help text, shared by generate and serve.
extern const char* const kGenerationDtypeHelp;

// --device: cpu, or cuda (one process, the whole model on its GPU). An Error naming the flag for
// anything else, for cuda with q8_0 weights or a model split over ranks (`split`), and for cuda
// where this build or machine has none.
Device generation_device(const std::string& value, const GenerationDtype& held, bool split);
extern const char* const kGenerationDeviceHelp;

struct KvCacheFlags {
  int64_t block_size = infer::kDefaultKvBlockSize;
  std::string memory;  // empty: no limit but a whole batch of sequences of the longest length
};
void add_kv_cache_flags(CLI::App* cmd, KvCacheFlags& f);
// The cache's options in `dtype`; a bad size is an Error naming its flag.
infer::KvCacheOptions kv_cache_options(const KvCacheFlags& f, DType dtype);

}  // namespace shardlm::cli
