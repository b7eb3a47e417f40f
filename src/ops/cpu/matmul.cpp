// Matrix multiply. Three paths, chosen per call, and a fourth for q8_0 weights:
//  - skinny: a few f32 rows times a transposed f32 or bf16 weight into f32 (a decode step: x W^T
//    with M = the batch, at most kSkinnyRows), by skinny_bt below, on every x86-64 CPU: each
//    weight row is read once, straight from memory, bf16 widened to f32 in registers (a 16-bit
//    shift), and every product and sum is f32. At one row, decode is memory-bound and a bf16
//    weight is read about twice as fast as an f32 one, and 1.5x as fast as oneDNN reads it. This
//    path is taken before the bf16 one even where oneDNN has bf16 hardware: oneDNN would round x
//    to bf16 and make a row's result depend on how many rows share the call (on the development
//    machine it was 1.5-2x faster at 8 rows, where this kernel is compute-bound: bench_ops
//    --decode; docs/generation.md). Where the CPU has AMX tiles (cpu_bf16_amx), a bf16 weight
//    takes skinny_bt_amx instead: x split into two bf16 parts, the weight's rows multiplied on
//    tiles in place; the same for every M, so still independent of the batch.
//  - bf16: with a bf16 operand, on a CPU with bf16 hardware, through oneDNN (ops/cpu/onednn.h):
//    bf16 x bf16 products accumulated in f32, C written in its own dtype. An f32 operand beside a
//    bf16 one (the f32 gradient buffers of the backward) is rounded to a bf16 Workspace copy: the
//    policy of the CUDA matmul, and of torch.autocast.
//  - q8_0 (ops::matmul_q8_0, at the end of this file): a decode step's rows take the skinny path with
//    the weight's blocks read in place; more rows dequantize it in blocks and take the paths above.
//  - f32: OpenBLAS sgemm. bf16 operands are widened to f32 first (into a Workspace buffer):
//    OpenBLAS 0.3.21 has sbgemm only for some CPUs, and widening costs O(n^2) against the O(n^3)
//    multiply. Skinny shapes whose A or C is bf16 are widened and take skinny_bt too.
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/q8_0.h"

#include "ops/cpu/amx.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/onednn.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/vec_math.h"
#include "ops/cpu_bf16.h"

