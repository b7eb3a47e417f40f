// Unit tests of src/core: dtypes, Tensor views, the tracking allocator, errors, the RNG.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"

using namespace shardlm;

namespace {
float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

TEST(DType, Bf16RoundTripsEveryBf16Value) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_f32(bf16_t{uint16_t(b)});
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f).bits, b) << "bf16 pattern " << b;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  // 1 + 3 * 2^-8 lies between 1 + 2^-7 (odd mantissa) and 1 + 2^-6: ties go up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  // Just above the tie rounds up.
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808001)).bits, 0x3f81);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f807fff)).bits, 0x3f80);
  // Overflow to infinity, and infinities kept.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
}

// Reference f32 -> f16 by exhaustive search: the nearest half, ties to even mantissa.
static uint16_t f16_nearest(float f) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t best = 0;
  double best_err = INFINITY;
  // Halves are monotonic in their bit pattern for non-negative values; binary search the bracket.
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    const uint16_t mid = uint16_t((lo + hi + 1) / 2);
    if (double(f16_to_f32(f16_t{mid})) <= a) lo = mid; else hi = uint16_t(mid - 1);
  }
  for (uint16_t c : {lo, uint16_t(lo + 1)}) {
    if (c > 0x7c00) continue;
    const double err = std::fabs(double(f16_to_f32(f16_t{c})) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

TEST(DType, F16DecodesEveryPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = uint16_t(b);
    const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const float f = f16_to_f32(f16_t{h});
    if (exp == 0x1f) {
      EXPECT_TRUE(man ? std::isnan(f) : std::isinf(f)) << b;
      continue;
    }
    const double want = exp ? sign * std::ldexp(1.0 + man / 1024.0, exp - 15) : sign * std::ldexp(man / 1024.0, -14);
    ASSERT_EQ(double(f), want) << "f16 pattern " << b;
    ASSERT_EQ(f32_to_f16(f).bits, h) << "round trip of f16 pattern " << b;
  }
}

TEST(DType, F16RoundsToNearestEvenIncludingSubnormals) {
  // Every f32 between consecutive halves, sampled densely around ties, across normal and
  // subnormal ranges, agrees with an exhaustive nearest-even search.
  for (uint32_t u = 0x33000000u; u < 0x47800000u; u += 0x1003u) {
    const float f = bits_to_f32(u);
    ASSERT_EQ(f32_to_f16(f).bits, f16_nearest(f)) << "f32 bits " << std::hex << u;
    ASSERT_EQ(f32_to_f16(-f).bits, f16_nearest(-f)) << "f32 bits -" << std::hex << u;
  }
  for (uint32_t h = 0; h < 0x7bff; ++h) {  // exact midpoints between neighbouring halves
    const double mid = (double(f16_to_f32(f16_t{uint16_t(h)})) + double(f16_to_f32(f16_t{uint16_t(h + 1)}))) / 2;
    const float f = float(mid);
    ASSERT_EQ(double(f), mid);
    ASSERT_EQ(f32_to_f16(f).bits, (h & 1) ? h + 1 : h) << "tie above half pattern " << h;
  }
  EXPECT_EQ(f32_to_f16(65519.0f).bits, 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);          // tie with 0: even is 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)).bits, 0x0001);          // above the tie
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(DType, ParseNames) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("BF16"), DType::BF16);
  EXPECT_EQ(parse_dtype("fp32"), DType::F32);
  EXPECT_EQ(parse_dtype("float16"), DType::F16);
  EXPECT_THROW(parse_dtype("f8"), Error);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
}

TEST(Tensor, ViewsShapesAndSlices) {
  std::vector<float> data(24);
  for (int i = 0; i < 24; ++i) data[size_t(i)] = float(i);
  Tensor t = Tensor::view(data.data(), DType::F32, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.rows(), 6);
  Tensor r = t.reshape({6, 4});
  EXPECT_EQ(r.shape[0], 6);
  Tensor s = r.slice(2, 5);
  EXPECT_EQ(s.shape[0], 3);
  EXPECT_EQ(s.f32()[0], 8.0f);
  EXPECT_EQ(t.describe(), "f32[2, 3, 4] on cpu");
  EXPECT_THROW(t.reshape({5, 5}), Error);
  EXPECT_THROW(r.slice(4, 7), Error);
  EXPECT_THROW(t.i32(), Error);  // wrong element type
  EXPECT_THROW(t.size(3), Error);
}

