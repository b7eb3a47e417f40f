// Tests of row formation: greedy packing and padding, checked against the model itself — a
// packed row gives every example exactly the loss it has alone, and padding never counts.
// Owner: the data pipeline.
#include <gtest/gtest.h>

#include <cmath>

#include "data/dataset.h"
#include "data/packing.h"
#include "model/config.h"
#include "model/llama.h"
#include "ops/ops.h"
#include "testing.h"
#include "shard/engine.h"
#include "shard/load.h"

using namespace shardlm;

namespace {

// Examples of the given lengths with every target trained (deterministic pseudo-random ids).
std::vector<data::Example> examples(const std::vector<int64_t>& lengths) {
  std::vector<data::Example> out;
  for (size_t k = 0; k < lengths.size(); ++k) {
    data::Example e;
    for (int64_t t = 0; t < lengths[k]; ++t) {
      e.ids.push_back(int32_t(3 + (k * 131 + size_t(t) * 37) % 500));
      e.targets.push_back(int32_t(3 + (k * 71 + size_t(t) * 53 + 11) % 500));
    }
    e.targets[0] = ops::kIgnoreIndex;  // a masked prompt token, as real data has
    out.push_back(e);
  }
  return out;
}

// The evaluation path of training: the engine, in one process.
struct TinyModel {
  ModelConfig cfg;
  std::unique_ptr<comm::Communicator> local = comm::make_local_communicator();
  shard::Mesh mesh;
  shard::ShardedModel engine;
  model::LlamaCompute model;
  TinyModel()
      : cfg(make_cfg()), mesh(shard::make_mesh(*local, {}, 1)), engine(cfg, {}, {}, mesh), model(cfg, DType::F32) {
    shard::init_random(engine, 21);
  }
  static ModelConfig make_cfg() {
    ModelConfig c = preset("tiny");
    c.initializer_range = 0.2;  // attention far from uniform, so a leak across segments would show
    return c;
  }
  ops::CrossEntropyResult loss(const data::BatchBuffers& b) {
    return engine.forward_loss(model, b.batch());
  }
};

}  // namespace

TEST(Packing, GreedyKeepsOrderAndCountsTruncation) {
  const std::vector<int64_t> len = {5, 4, 3, 9, 2, 12, 1};
  std::vector<int64_t> order = {0, 1, 2, 3, 4, 5, 6};
  int64_t truncated = 0;
  const auto rows = data::pack_greedy(order, [&](int64_t i) { return len[size_t(i)]; }, 10, &truncated);
  EXPECT_EQ(rows, (std::vector<std::vector<int64_t>>{{0, 1}, {2}, {3}, {4}, {5}, {6}}));
  EXPECT_EQ(truncated, 1);
  // 3 does not fit after 0+1 (9 of 10 used): a new row, never reordered to fill gaps.
  order = {2, 4, 0, 6};
  EXPECT_EQ(data::pack_greedy(order, [&](int64_t i) { return len[size_t(i)]; }, 10),
            (std::vector<std::vector<int64_t>>{{2, 4, 0}, {6}}));
}

TEST(Packing, PackedRowGivesEachExampleItsOwnLoss) {
  TinyModel m;
  const std::vector<data::Example> ex = examples({5, 9, 3, 7});
  const int64_t T = 28;  // 24 real tokens and 4 of padding
  const data::BatchBuffers packed = data::make_packed_batch({ex}, T, 0);
  EXPECT_EQ(packed.positions[5], 0);  // positions restart per example
  EXPECT_EQ(packed.positions[13], 8);
  EXPECT_EQ(packed.segments[14], 2);
  EXPECT_EQ(packed.segments[27], 4);  // padding: a segment of its own
  EXPECT_EQ(packed.targets[27], ops::kIgnoreIndex);
  const ops::CrossEntropyResult all = m.loss(packed);
  double sum_alone = 0;
  int64_t offset = 0;
  for (size_t k = 0; k < ex.size(); ++k) {
    // Example k alone, in a batch of its own length, without positions or segments.
    const ops::CrossEntropyResult alone = m.loss(data::make_batch({ex[k]}, int64_t(ex[k].ids.size()), 0));
    // The packed row with only example k's targets kept.
    data::BatchBuffers only = packed;
    for (int64_t t = 0; t < T; ++t)
      if (t < offset || t >= offset + int64_t(ex[k].ids.size())) only.targets[size_t(t)] = ops::kIgnoreIndex;
    const ops::CrossEntropyResult in_row = m.loss(only);
    EXPECT_EQ(in_row.count, alone.count) << k;
    EXPECT_NEAR(in_row.loss_sum, alone.loss_sum, 1e-5 * std::abs(alone.loss_sum)) << "example " << k;
    sum_alone += alone.loss_sum;
    offset += int64_t(ex[k].ids.size());
  }
  EXPECT_NEAR(all.loss_sum, sum_alone, 1e-5 * sum_alone);
  EXPECT_EQ(all.count, 4 + 8 + 2 + 6);
}

TEST(Packing, UnpackedBatchPadsToTheLongestAndPaddingNeverCounts) {
  TinyModel m;
  const std::vector<data::Example> ex = examples({6, 11, 4});
  const data::BatchBuffers b = data::make_padded_batch(ex, 32, 0);
  EXPECT_EQ(b.T, 11);  // the longest row, not max_T
  EXPECT_TRUE(b.positions.empty());
  EXPECT_EQ(b.count_targets(), 5 + 10 + 3);
  for (int64_t t = 4; t < 11; ++t) EXPECT_EQ(b.targets[size_t(2 * 11 + t)], ops::kIgnoreIndex);
  const ops::CrossEntropyResult padded = m.loss(b);
  double sum = 0;
  for (const data::Example& e : ex) sum += m.loss(data::make_batch({e}, int64_t(e.ids.size()), 0)).loss_sum;
  EXPECT_EQ(padded.count, 18);
  EXPECT_NEAR(padded.loss_sum, sum, 1e-5 * sum);
  // Rows longer than max_T are cut to it.
  EXPECT_EQ(data::make_padded_batch(ex, 8, 0).T, 8);
}
