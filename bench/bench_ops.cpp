// bench_ops: speed of the CPU ops at Llama-like shapes.
//
//   build/bench/bench_ops [--tokens N] [--quick]
//   build/bench/bench_ops --sgemm     only the machine's raw sgemm rate at 2048^3, as one JSON line
//                                     (bench/compare_torch.sh divides training FLOP rates by it)
//   build/bench/bench_ops --bf16      bf16 matmuls at training shapes on the CPU's bf16 path (oneDNN,
//                                     ops/cpu_bf16.h) and on its f32 fallback, beside raw sgemm on
//                                     the same shapes in f32, one JSON line per shape; and attention's
//                                     forward and backward with f32 inputs, bf16 inputs on the bf16 path
//                                     (and with its dot-product kernel where the default is AMX) and on
//                                     the fallback (bench/cpu_bf16.sh)
//   build/bench/bench_ops --decode    a decode step's matmuls (M = 1 and 8 rows times a transposed
//                                     weight) with f32 weights, with bf16 weights on the skinny
//                                     kernel, through oneDNN (x rounded to bf16) and through the f32
//                                     fallback's widening; and decode attention over an f32 and a
//                                     bf16 KV cache; one JSON line each
//   build/bench/bench_ops --memory-bound N
//                                     the memory-bound work a rank does per element of its shard in a
//                                     mixed-precision step (the bf16 copy for the gather, the reduced
//                                     part added in, the sums of squares, AdamW, zeroing) over N
//                                     elements, one thread: bytes moved per second as the step-time
//                                     model counts them (the dry run's rule, ops/check.h
//                                     count_traffic), the median of the passes of 5 seconds, one
//                                     JSON line
//                                     (bench/slow_links.sh runs 4 at once for --memory-bandwidth)
//   build/bench/bench_ops --peak      one thread's rate of 512-bit f32 multiply-adds (VFMADD231PS) and,
//                                     where the CPU has AVX512-BF16, of bf16 pair dot products
//                                     (VDPBF16PS), in registers: the balance that decides whether a
//                                     bf16 kernel should widen its weight to f32 or multiply in bf16
//                                     (an Intel Xeon ran VDPBF16PS at half the FMA's multiply-adds
//                                     per second; bench/RESULTS.md, session 15), one JSON line
//
// Part 1 compares ops::matmul with a raw OpenBLAS cblas_sgemm call on the same operands,
// interleaved in one run (best of several repetitions each), at 2048x2048x2048 f32 and at the
// projection shapes of a Llama 3.2 1B-like layer. Part 2 times every op's forward and backward
// at one decoder layer's shapes. Results are recorded in bench/RESULTS.md.
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/alloc.h"
#include "core/q8_0.h"
#include "core/platform.h"
#include "core/rng.h"
#include "ops/cpu_bf16.h"
#include "ops/ops.h"

using namespace shardlm;

namespace {

double seconds_best_of(int reps, const std::function<void()>& fn) {
  fn();  // warm-up: page faults, BLAS thread start-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

OwnedTensor randn(DType dtype, std::initializer_list<int64_t> shape, const char* name, float std = 1.0f) {
  OwnedTensor t(dtype, shape, MemCategory::Other, false);
  std::vector<float> v(size_t(t.t.numel()));
  fill_normal(v.data(), int64_t(v.size()), 1, name, 0, 0.0f, std);
  ops::cast(t.t, Tensor::view(v.data(), DType::F32, {int64_t(v.size())}));
  return t;
}

void compare_matmul(int64_t M, int64_t N, int64_t K, bool trans_b, int reps, const char* what) {
  OwnedTensor A = randn(DType::F32, {M, K}, "A");
  OwnedTensor B = trans_b ? randn(DType::F32, {N, K}, "B") : randn(DType::F32, {K, N}, "B");
  OwnedTensor C(DType::F32, {M, N}, MemCategory::Other);
  const double flop = 2.0 * double(M) * double(N) * double(K);
  // Interleave the two so that clock and thermal drift affect both alike.
  double t_op = 1e30, t_raw = 1e30;
  for (int round = 0; round < 3; ++round) {
    t_op = std::min(t_op, seconds_best_of(reps, [&] { ops::matmul(C.t, A.t, B.t, false, trans_b); }));
    t_raw = std::min(t_raw, seconds_best_of(reps, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), 1.0f,
                  A.t.f32(), int(K), B.t.f32(), trans_b ? int(K) : int(N), 0.0f, C.t.f32(), int(N));
    }));
  }
  fmt::print("  {:<34} {:>5}x{:>5}x{:>5}  ops::matmul {:7.1f} GFLOP/s   raw sgemm {:7.1f} GFLOP/s   ratio {:5.1f}%\n",
             what, M, N, K, flop / t_op * 1e-9, flop / t_raw * 1e-9, 100.0 * t_raw / t_op);
}

