// The paged KV cache (infer/kv_cache.h) and what runs on it: paged attention equals attention
// over the keys gathered (bit for bit), blocks are made as positions are used and reused when
// freed, a Generator's tokens do not depend on the block size, and a Batch whose cache runs out
// preempts its youngest requests and still produces every request's tokens and logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/float_bits.h"
#include "infer/generator.h"
#include "infer/kv_cache.h"
#include "infer/param_store.h"
#include "ops/ops.h"
#include "testing.h"

using namespace shardlm;
using namespace shardlm::testing;

namespace {

// Keys or values [Tk, Hkv, Dh] scattered over blocks of `block` positions, taken in a shuffled
// order from a pool (as a cache that has served other sequences hands them out), in `dtype`.
struct Scattered {
  std::vector<OwnedTensor> pool;
  std::vector<Tensor> blocks;  // in position order
  Scattered(const std::vector<float>& rows, int64_t Tk, int64_t Hkv, int64_t Dh, int64_t block, DType dtype,
            uint64_t seed) {
    const int64_t nb = (Tk + block - 1) / block;
    for (int64_t i = 0; i < nb + 2; ++i) pool.emplace_back(dtype, std::initializer_list<int64_t>{block, Hkv, Dh},
                                                           MemCategory::Workspace, true);
    std::vector<size_t> order(pool.size());
    std::iota(order.begin(), order.end(), 0);
    std::reverse(order.begin(), order.end());
    std::rotate(order.begin(), order.begin() + int64_t(seed % order.size()), order.end());
    for (int64_t i = 0; i < nb; ++i) {
      const Tensor& b = pool[order[size_t(i)]].t;
      blocks.push_back(b);
      const int64_t n = std::min(block, Tk - i * block);
      const Tensor src = Tensor::view(const_cast<float*>(rows.data()) + i * block * Hkv * Dh, DType::F32, {n, Hkv, Dh});
      ops::cast(b.slice(0, n), src);
    }
  }
};

// attention_forward over k, v [1, Tk, Hkv, Dh] (rounded to `dtype` as the blocks are) against
// attention_forward_paged over the same keys in blocks: out and lse equal bit for bit.
void expect_paged_equals_whole(int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t Dh, int64_t block, DType dtype,
                               uint64_t seed) {
  const std::vector<float> q = randn(Tq * H * Dh, seed, "q"), k = randn(Tk * Hkv * Dh, seed, "k"),
                           v = randn(Tk * Hkv * Dh, seed, "v");
  OwnedTensor kw(dtype, {1, Tk, Hkv, Dh}, MemCategory::Workspace), vw(dtype, {1, Tk, Hkv, Dh}, MemCategory::Workspace);
  ops::cast(kw.t, Tensor::view(const_cast<float*>(k.data()), DType::F32, {1, Tk, Hkv, Dh}));
  ops::cast(vw.t, Tensor::view(const_cast<float*>(v.data()), DType::F32, {1, Tk, Hkv, Dh}));
  const Tensor qt = Tensor::view(const_cast<float*>(q.data()), DType::F32, {1, Tq, H, Dh});
  const float scale = 1.0f / std::sqrt(float(Dh));
  std::vector<float> out1(size_t(Tq * H * Dh)), lse1(size_t(H * Tq)), out2(out1.size(), -1), lse2(lse1.size(), -1);
  ops::attention_forward(Tensor::view(out1.data(), DType::F32, {1, Tq, H, Dh}),
                         Tensor::view(lse1.data(), DType::F32, {1, H, Tq}), qt, kw.t, vw.t, Tensor{}, scale);
  const Scattered ks(k, Tk, Hkv, Dh, block, dtype, seed), vs(v, Tk, Hkv, Dh, block, dtype, seed + 1);
  ops::attention_forward_paged(Tensor::view(out2.data(), DType::F32, {1, Tq, H, Dh}),
                               Tensor::view(lse2.data(), DType::F32, {1, H, Tq}), qt, ks.blocks, vs.blocks, Tk, scale);
  const std::string what = "Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk) + " block " +
                           std::to_string(block) + " " + dtype_name(dtype);
  for (size_t i = 0; i < out1.size(); ++i) ASSERT_EQ(out1[i], out2[i]) << what << " out[" << i << "]";
  for (size_t i = 0; i < lse1.size(); ++i) ASSERT_EQ(lse1[i], lse2[i]) << what << " lse[" << i << "]";
}

ModelConfig gen_config() {
  ModelConfig c = preset("tiny");
  c.num_hidden_layers = 2;
  c.initializer_range = 0.2;
  c.num_key_value_heads = c.num_attention_heads / 2;
  return c;
}

// Requests of various lengths, greedy and sampled, some with logprobs and prompt logprobs.
std::vector<infer::Request> requests() {
  std::vector<infer::Request> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt(size_t(3 + 7 * i));
    for (size_t t = 0; t < prompt.size(); ++t) prompt[t] = int32_t(1 + (t * 31 + size_t(i) * 7) % 400);
    infer::SamplingOptions o;
    o.temperature = i % 2 ? 0.8f : 0.0f;
    o.seed = uint64_t(100 + i);
    o.max_new_tokens = 12 + 3 * i;
    reqs.push_back({prompt, o, i % 3 == 0 ? 2 : -1, i == 1 || i == 4});
  }
  return reqs;
}

