#include "infer/tensor_parallel.h"

#include <fmt/format.h>

#include "core/error.h"

namespace shardlm::infer {

ModelConfig sliced_config(const ModelConfig& cfg, int ranks, const std::string& flag) {
  SHARDLM_CHECK(ranks >= 1, "{} must be at least 1, got {}", flag, ranks);
  ModelConfig c = cfg;
  auto divide = [&](int64_t& n, const char* key, const char* what) {
    if (n % ranks != 0)
      throw Error(fmt::format("{} {} cannot be split evenly over {} {} ranks", n, what, flag, ranks), {.key = key});
    n /= ranks;
  };
  divide(c.num_attention_heads, "num_attention_heads", "attention heads");
  divide(c.num_key_value_heads, "num_key_value_heads", "key-value heads");
  divide(c.intermediate_size, "intermediate_size", "intermediate (MLP) columns");
  divide(c.vocab_size, "vocab_size", "vocabulary rows (embedding and lm_head)");
  return c;
}

TensorSplit tensor_parallel_split(const ModelConfig& cfg, int64_t n, int rank, int ranks, const std::string& flag) {
  if (n < 1) throw Error(fmt::format("must be at least 1, got {}", n), {.key = flag});
  if (n != ranks)
    throw Error(fmt::format("{} {} needs {} ranks, one per slice (shardlm launch --nproc-per-node {}), but this job has {}",
                            flag, n, n, n, ranks),
                {.key = flag});
  sliced_config(cfg, int(n), flag);  // every dimension divides
  return {.rank = rank, .ranks = int(n)};
}

void slice_runs(const std::vector<int64_t>& whole, const std::vector<int64_t>& part, const TensorSplit& split,
                const SliceRun& fn) {
  SHARDLM_CHECK(whole.size() == part.size() && !whole.empty() && whole.size() <= 2,
                "a slice of rank {} of a {}-D tensor", part.size(), whole.size());
  const int64_t rows = whole[0], cols = whole.size() == 2 ? whole[1] : 1;
  if (whole == part) {
    fn(0, rows * cols, 0);
  } else if (part[0] != rows) {  // rows split: one contiguous block
    SHARDLM_CHECK(part[0] * split.ranks == rows && (whole.size() == 1 || part[1] == cols), "a bad row slice");
    fn(int64_t(split.rank) * part[0] * cols, part[0] * cols, 0);
  } else {  // columns split: each row's piece
    const int64_t pc = part[1];
    SHARDLM_CHECK(pc * split.ranks == cols, "a bad column slice");
    for (int64_t r = 0; r < rows; ++r) fn(r * cols + int64_t(split.rank) * pc, pc, r * pc);
  }
}

}  // namespace shardlm::infer