// GFLOP/s of C = op(A) op(B) with bf16 A and B and an f32 C through ops::matmul on the bf16 path
// (when this CPU has one) and on the f32 fallback, and of raw sgemm on f32 copies, interleaved.
void compare_bf16(int64_t M, int64_t N, int64_t K, bool ta, bool tb, const char* what) {
  OwnedTensor A = ta ? randn(DType::BF16, {K, M}, "A") : randn(DType::BF16, {M, K}, "A");
  OwnedTensor B = tb ? randn(DType::BF16, {N, K}, "B") : randn(DType::BF16, {K, N}, "B");
  OwnedTensor Af(DType::F32, {A.t.shape[0], A.t.shape[1]}, MemCategory::Other);
  OwnedTensor Bf(DType::F32, {B.t.shape[0], B.t.shape[1]}, MemCategory::Other);
  ops::cast(Af.t, A.t);
  ops::cast(Bf.t, B.t);
  OwnedTensor C(DType::F32, {M, N}, MemCategory::Other);
  const double flop = 2.0 * double(M) * double(N) * double(K);
  const bool was = ops::cpu_bf16_enabled(), hw = ops::cpu_bf16_status().hardware;
  double t_bf16 = 1e30, t_fallback = 1e30, t_sgemm = 1e30;
  for (int round = 0; round < 3; ++round) {
    if (hw) {
      ops::set_cpu_bf16_enabled(true);
      t_bf16 = std::min(t_bf16, seconds_best_of(3, [&] { ops::matmul(C.t, A.t, B.t, ta, tb); }));
    }
    ops::set_cpu_bf16_enabled(false);
    t_fallback = std::min(t_fallback, seconds_best_of(3, [&] { ops::matmul(C.t, A.t, B.t, ta, tb); }));
    t_sgemm = std::min(t_sgemm, seconds_best_of(3, [&] {
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
                  1.0f, Af.t.f32(), int(Af.t.shape[1]), Bf.t.f32(), int(Bf.t.shape[1]), 0.0f, C.t.f32(), int(N));
    }));
  }
  ops::set_cpu_bf16_enabled(was);
  fmt::print("{{\"impl\": \"bf16 matmul\", \"what\": \"{}\", \"shape\": \"{}{}x{}x{}{}\", \"bf16_path_gflops\": {}, "
             "\"fallback_gflops\": {:.1f}, \"sgemm_gflops\": {:.1f}, \"threads\": {}}}\n",
             what, ta ? "T " : "", M, N, K, tb ? " T" : "", hw ? fmt::format("{:.1f}", flop / t_bf16 * 1e-9) : "null",
             flop / t_fallback * 1e-9, flop / t_sgemm * 1e-9, platform_info().omp_threads);
}

