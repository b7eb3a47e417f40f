// attention_forward / attention_backward: finite-difference gradient checks, masking (causal,
// KV-cache alignment, segments), memory use on a long sequence, determinism, and validation.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/error.h"
#include "ops/ops.h"
#include "testing.h"

using namespace shardlm;
using shardlm::testing::all_close;
using shardlm::testing::randn;

namespace {

// One attention problem with f32 inputs kept in vectors, so tests can perturb them in place.
struct Problem {
  int64_t B, Tq, Tk, H, Hkv, Dh;
  float scale;
  std::vector<float> q, k, v;
  std::vector<int32_t> seg;  // empty: no segment_ids

  Problem(int64_t B_, int64_t Tq_, int64_t Tk_, int64_t H_, int64_t Hkv_, int64_t Dh_, uint64_t seed)
      : B(B_), Tq(Tq_), Tk(Tk_), H(H_), Hkv(Hkv_), Dh(Dh_), scale(1.0f / std::sqrt(float(Dh_))),
        q(randn(q_numel(), seed, "q")), k(randn(kv_numel(), seed, "k")), v(randn(kv_numel(), seed, "v")) {}

  int64_t q_numel() const { return B * Tq * H * Dh; }
  int64_t kv_numel() const { return B * Tk * Hkv * Dh; }
  Tensor qt() { return Tensor::view(q.data(), DType::F32, {B, Tq, H, Dh}); }
  Tensor kt() { return Tensor::view(k.data(), DType::F32, {B, Tk, Hkv, Dh}); }
  Tensor vt() { return Tensor::view(v.data(), DType::F32, {B, Tk, Hkv, Dh}); }
  Tensor segt() { return seg.empty() ? Tensor{} : Tensor::view(seg.data(), DType::I32, {B, Tk}); }

  // Packed examples: batch row b gets segments of lengths 3, 2, 4, 3, ... shifted by b, so the
  // boundaries differ between rows.
  void add_segments() {
    seg.assign(size_t(B * Tk), 0);
    const int lengths[] = {3, 2, 4, 3};
    for (int64_t b = 0; b < B; ++b) {
      int32_t id = 0;
      int64_t left = lengths[b % 4];
      for (int64_t j = 0; j < Tk; ++j) {
        if (left == 0) left = lengths[(++id + b) % 4];
        seg[size_t(b * Tk + j)] = id;
        --left;
      }
    }
  }

  void forward(std::vector<float>& out, std::vector<float>& lse) {
    out.assign(size_t(q_numel()), 0.0f);
    lse.assign(size_t(B * H * Tq), 0.0f);
    ops::attention_forward(Tensor::view(out.data(), DType::F32, {B, Tq, H, Dh}),
                           Tensor::view(lse.data(), DType::F32, {B, H, Tq}), qt(), kt(), vt(), segt(), scale);
  }

  void backward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv, std::vector<float>& dout,
                std::vector<float>& out, std::vector<float>& lse) {
    dq.assign(size_t(q_numel()), 0.0f);
    dk.assign(size_t(kv_numel()), 0.0f);
    dv.assign(size_t(kv_numel()), 0.0f);
    ops::attention_backward(Tensor::view(dq.data(), DType::F32, {B, Tq, H, Dh}),
                            Tensor::view(dk.data(), DType::F32, {B, Tk, Hkv, Dh}),
                            Tensor::view(dv.data(), DType::F32, {B, Tk, Hkv, Dh}),
                            Tensor::view(dout.data(), DType::F32, {B, Tq, H, Dh}), qt(), kt(), vt(),
                            Tensor::view(out.data(), DType::F32, {B, Tq, H, Dh}),
                            Tensor::view(lse.data(), DType::F32, {B, H, Tq}), segt(), scale);
  }

