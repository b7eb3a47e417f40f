// The memory estimator's tables and automatic strategy choice, and the memory figures a training
// run reports. (The estimator against measured peaks, at 1, 2 and 4 ranks: tests/mpi/memory_test.cpp.)
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "comm/ring_collectives.h"
#include "io/yaml_config.h"
#include "memory/estimator.h"
#include "memory/levers.h"
#include "memory/usage.h"
#include "model/hf_dir.h"
#include "infer/param_store.h"
#include "train/train_config.h"
#include "train/trainer.h"

using namespace shardlm;
namespace fs = std::filesystem;

TEST(AccelerateTable, Llama2_7bByHand) {
  // llama2-7b: D 4096, F 11008, 32 layers, vocab 32000, untied head.
  //   decoder layer: 4 x 4096^2 (q, k, v, o) + 3 x 4096 x 11008 (gate, up, down) + 2 x 4096 (norms)
  //                = 67,108,864 + 135,266,304 + 8,192 = 202,383,360 (larger than the 131,072,000 embedding)
  //   total: 32 layers + embedding + lm_head + final norm = 6,476,267,520 + 262,144,000 + 4,096 = 6,738,415,616
  const std::vector<memory::AccelerateRow> rows = memory::accelerate_table(preset("llama2-7b"));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].dtype, "float32");
  EXPECT_EQ(rows[0].largest_layer, 202383360LL * 4);
  EXPECT_EQ(rows[0].total_size, 6738415616LL * 4);
  EXPECT_EQ(rows[0].adam_training, 6738415616LL * 16);  // weights, gradients, m, v: f32
  EXPECT_EQ(rows[0].accelerate_says, 6738415616LL * 16);
  EXPECT_EQ(rows[1].largest_layer, 202383360LL * 2);
  EXPECT_EQ(rows[1].total_size, 6738415616LL * 2);
  EXPECT_EQ(rows[1].adam_training, 6738415616LL * 18);  // f32 states + the bf16 compute copy
  EXPECT_EQ(rows[1].accelerate_says, 6738415616LL * 8);  // what accelerate prints: half of what is needed
  EXPECT_EQ(rows[2].adam_training, -1);
  EXPECT_EQ(rows[3].total_size, 6738415616LL / 2);
}

TEST(Estimator, ShardingDividesTheModelStates) {
  // Exact model states of FULL_SHARD at world 8: each unit padded to a multiple of 8, then split.
  memory::EstimateInput in;
  in.model = preset("llama2-7b");
  in.sharding.strategy = shard::Strategy::FullShard;
  in.world_size = 8;
  in.micro_batch_size = 1;
  in.seq_len = 128;
  const memory::Estimate e = memory::estimate(in);
  // Every unit of llama2-7b is already a multiple of 8 elements: no padding.
  EXPECT_EQ(e.padded_params, 6738415616LL);
  EXPECT_EQ(e.at_peak[size_t(memory::Term::ParamsAtRest)], 6738415616LL / 8 * 4);
  EXPECT_EQ(e.at_peak[size_t(memory::Term::Optimizer)], 6738415616LL / 8 * 8);
  EXPECT_EQ(e.num_units, 34);  // the embedding, 32 decoder layers, the head (final norm + lm_head)
  in.sharding.strategy = shard::Strategy::NoShard;
  const memory::Estimate ddp = memory::estimate(in);
  EXPECT_EQ(ddp.at_peak[size_t(memory::Term::Optimizer)], 6738415616LL * 8);
  EXPECT_GT(ddp.peak_total, 4 * e.peak_total);
  // Ring accounting as in docs/sharding.md: NO_SHARD 2 psi, FULL_SHARD 3 psi - head - embedding,
  // f32 both ways (every unit is gathered for its forward and again for its backward, except the
  // head, whose forward and backward are one visit, and the embedding, whose backward reads none
  // of its parameters).
  const double psi = 6738415616.0 * 4 * 7 / 8, head = (131072000.0 + 4096) * 4 * 7 / 8,
               embedding = 131072000.0 * 4 * 7 / 8;
  EXPECT_NEAR(ddp.comm_bytes_per_step, 2 * psi, 1);
  EXPECT_NEAR(e.comm_bytes_per_step, 3 * psi - head - embedding, 1);
}