TEST(Alloc, TracksLiveAndPeakPerCategory) {
  auto& tracker = MemoryTracker::for_device(Device::CPU);
  const MemStats before = tracker.stats();
  tracker.reset_peaks();
  {
    Buffer a(1000, MemCategory::Optimizer);
    Buffer b(3000, MemCategory::Activations);
    {
      Buffer c(500, MemCategory::Optimizer);
      EXPECT_EQ(tracker.stats().live[int(MemCategory::Optimizer)] - before.live[int(MemCategory::Optimizer)], 1500);
    }
    Buffer moved = std::move(b);
    EXPECT_TRUE(b.empty());
    EXPECT_EQ(moved.bytes(), 3000u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(moved.data()) % 64, 0u);
    const MemStats mid = tracker.stats();
    EXPECT_EQ(mid.live_total - before.live_total, 4000);
    EXPECT_EQ(mid.peak[int(MemCategory::Optimizer)] - before.live[int(MemCategory::Optimizer)], 1500);
    EXPECT_EQ(mid.peak_total - before.live_total, 4500);
  }
  const MemStats after = tracker.stats();
  EXPECT_EQ(after.live_total, before.live_total);
  EXPECT_EQ(after.peak_total - before.live_total, 4500);  // the peak remembers
  OwnedTensor t(DType::BF16, {4, 8}, MemCategory::Parameters);
  EXPECT_EQ(t.t.nbytes(), 64u);
  EXPECT_EQ(t.buffer.bytes(), 64u);
  EXPECT_EQ(format_bytes(3 * 1024 * 1024 / 2), "1.5 MiB");
}

// The host block cache: a freed large block comes back for the same size (zeroed when asked), a
// miss releases only as much as keeps live + cached within the peak of live bytes, and live bytes
// are charged as without the cache.
TEST(Alloc, HostBlockCacheReusesExactSizesWithinThePeak) {
  release_host_cache();
  if (!host_cache_stats().enabled) {
    // Off (SHARDLM_HOST_CACHE=0, sanitizer builds): every block goes back to the system at once,
    // so AddressSanitizer sees a use after free; large blocks are still huge-page aligned.
    const int64_t hits0 = host_cache_stats().hits;
    {
      Buffer a(size_t(10) << 20, MemCategory::Other);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % (uintptr_t(2) << 20), 0u);
    }
    { Buffer again(size_t(10) << 20, MemCategory::Other); }
    EXPECT_EQ(host_cache_stats().cached_bytes, 0);
    EXPECT_EQ(host_cache_stats().blocks, 0);
    EXPECT_EQ(host_cache_stats().hits, hits0);
    return;
  }
  auto& tracker = MemoryTracker::for_device(Device::CPU);
  const int64_t live0 = tracker.stats().live_total;
  const size_t big = (size_t(2) << 20) + 100;  // rounded to 64 inside
  void* first = nullptr;
  {
    Buffer a(big, MemCategory::Gradients);
    first = a.data();
    std::memset(a.data(), 0x5a, big);
    EXPECT_EQ(tracker.stats().live_total - live0, int64_t(big));
  }
  EXPECT_EQ(tracker.stats().live_total, live0);  // cached is not live
  HostCacheStats s = host_cache_stats();
  EXPECT_EQ(s.blocks, 1);
  EXPECT_EQ(s.cached_bytes, int64_t((big + 63) / 64 * 64));
  const int64_t hits0 = s.hits;
  {
    Buffer again(big, MemCategory::Activations);  // same size: the same block, zeroed
    EXPECT_EQ(again.data(), first);
    EXPECT_EQ(host_cache_stats().hits, hits0 + 1);
    EXPECT_EQ(host_cache_stats().cached_bytes, 0);
    const auto* bytes = static_cast<const unsigned char*>(again.data());
    EXPECT_TRUE(std::all_of(bytes, bytes + big, [](unsigned char b) { return b == 0; }));
  }
  {
    Buffer other(big * 2, MemCategory::Workspace);  // a miss: the cached block is released first
    EXPECT_EQ(host_cache_stats().cached_bytes, 0);
    EXPECT_EQ(host_cache_stats().hits, hits0 + 1);
  }
  Buffer small(1000, MemCategory::Other);  // below 1 MiB: never cached
  small = Buffer();
  EXPECT_EQ(host_cache_stats().blocks, 1);  // only `other`
  release_host_cache();
  {
    // A miss releases the smallest cached block at least as large, and keeps the others.
    Buffer two(size_t(2) << 20, MemCategory::Other), six(size_t(6) << 20, MemCategory::Other),
        nine(size_t(9) << 20, MemCategory::Other);
  }
  EXPECT_EQ(host_cache_stats().blocks, 3);
  // Live peak so far 18 MiB (9 MiB is held as 10: 8 MiB and more is rounded up to 2 MiB huge
  // pages); cached 18, live 0.
  {
    // 3 live + 18 cached is 3 over the peak: the smallest block of at least 3 MiB goes (6 MiB).
    Buffer three(size_t(3) << 20, MemCategory::Other);
    EXPECT_EQ(host_cache_stats().cached_bytes, int64_t(2 + 10) << 20);
    // 12 MiB more live: 15 live + 12 cached is 9 over: the 10 MiB block goes, the 2 MiB one stays.
    Buffer huge((size_t(10) << 20) + 1, MemCategory::Other);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(huge.data()) % (uintptr_t(2) << 20), 0u);
    EXPECT_EQ(host_cache_stats().cached_bytes, int64_t(2) << 20);
    // 16 live + 2 cached is the peak exactly: a miss within it releases nothing.
    Buffer one(size_t(1) << 20, MemCategory::Other);
    EXPECT_EQ(host_cache_stats().cached_bytes, int64_t(2) << 20);
    // 21 live, a new peak: the 2 cached would be 2 over it, and go.
    Buffer five(size_t(5) << 20, MemCategory::Other);
    EXPECT_EQ(host_cache_stats().cached_bytes, 0);
  }
  EXPECT_EQ(host_cache_stats().cached_bytes, int64_t(3 + 12 + 1 + 5) << 20);
  release_host_cache();
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
}

