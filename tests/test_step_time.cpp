// The step-time model (memory/step_time.h): the work the dry run records, the cost of a collective
// by where its group's ranks are, and the replay's overlap. (Against measured step times on
// emulated nodes: bench/slow_links.sh, recorded in bench/RESULTS.md.)
#include <gtest/gtest.h>

#include <algorithm>

#include "memory/estimator.h"
#include "memory/step_time.h"
#include "model/config.h"

using namespace shardlm;
using memory::WorkEvent;

namespace {

ModelConfig small_model() {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 2;
  return c;
}

memory::EstimateInput run_of(shard::Strategy s, int world, int per_node) {
  memory::EstimateInput in;
  in.model = small_model();
  in.world_size = world;
  in.ranks_per_node = per_node;
  in.micro_batch_size = 2;
  in.seq_len = 16;
  in.sharding.strategy = s;
  return in;
}

double recorded_flops(const memory::Estimate& e) {
  double f = 0;
  for (const WorkEvent& w : e.step_work)
    if (w.kind == WorkEvent::Kind::Compute) f += w.flops;
  return f;
}

// The matmul and attention arithmetic of one rank's step, by hand: 6 per weight per token for the
// decoder's projections and the head (forward, input and weight gradients), and per causal score
// (query i sees keys 0..i) 2 products of head_dim forward and 4 backward; a recomputed layer adds its
// forward again, all but the down projection (its output, the block's, is not needed again).
double flops_by_hand(const memory::EstimateInput& in, bool recompute) {
  const ModelConfig& c = in.model;
  const double d = double(c.hidden_size), N = double(in.micro_batch_size * in.seq_len), T = double(in.seq_len);
  const double layer = d * double(c.q_dim()) * 2 + d * double(c.kv_dim()) * 2 + 3 * d * double(c.intermediate_size);
  const double scores = double(in.micro_batch_size) * double(c.num_attention_heads) * T * (T + 1) / 2;
  const double attn_fwd = 2 * 2 * double(c.head_dim) * scores;
  const double L = double(c.num_hidden_layers);
  double f = 6 * N * (L * layer + double(c.vocab_size) * d) + L * 3 * attn_fwd;
  if (recompute) f += L * (2 * N * (layer - d * double(c.intermediate_size)) + attn_fwd);
  return f;
}

}  // namespace

TEST(StepTime, RecordsTheStepsArithmeticAndCheckpointingsRecompute) {
  memory::EstimateInput in = run_of(shard::Strategy::FullShard, 1, 1);
  EXPECT_NEAR(recorded_flops(memory::estimate(in)), flops_by_hand(in, false), 1e-9 * flops_by_hand(in, false));
  in.checkpoint_every = 1;
  EXPECT_NEAR(recorded_flops(memory::estimate(in)), flops_by_hand(in, true), 1e-9 * flops_by_hand(in, true));
}

TEST(StepTime, EveryIssuedCollectiveIsWaitedForAndItsBytesAreTheDryRunsCount) {
  const memory::EstimateInput in = run_of(shard::Strategy::HybridShard, 8, 4);
  const memory::Estimate e = memory::estimate(in);
  double bytes = 0;
  int issued = 0, replicate = 0;
  for (const WorkEvent& w : e.step_work) {
    if (w.kind != WorkEvent::Kind::Issue) continue;
    bytes += double(w.bytes);
    ++issued;
    replicate += w.group == WorkEvent::Group::Replicate;
    const auto wait = std::find_if(e.step_work.begin(), e.step_work.end(), [&](const WorkEvent& x) {
      return x.kind == WorkEvent::Kind::Wait && x.id == w.id;
    });
    EXPECT_NE(wait, e.step_work.end()) << "collective " << w.id << " is never waited for";
  }
  EXPECT_GT(issued, 0);
  EXPECT_GT(replicate, 0);  // hybrid: the all-reduces across nodes
  EXPECT_DOUBLE_EQ(bytes, e.comm_bytes_per_step);
}