namespace shardlm::ops::cpu {

namespace {
// f32 view of a tensor: the tensor itself, or its widened copy in `scratch`.
const float* as_f32(const Tensor& t, const Buffer& scratch) {
  if (t.dtype == DType::F32) return static_cast<const float*>(t.data);
  float* out = static_cast<float*>(scratch.data());
  convert_bf16_to_f32(static_cast<const bf16_t*>(t.data), out, size_t(t.numel()));
  return out;
}
// C [M, N] = alpha * A [M, K] B^T + beta * C, B [N, K] f32 or bf16, for M <= kSkinnyRows: every
// row of B is read once, straight from memory, and dotted with each row of A (which stays in
// cache). OpenBLAS 0.3.21's sgemm packs all of B first, which for a decode step means copying
// every weight once more per token: this path decoded a 506M-parameter model 1.5x faster in f32
// (bench/RESULTS.md). The work is tiles of all M rows of A by a few rows of B, one vector
// accumulator each in registers: a vector of B (a bf16 one widened to f32 in the register, exact)
// feeds every row of A, and a vector of A every row of B in the tile. With one or two rows of A the
// tiles are one row of B wide instead: B is then read as one sequential stream, which the hardware
// prefetcher keeps ahead (a bf16 lm_head at M = 1 read 1.4x faster than in tiles of 4 rows of B;
// at M = 8 the wide tiles were 1.7x faster; bench_ops --decode). The wide tiles take B in groups of
// rows and K in blocks (skinny_group below). Every dot product is computed the same way whatever
// tile it falls in (one accumulator over the vectors of K, summed lane by lane, then the tail), so
// a row's result does not depend on M (a sequence's logits do not depend on the batch it decodes
// in), and a bf16 B gives bit for bit its f32 widening's result.
constexpr int64_t kSkinnyRows = 8;
// A one-row-of-B tile prefetches B this many elements ahead of its loads (2 KiB of bf16). A row of
// a decode weight is a few KiB, and hardware prefetchers stop at 4 KiB page boundaries: on an Intel
// Xeon (bench/RESULTS.md, 2026-11-26) each row started cold, and a bf16 lm_head at M = 1 read at
// 13.5 GB/s; prefetched, 1.6x faster (f32 1.4x). The wide tiles read 4 rows at once and gained
// nothing from it (their M = 8 lm_head slowed when they prefetched too), so only this tile does.
constexpr int64_t kPrefetchAhead = 1024;
// Rows of B per tile: up to 4 rows of A by 4 rows of B, 5 to 8 rows by 3 (at most 24
// accumulators of AVX-512's 32 registers, beside the vectors of B and one of A), and half that
// with AVX2's 16.
constexpr int kTileCols = kLanes == 16 ? 4 : 2;
constexpr int kTileColsOver4Rows = kLanes == 16 ? 3 : 1;

typedef uint16_t vhalf_unaligned __attribute__((vector_size(kLanes * sizeof(uint16_t)), aligned(2), may_alias));
typedef uint32_t vuint __attribute__((vector_size(kLanes * sizeof(uint32_t))));
inline vfloat vload_f32(const float* p) { return vload(p); }
// bf16 is the top half of an f32: widen, shift into place. By intrinsics where there are vectors:
// GCC 12 splits __builtin_convertvector's 16 lanes into two halves, extracted and inserted again
// (six vector instructions where two do), and the skinny tiles run on the same ports.
// (GCC 12's AVX-512 conversion intrinsics start from an undefined vector, which -O3's
// -Wmaybe-uninitialized reports from inside its own header.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline vfloat vload_f32(const bf16_t* p) {
#if defined(__AVX512F__)
  static_assert(kLanes == 16);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return std::bit_cast<vfloat>(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif defined(__AVX2__)
  static_assert(kLanes == 8);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return std::bit_cast<vfloat>(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
  const vuint u = __builtin_convertvector(*reinterpret_cast<const vhalf_unaligned*>(p), vuint) << 16;
  return std::bit_cast<vfloat>(u);
#endif
}
#pragma GCC diagnostic pop
// A vector of A held in a register. Left to itself GCC 12 folds the load into every multiply-add
// that uses the vector (a memory operand each), so a tile C rows of B wide loaded it C times and
// was bound by its loads (bench/RESULTS.md, session 14). The empty asm makes the value opaque to
// the compiler, so it is loaded once.
inline vfloat vload_held(const float* p) {
  vfloat x = vload(p);
#if defined(__x86_64__)
  asm("" : "+v"(x));
#endif
  return x;
}
inline float widen(float x) { return x; }
inline float widen(bf16_t x) { return bf16_to_f32(x); }

// A q8_0 weight (core/q8_0.h) where the kernels take a float* or bf16_t* one: element `at` of the
// weight whose first block is at `base` (rows of K elements, K a multiple of 32, so a row starts a
// block). Its values are d * q, exact in f32: the kernel on a q8_0 weight (tile_accumulate's q8_0
// overload) gives bit for bit its result on the dequantized f32 weight.
struct Q8Elems {
  const uint8_t* base;
  int64_t at = 0;
  Q8Elems operator+(int64_t n) const { return {base, at + n}; }
  const uint8_t* block() const { return base + at / kQ8_0Block * kQ8_0BlockBytes; }
};
static_assert(kQ8_0Block % kLanes == 0, "a vector of a q8_0 weight must lie in one block");
typedef int8_t vq8_unaligned __attribute__((vector_size(kLanes), aligned(1), may_alias));
typedef int32_t vint32 __attribute__((vector_size(kLanes * sizeof(int32_t))));
// kLanes int8 as f32. By intrinsics where there are vectors: GCC 12 turns __builtin_convertvector from
// int8 (to int32 or f32) into one scalar conversion per element, 4x slower decode.
// (GCC 12's AVX-512 conversion intrinsics start from an undefined vector, which -O3's
// -Wmaybe-uninitialized reports from inside its own header.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
inline vfloat widen_q8(const uint8_t* p) {
#if defined(__AVX512F__)
  static_assert(kLanes == 16);
  return std::bit_cast<vfloat>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
#elif defined(__AVX2__)
  static_assert(kLanes == 8);
  return std::bit_cast<vfloat>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
#else
  return __builtin_convertvector(__builtin_convertvector(*reinterpret_cast<const vq8_unaligned*>(p), vint32), vfloat);
#endif
}
#pragma GCC diagnostic pop

// The tiles' accumulators, kept in registers while a tile runs (a local array whose address is not
// taken); between the K blocks of a blocked tile they rest in memory, which keeps every value.
template <int R, int C>
struct TileAcc {
  vfloat v[R][C];
};

// acc[r][j] += lane by lane, the products of row r of A and row j of B over the vectors of [k0, k1).
// W: the weight's element pointer (const float*, const bf16_t*); a q8_0 weight takes the overload below.
template <int R, int C, class W>
inline void tile_accumulate(TileAcc<R, C>& acc, const float* a, int64_t lda, W b, int64_t ldb, int64_t k0,
                            int64_t k1) {
  TileAcc<R, C> r = acc;
  for (int64_t k = k0; k < k1; k += kLanes) {
    if constexpr (C == 1) __builtin_prefetch(b + k + kPrefetchAhead);
    vfloat w[C];
    for (int j = 0; j < C; ++j) w[j] = vload_f32(b + j * ldb + k);
    for (int i = 0; i < R; ++i) {
      const vfloat x = vload_held(a + i * lda + k);
      for (int j = 0; j < C; ++j) r.v[i][j] += x * w[j];
    }
  }
  acc = r;
}

// The q8_0 step: the loop above with the weight read block by block (each row's scale converted once
// per block, not per vector); k0 and k1 are multiples of the block. The same multiply-adds in the
// same order as the loop above on the dequantized weight (a vector's values d * q are exact), so
// still bit for bit its result.
template <int R, int C>
inline void tile_accumulate(TileAcc<R, C>& acc, const float* a, int64_t lda, Q8Elems b, int64_t ldb, int64_t k0,
                            int64_t k1) {
  TileAcc<R, C> r = acc;
  const uint8_t* rows[C];
  for (int j = 0; j < C; ++j) rows[j] = (b + j * ldb).block();
  for (int64_t k = k0; k < k1; k += kQ8_0Block) {
    const int64_t blk = k / kQ8_0Block * kQ8_0BlockBytes;
    if constexpr (C == 1) __builtin_prefetch(rows[0] + blk + kPrefetchAhead);
    float d[C];
    for (int j = 0; j < C; ++j) d[j] = q8_0_scale(rows[j] + blk);
    for (int64_t h = 0; h < kQ8_0Block; h += kLanes) {
      vfloat w[C];
      for (int j = 0; j < C; ++j) w[j] = widen_q8(rows[j] + blk + 2 + h) * d[j];
      for (int i = 0; i < R; ++i) {
        const vfloat x = vload_held(a + i * lda + k + h);
        for (int j = 0; j < C; ++j) r.v[i][j] += x * w[j];
      }
    }
  }
  acc = r;
}

// The vectors of K a tile accumulates; the elements past them (the tail) tile_finish adds.
template <class W>
int64_t vector_end(int64_t K) {
  return std::is_same_v<W, Q8Elems> ? K : K / kLanes * kLanes;  // a q8_0 row is whole blocks
}

// c[r * ldc + j] = alpha * (row r of A) . (row j of B) + beta * c, for r < R, j < C, from the
// accumulators over [0, kv): their lanes summed in order, then the tail [kv, K).
template <int R, int C, class W>
inline void tile_finish(const TileAcc<R, C>& acc, float* c, int64_t ldc, const float* a, int64_t lda, W b,
                        int64_t ldb, int64_t kv, int64_t K, float alpha, float beta) {
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) {
      float sum = 0.0f;
      for (int l = 0; l < kLanes; ++l) sum += acc.v[r][j][l];
      // Explicit fused multiply-adds: whether the compiler would contract `sum + x * w` differs
      // between the f32 and the bf16 instantiation, and the two must agree bit for bit. (The
      // vector loop above is contracted in both; CpuBf16.DecodeShapesTakeTheSkinnyKernel checks it.)
      if constexpr (!std::is_same_v<W, Q8Elems>)
        for (int64_t q = kv; q < K; ++q) sum = std::fma(a[r * lda + q], widen(b[j * ldb + q]), sum);
      float& out = c[r * ldc + j];
      out = beta == 0.0f ? alpha * sum : std::fma(alpha, sum, beta * out);
    }
}

// A one-row-of-B tile over the whole of K (M <= 2; see kPrefetchAhead).
template <int R, class W>
inline void skinny_column(float* c, int64_t ldc, const float* a, int64_t lda, W b, int64_t ldb, int64_t K,
                          float alpha, float beta) {
  TileAcc<R, 1> acc{};
  const int64_t kv = vector_end<W>(K);
  tile_accumulate(acc, a, lda, b, ldb, 0, kv);
  tile_finish(acc, c, ldc, a, lda, b, ldb, kv, K, alpha, beta);
}

// More rows of A take the weight kGroupCols rows at a time, and K in blocks of kBlockK: each tile of
// the group (all R rows of A by C rows of B) accumulates over a block, then the next tile, so that
// the block of A (at most kSkinnyRows x kBlockK f32, 16 KiB) stays in the L1 cache while the
// group's rows of B stream past it. Over all of K at once, A (8 x 2048 f32 is 64 KiB, 8 x 8192 is
// 256 KiB) came from the L2 cache at every tile.
constexpr int64_t kBlockK = 512;
constexpr int64_t kGroupCols = 24;  // a multiple of every tile width
static_assert(kBlockK % kQ8_0Block == 0 && kBlockK % kLanes == 0, "a block must hold whole vectors and q8_0 blocks");

template <int R, int C, class W>
void skinny_group(float* c, int64_t ldc, const float* a, int64_t lda, W b, int64_t ldb, int64_t cols, int64_t K,
                  float alpha, float beta) {
  static_assert(kGroupCols % C == 0);
  TileAcc<R, C> wide[kGroupCols / C] = {};
  TileAcc<R, 1> narrow[C] = {};
  const int64_t full = cols / C, kv = vector_end<W>(K);
  for (int64_t k0 = 0; k0 < kv; k0 += kBlockK) {
    const int64_t k1 = std::min(k0 + kBlockK, kv);
    for (int64_t t = 0; t < full; ++t) tile_accumulate(wide[t], a, lda, b + t * C * ldb, ldb, k0, k1);
    for (int64_t j = full * C; j < cols; ++j) tile_accumulate(narrow[j - full * C], a, lda, b + j * ldb, ldb, k0, k1);
  }
  for (int64_t t = 0; t < full; ++t)
    tile_finish(wide[t], c + t * C, ldc, a, lda, b + t * C * ldb, ldb, kv, K, alpha, beta);
  for (int64_t j = full * C; j < cols; ++j)
    tile_finish(narrow[j - full * C], c + j, ldc, a, lda, b + j * ldb, ldb, kv, K, alpha, beta);
}

template <class W>
void skinny_bt(float* c, const float* a, W b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
               float alpha, float beta) {
  // A q8_0 weight's tiles are always wide: its dot products are one chain of multiply-adds each, and
  // a one-row tile waited on that chain (at M = 1 it read 19 GB/s of q8_0 in one-row tiles).
  const bool columns = M <= 2 && !std::is_same_v<W, Q8Elems>;
  const int64_t width = columns ? 1 : kGroupCols, units = (N + width - 1) / width;
  parallel_region(M * N * K >= kMinParallelWork, [&] {
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t n = u * width, cols = std::min<int64_t>(width, N - n);
      const W bu = b + n * ldb;
      // A tile takes all M rows of A: a vector of B (widened once) feeds M multiply-adds.
      if (columns) {
        if (M == 1) skinny_column<1>(c + n, N, a, lda, bu, ldb, K, alpha, beta);
        else skinny_column<2>(c + n, N, a, lda, bu, ldb, K, alpha, beta);
        continue;
      }
      switch (M) {
        case 1: skinny_group<1, kTileCols>(c + n, N, a, lda, bu, ldb, cols, K, alpha, beta); break;
        case 2: skinny_group<2, kTileCols>(c + n, N, a, lda, bu, ldb, cols, K, alpha, beta); break;
        case 3: skinny_group<3, kTileCols>(c + n, N, a, lda, bu, ldb, cols, K, alpha, beta); break;
        case 4: skinny_group<4, kTileCols>(c + n, N, a, lda, bu, ldb, cols, K, alpha, beta); break;
        case 5: skinny_group<5, kTileColsOver4Rows>(c + n, N, a, lda, bu, ldb, cols, K, alpha, beta); break;
        case 6: skinny_group<6, kTileColsOver4Rows>(c + n, N, a, lda, bu, ldb, cols, K, alpha, beta); break;
        case 7: skinny_group<7, kTileColsOver4Rows>(c + n, N, a, lda, bu, ldb, cols, K, alpha, beta); break;
        default: skinny_group<8, kTileColsOver4Rows>(c + n, N, a, lda, bu, ldb, cols, K, alpha, beta); break;
      }
    }
  });
}

// ---- skinny bf16 weights on AMX tiles ------------------------------------------------------------
//
// At 8 rows the kernel above is compute-bound with a bf16 weight (8 multiply-adds per widened
// vector), and bf16 decode at batch 8 was only 1.5x f32's on an Intel Xeon with AMX (bench/RESULTS.md,
// 2026-11-26). On tiles a weight is multiplied as it is read:
//   - x [M, K] f32 is split into two bf16 parts per value, hi = bf16(x) and lo = bf16(x - hi),
//     which together hold x to about 2^-17 of its size (x - hi is exact in f32); the products
//     with a bf16 weight are exact in f32, so the result is nearly the f32 kernel's, not the
//     error of x rounded to bf16 (what oneDNN does, and torch's bf16 decode);
//   - the parts are packed once per call as the B tile's columns: hi of row m in column m, lo in
//     column M + m (kSkinnyRows = 8 rows fill the 16), in pairs along K, zero past 2M and K;
//   - 16 rows of the weight (16 x 32 bf16) are loaded in place as an A tile (rows 64 bytes apart
//     in memory: the weight's own layout), and TDPBF16PS adds A times B to a 16 x 16 f32 tile;
//   - result (n, m) is the tile's (n, m) plus its (n, M + m), scaled and stored as the f32 kernel does.
// A column of a tile product is computed from that column of B alone, so a row's result is the
// same whatever M (the batch a sequence decodes in). It is not bit for bit the f32 widening's
// result, which the f32 kernel gives (TDPBF16PS sums in its own order, and treats subnormal
// inputs as zero): within f32 rounding of it (CpuBf16.DecodeShapesTakeTheSkinnyKernel).
#if defined(__x86_64__)
constexpr int64_t kAmxK = 32;     // contraction per tile product (bf16 per A tile row)
constexpr int64_t kAmxRows = 16;  // weight rows per tile
static_assert(2 * kSkinnyRows <= 16, "hi and lo of every row must fit the B tile's 16 columns");

int64_t amx_padded_k(int64_t K) { return (K + kAmxK - 1) / kAmxK * kAmxK; }
// Bytes of the packed x: K padded to whole tiles, in pairs, 16 words per pair.
size_t amx_packed_bytes(int64_t K) { return size_t(amx_padded_k(K) / 2) * 16 * sizeof(uint32_t); }

// packed[p][c]: the pair (2p, 2p + 1) of column c (see above), as two bf16 in a word.
void amx_pack_x(uint16_t* packed, const float* a, int64_t lda, int64_t M, int64_t K) {
  const int64_t Kp = amx_padded_k(K);
  std::fill(packed, packed + Kp * 16, uint16_t(0));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const float x = a[m * lda + k];
      const bf16_t hi = f32_to_bf16(x);
      // An infinite hi (x infinite, or beyond bf16's largest finite value, 3.39e38, which f32's
      // 3.40e38 passes) carries x alone: x - hi would be NaN.
      const bf16_t lo = std::isfinite(bf16_to_f32(hi)) ? f32_to_bf16(x - bf16_to_f32(hi)) : bf16_t{0};
      uint16_t* pair = packed + (k / 2) * 32 + (k % 2);
      pair[2 * m] = hi.bits;
      pair[2 * (M + m)] = lo.bits;
    }
}