void expect_same_completions(const std::vector<infer::Completion>& got, const std::vector<infer::Completion>& want,
                             const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", request " << i;
    EXPECT_EQ(got[i].finish, want[i].finish) << what << ", request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << what;
    for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
      EXPECT_NEAR(got[i].logprobs[t].logprob, want[i].logprobs[t].logprob, 1e-5) << what << ", request " << i;
      ASSERT_EQ(got[i].logprobs[t].top.size(), want[i].logprobs[t].top.size());
    }
    ASSERT_EQ(got[i].prompt_logprobs.size(), want[i].prompt_logprobs.size()) << what << ", request " << i;
    for (size_t t = 0; t < got[i].prompt_logprobs.size(); ++t) {
      EXPECT_EQ(got[i].prompt_logprobs[t].token, want[i].prompt_logprobs[t].token);
      EXPECT_NEAR(got[i].prompt_logprobs[t].logprob, want[i].prompt_logprobs[t].logprob, 1e-5) << what;
    }
  }
}

}  // namespace

TEST(PagedAttention, EqualsAttentionOverTheKeysGatheredBitForBit) {
  // Decode (1 query) and prefill chunks, keys within one block, across many, ending mid-block,
  // blocks smaller and larger than the kernel's 64-key tiles, GQA and MHA, f32 and bf16 blocks.
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t block : {1, 3, 16, 64, 100})
      for (auto [Tq, Tk] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 37}, {5, 37}, {1, 130}, {70, 200}})
        expect_paged_equals_whole(Tq, Tk, 4, 2, 16, block, dtype, uint64_t(block * 1000 + Tk));
  expect_paged_equals_whole(3, 21, 4, 4, 64, 8, DType::F32, 9);  // no GQA, head_dim 64
}

TEST(PagedAttention, RejectsBlocksThatDoNotHoldTheKeys) {
  const int64_t H = 4, Hkv = 2, Dh = 8;
  OwnedTensor q(DType::F32, {1, 2, H, Dh}, MemCategory::Workspace), out(DType::F32, {1, 2, H, Dh}, MemCategory::Workspace),
      lse(DType::F32, {1, H, 2}, MemCategory::Workspace), b0(DType::F32, {4, Hkv, Dh}, MemCategory::Workspace),
      b1(DType::F32, {4, Hkv, Dh}, MemCategory::Workspace), odd(DType::F32, {3, Hkv, Dh}, MemCategory::Workspace),
      half(DType::BF16, {4, Hkv, Dh}, MemCategory::Workspace);
  const std::vector<Tensor> two = {b0.t, b1.t};
  ops::attention_forward_paged(out.t, lse.t, q.t, two, two, 8, 0.5f);  // fits exactly
  expect_error([&] { ops::attention_forward_paged(out.t, lse.t, q.t, two, two, 9, 0.5f); }, "9 keys");
  expect_error([&] { ops::attention_forward_paged(out.t, lse.t, q.t, two, two, 1, 0.5f); }, "for 2 queries");
  expect_error([&] { ops::attention_forward_paged(out.t, lse.t, q.t, {b0.t}, two, 4, 0.5f); }, "1 key blocks and 2");
  expect_error([&] { ops::attention_forward_paged(out.t, lse.t, q.t, {b0.t, odd.t}, two, 6, 0.5f); }, "k_blocks");
  expect_error([&] { ops::attention_forward_paged(out.t, lse.t, q.t, {b0.t, half.t}, two, 6, 0.5f); }, "block 1");
  expect_error([&] { ops::attention_forward_paged(out.t, lse.t, q.t, {}, {}, 1, 0.5f); }, "at least one");
}

