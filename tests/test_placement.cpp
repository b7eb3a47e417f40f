// Placing parts on ranks for `generate --device-map` (infer/placement.h). Each expectation is what
// accelerate's get_balanced_memory + infer_auto_device_map give for the same module sizes, worked
// by hand from their rules (per rank: total / ranks + 1.25 x max(decoder layer, mean leaf) for all
// but the last; balanced_low_0 spreads over ranks 1..N-1 and caps rank 0 at what they cannot
// take; then the ranks are filled in order, a module that does not fit going to the next rank).
#include <gtest/gtest.h>

#include "infer/placement.h"
#include "io/model_files.h"
#include "model/config.h"
#include "model/llama.h"
#include "testing.h"
#include "infer/param_store.h"

using namespace shardlm;
using namespace shardlm::infer;

namespace {

// Five parts of 100 bytes: embedding, 4 layers, head (untied); mean leaf 20 (below a layer).
PartSizes five_by_100() {
  PartSizes s;
  s.embed = 100;
  s.layers = {100, 100, 100, 100};
  s.head = 100;
  s.mean_leaf = 20;
  return s;
}

// "E" = embedding, "H" = head, layers "0-1" (or "2" alone), per rank, e.g. "E 0-1 | 2-3 H".
std::string layout(const std::vector<RankShare>& shares) {
  std::string out;
  for (size_t r = 0; r < shares.size(); ++r) {
    const RankShare& s = shares[r];
    std::string one;
    if (s.embed) one += "E ";
    if (s.layer_end == s.layer_begin + 1) one += std::to_string(s.layer_begin) + " ";
    else if (s.layer_end > s.layer_begin)
      one += std::to_string(s.layer_begin) + "-" + std::to_string(s.layer_end - 1) + " ";
    if (s.head) one += "H ";
    if (one.empty()) one = "- ";
    one.pop_back();
    out += (r ? " | " : "") + one;
  }
  return out;
}

}  // namespace

TEST(Placement, SequentialFillsRankZeroFirst) {
  const PartSizes s = five_by_100();
  // Unlimited: accelerate's sequential puts everything on the first device.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Sequential, 2, 0)), "E 0-3 H | -");
  // 400 per rank, less the 100 rank 0 keeps for the largest part still to come: 3 parts there.
  const auto shares = place_parts(s, DeviceMap::Sequential, 2, 400);
  EXPECT_EQ(layout(shares), "E 0-1 | 2-3 H");
  EXPECT_EQ(shares[0].bytes, 300u);
  EXPECT_EQ(shares[1].bytes, 300u);
  // 300 per rank over 3 ranks: 2 parts on rank 0 (300 - 100 kept), 3 on rank 1, the head on rank 2.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Sequential, 3, 300)), "E 0 | 1-3 | H");
}

TEST(Placement, BalancedAddsTheLayerBufferAndLeavesTheRestToTheLastRank) {
  const PartSizes s = five_by_100();
  // total 600 / 2 + 1.25 x 100 = 425 on rank 0, less 100 kept: three parts; the last rank is
  // not capped.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Balanced, 2, 0)), "E 0-1 | 2-3 H");
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Auto, 2, 0)), "E 0-1 | 2-3 H");  // auto = balanced
  // 3 ranks: 600 / 3 + 125 = 325: rank 0 two parts (225 after the 100 kept), rank 1 three.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Balanced, 3, 0)), "E 0 | 1-3 | H");
  // 4 ranks: 600 / 4 + 125 = 275: the embedding alone on rank 0, then two parts per rank.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Balanced, 4, 0)), "E | 0-1 | 2-3 | H");
  // A mean leaf larger than a layer sets the buffer: 600 / 2 + 1.25 x 200 = 550 on rank 0.
  PartSizes big_leaf = s;
  big_leaf.mean_leaf = 200;
  EXPECT_EQ(layout(place_parts(big_leaf, DeviceMap::Balanced, 2, 0)), "E 0-2 | 3 H");
  // A max memory below the balanced share wins: min(550, 450) = 450 on rank 0.
  EXPECT_EQ(layout(place_parts(big_leaf, DeviceMap::Balanced, 2, 450)), "E 0-1 | 2-3 H");
}