// c[:, n, n + rows) for rows <= 16 weight rows from n. A tile that would read past the weight
// (the last rows, or K's last partial 32) is copied into a zero-padded block first.
SHARDLM_AMX void amx_skinny_block(float* c, int64_t ldc, const uint32_t* packed, const bf16_t* b, int64_t ldb,
                                  int64_t rows, int64_t M, int64_t K, float alpha, float beta) {
  alignas(64) float acc[kAmxRows][16];
  alignas(64) uint16_t edge[kAmxRows][kAmxK];
  _tile_zero(0);
  for (int64_t k = 0; k < K; k += kAmxK) {
    if (rows == kAmxRows && k + kAmxK <= K) {
      // No software prefetch: 16 rows are read side by side, which the hardware prefetcher follows
      // (prefetching each row 2 KiB ahead made every shape slower, the M = 1 lm_head 1.3x).
      _tile_loadd(1, b + k, ldb * 2);
    } else {
      const int64_t width = std::min(kAmxK, K - k);
      for (int64_t r = 0; r < kAmxRows; ++r)
        for (int64_t q = 0; q < kAmxK; ++q) edge[r][q] = r < rows && q < width ? b[r * ldb + k + q].bits : 0;
      _tile_loadd(1, edge, kAmxK * 2);
    }
    _tile_loadd(2, packed + k / 2 * 16, 16 * sizeof(uint32_t));
    _tile_dpbf16ps(0, 1, 2);
  }
  _tile_stored(0, acc, 16 * sizeof(float));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < rows; ++r) {
      const float sum = acc[r][m] + acc[r][M + m];
      float& out = c[m * ldc + r];
      out = beta == 0.0f ? alpha * sum : std::fma(alpha, sum, beta * out);
    }
}