TEST(Estimator, HybridNeedsAShardGroupThatDividesTheWorld) {
  memory::EstimateInput in;
  in.model = preset("tiny");
  in.sharding.strategy = shard::Strategy::HybridShard;
  in.world_size = 6;
  in.ranks_per_node = 4;
  EXPECT_THROW(memory::estimate(in), Error);
  in.ranks_per_node = 3;
  EXPECT_EQ(memory::estimate(in).shard_group, 3);
}

namespace {
memory::EstimateInput seven_b(int world, int nproc = 0) {
  memory::EstimateInput in;
  in.model = preset("llama2-7b");
  in.world_size = world;
  in.ranks_per_node = nproc;
  in.micro_batch_size = 1;
  in.seq_len = 1024;
  in.checkpoint_every = 1;
  return in;
}
int64_t peak_of(memory::EstimateInput in, shard::Strategy s) {
  in.sharding.strategy = s;
  return memory::estimate(in).device_bytes;
}
}  // namespace

TEST(AutoStrategy, PicksTheLeastCommunicationThatFits) {
  using S = shard::Strategy;
  const memory::EstimateInput in = seven_b(8);
  const int64_t ddp = peak_of(in, S::NoShard), z1 = peak_of(in, S::Zero1), z2 = peak_of(in, S::ShardGradOp),
                z3 = peak_of(in, S::FullShard);
  ASSERT_GT(ddp, z1);
  ASSERT_GT(z1, z2);
  ASSERT_GT(z2, z3);
  std::string why;
  // f32 everywhere: NO_SHARD, ZERO1 and SHARD_GRAD_OP all move 2 psi per step; ties go to the
  // least sharding. FULL_SHARD moves more and is chosen only when nothing else fits.
  EXPECT_EQ(memory::choose_strategy(in, ddp, &why), S::NoShard);
  EXPECT_NE(why.find("auto: NO_SHARD"), std::string::npos) << why;
  EXPECT_EQ(memory::choose_strategy(in, ddp - 1, &why), S::Zero1);
  EXPECT_NE(why.find("NO_SHARD needs"), std::string::npos) << why;
  EXPECT_EQ(memory::choose_strategy(in, z1 - 1, &why), S::ShardGradOp);
  EXPECT_EQ(memory::choose_strategy(in, z2 - 1, &why), S::FullShard);
  EXPECT_NE(why.find("SHARD_GRAD_OP needs"), std::string::npos) << why;
  EXPECT_THROW(memory::choose_strategy(in, z3 - 1, &why), Error);
  try {
    memory::choose_strategy(in, 1 << 30, &why);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nothing fits"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line";
  }
}

TEST(AutoStrategy, HybridAcrossNodesKeepsGathersInsideANode) {
  // 2 nodes of 4: with room for it, _HYBRID_SHARD_ZERO2 puts only the all-reduce of a shard on the
  // links between nodes, less than any strategy that shards or reduces over all 8 ranks.
  const memory::EstimateInput in = seven_b(8, 4);
  std::string why;
  const int64_t hz2 = peak_of(in, shard::Strategy::HybridShardZero2);
  EXPECT_EQ(memory::choose_strategy(in, hz2, &why), shard::Strategy::HybridShardZero2) << why;
  // With too little room for that, HYBRID_SHARD (still a node's shard group) comes next.
  const int64_t hs = peak_of(in, shard::Strategy::HybridShard);
  ASSERT_LT(hs, hz2);
  EXPECT_EQ(memory::choose_strategy(in, hz2 - 1, &why), shard::Strategy::HybridShard) << why;
}

TEST(MemoryUsage, ProgressFieldAndMetricsRecord) {
  MemStats m;
  m.live[size_t(MemCategory::Parameters)] = 400 << 20;
  m.peak[size_t(MemCategory::Parameters)] = 400 << 20;
  m.peak[size_t(MemCategory::Workspace)] = 40 << 20;
  m.live_total = 400 << 20;
  m.peak_total = 440 << 20;
  const memory::ProcessMemory p{int64_t(2) << 30, int64_t(3) << 30};
  EXPECT_EQ(memory::memory_brief(m, p), "mem 400M/440M (par 400M/400M ws 0/40.0M) rss 2.00G/3.00G");
  nlohmann::json r;
  memory::add_memory_fields(r, m, p);
  EXPECT_EQ(r["mem_peak_workspace"], 40 << 20);
  EXPECT_EQ(r["mem_live_parameters"], 400 << 20);
  EXPECT_EQ(r["rss_peak_bytes"], int64_t(3) << 30);
  const memory::ProcessMemory self = memory::process_memory();
  EXPECT_GT(self.rss, 0);
  EXPECT_GE(self.rss_peak, self.rss);
}

