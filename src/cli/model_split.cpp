#include "cli/model_split.h"

#include <fmt/format.h>

#include <cstdio>

#include "cli/commands.h"
#include "core/alloc.h"
#include "core/error.h"
#include "infer/placement.h"
#include "io/model_files.h"

namespace shardlm::cli {

namespace {

infer::DeviceMap device_map_flag(const std::string& text) {
  try {
    return infer::parse_device_map(text);
  } catch (Error& e) {
    e.set_key("--device-map");
    throw;
  }
}

// --max-memory-per-rank: bytes, 0 when not given (unlimited).
uint64_t max_memory_per_rank(const ModelSplitFlags& f) {
  if (f.max_memory_per_rank.empty()) return 0;
  uint64_t n = 0;
  try {
    n = io::parse_size(f.max_memory_per_rank);
  } catch (Error& e) {
    e.set_key("--max-memory-per-rank");
    throw;
  }
  if (n == 0) throw Error("must be more than 0 bytes", {.key = "--max-memory-per-rank"});
  return n;
}

}  // namespace

void add_model_split_flags(CLI::App* cmd, ModelSplitFlags& f, const std::string& command) {
  const bool serving = command == "serve";
  cmd->add_option("--device-map", f.device_map,
                  "Split the model's layers over the ranks of `shardlm launch` (one process: all on rank 0), as "
                  "accelerate's device_map does: auto (= balanced), balanced, balanced_low_0 (rank 0 as light as "
                  "possible) or sequential (fill rank 0 first, then rank 1, ...). Each rank loads and runs only "
                  "its layers; the placement is printed (docs/generation.md)" +
                      std::string(serving ? "; rank 0 serves HTTP and schedules, the others run its forwards" : ""));
  cmd->add_option("--max-memory-per-rank", f.max_memory_per_rank,
                  "With --device-map: the most parameter bytes (in --dtype) one rank may hold, e.g. 20GB, "
                  "500MiB; default unlimited");
  cmd->add_option("--tensor-parallel", f.tensor_parallel,
                  "Split every layer over N ranks of `shardlm launch --nproc-per-node N` (N = the number of "
                  "ranks), as Megatron-LM does: each rank holds and loads 1/N of the attention heads, MLP and "
                  "vocabulary and all compute each token at once; the heads, key-value heads, intermediate_size "
                  "and vocab_size must divide by N (docs/generation.md)" +
                      std::string(serving ? "; rank 0 serves HTTP and schedules, every rank computes each step" : ""))
      ->check(CLI::PositiveNumber);
}

void check_model_split_flags(const ModelSplitFlags& f) {
  if (f.tensor_parallel > 0 && !f.device_map.empty())
    throw Error("cannot be combined with --device-map (one way of splitting the model at a time)",
                {.key = "--tensor-parallel"});
  if (!f.device_map.empty()) device_map_flag(f.device_map);
  else if (!f.max_memory_per_rank.empty())
    throw Error("applies only with --device-map", {.key = "--max-memory-per-rank"});
  max_memory_per_rank(f);
}

ModelSplit split_model(const ModelSplitFlags& f, const ModelConfig& cfg, const GenerationDtype& held,
                       const std::string& command, bool print) {
  comm::Communicator& w = world();
  ModelSplit s;
  s.command = command;
  if (!f.device_map.empty()) {
    const infer::DeviceMap map = device_map_flag(f.device_map);
    const uint64_t max_memory = max_memory_per_rank(f);
    s.pipeline = {.comm = &w,
                  .shares = infer::place_parts(infer::part_sizes(cfg, held.dtype, held.q8_0), map, w.size(), max_memory,
                                               "--max-memory-per-rank")};
    if (print) {
      std::fprintf(stderr, "%s: device map %s over %d rank%s (%s weights, max memory per rank %s):\n", command.c_str(),
                   infer::device_map_name(map), w.size(), w.size() == 1 ? "" : "s", held.name(),
                   max_memory ? format_bytes(int64_t(max_memory)).c_str() : "unlimited");
      for (int r = 0; r < w.size(); ++r)
        std::fprintf(stderr, "%s:   %s\n", command.c_str(), infer::describe_share(r, s.pipeline.shares[size_t(r)]).c_str());
    }
    const infer::RankShare mine = s.pipeline.shares[size_t(w.rank())];
    const bool tied = cfg.tie_word_embeddings;
    s.keep = [tied, mine](const model::ModelPart& part) {
      switch (part.kind) {
        case model::PartKind::Embedding: return mine.embed || (mine.head && tied);
        case model::PartKind::Layer: return part.layer >= mine.layer_begin && part.layer < mine.layer_end;
        case model::PartKind::Head: return mine.head;
      }
      return false;
    };
    // What a rank was doing when the watchdog names a send, recv or broadcast that never completed.
    comm::set_activity({.step = 0, .what = "generation over a --device-map pipeline", .unit = nullptr});
  }
  if (f.tensor_parallel > 0) {
    s.split = infer::tensor_parallel_split(cfg, f.tensor_parallel, w.rank(), w.size());
    s.tp.comm = &w;
    if (print && s.split.active())
      std::fprintf(stderr,
                   "%s: tensor parallel over %d ranks: %lld of %lld attention heads, %lld of %lld key-value heads "
                   "and 1/%d of the MLP and vocabulary per rank\n",
                   command.c_str(), s.split.ranks, (long long)(cfg.num_attention_heads / s.split.ranks),
                   (long long)cfg.num_attention_heads, (long long)(cfg.num_key_value_heads / s.split.ranks),
                   (long long)cfg.num_key_value_heads, s.split.ranks);
    comm::set_activity({.step = 0, .what = "generation split by --tensor-parallel", .unit = nullptr});
  }
  if (s.active() && w.rank() != 0) s.command = fmt::format("{}: rank {}", command, w.rank());
  return s;
}

}  // namespace shardlm::cli