void skinny_bt_amx(float* c, const float* a, const bf16_t* b, int64_t M, int64_t N, int64_t K, int64_t lda,
                   int64_t ldb, float alpha, float beta, uint16_t* packed) {
  amx_pack_x(packed, a, lda, M, K);
  const int64_t blocks = (N + kAmxRows - 1) / kAmxRows;
  parallel_region(M * N * K >= kMinParallelWork, [&] {
    const AmxScope tiles;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < blocks; ++t) {
      const int64_t n = t * kAmxRows;
      amx_skinny_block(c + n, N, reinterpret_cast<const uint32_t*>(packed), b + n * ldb, ldb,
                       std::min(kAmxRows, N - n), M, K, alpha, beta);
    }
  });
}
#endif
}  // namespace

// The skinny path takes a few f32 rows times a transposed weight (f32 or bf16) into f32.
static bool takes_skinny_path(const Tensor& C, const Tensor& A, bool trans_a, bool trans_b) {
  return C.shape[0] <= kSkinnyRows && !trans_a && trans_b && A.dtype == DType::F32 && C.dtype == DType::F32;
}

// Of those, a bf16 weight goes to the tiles where the CPU's bf16 path has them.
static bool takes_skinny_amx_path(const Tensor& B) {
#if defined(__x86_64__)
  return B.dtype == DType::BF16 && cpu_bf16_enabled() && cpu_bf16_amx();
#else
  (void)B;
  return false;
#endif
}