TEST(Training, ReportsMemoryAndPicksTheStrategyItself) {
  const fs::path d = fs::path(::testing::TempDir()) / "shardlm_memory_train";
  fs::remove_all(d);
  fs::create_directories(d);
  ModelConfig cfg = preset("tiny");
  cfg.num_hidden_layers = 2;
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(0);
  p.save((d / "init").string(), DType::F32, ~uint64_t(0), "");
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(d / "corpus.txt") << text;
  const std::string head = "model: " + (d / "init").string() + "\noutput_dir: " + (d / "out").string() +
                           "\ndata: {train: " + (d / "corpus.txt").string() +
                           "}\nseq_len: 16\nmicro_batch_size: 2\nmax_steps: 2\neval_batches: 1\nprogress: none\n";
  {
    ConfigTree t = ConfigTree::parse(head + "sharding_strategy: auto\n");
    EXPECT_THROW(train::read_train_config(t), Error);  // auto without a budget
  }
  {
    ConfigTree t = ConfigTree::parse(head + "sharding_strategy: auto\nmax_memory_per_rank: 10kB\n");
    try {
      train::run_training(train::read_train_config(t));
      ADD_FAILURE() << "a 10 kB budget fits nothing";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("nothing fits"), std::string::npos) << e.what();
      // The smallest strategy's levers, as config keys, and what is left beyond them.
      EXPECT_NE(std::string(e.what()).find("try, in order of cost to speed: optimizer_state_dtype: bf16 → "),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("beyond that: more ranks"), std::string::npos) << e.what();
    }
  }
  ConfigTree t = ConfigTree::parse(head + "sharding_strategy: auto\nmax_memory_per_rank: 1GiB\n");
  const train::TrainConfig c = train::read_train_config(t);
  EXPECT_TRUE(c.sharding.auto_strategy);
  EXPECT_EQ(c.max_memory_per_rank, int64_t(1) << 30);
  train::run_training(c);
  std::ifstream f(d / "out" / "metrics.jsonl");
  std::string line;
  int steps = 0;
  while (std::getline(f, line)) {
    const nlohmann::json r = nlohmann::json::parse(line);
    EXPECT_TRUE(r.contains("mem_peak_bytes") && r.contains("rss_peak_bytes")) << line;  // eval records too
    if (!r.contains("loss")) continue;
    ++steps;
    for (const char* k : {"mem_live_bytes", "mem_peak_bytes", "mem_peak_parameters", "mem_peak_activations",
                          "mem_live_optimizer", "rss_bytes", "rss_peak_bytes"})
      EXPECT_TRUE(r.contains(k)) << k << " missing from " << line;
    EXPECT_GT(r["mem_peak_activations"].get<int64_t>(), 0);
  }
  EXPECT_EQ(steps, 2);
}