TEST(Placement, BalancedLowZeroKeepsRankZeroEmptyWhenTheOthersCanTakeIt) {
  const PartSizes s = five_by_100();
  // Ranks 1..2: 600 / 2 + 125 = 425 on rank 1, rank 2 unlimited: rank 0 is capped at 0.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::BalancedLow0, 3, 0)), "- | E 0-2 | 3 H");
  EXPECT_EQ(layout(place_parts(s, DeviceMap::BalancedLow0, 2, 0)), "- | E 0-3 H");
  // 300 per rank on 3 ranks: ranks 1 and 2 can take all 600, so rank 0 is capped at 0 again.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::BalancedLow0, 3, 300)), "- | E 0-1 | 2-3 H");
  EXPECT_EQ(layout(place_parts(s, DeviceMap::BalancedLow0, 4, 250)), "- | E 0 | 1-2 | 3 H");
  // 250 on 3 ranks: ranks 1 and 2 take 500 of 600, so rank 0 may hold 100, all of which it keeps
  // for the largest part to come; whole layers then fill ranks 1 and 2 and the rest fits nowhere.
  EXPECT_THROW(place_parts(s, DeviceMap::BalancedLow0, 3, 250), Error);
}

TEST(Placement, TiedHeadCountsItsCopyOfTheEmbeddingOnlyOnAnotherRank) {
  PartSizes s;
  s.embed = 100;
  s.layers = {100, 100};
  s.head = 10;  // the final norm; lm_head is the embedding matrix
  s.tied = true;
  s.mean_leaf = 30;
  EXPECT_EQ(s.total(), 310u);  // the matrix once, as accelerate counts a tied model
  auto one = place_parts(s, DeviceMap::Sequential, 1, 0);
  EXPECT_EQ(layout(one), "E 0-1 H");
  EXPECT_EQ(one[0].bytes, 310u);  // shared on the embedding's rank
  // 320 per rank: rank 0 keeps 110 (the head with its copy) for later, so 2 parts; rank 1 holds
  // layer 1, the norm and its own copy of the matrix.
  auto two = place_parts(s, DeviceMap::Sequential, 2, 320);
  EXPECT_EQ(layout(two), "E 0 | 1 H");
  EXPECT_EQ(two[1].bytes, 210u);
  // 200 per rank: rank 0 cannot keep 110 beside the embedding; rank 1 takes it and layer 0.
  EXPECT_THROW(place_parts(s, DeviceMap::Sequential, 2, 200), Error);
}

TEST(Placement, MoreRanksThanPartsLeavesSomeEmpty) {
  PartSizes s;
  s.embed = 100;
  s.layers = {100, 100};
  s.head = 100;
  s.mean_leaf = 20;
  // 400 / 8 + 125 = 175 per rank: rank 0 keeps 100 of it, so the embedding goes to rank 1; one
  // part per rank after that, and ranks 5..7 get nothing.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Balanced, 8, 0)), "- | E | 0 | 1 | H | - | - | -");
}

TEST(Placement, APartThatFitsNowhereNamesTheFlag) {
  const PartSizes s = five_by_100();
  try {
    // rank 0: E (150 after 100 kept); rank 1: 0-1. The caller names its flag.
    place_parts(s, DeviceMap::Sequential, 2, 250, "--max-memory-per-rank");
    FAIL() << "placed 600 bytes on 2 ranks of 250";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--max-memory-per-rank"), std::string::npos) << what;
    EXPECT_NE(what.find("model.layers.2"), std::string::npos) << what;
  }
  EXPECT_THROW(place_parts(s, DeviceMap::Balanced, 4, 50), Error);  // a layer is 100
  EXPECT_THROW(parse_device_map("balance"), Error);
  EXPECT_EQ(parse_device_map("balanced_low_0"), DeviceMap::BalancedLow0);
}