TEST(StepTime, HybridAllReduceAcrossNodesRunsBehindCompute) {
  // Each replicate all-reduce is issued after its unit's reduce-scatter and waited for only after
  // the next visit's compute: some arithmetic lies between its issue and its wait.
  const memory::Estimate e = memory::estimate(run_of(shard::Strategy::HybridShard, 8, 4));
  int overlapped = 0, across = 0;
  for (size_t i = 0; i < e.step_work.size(); ++i) {
    const WorkEvent& w = e.step_work[i];
    if (w.kind != WorkEvent::Kind::Issue || w.group != WorkEvent::Group::Replicate ||
        w.collective != DryCollective::AllReduce)
      continue;
    ++across;
    for (size_t j = i + 1; j < e.step_work.size(); ++j) {
      if (e.step_work[j].kind == WorkEvent::Kind::Wait && e.step_work[j].id == w.id) break;
      if (e.step_work[j].kind == WorkEvent::Kind::Compute) {
        ++overlapped;
        break;
      }
    }
  }
  EXPECT_GT(across, 0);
  EXPECT_GT(overlapped, 0);
}

TEST(StepTime, GroupPlacesFollowTheNodes) {
  // 16 ranks, 4 per node. FULL_SHARD: one group of all 16 over 4 nodes. HYBRID_SHARD: shard group =
  // a node; replicate group = 4 ranks, one per node.
  memory::EstimateInput in = run_of(shard::Strategy::FullShard, 16, 4);
  memory::Estimate e = memory::estimate(in);
  memory::GroupPlace g = memory::shard_group_place(in, e);
  EXPECT_EQ(g.size, 16);
  EXPECT_EQ(g.nodes, 4);
  EXPECT_EQ(g.per_node, 4);
  EXPECT_EQ(memory::replicate_group_place(in, e).size, 1);
  in.sharding.strategy = shard::Strategy::HybridShard;
  e = memory::estimate(in);
  g = memory::shard_group_place(in, e);
  EXPECT_EQ(g.size, 4);
  EXPECT_EQ(g.nodes, 1);
  g = memory::replicate_group_place(in, e);
  EXPECT_EQ(g.size, 4);
  EXPECT_EQ(g.nodes, 4);
  EXPECT_EQ(g.per_node, 1);
  // A shard group of 2 within nodes of 4: replicate groups of 8 ranks, 2 on each node.
  in.sharding.shard_group_size = 2;
  e = memory::estimate(in);
  g = memory::replicate_group_place(in, e);
  EXPECT_EQ(g.size, 8);
  EXPECT_EQ(g.nodes, 4);
  EXPECT_EQ(g.per_node, 2);
}

TEST(StepTime, CollectiveCostsByHand) {
  const memory::Hardware hw{.flops_per_s = 1e12, .intra_bytes_per_s = 100e9, .inter_bytes_per_s = 50e9,
                            .intra_latency_s = 1e-6, .inter_latency_s = 10e-6};
  const int64_t V = 1'000'000'000;
  // Within a node of 8: 7 steps of latency + V at a rank's intra-node bandwidth.
  EXPECT_NEAR(memory::collective_seconds(DryCollective::AllGather, V, {8, 1, 8}, 8, hw), 7e-6 + 0.01, 1e-12);
  // One ring over 4 nodes of 8 (FULL_SHARD): each node sends V once, over 50 GB/s; 31 steps across.
  EXPECT_NEAR(memory::collective_seconds(DryCollective::ReduceScatter, V, {32, 4, 8}, 8, hw), 31e-5 + 0.02, 1e-12);
  // Hybrid's replicate groups (1 rank per node): all 8 of a node's groups share its links.
  EXPECT_NEAR(memory::collective_seconds(DryCollective::AllReduce, V, {4, 4, 1}, 8, hw), 6e-5 + 0.16, 1e-12);
  // A group of one rank costs nothing.
  EXPECT_EQ(memory::collective_seconds(DryCollective::AllReduce, V, {1, 1, 1}, 8, hw), 0.0);
  // A missing figure is named.
  EXPECT_THROW(memory::collective_seconds(DryCollective::AllGather, V, {32, 4, 8}, 8,
                                          {.flops_per_s = 1, .intra_bytes_per_s = 1e9}),
               Error);
}