// "It won't fit, try X": the levers a run does not use, applied one after another, each step's
// peak the estimator's own for that run, shrinking until the budget is met; levers already in
// use are not offered, and a run that fits gets none.
TEST(Levers, EachStepIsTheEstimateOfTheRunWithItAndTheLastFits) {
  memory::EstimateInput in;
  in.model = preset("llama3.2-1b");
  in.model.num_hidden_layers = 4;  // the 1B's shape, fewer layers: quick to estimate
  in.world_size = 4;
  in.sharding.strategy = shard::Strategy::ShardGradOp;
  in.micro_batch_size = 8;
  in.seq_len = 512;
  const int64_t full = memory::estimate(in).device_bytes;
  const int64_t budget = full * 55 / 100;  // needs every lever but offload, the micro-batch smaller
  const std::vector<memory::LeverStep> steps = memory::levers_to_fit(in, budget, false);
  ASSERT_FALSE(steps.empty());
  int64_t before = full;
  for (const memory::LeverStep& s : steps) {
    EXPECT_LT(s.device_bytes, before) << int(s.lever);
    EXPECT_EQ(s.device_bytes, memory::estimate(s.input).device_bytes) << int(s.lever);
    before = s.device_bytes;
  }
  EXPECT_LE(steps.back().device_bytes, budget);
  EXPECT_EQ(steps.front().lever, memory::Lever::StateBf16);  // the cheapest first
  for (const memory::LeverStep& s : steps) EXPECT_NE(s.lever, memory::Lever::Offload);  // not a GPU run
  const memory::EstimateInput& last = steps.back().input;
  EXPECT_EQ(last.micro_batch_size * last.grad_accum, in.micro_batch_size * in.grad_accum);  // the global batch kept
  const std::string line = memory::describe_levers(steps, budget, [](const memory::LeverStep& s) {
    return fmt::format("L{}", int(s.lever));
  });
  EXPECT_EQ(line.rfind("L0 → ", 0), 0u) << line;
  EXPECT_NE(line.find(" (fits)"), std::string::npos) << line;

  // Already on: not offered again.
  memory::EstimateInput lean = steps.back().input;
  lean.micro_batch_size = in.micro_batch_size;
  lean.grad_accum = in.grad_accum;
  for (const memory::LeverStep& s : memory::levers_to_fit(lean, budget, false))
    EXPECT_TRUE(s.lever == memory::Lever::SmallerMicroBatch) << int(s.lever);
  EXPECT_TRUE(memory::levers_to_fit(in, full, false).empty());

  // 8-bit moments only where bf16 ones, with every other lever, would not fit.
  memory::EstimateInput one = in;
  one.micro_batch_size = 1;  // no smaller micro-batch to offer
  // The 8-bit run keeps the embedding's moments f32 (shard::PlannedUnit::state_dtype): a vocabulary
  // small beside these four layers, so that 8-bit moments are the smaller state.
  one.model.vocab_size = 16384;
  auto all_with = [&](DType state) {
    memory::EstimateInput x = one;
    x.sharding.state_dtype = state;
    x.sharding.param_dtype = DType::BF16;
    x.sharding.strategy = shard::Strategy::FullShard;
    x.checkpoint_every = 1;
    return memory::estimate(x).device_bytes;
  };
  const int64_t with_bf16 = all_with(DType::BF16), with_8bit = all_with(DType::U8);
  ASSERT_LT(with_8bit, with_bf16);
  const int64_t between = (with_8bit + with_bf16) / 2;
  const std::vector<memory::LeverStep> tight = memory::levers_to_fit(one, between, false);
  ASSERT_FALSE(tight.empty());
  EXPECT_EQ(tight.front().lever, memory::Lever::State8bit);
  EXPECT_LE(tight.back().device_bytes, between);
  const std::vector<memory::LeverStep> roomy = memory::levers_to_fit(one, with_bf16, false);
  ASSERT_FALSE(roomy.empty());
  EXPECT_EQ(roomy.front().lever, memory::Lever::StateBf16);
}

// CPU ranks over MPI on several nodes: a group across nodes passes its reductions around the ring
// (comm/ring_collectives.h), whose scratch the dry run holds from issue to wait as the ring does.
// Within one node, or on GPUs (NCCL), there is none.
TEST(MemoryEstimate, RingScratchOnlyForGroupsAcrossNodesOnCpuRanks) {
  memory::EstimateInput in;
  in.model = preset("llama3.2-1b");  // a dry run: nothing is allocated for real
  in.model.num_hidden_layers = 2;
  in.micro_batch_size = 1;
  in.seq_len = 64;
  in.world_size = 4;
  in.sharding.strategy = shard::Strategy::FullShard;
  auto comm_peak = [&](int per_node, bool ring) {
    memory::EstimateInput x = in;
    x.ranks_per_node = per_node;
    x.mpi_ring = ring;
    return memory::estimate(x).peak[size_t(memory::Term::Communication)];
  };
  // A decoder layer's gradients (61M f32) reduce-scatter over 4 ranks in 4 lanes of two 4 MiB
  // segments: 32 MiB from issue to wait, one or two reductions in flight at once.
  const int64_t scratch = int64_t(comm::ring_shape(comm::RingOp::ReduceScatter, 4, 60'000'000 / 4, 4).scratch_bytes);
  ASSERT_EQ(scratch, int64_t(comm::kRingLanes) * 2 * int64_t(comm::kRingSegmentBytes));
  const int64_t plain = comm_peak(2, false);
  EXPECT_GE(comm_peak(2, true), plain + scratch);
  EXPECT_LE(comm_peak(2, true), plain + 2 * scratch);
  EXPECT_EQ(comm_peak(4, true), comm_peak(4, false));  // one node: shared memory and MPI, no ring
  EXPECT_EQ(comm_peak(0, true), plain);                 // no node count: one node
}