  // Naive double-precision output row and lse of query qi, head h, batch b, straight from the
  // definition in ops.h.
  void naive_row(int64_t b, int64_t qi, int64_t h, std::vector<double>& out_row, double& lse) const {
    const int64_t g = h / (H / Hkv), pos = qi + Tk - Tq;
    std::vector<double> s(size_t(Tk), -INFINITY);
    double mx = -INFINITY;
    for (int64_t j = 0; j <= pos; ++j) {
      if (!seg.empty() && seg[size_t(b * Tk + j)] != seg[size_t(b * Tk + pos)]) continue;
      double acc = 0;
      for (int64_t d = 0; d < Dh; ++d)
        acc += double(q[size_t(((b * Tq + qi) * H + h) * Dh + d)]) * k[size_t(((b * Tk + j) * Hkv + g) * Dh + d)];
      s[size_t(j)] = acc * scale;
      mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0;
    out_row.assign(size_t(Dh), 0.0);
    for (int64_t j = 0; j < Tk; ++j) {
      if (s[size_t(j)] == -INFINITY) continue;
      const double p = std::exp(s[size_t(j)] - mx);
      sum += p;
      for (int64_t d = 0; d < Dh; ++d) out_row[size_t(d)] += p * v[size_t(((b * Tk + j) * Hkv + g) * Dh + d)];
    }
    for (double& o : out_row) o /= sum;
    lse = mx + std::log(sum);
  }
};

// Checks dq, dk, dv of loss = dot(out, w) against central finite differences.
void check_gradients(Problem& p, const std::string& name) {
  std::vector<float> w = randn(p.q_numel(), 99, "w");
  std::vector<float> out, lse, dq, dk, dv;
  p.forward(out, lse);
  p.backward(dq, dk, dv, w, out, lse);
  auto loss = [&] {
    std::vector<float> o, l;
    p.forward(o, l);
    return shardlm::testing::dot(o.data(), w.data(), int64_t(o.size()));
  };
  EXPECT_TRUE(shardlm::testing::check_gradient(loss, p.q.data(), p.q_numel(), dq.data(), {}, name + " dq"));
  EXPECT_TRUE(shardlm::testing::check_gradient(loss, p.k.data(), p.kv_numel(), dk.data(), {}, name + " dk"));
  EXPECT_TRUE(shardlm::testing::check_gradient(loss, p.v.data(), p.kv_numel(), dv.data(), {}, name + " dv"));
}

}  // namespace

TEST(Attention, GradientsCausal) {
  Problem p(2, 7, 7, 4, 2, 8, 1);
  check_gradients(p, "causal");
}

TEST(Attention, GradientsSegments) {
  Problem p(2, 9, 9, 4, 2, 8, 2);
  p.add_segments();
  check_gradients(p, "segments");
}

TEST(Attention, GradientsKvCache) {
  Problem p(2, 4, 9, 4, 2, 8, 3);  // Tq < Tk: queries sit at positions 5..8
  check_gradients(p, "kvcache");
}

TEST(Attention, GradientsKvCacheSegments) {
  Problem p(1, 5, 8, 4, 2, 8, 4);
  p.add_segments();
  check_gradients(p, "kvcache+segments");
}

TEST(Attention, GradientsAcrossBlocks) {
  // More than one 64-row block of queries and keys, one kv head (multi-query attention).
  Problem p(1, 67, 67, 2, 1, 8, 5);
  check_gradients(p, "blocks");
}

// A long causal sequence: the forward must not materialize T x T scores (64 MiB here) and must
// still match the definition.
TEST(Attention, LongSequenceUsesNoQuadraticMemory) {
  const int64_t T = 4096, H = 2, Hkv = 1, Dh = 64;
  Problem p(1, T, T, H, Hkv, Dh, 6);
  std::vector<float> out(size_t(p.q_numel())), lse(size_t(H * T));

  auto& tracker = MemoryTracker::for_device(Device::CPU);
  tracker.reset_peaks();
  const MemStats before = tracker.stats();
  ops::attention_forward(Tensor::view(out.data(), DType::F32, {1, T, H, Dh}),
                         Tensor::view(lse.data(), DType::F32, {1, H, T}), p.qt(), p.kt(), p.vt(), Tensor{}, p.scale);
  const MemStats after = tracker.stats();
  const int ws = int(MemCategory::Workspace);
  const int64_t quadratic = T * T * 4;
  EXPECT_LT(after.peak[ws] - before.live[ws], quadratic / 64) << "workspace grew with T x T";
  EXPECT_LT(after.peak_total - before.live_total, quadratic / 64) << "tracked memory grew with T x T";

  for (int64_t qi : {int64_t(0), int64_t(1), int64_t(63), int64_t(64), int64_t(1000), int64_t(2047), T - 1}) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> want;
      double want_lse;
      p.naive_row(0, qi, h, want, want_lse);
      std::vector<float> want_f(want.begin(), want.end());
      const std::string label = "row " + std::to_string(qi) + " head " + std::to_string(h);
      EXPECT_TRUE(all_close(&out[size_t((qi * H + h) * Dh)], want_f.data(), Dh, 1e-4, 0.0, label + " out"));
      EXPECT_NEAR(lse[size_t(h * T + qi)], want_lse, 1e-4) << label;
    }
  }
}