TEST(KvCache, BlocksAreMadeAsPositionsAreUsedAndReusedWhenFreed) {
  infer::KvCache cache(3, 2, 8, DType::BF16, 4, 5);
  EXPECT_EQ(cache.bytes_per_block(), 2 * 3 * 4 * 2 * 8 * 2);
  const MemStats before = MemoryTracker::for_device(Device::CPU).stats();
  infer::BlockTable a, b;
  ASSERT_TRUE(cache.grow(a, 1));
  EXPECT_EQ(cache.made(), 1);
  ASSERT_TRUE(cache.grow(a, 4));  // the same block
  EXPECT_EQ(cache.made(), 1);
  ASSERT_TRUE(cache.grow(a, 9));
  EXPECT_EQ(a.ids.size(), 3u);
  ASSERT_EQ(a.k.size(), 3u);  // a view per layer and block
  EXPECT_EQ(a.k[2].size(), 3u);
  EXPECT_EQ(a.k[2][1].shape[0], 4);
  EXPECT_EQ(a.k[1][0].data, static_cast<std::byte*>(a.k[0][0].data) + 2 * 4 * 2 * 8 * 2);  // k0 v0 k1 ...
  const MemStats grown = MemoryTracker::for_device(Device::CPU).stats();
  EXPECT_EQ(grown.live[int(MemCategory::Activations)] - before.live[int(MemCategory::Activations)],
            3 * cache.bytes_per_block());
  EXPECT_FALSE(cache.grow(b, 12));  // needs 3, 2 left: takes nothing
  EXPECT_TRUE(b.ids.empty());
  EXPECT_EQ(cache.made(), 3);
  ASSERT_TRUE(cache.grow(b, 8));
  EXPECT_EQ(cache.in_use(), 5);
  EXPECT_FALSE(cache.grow(b, 9));
  cache.shrink(a, 4);  // keeps its first block
  EXPECT_EQ(a.ids.size(), 1u);
  EXPECT_EQ(a.k[0].size(), 1u);
  EXPECT_EQ(cache.in_use(), 3);
  ASSERT_TRUE(cache.grow(b, 16));  // the freed blocks, no new ones
  EXPECT_EQ(cache.made(), 5);
  cache.shrink(a, 0);
  cache.shrink(b, 0);
  EXPECT_EQ(cache.in_use(), 0);
  EXPECT_EQ(cache.made(), 5);  // kept for the next sequences
}

TEST(Generator, TokensDoNotDependOnTheKvBlockSize) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(3);
  const std::vector<infer::Request> reqs = requests();
  // One block of max_len per sequence: the layout before paging.
  infer::Generator whole(cfg, p.compute_weights(), 80, 3, {}, {}, {.block_size = 80});
  EXPECT_EQ(whole.kv_cache_stats().capacity, 3);
  const std::vector<infer::Completion> want = whole.run(reqs, {}, {}, 8);
  for (int64_t block : {1, 5, 16}) {
    infer::Generator g(cfg, p.compute_weights(), 80, 3, {}, {}, {.block_size = block});
    EXPECT_EQ(g.kv_cache_stats().capacity, 3 * ((80 + block - 1) / block));
    expect_same_completions(g.run(reqs, {}, {}, 8), want, "block " + std::to_string(block));
    const infer::Generator::KvCacheStats kv = g.kv_cache_stats();
    EXPECT_EQ(kv.in_use, 0);
    // Never more blocks than the batch held at once: three sequences of at most 76 positions.
    EXPECT_LE(kv.made, 3 * ((76 + block - 1) / block));
    EXPECT_GT(kv.made, 0);
  }
}