// Llama 2 7B held in f32 on 2 ranks, balanced: 26.95 GB / 2 + 1.25 x one layer (809.5 MB) =
// 14.49 GB on rank 0, less one layer kept = 13.68 GB: the embedding (524 MB) + 16 layers; rank 1
// the other 16 and the head. (The same split in bf16: every size halves.)
TEST(Placement, Llama2SevenBOnTwoRanks) {
  const PartSizes s = part_sizes(preset("llama2-7b"));
  EXPECT_EQ(s.embed, 32000ull * 4096 * 4);
  ASSERT_EQ(s.layers.size(), 32u);
  EXPECT_EQ(s.layers[0], (4ull * 4096 * 4096 + 3ull * 4096 * 11008 + 2 * 4096) * 4);
  EXPECT_EQ(s.head, (4096ull + 32000ull * 4096) * 4);
  EXPECT_EQ(s.total(), 26953662464ull);
  EXPECT_EQ(s.mean_leaf, 26953662464ull / 291);  // 291 leaves: embedding, 9 per layer, norm, lm_head
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Balanced, 2, 0)), "E 0-15 | 16-31 H");
  // Sequential with 15 GB per rank: 524 MB + 16 layers (13.48 GB) fit beside the 810 MB kept.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Sequential, 2, 15'000'000'000ull)), "E 0-15 | 16-31 H");
  // 10 GB: 10 layers beside the embedding and the layer kept, 12 alone, the last 10 and the head.
  EXPECT_EQ(layout(place_parts(s, DeviceMap::Sequential, 3, 10'000'000'000ull)), "E 0-9 | 10-21 | 22-31 H");
  // In bf16 (generate --dtype bf16) every size halves, so 5 GB per rank places what 10 GB did in f32.
  const PartSizes h = part_sizes(preset("llama2-7b"), DType::BF16);
  EXPECT_EQ(h.embed, s.embed / 2);
  EXPECT_EQ(h.layers[0], s.layers[0] / 2);
  EXPECT_EQ(h.head, s.head / 2);
  EXPECT_EQ(h.total(), s.total() / 2);
  EXPECT_EQ(h.mean_leaf, s.mean_leaf / 2);
  EXPECT_EQ(layout(place_parts(h, DeviceMap::Sequential, 3, 5'000'000'000ull)), "E 0-9 | 10-21 | 22-31 H");
}

// A rank's ParamStore (generate --device-map) holds, loads and binds only its parts: here layer 1
// and the head of a tied model, which then needs the embedding matrix too.
TEST(Placement, ARankStoreHoldsOnlyItsParts) {
  shardlm::testing::TempDir dir;
  ModelConfig cfg = preset("tiny");
  cfg.num_hidden_layers = 3;
  cfg.tie_word_embeddings = true;
  infer::ParamStore whole(cfg, DType::F32);
  whole.init_random(4);
  whole.save(dir / "m", DType::F32, 1ull << 40, "");
  infer::ParamStore part(cfg, DType::F32, [](const model::ModelPart& p) {
    return p.kind != model::PartKind::Layer || p.layer == 1;
  });
  EXPECT_TRUE(part.partial());
  part.load(io::ModelWeights(dir / "m"), dir / "m");
  const model::LlamaWeights& w = part.compute_weights();
  ASSERT_EQ(w.layers.size(), 3u);
  EXPECT_FALSE(w.layers[0].wq.defined());
  EXPECT_FALSE(w.layers[2].w_down.defined());
  ASSERT_TRUE(w.layers[1].wq.defined());
  ASSERT_TRUE(w.lm_head.defined());
  EXPECT_EQ(w.lm_head.data, w.embed.data);  // tied: the head's matrix is the embedding
  EXPECT_TRUE(part.has("model.layers.1.mlp.down_proj.weight"));
  EXPECT_FALSE(part.has("model.layers.0.mlp.down_proj.weight"));
  EXPECT_EQ(part.numel(), whole.numel() - 2 * (part.numel() - w.embed.numel() - cfg.hidden_size));
  const Tensor a = whole.master("model.layers.1.self_attn.q_proj.weight");
  const Tensor b = part.master("model.layers.1.self_attn.q_proj.weight");
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], b.f32()[i]) << i;
  EXPECT_THROW(part.save(dir / "out", DType::F32, 1ull << 40, ""), Error);
}

// --device-map with --dtype q8_0 places the parts by the bytes generation holds: the planner's
// sizes are the store's, weight for weight (held_in_q8_0 is the one rule), for a model whose
// down_proj rows are not whole blocks of 32 (held in bf16) and with tied embeddings.
TEST(Placement, Q8_0SizesAreWhatTheStoreHolds) {
  for (bool tied : {false, true}) {
    ModelConfig cfg = preset("tiny");
    cfg.num_hidden_layers = 2;
    cfg.intermediate_size = 100;  // down_proj's rows: 100 columns, not whole blocks
    cfg.tie_word_embeddings = tied;
    infer::ParamStore store(cfg, DType::F32);
    store.init_random(1);
    const int quantized = store.keep_only_q8_0();
    EXPECT_EQ(quantized, 2 * 6);  // q, k, v, o, gate, up per layer
    const infer::PartSizes q8 = infer::part_sizes(cfg, DType::BF16, true), bf16 = infer::part_sizes(cfg, DType::BF16);
    EXPECT_EQ(int64_t(q8.total()), store.bytes()) << "tied " << tied;
    EXPECT_LT(q8.layers[0], bf16.layers[0]);
    EXPECT_EQ(q8.embed, bf16.embed);  // the embedding and the head stay bf16
    EXPECT_EQ(q8.head, bf16.head);
  }
}
