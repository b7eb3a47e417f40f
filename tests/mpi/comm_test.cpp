// Collectives under MPI: run by ctest with 1, 2 and 4 ranks (mpirun --oversubscribe). Values
// depend on the rank so that a wrong slice, order or reduction shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "comm/communicator.h"
#include "comm/ring_collectives.h"
#include "mpi_test_main.h"

using namespace shardlm;
using namespace shardlm::comm;

static Communicator* g_world = nullptr;

namespace {
Tensor view(std::vector<float>& v) { return Tensor::view(v.data(), DType::F32, {int64_t(v.size())}); }
}  // namespace

TEST(Comm, AllGatherPlacesEachRankSlice) {
  const int R = g_world->rank(), W = g_world->size(), n = 5;
  std::vector<float> in(n), out(size_t(n * W), -1.0f);
  for (int i = 0; i < n; ++i) in[size_t(i)] = float(R * 100 + i);
  g_world->all_gather(view(out), view(in));
  for (int r = 0; r < W; ++r)
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[size_t(r * n + i)], float(r * 100 + i)) << "rank " << R;
  // In place: the input is this rank's slice of the output.
  std::vector<float> buf(size_t(n * W), 0.0f);
  for (int i = 0; i < n; ++i) buf[size_t(R * n + i)] = float(R * 100 + i);
  g_world->all_gather(view(buf), Tensor::view(buf.data() + R * n, DType::F32, {n}));
  EXPECT_EQ(buf, out);
}

TEST(Comm, ReduceScatterSumAndAverage) {
  const int R = g_world->rank(), W = g_world->size(), n = 3;
  std::vector<float> in(size_t(n * W)), out(n);
  for (int j = 0; j < n * W; ++j) in[size_t(j)] = float((R + 1) * j);
  g_world->reduce_scatter(view(out), view(in), ReduceOp::Sum);
  const float ranks_sum = float(W * (W + 1) / 2);  // sum of (r + 1)
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[size_t(i)], ranks_sum * float(R * n + i));
  g_world->reduce_scatter(view(out), view(in), ReduceOp::Avg);
  for (int i = 0; i < n; ++i) EXPECT_FLOAT_EQ(out[size_t(i)], ranks_sum * float(R * n + i) / float(W));
}

TEST(Comm, AllReduceF32AndBf16) {
  const int R = g_world->rank(), W = g_world->size();
  std::vector<float> v = {float(R), 1.0f, -2.0f * float(R)};
  g_world->all_reduce(view(v), ReduceOp::Sum);
  const float s = float(W * (W - 1) / 2);
  EXPECT_EQ(v, (std::vector<float>{s, float(W), -2.0f * s}));
  std::vector<bf16_t> h = {f32_to_bf16(float(R + 1)), f32_to_bf16(0.5f)};
  g_world->all_reduce(Tensor::view(h.data(), DType::BF16, {2}), ReduceOp::Sum);
  EXPECT_EQ(bf16_to_f32(h[0]), float(W * (W + 1) / 2));  // small integers are exact in bf16
  EXPECT_EQ(bf16_to_f32(h[1]), 0.5f * float(W));
  g_world->all_reduce(Tensor::view(h.data(), DType::BF16, {2}), ReduceOp::Avg);
  EXPECT_EQ(bf16_to_f32(h[1]), 0.5f * float(W));
  EXPECT_NEAR(g_world->all_reduce_sum(0.1 * (R + 1)), 0.1 * W * (W + 1) / 2, 1e-12);
}

TEST(Comm, BroadcastFromTheLastRank) {
  const int R = g_world->rank(), W = g_world->size();
  std::vector<float> v = {float(R), float(R) * 2};
  g_world->broadcast(view(v), W - 1);
  EXPECT_EQ(v, (std::vector<float>{float(W - 1), float(W - 1) * 2}));
}