TEST(StepTime, OverlapLiesBetweenTheLongerClockAndTheSum) {
  const memory::EstimateInput in = run_of(shard::Strategy::FullShard, 8, 4);
  const memory::Estimate e = memory::estimate(in);
  memory::Hardware hw{.flops_per_s = 1e9, .intra_bytes_per_s = 1e9, .inter_bytes_per_s = 1e8,
                      .intra_latency_s = 1e-5, .inter_latency_s = 1e-4};
  const memory::StepTime with = memory::predict_step_time(in, e, hw);
  hw.overlap = false;
  const memory::StepTime without = memory::predict_step_time(in, e, hw);
  EXPECT_NEAR(without.step_s, without.compute_s + without.comm_s, 1e-12);
  EXPECT_DOUBLE_EQ(with.compute_s, without.compute_s);
  EXPECT_DOUBLE_EQ(with.comm_s, without.comm_s);
  EXPECT_LT(with.step_s, without.step_s);
  EXPECT_GE(with.step_s, std::max(with.compute_s, with.comm_s) - 1e-12);
  EXPECT_DOUBLE_EQ(with.tokens, double(in.micro_batch_size * in.seq_len));
  // Faster links, never a slower step.
  hw.overlap = true;
  hw.inter_bytes_per_s *= 10;
  EXPECT_LE(memory::predict_step_time(in, e, hw).step_s, with.step_s);
}

// CPU ranks: each byte a rank communicates takes its cores 1 / host_copy_bytes_per_s of compute
// time; nothing else changes.
TEST(StepTime, HostCopiesAddTheirBytesToCompute) {
  const memory::EstimateInput in = run_of(shard::Strategy::HybridShard, 8, 4);
  const memory::Estimate e = memory::estimate(in);
  memory::Hardware hw{.flops_per_s = 1e9, .intra_bytes_per_s = 1e9, .inter_bytes_per_s = 1e8,
                      .intra_latency_s = 1e-5, .inter_latency_s = 1e-4, .overlap = false};
  const memory::StepTime gpu = memory::predict_step_time(in, e, hw);
  hw.host_copy_bytes_per_s = 2e9;
  const memory::StepTime cpu = memory::predict_step_time(in, e, hw);
  double bytes = 0;
  for (const memory::WorkEvent& w : e.step_work)
    if (w.kind == memory::WorkEvent::Kind::Issue) bytes += double(w.bytes);
  ASSERT_GT(bytes, 0);
  EXPECT_NEAR(cpu.compute_s, gpu.compute_s + bytes / 2e9, 1e-9);
  EXPECT_DOUBLE_EQ(cpu.comm_s, gpu.comm_s);
  EXPECT_DOUBLE_EQ(cpu.flops, gpu.flops);
  EXPECT_NEAR(cpu.step_s, gpu.step_s + bytes / 2e9, 1e-9);  // no overlap: the copies add to the step
}

// With a memory bandwidth, the bytes the dry run's memory-bound ops move take their own time,
// added to the FLOPs' (without it they are folded into the FLOP rate, and nothing is added).
// A hybrid rank steps AdamW over twice the shard of a FULL_SHARD rank of the same world: the FLOPs
// are the same, the bytes differ by at least AdamW's 28 per parameter element of the difference.
TEST(StepTime, MemoryBoundBytesRunAtTheirOwnRateAndFollowTheShard) {
  memory::EstimateInput full = run_of(shard::Strategy::FullShard, 4, 4), hybrid = run_of(shard::Strategy::HybridShard, 4, 4);
  full.sharding.shard_group_size = hybrid.sharding.shard_group_size = 2;
  const memory::Estimate ef = memory::estimate(full), eh = memory::estimate(hybrid);
  ASSERT_EQ(ef.shard_group, 4);
  ASSERT_EQ(eh.shard_group, 2);
  memory::Hardware hw{.flops_per_s = 1e9, .intra_bytes_per_s = 1e9, .overlap = false};
  const memory::StepTime folded = memory::predict_step_time(full, ef, hw);
  hw.memory_bytes_per_s = 5e9;
  const memory::StepTime f = memory::predict_step_time(full, ef, hw), h = memory::predict_step_time(hybrid, eh, hw);
  double bytes = 0;
  for (const WorkEvent& w : ef.step_work)
    if (w.kind == WorkEvent::Kind::Compute) bytes += w.memory_bytes;
  EXPECT_EQ(folded.memory_s, 0.0);
  EXPECT_EQ(folded.memory_bytes, bytes);
  EXPECT_EQ(f.memory_bytes, bytes);
  EXPECT_NEAR(f.memory_s, bytes / 5e9, 1e-12);
  EXPECT_NEAR(f.compute_s, folded.compute_s + bytes / 5e9, 1e-9);
  EXPECT_NEAR(f.step_s, folded.step_s + bytes / 5e9, 1e-9);
  EXPECT_DOUBLE_EQ(f.flops, h.flops);
  EXPECT_GE(h.memory_bytes - f.memory_bytes, 28.0 * double(ef.padded_params) / 4);
  EXPECT_GT(h.compute_s, f.compute_s);
}