// Attention's forward and backward at a training shape, ms per call: f32 inputs; bf16 inputs on the
// bf16 path (VDPBF16PS block products, ops/cpu/attention.cpp), when this CPU has one; bf16 inputs on
// the f32 fallback (widened to f32 blocks). Interleaved, best of 3 x 3.
void compare_bf16_attention(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t Dh, const char* what) {
  const bool was = ops::cpu_bf16_enabled(), hw = ops::cpu_bf16_status().hardware;
  const bool amx = ops::cpu_bf16_status().amx;
  struct Side {
    DType dtype;
    bool bf16_path;
    bool amx = false;  // the bf16 path's kernel: AMX tiles, or AVX512-BF16 dot products
    double fwd = 1e30, bwd = 1e30;
  };
  // f32; bf16 on the bf16 path with its default kernel; bf16 on the fallback; and where the
  // default is AMX, the bf16 path's dot-product kernel too.
  std::vector<Side> sides{{DType::F32, false}, {DType::BF16, true, amx}, {DType::BF16, false}};
  if (amx) sides.push_back({DType::BF16, true, false});
  const float scale = 1.0f / std::sqrt(float(Dh));
  for (int round = 0; round < 3; ++round)
    for (Side& s : sides) {
      if (s.bf16_path && !hw) continue;
      ops::set_cpu_bf16_enabled(s.bf16_path);
      if (s.bf16_path) ops::set_cpu_bf16_amx(s.amx);
      OwnedTensor q = randn(s.dtype, {B, T, H, Dh}, "q"), k = randn(s.dtype, {B, T, Hkv, Dh}, "k"),
                  v = randn(s.dtype, {B, T, Hkv, Dh}, "v"), dout = randn(s.dtype, {B, T, H, Dh}, "dout");
      OwnedTensor o(s.dtype, {B, T, H, Dh}, MemCategory::Other), lse(DType::F32, {B, H, T}, MemCategory::Other);
      OwnedTensor dq(DType::F32, {B, T, H, Dh}, MemCategory::Other), dk(DType::F32, {B, T, Hkv, Dh}, MemCategory::Other),
          dv(DType::F32, {B, T, Hkv, Dh}, MemCategory::Other);
      s.fwd = std::min(s.fwd, seconds_best_of(3, [&] {
        ops::attention_forward(o.t, lse.t, q.t, k.t, v.t, Tensor{}, scale);
      }));
      s.bwd = std::min(s.bwd, seconds_best_of(3, [&] {
        ops::attention_backward(dq.t, dk.t, dv.t, dout.t, q.t, k.t, v.t, o.t, lse.t, Tensor{}, scale);
      }));
    }
  ops::set_cpu_bf16_enabled(was);
  if (amx) ops::set_cpu_bf16_amx(true);
  auto ms = [&](const Side& s, double t) { return s.bf16_path && !hw ? std::string("null") : fmt::format("{:.2f}", t * 1e3); };
  fmt::print("{{\"impl\": \"bf16 attention\", \"what\": \"{}\", \"shape\": \"q [{}, {}, {}, {}], {} kv heads\", "
             "\"f32_fwd_ms\": {}, \"f32_bwd_ms\": {}, \"bf16_path_fwd_ms\": {}, \"bf16_path_bwd_ms\": {}, "
             "\"fallback_fwd_ms\": {}, \"fallback_bwd_ms\": {}, \"kernel\": \"{}\", \"dot_fwd_ms\": {}, "
             "\"dot_bwd_ms\": {}, \"threads\": {}}}\n",
             what, B, T, H, Dh, Hkv, ms(sides[0], sides[0].fwd), ms(sides[0], sides[0].bwd), ms(sides[1], sides[1].fwd),
             ms(sides[1], sides[1].bwd), ms(sides[2], sides[2].fwd), ms(sides[2], sides[2].bwd),
             amx ? "amx" : "avx512_bf16 dot", amx ? ms(sides[3], sides[3].fwd) : "null",
             amx ? ms(sides[3], sides[3].bwd) : "null", platform_info().omp_threads);
}