// Point to point around a ring: rank R sends R-dependent values to R+1 and receives R-1's. Even
// ranks send first and odd ranks receive first, so blocking calls pair up at any size. One rank
// has no peer: the local communicator refuses.
TEST(Comm, SendRecvAroundARing) {
  const int R = g_world->rank(), W = g_world->size();
  std::vector<float> out = {float(R), float(R) + 0.5f, -float(R)}, in(3, -1.0f);
  if (W == 1) {
    EXPECT_THROW(g_world->send(view(out), 0), Error);
    EXPECT_THROW(g_world->recv(view(in), 0), Error);
    return;
  }
  const int next = (R + 1) % W, prev = (R + W - 1) % W;
  const int64_t sent = g_world->stats().send_bytes;
  if (R % 2 == 0) {
    g_world->send(view(out), next);
    g_world->recv(view(in), prev);
  } else {
    g_world->recv(view(in), prev);
    g_world->send(view(out), next);
  }
  EXPECT_EQ(in, (std::vector<float>{float(prev), float(prev) + 0.5f, -float(prev)}));
  EXPECT_EQ(g_world->stats().send_bytes - sent, 12);
  // Two messages to one peer arrive in the order sent.
  if (R == 0) {
    std::vector<float> a = {1}, b = {2};
    g_world->send(view(a), 1);
    g_world->send(view(b), 1);
  } else if (R == 1) {
    std::vector<float> a(1), b(1);
    g_world->recv(view(a), 0);
    g_world->recv(view(b), 0);
    EXPECT_EQ(a[0], 1.0f);
    EXPECT_EQ(b[0], 2.0f);
  }
  EXPECT_THROW(g_world->send(view(out), R), Error);  // no peer: itself
  EXPECT_THROW(g_world->recv(view(in), W), Error);   // no such rank
}

TEST(Comm, SplitIntoShardAndReplicaGroups) {
  // A 2-wide mesh: shard groups of consecutive ranks, replica groups of equal position.
  const int R = g_world->rank(), W = g_world->size();
  const int width = W % 2 == 0 ? 2 : 1;
  auto shard = g_world->split(R / width, R);
  auto replica = g_world->split(R % width, R);
  EXPECT_EQ(shard->size(), width);
  EXPECT_EQ(shard->rank(), R % width);
  EXPECT_EQ(replica->size(), W / width);
  std::vector<float> v = {float(R)};
  shard->all_reduce(view(v), ReduceOp::Sum);
  const int base = R / width * width;
  EXPECT_EQ(v[0], float(width == 2 ? 2 * base + 1 : base));
}

TEST(Comm, TwoCollectivesInFlight) {
  const int R = g_world->rank(), W = g_world->size(), n = 64;
  std::vector<float> in(n, float(R)), gathered(size_t(n * W)), big(size_t(n * W), 1.0f), part(n);
  auto a = g_world->all_gather_async(view(gathered), view(in));
  auto b = g_world->reduce_scatter_async(view(part), view(big), ReduceOp::Sum);
  b->wait();
  a->wait();
  EXPECT_EQ(gathered[size_t(n * (W - 1))], float(W - 1));
  EXPECT_EQ(part[0], float(W));
}

TEST(Comm, BytesFollowRingAccounting) {
  const int W = g_world->size(), n = 1000;
  g_world->reset_stats();
  std::vector<float> in(n), out(size_t(n * W));
  g_world->all_gather(view(out), view(in));
  g_world->reduce_scatter(view(in), view(out), ReduceOp::Sum);
  g_world->all_reduce(view(out), ReduceOp::Sum);
  const int64_t full = int64_t(n) * W * 4;
  EXPECT_EQ(g_world->stats().all_gather_bytes, full * (W - 1) / W);
  EXPECT_EQ(g_world->stats().reduce_scatter_bytes, full * (W - 1) / W);
  EXPECT_EQ(g_world->stats().all_reduce_bytes, 2 * full * (W - 1) / W);
}

// Larger than one chunk of the shared-memory path (shm_collectives.h: 8 MiB halves) and of sizes
// no chunk divides, with values whose sums are exact in any order: every chunk lands in its place,
// on both paths (ctest runs this file with SHARDLM_SHM=0 too).
TEST(Comm, MultiChunkCollectivesOfOddSizes) {
  const int R = g_world->rank(), W = g_world->size();
  const int64_t n = 3'000'017;  // f32 per rank: 12 MB
  auto value = [](int r, int64_t j) { return float((r + 1) * (j % 997)); };
  std::vector<float> in(static_cast<size_t>(n)), all(static_cast<size_t>(n * W));
  for (int64_t i = 0; i < n; ++i) in[size_t(i)] = value(R, i);
  g_world->all_gather(view(all), view(in));
  for (int r = 0; r < W; ++r)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(all[size_t(r * n + i)], value(r, i)) << "rank " << R << " part " << r;

  const float ranks = float(W * (W + 1) / 2);  // sum of (r + 1)
  for (int64_t j = 0; j < n * W; ++j) all[size_t(j)] = value(R, j);
  std::vector<float> part(static_cast<size_t>(n));
  g_world->reduce_scatter(view(part), view(all), ReduceOp::Sum);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(part[size_t(i)], ranks * float((R * n + i) % 997)) << "element " << i;
  g_world->all_reduce(view(all), ReduceOp::Avg);
  for (int64_t j = 0; j < n * W; ++j) ASSERT_FLOAT_EQ(all[size_t(j)], ranks * float(j % 997) / float(W)) << j;

  // bf16: small integers, exact in bf16 whatever the order of the additions.
  const int64_t m = 4'200'001;
  std::vector<bf16_t> h(size_t(m * W)), hp(static_cast<size_t>(m));
  for (int64_t j = 0; j < m * W; ++j) h[size_t(j)] = f32_to_bf16(float((R + 1) * (j % 13)));
  g_world->reduce_scatter(Tensor::view(hp.data(), DType::BF16, {m}), Tensor::view(h.data(), DType::BF16, {m * W}),
                          ReduceOp::Sum);
  for (int64_t i = 0; i < m; ++i) ASSERT_EQ(bf16_to_f32(hp[size_t(i)]), ranks * float((R * m + i) % 13)) << i;
}