// The bf16 path takes a call with a bf16 operand and a non-empty product.
static bool takes_bf16_path(const Tensor& C, const Tensor& A, const Tensor& B) {
  return (A.dtype == DType::BF16 || B.dtype == DType::BF16) && C.numel() > 0 && A.numel() > 0 && cpu_bf16_enabled();
}

MatmulScratch matmul_scratch(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b,
                             Device device) {
  if (C.numel() == 0) return {};
  if (takes_skinny_path(C, A, trans_a, trans_b)) {
    MatmulScratch s;
#if defined(__x86_64__)
    if (takes_skinny_amx_path(B)) s.a = Buffer(amx_packed_bytes(A.shape[1]), MemCategory::Workspace, false, device);
#endif
    return s;
  }
  if (takes_bf16_path(C, A, B)) {  // bf16 copies of the f32 operands
    auto narrowed = [&](const Tensor& t) {
      return t.dtype == DType::BF16 ? Buffer() : Buffer(size_t(t.numel()) * 2, MemCategory::Workspace, false, device);
    };
    MatmulScratch s;
    s.a = narrowed(A);
    s.b = narrowed(B);
    return s;
  }
  auto widened = [&](const Tensor& t) {
    return t.dtype == DType::F32 ? Buffer() : Buffer(size_t(t.numel()) * 4, MemCategory::Workspace, false, device);
  };
  MatmulScratch s;
  s.a = widened(A);
  s.b = widened(B);
  s.c = widened(C);
  return s;
}

void matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha, float beta) {
  const int64_t M = C.shape[0], N = C.shape[1];
  const int64_t K = trans_a ? A.shape[0] : A.shape[1];
  if (M == 0 || N == 0) return;

  if (takes_skinny_path(C, A, trans_a, trans_b)) {
    float* c = static_cast<float*>(C.data);
    const float* a = static_cast<const float*>(A.data);
    if (B.dtype == DType::F32) {
      skinny_bt(c, a, static_cast<const float*>(B.data), M, N, K, A.shape[1], B.shape[1], alpha, beta);
#if defined(__x86_64__)
    } else if (takes_skinny_amx_path(B)) {
      const MatmulScratch scratch = matmul_scratch(C, A, B, trans_a, trans_b, Device::CPU);
      skinny_bt_amx(c, a, static_cast<const bf16_t*>(B.data), M, N, K, A.shape[1], B.shape[1], alpha, beta,
                    static_cast<uint16_t*>(scratch.a.data()));
#endif
    } else {
      skinny_bt(c, a, static_cast<const bf16_t*>(B.data), M, N, K, A.shape[1], B.shape[1], alpha, beta);
    }
    return;
  }
  const MatmulScratch scratch = matmul_scratch(C, A, B, trans_a, trans_b, Device::CPU);
  if (takes_bf16_path(C, A, B)) {
    auto as_bf16 = [](const Tensor& t, const Buffer& copy) {
      if (t.dtype == DType::BF16) return static_cast<const bf16_t*>(t.data);
      bf16_t* out = static_cast<bf16_t*>(copy.data());
      convert_f32_to_bf16(static_cast<const float*>(t.data), out, size_t(t.numel()));
      return static_cast<const bf16_t*>(out);
    };
    onednn_matmul(C.data, C.dtype, as_bf16(A, scratch.a), as_bf16(B, scratch.b), M, N, K, trans_a, trans_b, alpha,
                  beta);
    return;
  }
  const float* a = as_f32(A, scratch.a);
  const float* b = as_f32(B, scratch.b);
  float* c;
  if (C.dtype == DType::F32) {
    c = static_cast<float*>(C.data);
  } else {
    c = static_cast<float*>(scratch.c.data());
    if (beta != 0.0f) convert_bf16_to_f32(static_cast<const bf16_t*>(C.data), c, size_t(M * N));
  }

  if (M <= kSkinnyRows && !trans_a && trans_b)
    skinny_bt(c, a, b, M, N, K, A.shape[1], B.shape[1], alpha, beta);
  else
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M),
                int(N), int(K), alpha, a, int(A.shape[1]), b, int(B.shape[1]), beta, c, int(N));

  if (C.dtype == DType::BF16) convert_f32_to_bf16(c, static_cast<bf16_t*>(C.data), size_t(M * N));
}