// A cache too small for the batch: the youngest requests are preempted and recomputed, and every
// request still gets the tokens, logprobs and prompt logprobs it gets with room to spare.
TEST(Batch, PreemptsTheYoungestWhenTheKvCacheRunsOutAndGeneratesTheSameTokens) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(4);
  const std::vector<infer::Request> reqs = requests();
  infer::Generator roomy(cfg, p.compute_weights(), 80, 4, {}, {}, {.block_size = 4});
  const std::vector<infer::Completion> want = roomy.run(reqs, {}, {}, 16);
  const int64_t block_bytes = roomy.kv_cache_stats().bytes_per_block;
  for (int64_t blocks : {20, 26, 40})
    for (int64_t chunk : {0, 5}) {
      const std::string what = std::to_string(blocks) + " blocks, chunk " + std::to_string(chunk);
      infer::Generator g(cfg, p.compute_weights(), 80, 4, {}, {}, {.block_size = 4, .max_bytes = blocks * block_bytes});
      ASSERT_EQ(g.kv_cache_stats().capacity, blocks);
      int64_t most = 0;
      std::vector<infer::Completion> got(reqs.size());
      infer::Batch batch(g, {}, chunk);
      size_t next = 0;
      while (next < reqs.size() || !batch.empty()) {
        while (next < reqs.size() && batch.admit(next, reqs[next]) != infer::Batch::Admit::Full) ++next;
        batch.step({}, [&](size_t id, infer::Completion&& c) { got[id] = std::move(c); });
        most = std::max(most, g.kv_cache_stats().in_use);
      }
      expect_same_completions(got, want, what);
      EXPECT_LE(most, blocks) << what;
      EXPECT_LE(g.kv_cache_stats().made, blocks) << what;
      int preempted = 0;
      for (const infer::Completion& c : got) preempted += c.preemptions;
      EXPECT_EQ(preempted, batch.preemptions()) << what;
      if (blocks == 20) {
        EXPECT_GT(preempted, 0) << what << ": the test must preempt";
      }
      EXPECT_EQ(got[0].preemptions, 0) << what << ": the oldest request is never preempted";
    }
  for (const infer::Completion& c : want) EXPECT_EQ(c.preemptions, 0);
}

TEST(Generator, AKvCacheLimitMustHoldOneSequence) {
  const ModelConfig cfg = gen_config();
  infer::ParamStore p(cfg, DType::F32);
  p.init_random(1);
  infer::Generator g(cfg, p.compute_weights(), 64, 2, {}, {}, {.block_size = 16});
  const int64_t block_bytes = g.kv_cache_stats().bytes_per_block;
  infer::Generator one(cfg, p.compute_weights(), 64, 2, {}, {}, {.block_size = 16, .max_bytes = 4 * block_bytes});
  EXPECT_EQ(one.kv_cache_stats().capacity, 4);
  try {
    infer::Generator(cfg, p.compute_weights(), 64, 2, {}, {},
                     {.block_size = 16, .max_bytes = 4 * block_bytes - 1, .limit_key = "--kv-cache-memory"});
    FAIL() << "a cache for less than one sequence was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().key, "--kv-cache-memory");
    EXPECT_NE(std::string(e.what()).find("holds 3 blocks of 16 positions"), std::string::npos) << e.what();
  }
  // reserve() takes nothing when the blocks are not there; forward_parts says so.
  const int a = one.acquire(), b = one.acquire();
  EXPECT_TRUE(one.reserve(a, 40));
  EXPECT_FALSE(one.reserve(b, 20));
  EXPECT_FALSE(one.holds_cache(b));
  expect_error([&] { one.forward(std::vector<int>{b}, std::vector<int32_t>(20, 3)); }, "no free block");
  one.evict(a);
  EXPECT_EQ(one.kv_cache_stats().in_use, 0);
  EXPECT_TRUE(one.reserve(b, 20));
}