TEST(ErrorTest, OneLineWithContext) {
  Error e("byte range [10, 20) outside file\nof 16 bytes");
  e.set_tensor("lm_head.weight").set_file("m/model.safetensors");
  EXPECT_STREQ(e.what(), "m/model.safetensors: tensor 'lm_head.weight': byte range [10, 20) outside file of 16 bytes");
  e.set_file("outer.json");  // inner context wins
  EXPECT_EQ(e.context().file, "m/model.safetensors");
  Error k("must be positive");
  k.set_key("micro_batch_size").set_file("train.yaml").set_line(7).set_rank(3);
  EXPECT_STREQ(k.what(), "rank 3: train.yaml:7: key 'micro_batch_size': must be positive");
  try {
    SHARDLM_CHECK(1 + 1 == 3, "arithmetic is {}", "broken");
    FAIL() << "SHARDLM_CHECK did not throw";
  } catch (const Error& x) {
    EXPECT_STREQ(x.what(), "arithmetic is broken");
  }
}

// An error every rank meets is marked so (on_every_rank) and printed once by a multi-rank job
// (Communicator::abort); any other is this rank's own.
TEST(ErrorTest, OnEveryRankMarksTheScopeAndPassesValuesThrough) {
  EXPECT_EQ(Error("a file of this rank").context().scope, ErrorScope::this_rank);
  EXPECT_EQ(on_every_rank([] { return 7; }), 7);
  try {
    on_every_rank([]() -> int { throw Error("must be positive", {.key = "lr"}); });
    FAIL() << "on_every_rank swallowed the error";
  } catch (const Error& e) {
    EXPECT_EQ(e.context().scope, ErrorScope::every_rank);
    EXPECT_STREQ(e.what(), "key 'lr': must be positive");  // the text is unchanged
  }
}

TEST(Rng, PhiloxKnownAnswers) {
  // Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
  auto r = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  r = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r[0], 0x408f276du);
  EXPECT_EQ(r[1], 0x41c83b0eu);
  EXPECT_EQ(r[2], 0xa20bc7c6u);
  EXPECT_EQ(r[3], 0x6d5451fdu);
  r = philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(r[0], 0xd16cfe09u);
  EXPECT_EQ(r[1], 0x94fdccebu);
  EXPECT_EQ(r[2], 0x5001e420u);
  EXPECT_EQ(r[3], 0x24126ea1u);
}

TEST(Rng, ShardsAgreeWithTheWholeTensor) {
  // Filling a tensor in 1, 2, 3 or 4 shards gives the same elements as filling it whole: the
  // property that lets each rank initialize only its own shard.
  const int64_t n = 1003;
  std::vector<float> whole(n);
  fill_normal(whole.data(), n, 42, "model.layers.0.mlp.up_proj.weight", 0, 0.0f, 0.02f);
  for (int shards : {2, 3, 4}) {
    std::vector<float> pieces(n);
    const int64_t per = (n + shards - 1) / shards;
    for (int s = 0; s < shards; ++s) {
      const int64_t begin = s * per, end = std::min(n, begin + per);
      fill_normal(pieces.data() + begin, end - begin, 42, "model.layers.0.mlp.up_proj.weight", uint64_t(begin), 0.0f, 0.02f);
    }
    EXPECT_EQ(std::memcmp(whole.data(), pieces.data(), n * 4), 0) << shards << " shards";
  }
  std::vector<float> other(n);
  fill_normal(other.data(), n, 42, "model.layers.1.mlp.up_proj.weight", 0, 0.0f, 0.02f);
  EXPECT_NE(std::memcmp(whole.data(), other.data(), n * 4), 0) << "different names must give different streams";
  fill_normal(other.data(), n, 43, "model.layers.0.mlp.up_proj.weight", 0, 0.0f, 0.02f);
  EXPECT_NE(std::memcmp(whole.data(), other.data(), n * 4), 0) << "different seeds must differ";
}

TEST(Rng, NormalAndUniformMoments) {
  const int64_t n = 200000;
  std::vector<float> x(n), u(n);
  fill_normal(x.data(), n, 7, "moments", 0, 1.0f, 2.0f);
  fill_uniform(u.data(), n, 7, "moments", 0, -1.0f, 3.0f);
  double s = 0, s2 = 0, us = 0;
  float umin = 10, umax = -10;
  for (int64_t i = 0; i < n; ++i) {
    s += x[i];
    s2 += double(x[i]) * x[i];
    us += u[i];
    umin = std::min(umin, u[i]);
    umax = std::max(umax, u[i]);
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.02);
  EXPECT_NEAR(us / n, 1.0, 0.02);
  EXPECT_GE(umin, -1.0f);
  EXPECT_LT(umax, 3.0f);
}