// ---- q8_0 weights (ops::matmul_q8_0) ---------------------------------------------------------------
// A decode step's rows (M <= kSkinnyRows) take the skinny kernel above with the weight read in
// place, block by block, and dequantized in registers: bit for bit the f32 kernel's result on the
// dequantized weight, so a row's result does not depend on M. More rows (a prefill chunk) take the
// weight kQ8Rows rows at a time: dequantized into a block that stays in cache (bf16 on the bf16
// path, d * q rounded once; else exact f32) and multiplied as matmul does into a block of C. Whole,
// the dequantized weight went to memory and back: a 84-token prefill of a 1.2B model took 2.5x
// bf16's time (bench/RESULTS.md, session 11).
constexpr int64_t kQ8Rows = 256;
static bool q8_0_skinny(const Tensor& C) { return C.shape[0] <= kSkinnyRows; }

MatmulQ8Scratch matmul_q8_0_scratch(const Tensor& C, const Tensor& A, const Tensor& W, Device device) {
  if (C.numel() == 0 || q8_0_skinny(C)) return {};
  const int64_t rows = std::min(kQ8Rows, W.shape[0]);
  const size_t esize = cpu_bf16_enabled() ? 2 : 4;
  return {Buffer(size_t(rows * A.shape[1]) * esize, MemCategory::Workspace, false, device),
          Buffer(size_t(C.shape[0] * rows) * 4, MemCategory::Workspace, false, device)};
}