// An all-reduce of values whose sum depends on the order of the additions still leaves every rank
// with the same bits (replicas must not drift apart), close to the exact sum.
TEST(Comm, AllReduceGivesEveryRankTheSameBits) {
  const int R = g_world->rank(), W = g_world->size();
  const int64_t n = 2'500'003;
  auto value = [](int r, int64_t i) {
    return float(int64_t((uint64_t(i) * 2654435761u + uint64_t(r) * 40503u) % 10007u)) / 10007.0f - 0.5f;
  };
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(R, i);
  g_world->all_reduce(view(v), ReduceOp::Sum);
  for (int64_t i = 0; i < n; i += 4999) {
    double exact = 0;
    for (int r = 0; r < W; ++r) exact += value(r, i);
    ASSERT_NEAR(v[size_t(i)], exact, 1e-5) << i;
  }
  std::vector<float> everyone(size_t(n * W));
  g_world->all_gather(view(everyone), view(v));
  for (int r = 1; r < W; ++r)
    ASSERT_EQ(std::memcmp(everyone.data(), everyone.data() + r * n, size_t(n) * sizeof(float)), 0) << "rank " << r;
}

// Several collectives of each kind in flight at once, waited for in reverse order.
TEST(Comm, ManyCollectivesInFlightCompleteInAnyWaitOrder) {
  const int R = g_world->rank(), W = g_world->size();
  constexpr int kOps = 9;
  std::vector<std::vector<float>> a(kOps), b(kOps);
  std::vector<std::unique_ptr<Request>> pending;
  for (int k = 0; k < kOps; ++k) {
    const int64_t n = 1000 + 300'001 * k;  // from 4 KB to 10 MB: both paths (shm_collectives.h kMinBytes)
    a[size_t(k)].assign(size_t(n), float(R + k));
    b[size_t(k)].assign(size_t(n * W), float(R + 1));
    if (k % 3 == 0) pending.push_back(g_world->all_gather_async(view(b[size_t(k)]), view(a[size_t(k)])));
    if (k % 3 == 1) pending.push_back(g_world->reduce_scatter_async(view(a[size_t(k)]), view(b[size_t(k)]), ReduceOp::Sum));
    if (k % 3 == 2) pending.push_back(g_world->all_reduce_async(view(a[size_t(k)]), ReduceOp::Sum));
  }
  for (int k = kOps - 1; k >= 0; --k) pending[size_t(k)]->wait();
  for (int k = 0; k < kOps; ++k) {
    const auto& x = k % 3 == 0 ? b[size_t(k)] : a[size_t(k)];
    for (size_t i = 0; i < x.size(); i += 997) {
      const float want = k % 3 == 0 ? float(int(i) / int(a[size_t(k)].size()) + k)
                         : k % 3 == 1 ? float(W * (W + 1) / 2)
                                      : float(W * (W - 1) / 2 + W * k);
      ASSERT_EQ(x[i], want) << "op " << k << " element " << i;
    }
  }
}

// The ring (ring_collectives.h) visits the ranks host by host, whatever their numbers: with
// mpirun --map-by node (ranks 0, 2 on one host and 1, 3 on the other) it crosses between the hosts
// twice, not four times.
TEST(Ring, OrderVisitsTheRanksHostByHost) {
  EXPECT_EQ(ring_order({0, 1, 0, 1}), (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(ring_order({0, 0, 1, 1}), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ring_order({0, 1, 2, 0, 1, 2}), (std::vector<int>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(ring_order({0}), (std::vector<int>{0}));
}

TEST(Comm, MismatchedSizesAreErrors) {
  std::vector<float> in(3), out(5);
  EXPECT_THROW(g_world->all_gather(view(out), view(in)), Error);
}

int main(int argc, char** argv) { return shardlm::testing::run_mpi_tests(argc, argv, g_world); }
