#include "cli/generation_flags.h"

#include <fmt/format.h>

#include "core/device.h"
#include "core/error.h"
#include "io/model_files.h"

namespace shardlm::cli {

namespace {
constexpr int64_t kMaxBlockSize = int64_t(1) << 20;
}

GenerationDtype generation_dtype(const std::string& value) {
  if (value == "q8_0" || value == "Q8_0") return {DType::BF16, true};
  try {
    const DType d = parse_dtype(value);
    if (d == DType::F32 || d == DType::BF16) return {d, false};
  } catch (const Error&) {
  }
  throw Error(fmt::format("--dtype {}: expected f32, bf16 or q8_0", value));
}

const char* const kGenerationDtypeHelp =
    "What the weights and the KV cache are held in: f32; bf16 (half the memory and about twice the decode speed "
    "of f32); or q8_0 (the decoder's Linear weights in ggml's Q8_0 blocks, 8 bits and a scale per 32, read as "
    "they are stored in decode; the other weights and the KV cache in bf16). Rounded or quantized once after "
    "loading, 4-bit and --adapter merging, which run in f32; activations, norms, softmax and logits stay f32";

Device generation_device(const std::string& value, const GenerationDtype& held, bool split) {
  const ErrorContext flag{.key = "--device"};
  if (value == "cpu") return Device::CPU;
  if (value != "cuda") throw Error(fmt::format("expected cpu or cuda, not '{}'", value), flag);
  if (held.q8_0)
    throw Error("cuda: q8_0 weights are read by a CPU kernel; use --dtype bf16 or f32 on the GPU", flag);
  if (split)
    throw Error("cuda: a model split over ranks (--device-map, --tensor-parallel) generates on CPU ranks; "
                "on a GPU one process holds the whole model", flag);
  std::string why;
  if (!device::cuda_available(&why)) throw Error(fmt::format("cuda: {}", why), flag);
  return Device::CUDA;
}

const char* const kGenerationDeviceHelp =
    "Where the weights, the KV cache and the forward live: cpu, or cuda (this process's GPU, the whole model "
    "on it; loading, 4-bit rounding and --adapter merging run on the CPU first). Sampling runs on the CPU";

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