void matmul_q8_0(const Tensor& C, const Tensor& A, const Tensor& W, float alpha, float beta) {
  const int64_t M = C.shape[0], N = C.shape[1], K = A.shape[1];
  if (C.numel() == 0) return;
  const uint8_t* q = static_cast<const uint8_t*>(W.data);
  if (q8_0_skinny(C)) {
    skinny_bt(static_cast<float*>(C.data), static_cast<const float*>(A.data), Q8Elems{q}, M, N, K, K, K, alpha, beta);
    return;
  }
  const MatmulQ8Scratch scratch = matmul_q8_0_scratch(C, A, W, Device::CPU);
  const int64_t row_bytes = q8_0_bytes(K);
  const bool bf16 = cpu_bf16_enabled();
  float* c = static_cast<float*>(C.data);
  float* cb = static_cast<float*>(scratch.c.data());  // C's columns [n0, n0 + rows), [M, rows]
  for (int64_t n0 = 0; n0 < N; n0 += kQ8Rows) {
    const int64_t rows = std::min(kQ8Rows, N - n0);
    parallel_region(rows * K >= kMinParallelWork, [&] {
      std::vector<float> row(static_cast<size_t>(bf16 ? K : 0));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* src = q + (n0 + r) * row_bytes;
        if (!bf16) {
          dequantize_q8_0(src, K, static_cast<float*>(scratch.w.data()) + r * K);
          continue;
        }
        dequantize_q8_0(src, K, row.data());
        convert_f32_to_bf16(row.data(), static_cast<bf16_t*>(scratch.w.data()) + r * K, size_t(K));
      }
    });
    if (beta != 0.0f)
      for (int64_t m = 0; m < M; ++m) std::copy_n(c + m * N + n0, rows, cb + m * rows);
    matmul(Tensor::view(cb, DType::F32, {M, rows}), A,
           Tensor::view(scratch.w.data(), bf16 ? DType::BF16 : DType::F32, {rows, K}), false, true, alpha, beta);
    for (int64_t m = 0; m < M; ++m) std::copy_n(cb + m * rows, rows, c + m * N + n0);
  }
}

}  // namespace shardlm::ops::cpu