#if defined(__x86_64__)
// Nanoseconds per instruction of one thread issuing 24 independent chains of `step` (more chains
// than the instruction's latency times its throughput on any x86 CPU, so it is the throughput).
constexpr int kPeakChains = 24;
constexpr long kPeakRounds = 20'000'000;
template <class Step>
double ns_per_instruction(Step step) {
  const auto t0 = std::chrono::steady_clock::now();
  const float sum = step(kPeakRounds);
  asm volatile("" : : "x"(sum));  // the chains' result is used, so they are computed
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s / double(kPeakRounds * kPeakChains) * 1e9;
}
// Every lane of the chains, summed (by memory: GCC 12's reduce intrinsics warn from its own header).
__attribute__((target("avx512f"))) float sum_lanes(const __m512 (&acc)[kPeakChains]) {
  float lanes[16], sum = 0.0f;
  for (int i = 0; i < kPeakChains; ++i) {
    _mm512_storeu_ps(lanes, acc[i]);
    for (float v : lanes) sum += v;
  }
  return sum;
}
__attribute__((target("avx512f"))) float fma_chains(long rounds) {
  __m512 acc[kPeakChains];
  for (int i = 0; i < kPeakChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-4f);
  for (long r = 0; r < rounds; ++r)
#pragma GCC unroll 24
    for (int i = 0; i < kPeakChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  return sum_lanes(acc);
}
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_chains(long rounds) {
  __m512 acc[kPeakChains];
  for (int i = 0; i < kPeakChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3f00);  // 1, 0.5
  for (long r = 0; r < rounds; ++r)
#pragma GCC unroll 24
    for (int i = 0; i < kPeakChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  return sum_lanes(acc);
}
#endif

// One thread's peak of each instruction a bf16 kernel can be built on. A VFMADD231PS is 16
// multiply-adds, a VDPBF16PS 32 (two bf16 products into each f32 lane).
int peak_rates() {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512f")) {
    fmt::print(stderr, "bench_ops --peak: this CPU has no AVX-512\n");
    return 1;
  }
  const bool bf16 = __builtin_cpu_supports("avx512bf16");
  const double fma = ns_per_instruction(fma_chains), dp = bf16 ? ns_per_instruction(dpbf16_chains) : -1.0;
  auto gmacs = [](double ns, int macs) { return ns < 0 ? std::string("null") : fmt::format("{:.1f}", macs / ns); };
  fmt::print("{{\"impl\": \"peak\", \"threads\": 1, \"fma_zmm_ns\": {:.3f}, \"dpbf16_zmm_ns\": {}, \"fma_gmacs\": {}, "
             "\"dpbf16_gmacs\": {}, \"dpbf16_over_fma_macs\": {}}}\n",
             fma, dp < 0 ? std::string("null") : fmt::format("{:.3f}", dp), gmacs(fma, 16), gmacs(dp, 32),
             dp < 0 ? std::string("null") : fmt::format("{:.2f}", 32.0 / dp / (16.0 / fma)));
  return 0;
#else
  fmt::print(stderr, "bench_ops --peak: x86-64 only\n");
  return 1;
#endif
}

// A decode step's x W^T, W [N, K], M rows: ms per call and the weight's GB/s on each path.
void compare_decode(int64_t M, int64_t N, int64_t K, const char* what) {
  OwnedTensor x = randn(DType::F32, {M, K}, "x"), xh = randn(DType::BF16, {M, K}, "x");
  OwnedTensor w = randn(DType::F32, {N, K}, "w"), wh = randn(DType::BF16, {N, K}, "w");
  OwnedTensor c(DType::F32, {M, N}, MemCategory::Other);
  const bool was = ops::cpu_bf16_enabled(), hw = ops::cpu_bf16_status().hardware;
  auto time = [&](const Tensor& a, const Tensor& b, bool bf16_path) {
    if (bf16_path && !hw) return -1.0;
    ops::set_cpu_bf16_enabled(bf16_path);
    return seconds_best_of(5, [&] { ops::matmul(c.t, a, b, false, true); });
  };
  // The bf16 weight with f32 x: on the f32 skinny kernel (the f32 path), and on the bf16 path's,
  // which is AMX tiles where the CPU has them (else the same f32 skinny kernel: not timed twice).
  const double f32 = time(x.t, w.t, false), skinny = time(x.t, wh.t, false),
               tiles = ops::cpu_bf16_amx() ? time(x.t, wh.t, true) : -1.0, onednn = time(xh.t, wh.t, true),
               widened = time(xh.t, wh.t, false);
  // The weight in q8_0 (generate --dtype q8_0), read in place: the same kernel on either path.
  double q8 = -1.0;
  if (K % kQ8_0Block == 0) {
    OwnedTensor wq(DType::U8, {N, q8_0_bytes(K)}, MemCategory::Other, false);
    quantize_q8_0(w.t.f32(), N * K, static_cast<uint8_t*>(wq.t.data));
    q8 = seconds_best_of(5, [&] { ops::matmul_q8_0(c.t, x.t, wq.t); });
  }
  ops::set_cpu_bf16_enabled(was);
  auto ms = [](double t) { return t < 0 ? std::string("null") : fmt::format("{:.3f}", t * 1e3); };
  const double nk = double(N) * double(K);
  fmt::print("{{\"impl\": \"decode matmul\", \"what\": \"{}\", \"shape\": \"{}x{}x{} T\", \"f32_ms\": {}, "
             "\"bf16_skinny_ms\": {}, \"bf16_amx_ms\": {}, \"bf16_onednn_ms\": {}, \"bf16_widened_ms\": {}, "
             "\"f32_weight_gbs\": {:.1f}, \"bf16_skinny_weight_gbs\": {:.1f}, \"bf16_amx_weight_gbs\": {}, "
             "\"q8_0_ms\": {}, \"q8_0_weight_gbs\": {}, \"threads\": {}}}\n",
             what, M, N, K, ms(f32), ms(skinny), ms(tiles), ms(onednn), ms(widened), nk * 4 / f32 * 1e-9,
             nk * 2 / skinny * 1e-9, tiles < 0 ? std::string("null") : fmt::format("{:.1f}", nk * 2 / tiles * 1e-9),
             ms(q8), q8 < 0 ? std::string("null") : fmt::format("{:.1f}", nk * 34 / 32 / q8 * 1e-9),
             platform_info().omp_threads);
}

// One decode step's attention (1 query row per head) against a KV cache of T positions, f32 or bf16.
void compare_decode_attention(int64_t T, int64_t H, int64_t Hkv, int64_t Dh) {
  OwnedTensor q = randn(DType::F32, {1, 1, H, Dh}, "q"), o(DType::F32, {1, 1, H, Dh}, MemCategory::Other),
              lse(DType::F32, {1, H, 1}, MemCategory::Other);
  double t[2];
  for (int i = 0; i < 2; ++i) {
    const DType d = i ? DType::BF16 : DType::F32;
    OwnedTensor k = randn(d, {1, T, Hkv, Dh}, "k"), v = randn(d, {1, T, Hkv, Dh}, "v");
    t[i] = seconds_best_of(5, [&] { ops::attention_forward(o.t, lse.t, q.t, k.t, v.t, Tensor{}, 0.125f); });
  }
  fmt::print("{{\"impl\": \"decode attention\", \"shape\": \"cache {} x {} kv heads x {}, {} heads\", "
             "\"f32_cache_ms\": {:.3f}, \"bf16_cache_ms\": {:.3f}, \"threads\": {}}}\n",
             T, Hkv, Dh, H, t[0] * 1e3, t[1] * 1e3, platform_info().omp_threads);
}

// One shard step's memory-bound ops over n elements; on meta tensors the dry run counts their bytes.
struct ShardState {
  OwnedTensor p, g, m, v, h;
  ShardState(int64_t n, Device d)
      : p(DType::F32, {n}, MemCategory::Other, true, d), g(DType::F32, {n}, MemCategory::Other, true, d),
        m(DType::F32, {n}, MemCategory::Other, true, d), v(DType::F32, {n}, MemCategory::Other, true, d),
        h(DType::BF16, {n}, MemCategory::Other, true, d) {}
  void step(int64_t t) {
    ops::cast(h.t, p.t);         // the parameters' bf16 copy for the all-gather
    ops::add_inplace(g.t, h.t);  // the reduced bf16 gradient added into the shard
    (void)ops::sum_squares(g.t);  // the gradient norm
    ops::adamw_step(p.t, g.t, m.t, v.t, {}, t);
    (void)ops::sum_squares(p.t);  // the updated weights' check
    ops::zero(g.t);
  }
};

void memory_bound(int64_t n) {
  struct Bytes final : MetaObserver {
    double bytes = 0;
    void on_alloc(const Buffer&) override {}
    void on_free(const Buffer&) override {}
    void on_traffic(double b) override { bytes += b; }
  } counted;
  {
    ShardState meta(n, Device::Meta);
    const ObserveMeta observe(counted);
    meta.step(1);
  }
  // At least 16 passes and 5 seconds, the first pass left out: processes started together overlap
  // for most of their passes, as a node's ranks do.
  ShardState s(n, Device::CPU);
  std::vector<double> seconds;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t t = 1; t <= 16 || std::chrono::steady_clock::now() - start < std::chrono::seconds(5); ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    s.step(t);
    if (t > 1) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const auto mid = seconds.begin() + std::ptrdiff_t(seconds.size() / 2);
  std::nth_element(seconds.begin(), mid, seconds.end());
  fmt::print("{{\"impl\": \"memory-bound\", \"elements\": {}, \"bytes_per_pass\": {:.0f}, \"passes\": {}, "
             "\"median_s\": {:.5f}, \"bytes_per_s\": {:.0f}, \"threads\": {}}}\n",
             n, counted.bytes, seconds.size(), *mid, counted.bytes / *mid, platform_info().omp_threads);
}

void row(const char* name, const char* shape, double s, double flop = 0) {
  if (flop > 0)
    fmt::print("  {:<28} {:<34} {:9.3f} ms  {:7.1f} GFLOP/s\n", name, shape, s * 1e3, flop / s * 1e-9);
  else
    fmt::print("  {:<28} {:<34} {:9.3f} ms\n", name, shape, s * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_kernels(argv);  // OpenBLAS's kernels as shardlm picks them (core/platform.h)
  int64_t T = 1024;  // tokens in the micro-batch (B=1)
  bool quick = false, sgemm_only = false, bf16_only = false, decode_only = false, peak_only = false;
  int64_t memory_elements = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) T = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--sgemm")) sgemm_only = true;
    else if (!std::strcmp(argv[i], "--bf16")) bf16_only = true;
    else if (!std::strcmp(argv[i], "--decode")) decode_only = true;
    else if (!std::strcmp(argv[i], "--peak")) peak_only = true;
    else if (!std::strcmp(argv[i], "--memory-bound") && i + 1 < argc) memory_elements = std::atoll(argv[++i]);
    else {
      fmt::print(stderr, "usage: bench_ops [--tokens N] [--quick] | --sgemm | --bf16 | --decode | --peak | --memory-bound N\n");
      return 2;
    }
  }
  if (memory_elements > 0) {
    memory_bound(memory_elements);
    return 0;
  }
  if (peak_only) return peak_rates();
  if (sgemm_only) {
    const int64_t n = 2048;
    OwnedTensor A = randn(DType::F32, {n, n}, "A"), B = randn(DType::F32, {n, n}, "B");
    OwnedTensor C(DType::F32, {n, n}, MemCategory::Other);
    const double s = seconds_best_of(5, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(n), int(n), 1.0f, A.t.f32(), int(n), B.t.f32(),
                  int(n), 0.0f, C.t.f32(), int(n));
    });
    fmt::print("{{\"impl\": \"sgemm\", \"shape\": \"{0}x{0}x{0}\", \"gflops\": {1:.1f}, \"threads\": {2}}}\n", n,
               2.0 * double(n * n * n) / s * 1e-9, platform_info().omp_threads);
    return 0;
  }
  if (decode_only) {
    fmt::print("# cpu bf16: {}\n", ops::cpu_bf16_status().line);
    // Llama 3.2 1B's projections and head (dim 2048, ffn 8192, kv 512, vocab 128256), one row and 8.
    for (int64_t M : {1, 8}) {
      compare_decode(M, 2048, 2048, "q/o proj");
      compare_decode(M, 512, 2048, "k/v proj");
      compare_decode(M, 8192, 2048, "gate/up proj");
      compare_decode(M, 2048, 8192, "down proj");
      compare_decode(M, 128256, 2048, "lm_head");
    }
    for (int64_t T : {128, 1024, 4096}) compare_decode_attention(T, 32, 8, 64);
    return 0;
  }
  if (bf16_only) {
    fmt::print("# cpu bf16: {}\n", ops::cpu_bf16_status().line);
    // The 19M model of bench/compare_torch.sh (dim 256, ffn 688, vocab 32000, 2048 tokens) and a
    // Llama 3.2 1B layer (dim 2048, ffn 8192; 256 tokens, as bench/rank_scaling.sh): forward x W^T,
    // backward dx = dy W and dW += dy^T x.
    compare_bf16(2048, 688, 256, false, true, "19M gate/up x W^T");
    compare_bf16(2048, 256, 688, false, true, "19M down x W^T");
    compare_bf16(2048, 256, 688, false, false, "19M dx of gate/up: dy W");
    compare_bf16(688, 256, 2048, true, false, "19M dW of gate/up: dy^T x");
    compare_bf16(1024, 32000, 256, false, true, "19M head chunk x W^T");
    compare_bf16(256, 8192, 2048, false, true, "1B gate/up x W^T");
    compare_bf16(256, 2048, 8192, false, false, "1B dx of down: dy W");
    compare_bf16(8192, 2048, 256, true, false, "1B dW of gate/up: dy^T x");
    compare_bf16_attention(8, 256, 8, 4, 32, "19M attention");
    compare_bf16_attention(1, 256, 32, 8, 64, "1B attention, seq 256");
    compare_bf16_attention(1, 2048, 32, 8, 64, "1B attention, seq 2048");
    return 0;
  }
  const int reps = quick ? 1 : 3;
  const PlatformInfo p = platform_info();
  fmt::print("shardlm {} bench_ops: {} OpenMP threads; {}\n\n", p.version, p.omp_threads, p.blas);

  // Llama 3.2 1B-like layer: hidden 2048, 32 heads of 64, 8 kv heads, ffn 8192; Llama 2 vocab.
  const int64_t D = 2048, H = 32, Hkv = 8, Dh = 64, F = 8192, V = 32000;

  fmt::print("matmul vs raw OpenBLAS sgemm (f32, best of {} x 3 interleaved rounds)\n", reps);
  compare_matmul(2048, 2048, 2048, false, reps, "square");
  compare_matmul(T, D, D, true, reps, "q/o projection x W^T");
  compare_matmul(T, F, D, true, reps, "gate/up projection x W^T");
  {
    OwnedTensor A = randn(DType::BF16, {2048, 2048}, "A"), B = randn(DType::BF16, {2048, 2048}, "B");
    OwnedTensor C(DType::F32, {2048, 2048}, MemCategory::Other);
    const double s = seconds_best_of(reps, [&] { ops::matmul(C.t, A.t, B.t); });
    fmt::print("  {:<34} {:>5}x{:>5}x{:>5}  ops::matmul {:7.1f} GFLOP/s ({})\n", "square bf16", 2048, 2048, 2048,
               2.0 * 2048 * 2048 * 2048 / s * 1e-9, ops::cpu_bf16_status().line);
  }

  fmt::print("\nper-op time at one decoder layer's shapes, {} tokens (f32)\n", T);
  const std::string tok_d = fmt::format("[{}, {}]", T, D);
  {
    OwnedTensor x = randn(DType::F32, {T, D}, "x"), w = randn(DType::F32, {D}, "w"), y(DType::F32, {T, D}, MemCategory::Other);
    OwnedTensor rstd(DType::F32, {T}, MemCategory::Other), dx(DType::F32, {T, D}, MemCategory::Other),
        dw(DType::F32, {D}, MemCategory::Other);
    row("rmsnorm forward", tok_d.c_str(), seconds_best_of(reps, [&] { ops::rmsnorm_forward(y.t, rstd.t, x.t, w.t, 1e-5f); }));
    row("rmsnorm backward", tok_d.c_str(),
        seconds_best_of(reps, [&] { ops::rmsnorm_backward(dx.t, dw.t, y.t, x.t, w.t, rstd.t); }));
  }
  {
    OwnedTensor q = randn(DType::F32, {1, T, H, Dh}, "q"), pos(DType::I32, {1, T}, MemCategory::Other);
    for (int64_t t = 0; t < T; ++t) pos.t.i32()[t] = int32_t(t);
    const std::vector<float> inv = ops::rope_inv_freq(Dh, 500000.0f, {});
    const Tensor invt = Tensor::view(const_cast<float*>(inv.data()), DType::F32, {Dh / 2});
    const std::string shape = fmt::format("[1, {}, {}, {}]", T, H, Dh);
    row("rope forward (q)", shape.c_str(), seconds_best_of(reps, [&] { ops::rope_forward(q.t, q.t, pos.t, invt); }));
    row("rope backward (q)", shape.c_str(), seconds_best_of(reps, [&] { ops::rope_backward(q.t, q.t, pos.t, invt); }));
  }
  {
    OwnedTensor q = randn(DType::F32, {1, T, H, Dh}, "q"), k = randn(DType::F32, {1, T, Hkv, Dh}, "k"),
                v = randn(DType::F32, {1, T, Hkv, Dh}, "v"), o(DType::F32, {1, T, H, Dh}, MemCategory::Other),
                lse(DType::F32, {1, H, T}, MemCategory::Other), dout = randn(DType::F32, {1, T, H, Dh}, "dout");
    OwnedTensor dq(DType::F32, {1, T, H, Dh}, MemCategory::Other), dk(DType::F32, {1, T, Hkv, Dh}, MemCategory::Other),
        dv(DType::F32, {1, T, Hkv, Dh}, MemCategory::Other);
    const float scale = 1.0f / std::sqrt(float(Dh));
    const double flop = 2.0 * 2.0 * double(T) * double(T) * double(H) * double(Dh) / 2;  // causal half
    const std::string shape = fmt::format("q[1, {}, {}, {}] kv {} heads", T, H, Dh, Hkv);
    row("attention forward", shape.c_str(),
        seconds_best_of(reps, [&] { ops::attention_forward(o.t, lse.t, q.t, k.t, v.t, Tensor{}, scale); }), flop);
    row("attention backward", shape.c_str(), seconds_best_of(reps, [&] {
          ops::attention_backward(dq.t, dk.t, dv.t, dout.t, q.t, k.t, v.t, o.t, lse.t, Tensor{}, scale);
        }), 2.5 * flop);
  }
  {
    OwnedTensor g = randn(DType::F32, {T, F}, "g"), u = randn(DType::F32, {T, F}, "u"), o(DType::F32, {T, F}, MemCategory::Other);
    OwnedTensor dg(DType::F32, {T, F}, MemCategory::Other), du(DType::F32, {T, F}, MemCategory::Other);
    const std::string shape = fmt::format("[{}, {}]", T, F);
    row("swiglu forward", shape.c_str(), seconds_best_of(reps, [&] { ops::swiglu_forward(o.t, g.t, u.t); }));
    row("swiglu backward", shape.c_str(), seconds_best_of(reps, [&] { ops::swiglu_backward(dg.t, du.t, o.t, g.t, u.t); }));
  }
  {
    OwnedTensor w = randn(DType::F32, {V, D}, "emb", 0.02f), ids(DType::I32, {T}, MemCategory::Other),
        o(DType::F32, {T, D}, MemCategory::Other), dw(DType::F32, {V, D}, MemCategory::Other);
    for (int64_t t = 0; t < T; ++t) ids.t.i32()[t] = int32_t((t * 7919) % V);
    row("embedding forward", tok_d.c_str(), seconds_best_of(reps, [&] { ops::embedding_forward(o.t, w.t, ids.t); }));
    row("embedding backward", tok_d.c_str(), seconds_best_of(reps, [&] { ops::embedding_backward(dw.t, o.t, ids.t); }));
  }
  {
    OwnedTensor x = randn(DType::F32, {T, D}, "x"), w = randn(DType::F32, {V, D}, "head", 0.02f),
        tgt(DType::I32, {T}, MemCategory::Other), dx(DType::F32, {T, D}, MemCategory::Other),
        dw(DType::F32, {V, D}, MemCategory::Other);
    for (int64_t t = 0; t < T; ++t) tgt.t.i32()[t] = int32_t((t * 31) % V);
    const std::string shape = fmt::format("x[{}, {}] head[{}, {}]", T, D, V, D);
    const double flop = 2.0 * double(T) * double(D) * double(V);
    row("linear+cross-entropy fwd", shape.c_str(),
        seconds_best_of(reps, [&] { ops::linear_cross_entropy(x.t, w.t, tgt.t, Tensor{}, Tensor{}, 1.0f); }), flop);
    row("linear+cross-entropy fwd+bwd", shape.c_str(),
        seconds_best_of(reps, [&] { ops::linear_cross_entropy(x.t, w.t, tgt.t, dx.t, dw.t, 1.0f / float(T)); }),
        3 * flop);
  }
  {
    const int64_t n = 64 * 1024 * 1024;  // 64M parameters: a 256 MiB f32 shard
    OwnedTensor p = randn(DType::F32, {n}, "p", 0.02f), g = randn(DType::F32, {n}, "g", 0.01f);
    OwnedTensor m(DType::F32, {n}, MemCategory::Other), v(DType::F32, {n}, MemCategory::Other),
        h(DType::BF16, {n}, MemCategory::Other);
    int64_t step = 0;
    row("adamw step", "64M f32", seconds_best_of(reps, [&] { ops::adamw_step(p.t, g.t, m.t, v.t, {}, ++step); }));
    row("sum of squares", "64M f32", seconds_best_of(reps, [&] { (void)ops::sum_squares(g.t); }));
    row("cast f32 -> bf16", "64M", seconds_best_of(reps, [&] { ops::cast(h.t, p.t); }));
  }
  return 0;
}