// Changing the key/value of a later position, or of another segment, must leave a query's
// output bit-for-bit unchanged, and changing a visible one must change it.
TEST(Attention, MaskingIsExact) {
  for (const int64_t Tq : {int64_t(20), int64_t(12)}) {  // self-attention, and a KV cache of Tk = 20
    Problem p(2, Tq, 20, 4, 2, 8, 7);
    p.add_segments();
    const int64_t off = p.Tk - p.Tq;
    std::vector<float> base, lse;
    p.forward(base, lse);

    const int64_t changed_pos = 13;  // perturb key/value position 13 of batch row 0, every kv head
    const int32_t changed_seg = p.seg[size_t(changed_pos)];
    for (int64_t g = 0; g < p.Hkv; ++g)
      for (int64_t d = 0; d < p.Dh; ++d) {
        p.k[size_t((changed_pos * p.Hkv + g) * p.Dh + d)] += 1.5f;
        p.v[size_t((changed_pos * p.Hkv + g) * p.Dh + d)] -= 2.0f;
      }
    std::vector<float> out;
    p.forward(out, lse);

    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t qi = 0; qi < p.Tq; ++qi) {
        const int64_t pos = qi + off;
        const bool sees = b == 0 && pos >= changed_pos && p.seg[size_t(pos)] == changed_seg;
        for (int64_t h = 0; h < p.H; ++h) {
          const size_t r = size_t(((b * p.Tq + qi) * p.H + h) * p.Dh);
          bool same = true;
          for (int64_t d = 0; d < p.Dh; ++d) same = same && out[r + size_t(d)] == base[r + size_t(d)];
          EXPECT_EQ(same, !sees) << "Tq " << Tq << " batch " << b << " query " << qi << " head " << h;
        }
      }
  }
}

// A few query rows (a decode step) take every query head of a kv head's group into one block of the
// forward; a row's products are still those it has alone, so each head's output and lse are bit
// for bit those of the same head computed by itself (one head, one kv head: a block of its rows).
TEST(Attention, GroupedHeadsGiveEachHeadItsOwnResult) {
  for (const int64_t Tq : {int64_t(1), int64_t(3)}) {
    Problem p(2, Tq, 150, 8, 2, 40, 9);  // 150 keys: three key blocks, the last partial
    p.add_segments();
    std::vector<float> out, lse;
    p.forward(out, lse);
    const int64_t group = p.H / p.Hkv;
    for (int64_t h = 0; h < p.H; ++h) {
      Problem one(p.B, p.Tq, p.Tk, 1, 1, p.Dh, 1);
      one.seg = p.seg;
      for (int64_t b = 0; b < p.B; ++b) {
        for (int64_t t = 0; t < p.Tq; ++t)
          for (int64_t d = 0; d < p.Dh; ++d)
            one.q[size_t((b * p.Tq + t) * p.Dh + d)] = p.q[size_t(((b * p.Tq + t) * p.H + h) * p.Dh + d)];
        for (int64_t t = 0; t < p.Tk; ++t)
          for (int64_t d = 0; d < p.Dh; ++d) {
            const size_t from = size_t(((b * p.Tk + t) * p.Hkv + h / group) * p.Dh + d), to = size_t((b * p.Tk + t) * p.Dh + d);
            one.k[to] = p.k[from];
            one.v[to] = p.v[from];
          }
      }
      std::vector<float> out1, lse1;
      one.forward(out1, lse1);
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t t = 0; t < p.Tq; ++t) {
          for (int64_t d = 0; d < p.Dh; ++d)
            ASSERT_EQ(out[size_t(((b * p.Tq + t) * p.H + h) * p.Dh + d)], out1[size_t((b * p.Tq + t) * p.Dh + d)])
                << "Tq " << Tq << " batch " << b << " query " << t << " head " << h << " d " << d;
          ASSERT_EQ(lse[size_t((b * p.H + h) * p.Tq + t)], lse1[size_t(b * p.Tq + t)])
              << "Tq " << Tq << " batch " << b << " query " << t << " head " << h;
        }
    }
  }
}

