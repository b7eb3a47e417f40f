// Tensor parallelism's slicing (infer/tensor_parallel.h): which runs of a tensor a rank holds, the
// config its slices form, and a split ParamStore that reads exactly the whole tensors' slices from
// the files. (The forward over ranks is checked end to end against one process by
// tests/scripts/tensor_parallel_cli.sh.)
#include <gtest/gtest.h>

#include "infer/param_store.h"
#include "infer/tensor_parallel.h"
#include "io/model_files.h"
#include "model/config.h"
#include "testing.h"

using namespace shardlm;

namespace {
struct Piece {
  int64_t at, n, to;
  bool operator==(const Piece&) const = default;
};
std::vector<Piece> runs(std::vector<int64_t> whole, std::vector<int64_t> part, int rank, int ranks) {
  std::vector<Piece> out;
  infer::slice_runs(whole, part, {.rank = rank, .ranks = ranks},
                    [&](int64_t at, int64_t n, int64_t to) { out.push_back({at, n, to}); });
  return out;
}
}  // namespace

TEST(TensorParallel, SliceRunsRowsColumnsAndWhole) {
  EXPECT_EQ(runs({6, 4}, {3, 4}, 1, 2), (std::vector<Piece>{{12, 12, 0}}));              // rows: one block
  EXPECT_EQ(runs({2, 6}, {2, 2}, 2, 3), (std::vector<Piece>{{4, 2, 0}, {10, 2, 2}}));    // columns: per row
  EXPECT_EQ(runs({8}, {4}, 1, 2), (std::vector<Piece>{{4, 4, 0}}));                       // a bias
  EXPECT_EQ(runs({5, 3}, {5, 3}, 1, 2), (std::vector<Piece>{{0, 15, 0}}));                // replicated
}

TEST(TensorParallel, SlicedConfigDividesOrNamesTheKey) {
  const ModelConfig cfg = preset("tiny");  // 4 heads, 2 kv heads, intermediate 172
  const ModelConfig two = infer::sliced_config(cfg, 2);
  EXPECT_EQ(two.num_attention_heads, 2);
  EXPECT_EQ(two.num_key_value_heads, 1);
  EXPECT_EQ(two.intermediate_size, 86);
  EXPECT_EQ(two.vocab_size, cfg.vocab_size / 2);
  EXPECT_EQ(two.head_dim, cfg.head_dim);
  EXPECT_EQ(two.hidden_size, cfg.hidden_size);
  try {
    infer::sliced_config(cfg, 4);
    FAIL() << "2 kv heads over 4 ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().key, "num_key_value_heads") << e.what();
  }
  try {
    infer::tensor_parallel_split(cfg, 2, 0, 3);
    FAIL() << "--tensor-parallel 2 on 3 ranks";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().key, "--tensor-parallel") << e.what();
  }
}

// Each rank's store holds the slices of the whole model's tensors: q/k/v, gate/up and the
// (tied) embedding by rows, o_proj and down_proj by columns, norms whole.
TEST(TensorParallel, ASplitStoreReadsItsSlices) {
  shardlm::testing::TempDir dir;
  ModelConfig cfg = preset("tiny");
  cfg.tie_word_embeddings = true;
  infer::ParamStore whole(cfg, DType::F32);
  whole.init_random(4);
  whole.save(dir / "m", DType::F32, 1ull << 40, "");
  int64_t held = 0;
  for (int rank = 0; rank < 2; ++rank) {
    infer::ParamStore part(cfg, DType::F32, {}, {.rank = rank, .ranks = 2});
    part.load(io::ModelWeights(dir / "m"), dir / "m");
    held += part.numel();
    auto expect_slice = [&](const std::string& name, int dim) {
      const Tensor w = whole.master(name), p = part.master(name);
      const int64_t rows = p.shape[0], cols = p.ndim == 2 ? p.shape[1] : 1, wcols = w.ndim == 2 ? w.shape[1] : 1;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t wr = dim == 0 ? rank * rows + r : r, wc = dim == 1 ? rank * cols + c : c;
          ASSERT_EQ(p.f32()[r * cols + c], w.f32()[wr * wcols + wc]) << name << " [" << r << ", " << c << "]";
        }
    };
    expect_slice("model.layers.1.self_attn.q_proj.weight", 0);
    expect_slice("model.layers.1.self_attn.k_proj.weight", 0);
    expect_slice("model.layers.1.self_attn.o_proj.weight", 1);
    expect_slice("model.layers.0.mlp.up_proj.weight", 0);
    expect_slice("model.layers.0.mlp.down_proj.weight", 1);
    expect_slice("model.embed_tokens.weight", 0);
    expect_slice("model.norm.weight", -1);
    EXPECT_EQ(part.master("model.layers.0.self_attn.v_proj.weight").shape[0], cfg.head_dim);  // one kv head
    const model::LlamaWeights& w = part.compute_weights();
    EXPECT_EQ(w.lm_head.data, w.embed.data);  // tied: the head's rows are the embedding's
    // From a whole store in memory (what --adapter and --load-in-4bit go through): the same slices.
    infer::ParamStore copy(cfg, DType::F32, {}, {.rank = rank, .ranks = 2});
    copy.load_slices(whole);
    for (const std::string& name : part.names()) {
      const Tensor a = part.master(name), b = copy.master(name);
      for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << name << " " << i;
    }
  }
  // Two ranks hold every weight once, and the norms twice.
  const int64_t norms = (2 * cfg.num_hidden_layers + 1) * cfg.hidden_size;
  EXPECT_EQ(held, whole.numel() + norms);
}