// The backward runs without atomics or per-thread reductions: each output element is computed
// by one task in a fixed order, so results agree bit for bit between runs and thread counts.
TEST(Attention, BackwardIsDeterministic) {
  Problem p(1, 200, 200, 4, 2, 32, 8);  // large enough to run multi-threaded
  p.add_segments();
  std::vector<float> dout = randn(p.q_numel(), 8, "dout");
  std::vector<float> out, lse, dq1, dk1, dv1, dq2, dk2, dv2, dq3, dk3, dv3;
  p.forward(out, lse);
  p.backward(dq1, dk1, dv1, dout, out, lse);
  p.backward(dq2, dk2, dv2, dout, out, lse);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  p.backward(dq3, dk3, dv3, dout, out, lse);
  omp_set_num_threads(threads);
  EXPECT_EQ(dq1, dq2);
  EXPECT_EQ(dk1, dk2);
  EXPECT_EQ(dv1, dv2);
  EXPECT_EQ(dq1, dq3);
  EXPECT_EQ(dk1, dk3);
  EXPECT_EQ(dv1, dv3);
}

TEST(Attention, RejectsBadArguments) {
  // Inputs share one zeroed buffer (their values do not matter here); outputs get their own.
  std::vector<float> buf(4096), out_buf(4096);
  std::vector<int32_t> ibuf(64);
  auto f32 = [&](std::initializer_list<int64_t> shape) { return Tensor::view(buf.data(), DType::F32, shape); };
  const Tensor q = f32({1, 4, 4, 8}), kv = f32({1, 4, 2, 8});
  const Tensor out = Tensor::view(out_buf.data(), DType::F32, {1, 4, 4, 8});
  const Tensor lse = Tensor::view(out_buf.data() + 1024, DType::F32, {1, 4, 4});
  // Sanity: the good call is accepted.
  EXPECT_NO_THROW(ops::attention_forward(out, lse, q, kv, kv, Tensor{}, 0.35f));
  // 4 query heads over 3 kv heads.
  EXPECT_THROW(ops::attention_forward(out, lse, q, f32({1, 4, 3, 8}), f32({1, 4, 3, 8}), Tensor{}, 0.35f), Error);
  // More queries than keys.
  EXPECT_THROW(ops::attention_forward(out, lse, q, f32({1, 3, 2, 8}), f32({1, 3, 2, 8}), Tensor{}, 0.35f), Error);
  // v differs from k.
  EXPECT_THROW(ops::attention_forward(out, lse, q, kv, f32({1, 4, 2, 4}), Tensor{}, 0.35f), Error);
  // lse of the wrong shape or dtype.
  EXPECT_THROW(ops::attention_forward(out, Tensor::view(out_buf.data() + 1024, DType::F32, {1, 4, 3}), q, kv, kv, Tensor{}, 0.35f), Error);
  EXPECT_THROW(ops::attention_forward(out, Tensor::view(ibuf.data(), DType::I32, {1, 4, 4}), q, kv, kv, Tensor{},
                                      0.35f),
               Error);
  // segment_ids must be i32 [B, Tk].
  EXPECT_THROW(ops::attention_forward(out, lse, q, kv, kv, f32({1, 4}), 0.35f), Error);
  EXPECT_THROW(ops::attention_forward(out, lse, q, kv, kv, Tensor::view(ibuf.data(), DType::I32, {1, 5}), 0.35f),
               Error);
  // Gradients must be f32.
  const Tensor bf = Tensor::view(out_buf.data() + 2048, DType::BF16, {1, 4, 4, 8});
  EXPECT_THROW(ops::attention_backward(bf, kv, kv, out, q, kv, kv, out, lse, Tensor{}, 0.35f), Error);
}
