// Causal grouped-query attention on the CPU, FlashAttention style.
//
// The T x T score matrix never exists. Queries are processed kBq rows at a time against keys
// kBk at a time; each query row keeps a running max m and a running sum l of exp(s - m)
// (the "online softmax"), rescaling its output accumulator whenever m grows. Scratch is a few
// blocks of kBq x Dh / kBk x Dh values per thread, so memory is O(block * Dh) on top of the
// O(T * Dh) tensors themselves. Key blocks entirely above the causal diagonal are skipped.
//
// The backward is FlashAttention-2's: with D_i = dO_i . O_i and P recomputed from the saved lse,
//   dV_j += sum_i P_ij dO_i,   dP_ij = dO_i . V_j,   dS_ij = P_ij (dP_ij - D_i),
//   dQ_i += scale sum_j dS_ij K_j,   dK_j += scale sum_i dS_ij Q_i.
// To stay race-free and deterministic without atomics it runs in two passes: one owns a block
// of keys of one kv head (and sums over the query heads of its group) to produce dK and dV, the
// other owns a block of queries of one head to produce dQ. Both recompute P; that doubles the
// score work but needs no per-thread copies of dK/dV and no reduction.
//
// All the arithmetic of a block pair is small matrix products of two kinds, each computed from a
// register tile of accumulators:
//   over the head dimension, a block of rows times a block of keys transposed: S = Q K^T, dP = dO V^T;
//   over the rows of a block, scores times a block of rows: O += P V, dV += P^T dO, dK += dS^T Q,
//   dQ += dS K.
// The softmax between them runs in f32 over contiguous rows of kBk scores with a vectorized exp.
// Block rows are padded with zeros to Dp, a whole number of 16 floats, which leaves every product
// unchanged. BLAS is not called: OpenBLAS here is the pthread build and must not be entered from
// inside an OpenMP region, and its per-call overhead is large beside a 64 x 64 block.
//
// The products run on one of two paths, chosen per call (the kernels are templates on it):
//   F32Blocks: f32 blocks (bf16 inputs widened exactly), f32 multiply-adds; every CPU.
//   Bf16Blocks: when q, k and v are bf16 and the CPU's bf16 path is on (ops/cpu_bf16.h, which
//     requires AVX512-BF16), bf16 blocks multiplied by VDPBF16PS with f32 accumulation. Q, K, V and
//     dO enter as they are (dO rounded to bf16 if it is f32); the probabilities P and dS are rounded
//     to bf16 before their products, as PyTorch's CPU flash attention and FlashAttention-2 on GPUs
//     do. Scores, the softmax, lse, D and every accumulator stay f32. The instruction takes pairs
//     of bf16 along the contraction, so the right operand of each product is laid out in pairs:
//     a key block transposed by 32-bit words (pairs along the head dimension), a block of rows
//     interleaved two rows at a time (pairs along the rows).
// Both paths read rows through RowSource, so paged attention equals attention_forward bit for bit
// on either.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ops/cpu/amx.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/vec_math.h"
#include "ops/cpu_bf16.h"

namespace shardlm::ops::cpu {

namespace {

constexpr int64_t kBq = 64;  // query rows per block
constexpr int64_t kBk = 64;  // keys per block (score rows are kBk wide, padded past the last key)
constexpr int64_t kB = std::max(kBq, kBk);
// Block rows are padded to a whole number of kPad values: a whole number of float vectors at any
// width, of the 16 words of a bf16 pair vector, and of the 32 bf16 of an AMX tile's row.
constexpr int64_t kPad = 32;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
static_assert(kBk % kPad == 0 && kBq % kPad == 0 && kPad % kLanes == 0, "blocks must be whole vectors wide");

// ---- f32 block products ------------------------------------------------------------------------

// Register tile of block_matmul: kTileRows rows x up to kTileVecs vectors of accumulators, 16
// registers, plus the tile's row of B and a broadcast. AVX-512 has 32 vector registers, AVX2 16.
constexpr int kTileRows = 4;
constexpr int kTileVecs = kLanes == 16 ? 4 : 2;

// C[R rows][NV vectors] += A[R rows][0, K) . B[0, K)[NV vectors], accumulated in registers.
template <int R, int NV>
inline void matmul_tile(const float* A, int64_t lda, int64_t K, const float* B, int64_t ldb, float* C, int64_t ldc) {
  vfloat acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vload(C + r * ldc + v * kLanes);
  for (int64_t k = 0; k < K; ++k) {
    vfloat b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(B + k * ldb + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const vfloat a = vsplat(A[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) vstore(C + r * ldc + v * kLanes, acc[r][v]);
}

template <int R>
inline void matmul_tile(int64_t nv, const float* A, int64_t lda, int64_t K, const float* B, int64_t ldb, float* C,
                        int64_t ldc) {
  switch (nv) {
    case 1: return matmul_tile<R, 1>(A, lda, K, B, ldb, C, ldc);
    case 2: return matmul_tile<R, 2>(A, lda, K, B, ldb, C, ldc);
    case 3: return matmul_tile<R, 3>(A, lda, K, B, ldb, C, ldc);
    default: return matmul_tile<R, 4>(A, lda, K, B, ldb, C, ldc);
  }
}

// C[n][0, W) += A[n][0, K) . B[K][0, W): row-major f32 blocks with row strides lda, ldb, ldc;
// W is a whole number of vectors.
void block_matmul(const float* A, int64_t lda, int64_t n, int64_t K, const float* B, int64_t ldb, int64_t W,
                  float* C, int64_t ldc) {
  for (int64_t c = 0; c < W; c += kTileVecs * kLanes) {
    const int64_t nv = std::min<int64_t>(kTileVecs, (W - c) / kLanes);
    int64_t i = 0;
    for (; i + kTileRows <= n; i += kTileRows)
      matmul_tile<kTileRows>(nv, A + i * lda, lda, K, B + c, ldb, C + i * ldc + c, ldc);
    for (; i < n; ++i) matmul_tile<1>(nv, A + i * lda, lda, K, B + c, ldb, C + i * ldc + c, ldc);
  }
}

// ---- Transposes ----------------------------------------------------------------------------------
// A key block is its keys transposed, and the backward's products with P^T and dS^T take the score
// blocks transposed. Element by element, the key block's transpose was most of the work of a
// decode step's attention (one query row against each block of keys); whole kLanes x kLanes tiles
// go by vector shuffles instead.

// Lanes [0, kLanes / 2) of a and b interleaved (a0 b0 a1 b1 ...), and lanes [kLanes / 2, kLanes).
template <size_t... I>
inline vfloat zip_low(vfloat a, vfloat b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, int(I / 2 + (I % 2) * kLanes)...);
}
template <size_t... I>
inline vfloat zip_high(vfloat a, vfloat b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, int(kLanes / 2 + I / 2 + (I % 2) * kLanes)...);
}

// v[i][j] becomes v[j][i]. Each round interleaves row i with row i + kLanes / 2 into rows 2i and
// 2i + 1; after log2(kLanes) rounds row i holds what was column i. The lanes are moved bit for bit
// (shuffles do no arithmetic), so they may hold any 32-bit values.
inline void transpose_tile(vfloat (&v)[kLanes]) {
  constexpr auto lanes = std::make_index_sequence<kLanes>{};
  for (int round = 1; round < kLanes; round *= 2) {
    vfloat t[kLanes];
    for (int i = 0; i < kLanes / 2; ++i) {
      t[2 * i] = zip_low(v[i], v[i + kLanes / 2], lanes);
      t[2 * i + 1] = zip_high(v[i], v[i + kLanes / 2], lanes);
    }
    for (int i = 0; i < kLanes; ++i) v[i] = t[i];
  }
}

// dst[d * ldd + j] = row j's value d, for j < n, d < D: n rows of 32-bit values (f32, or words of
// two bf16) made the columns of dst. row_at(j, slot) gives row j's address; slot (j % kLanes) may
// pick scratch for it, valid until the next kLanes rows are asked for. Whole kLanes x kLanes tiles
// by transpose_tile, the rest value by value; every access is a may-alias vector or a memcpy, so
// any 32-bit type may be moved.
template <class RowAt>
void rows_to_columns(int64_t n, int64_t D, void* dst, int64_t ldd, RowAt row_at) {
  static_assert(sizeof(float) == 4);
  for (int64_t j0 = 0; j0 < n; j0 += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, n - j0);
    const void* rows[kLanes];
    for (int64_t j = 0; j < m; ++j) rows[j] = row_at(j0 + j, j);
    auto* out = static_cast<char*>(dst) + j0 * 4;
    int64_t d = 0;
    if (m == kLanes)
      for (; d + kLanes <= D; d += kLanes) {
        vfloat v[kLanes];
        for (int j = 0; j < kLanes; ++j) v[j] = vload(static_cast<const float*>(rows[j]) + d);
        transpose_tile(v);
        for (int i = 0; i < kLanes; ++i) vstore(reinterpret_cast<float*>(out) + (d + i) * ldd, v[i]);
      }
    for (; d < D; ++d)
      for (int64_t j = 0; j < m; ++j)
        std::memcpy(out + (d * ldd + j) * 4, static_cast<const char*>(rows[j]) + d * 4, 4);
  }
}

// dst[j][i] = src[i][j] for i < rows, j < cols (a block of scores, for the products with P^T).
void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  rows_to_columns(rows, cols, dst, ld_dst, [&](int64_t i, int64_t) { return src + i * ld_src; });
}

// ---- bf16 block products (AVX512-BF16), compiled for that ISA whatever -march says and called only
// where the CPU has it (cpu_bf16_enabled) ------------------------------------------------------------
#if defined(__x86_64__)
constexpr bool kHaveBf16Products = true;
#define SHARDLM_BF16_PRODUCTS __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// A word of two bf16 from a row of bf16 at p (memcpy: the row is uint16_t, and a cast would alias).
inline uint32_t pair_at(const uint16_t* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

// C[R rows][NV x 16 columns] += A[R rows][0, 2 K2) . B over K2 pairs. A: rows of bf16 (stride lda
// values). B: K2 rows of words (stride ldb words), word c of row p holding column c's two values
// 2p and 2p + 1. VDPBF16PS adds both products of a pair to an f32 lane.
template <int R, int NV>
SHARDLM_BF16_PRODUCTS void dot_tile(const uint16_t* A, int64_t lda, int64_t K2, const uint32_t* B, int64_t ldb,
                                    float* C, int64_t ldc) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_loadu_ps(C + r * ldc + v * 16);
  for (int64_t p = 0; p < K2; ++p) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(B + p * ldb + v * 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int(pair_at(A + r * lda + 2 * p)));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + v * 16, acc[r][v]);
}

template <int R>
SHARDLM_BF16_PRODUCTS void dot_tile(int64_t nv, const uint16_t* A, int64_t lda, int64_t K2, const uint32_t* B,
                                    int64_t ldb, float* C, int64_t ldc) {
  switch (nv) {
    case 1: return dot_tile<R, 1>(A, lda, K2, B, ldb, C, ldc);
    case 2: return dot_tile<R, 2>(A, lda, K2, B, ldb, C, ldc);
    case 3: return dot_tile<R, 3>(A, lda, K2, B, ldb, C, ldc);
    default: return dot_tile<R, 4>(A, lda, K2, B, ldb, C, ldc);
  }
}

// C[n][0, W) += A[n][0, 2 K2) . B: block_matmul's shape with bf16 operands, B in pairs (dot_tile);
// W is a whole number of 16 columns. The same 4 x 4 tile of accumulators as the f32 kernel.
SHARDLM_BF16_PRODUCTS void block_dot(const uint16_t* A, int64_t lda, int64_t n, int64_t K2, const uint32_t* B,
                                     int64_t ldb, int64_t W, float* C, int64_t ldc) {
  for (int64_t c = 0; c < W; c += 4 * 16) {
    const int64_t nv = std::min<int64_t>(4, (W - c) / 16);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) dot_tile<4>(nv, A + i * lda, lda, K2, B + c, ldb, C + i * ldc + c, ldc);
    for (; i < n; ++i) dot_tile<1>(nv, A + i * lda, lda, K2, B + c, ldb, C + i * ldc + c, ldc);
  }
}

// dst[i][0, m) = src[i][0, m) rounded to bf16 (to nearest even), and zero from m to m rounded up to
// kPad, so that every row is whole pairs and whole AMX tile rows: f32 probabilities made the left
// operand of a bf16 product.
SHARDLM_BF16_PRODUCTS void round_rows(const float* src, int64_t lds, int64_t n, int64_t m, uint16_t* dst,
                                      int64_t ldd) {
  const int64_t padded = (m + kPad - 1) / kPad * kPad;
  for (int64_t i = 0; i < n; ++i) {
    const float* s = src + i * lds;
    uint16_t* d = dst + i * ldd;
    for (int64_t j = 0; j < m; j += 16) {
      const __mmask16 lanes = j + 16 <= m ? __mmask16(0xFFFF) : __mmask16((1u << (m - j)) - 1);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lanes, s + j));
      _mm256_mask_storeu_epi16(d + j, lanes, (__m256i)h);
    }
    std::fill(d + m, d + padded, uint16_t(0));
  }
}

// C[n][0, W) += A[n][0, K) . B as block_dot, on tiles (configured on this thread): C in 32 x 32
// pieces of four tiles (tmm0-3), times two 16-row tiles of A (tmm4, tmm5) and two 16-column tiles
// of B (tmm6, tmm7) per 32 of the contraction. W and K are whole 32s; n is taken in whole 32s, so
// A and C must have rows up to n rounded up to 32 (the extra rows are computed from whatever A holds
// there, and ignored), and B rows up to K / 2.
SHARDLM_AMX void amx_block_dot(const uint16_t* A, int64_t lda, int64_t n, int64_t K, const uint32_t* B, int64_t ldb,
                               int64_t W, float* C, int64_t ldc) {
  const int64_t sa = lda * 2, sb = ldb * 4, sc = ldc * 4;  // row strides in bytes
  for (int64_t i = 0; i < n; i += 32)
    for (int64_t c = 0; c < W; c += 32) {
      float* c0 = C + i * ldc + c;
      float* c1 = c0 + 16 * ldc;
      _tile_loadd(0, c0, sc);
      _tile_loadd(1, c0 + 16, sc);
      _tile_loadd(2, c1, sc);
      _tile_loadd(3, c1 + 16, sc);
      for (int64_t k = 0; k < K; k += 32) {
        _tile_loadd(4, A + i * lda + k, sa);
        _tile_loadd(5, A + (i + 16) * lda + k, sa);
        _tile_loadd(6, B + k / 2 * ldb + c, sb);
        _tile_loadd(7, B + k / 2 * ldb + c + 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, sc);
      _tile_stored(1, c0 + 16, sc);
      _tile_stored(2, c1, sc);
      _tile_stored(3, c1 + 16, sc);
    }
}
#else
constexpr bool kHaveBf16Products = false;
#endif

// ---- Sizes, mask and sources ---------------------------------------------------------------------

// Sizes and the mask, shared by all kernels.
struct Attn {
  int64_t B, Tq, Tk, H, Hkv, Dh;
  int64_t Dp;          // Dh rounded up to whole kPad: the row length of every block
  int64_t group;       // query heads per kv head
  int64_t off;         // Tk - Tq: query i sits at key position i + off
  const int32_t* seg;  // [B, Tk] or nullptr

  Attn(const Tensor& q, int64_t Tk_, int64_t Hkv_, const Tensor& segment_ids)
      : B(q.shape[0]), Tq(q.shape[1]), Tk(Tk_), H(q.shape[2]), Hkv(Hkv_), Dh(q.shape[3]),
        Dp((Dh + kPad - 1) / kPad * kPad), group(H / Hkv), off(Tk - Tq),
        seg(segment_ids.defined() ? segment_ids.i32() : nullptr) {}
  Attn(const Tensor& q, const Tensor& k, const Tensor& segment_ids) : Attn(q, k.shape[1], k.shape[2], segment_ids) {}

  int64_t num_q_blocks() const { return (Tq + kBq - 1) / kBq; }
  int64_t num_k_blocks() const { return (Tk + kBk - 1) / kBk; }
  // Whether the problem is big enough to pay for a parallel region: 2^17 multiply-adds of visible
  // scores (a few tens of microseconds serially, against a few for the region; a decode step's
  // one query row over 64 keys of 32 heads of 64 is that). Small calls, such as the thousands a
  // finite-difference check makes, stay serial, which also spares them OpenMP's barrier spinning
  // when the cores are oversubscribed. Query i sees i + off + 1 keys: Tq Tk - Tq^2 / 2 in all.
  bool worth_threads() const { return B * H * (Tq * Tk - Tq * Tq / 2) * Dh >= (int64_t(1) << 17); }
  // Key blocks that queries [i0, i0 + nq) can see: the causal diagonal ends at i0 + nq - 1 + off.
  int64_t visible_k_blocks(int64_t i0, int64_t nq) const { return (i0 + nq - 1 + off) / kBk + 1; }

  // Number of keys of the block starting at j0 (of nk keys) that lie at or before query qi's
  // position; those after it are causally masked. May be <= 0.
  int64_t causal_limit(int64_t qi, int64_t j0, int64_t nk) const { return std::min(nk, qi + off - j0 + 1); }
  // The segment of query qi and of keys [j0, j0 + nk) (into kseg[0, kBk)); all 0 without
  // segment_ids. A key is visible to a query only within its segment.
  int32_t query_segment(int64_t b, int64_t qi) const { return seg ? seg[b * Tk + qi + off] : 0; }
  void key_segments(int64_t b, int64_t j0, int64_t nk, int32_t* kseg) const {
    for (int64_t j = 0; j < kBk; ++j) kseg[j] = seg && j < nk ? seg[b * Tk + j0 + j] : 0;
  }
};

// Where a kernel reads rows [T, heads, Dh] of batch row b from: a tensor [B, T, heads, Dh], or
// (attention_forward_paged, batch 1) blocks [block, heads, Dh] of a paged KV cache, position t in
// row t % block of block t / block. Views, valid for the call.
struct RowSource {
  const Tensor* whole = nullptr;
  const std::vector<Tensor>* blocks = nullptr;
  int64_t block = 0;

  RowSource(const Tensor& t) : whole(&t) {}  // NOLINT(google-explicit-constructor): a tensor is one source
  explicit RowSource(const std::vector<Tensor>& b) : blocks(&b), block(b.front().shape[0]) {}

  DType dtype() const { return whole ? whole->dtype : blocks->front().dtype; }

  // Position t, head h of batch row b, Dh values as f32 (the row itself, or widened into scratch).
  const float* row(int64_t b, int64_t t, int64_t h, int64_t Dh, float* scratch) const {
    const auto [x, r] = locate(b, t, h);
    return row_f32(*x, r, Dh, scratch);
  }
  // The same row's Dh values as bf16 into dst: copied, or rounded from f32.
  void row_bf16(int64_t b, int64_t t, int64_t h, int64_t Dh, uint16_t* dst) const {
    const auto [x, r] = locate(b, t, h);
    if (x->dtype == DType::BF16) {
      std::memcpy(dst, static_cast<const bf16_t*>(x->data) + r * Dh, size_t(Dh) * sizeof(uint16_t));
    } else {
      const float* src = static_cast<const float*>(x->data) + r * Dh;
      for (int64_t d = 0; d < Dh; ++d) dst[d] = f32_to_bf16(src[d]).bits;
    }
  }

 private:
  // The tensor holding position t, head h of batch row b, and its row there (rows of Dh values).
  std::pair<const Tensor*, int64_t> locate(int64_t b, int64_t t, int64_t h) const {
    if (whole) return {whole, (b * whole->shape[1] + t) * whole->shape[2] + h};
    const Tensor& blk = (*blocks)[size_t(t / block)];
    return {&blk, (t % block) * blk.shape[1] + h};
  }
};

template <class T>
std::vector<T> zeros(int64_t n) {
  return std::vector<T>(static_cast<size_t>(n));
}
std::vector<float> floats(int64_t n) { return zeros<float>(n); }

// ---- The two paths' blocks and products ----------------------------------------------------------
// Each path has three kinds of block, loaded from a RowSource, and two products:
//   a row block (Rows)  [n][Dp]: rows of q or dout, the left operand of a product over the head dim;
//   a key block (Keys): keys [j0, j0 + kBk) of k or v, transposed: the right operand of that product;
//   a pair block (Pairs): rows of v, k, q or dout, the right operand of a product over the rows.
//   over_head(A, n, B, C):        C[n][kBk] += A[n] . B^T      (S = Q K^T, dP = dO V^T)
//   over_rows(S, lds, n, m, B, C): C[n][Dp] += S[n][0, m) . B  (O += P V, dV += P^T dO, ...)
// Blocks past the last row or key are zero, so a partial block's products are those of its rows.
// One object per thread: it owns its scratch.

// f32 blocks and multiply-adds. A pair block is a row block.
struct F32Blocks {
  using Rows = float;   // [n][Dp]
  using Keys = float;   // [Dh][kBk]: element (d, j) is key j's value d
  using Pairs = float;  // [n][Dp]: the row block
  static constexpr bool kPairsAreRows = true;
  static int64_t rows_size(const Attn& a, int64_t n) { return n * a.Dp; }
  static int64_t keys_size(const Attn& a) { return a.Dh * kBk; }
  static int64_t pairs_size(const Attn& a, int64_t n) { return n * a.Dp; }

  const Attn& a;
  std::vector<float> rows;  // [kLanes][Dh] bf16 widening scratch: the keys load_keys transposes at once
  explicit F32Blocks(const Attn& attn) : a(attn), rows(floats(kLanes * attn.Dh)) {}

  // Rows [t0, t0 + n) of head h, batch b, as f32, zero past Dh. Always a copy, even of f32 rows: in
  // the tensor, a head's rows lie heads * Dh floats apart, a power of two in practice, so a block of
  // them would fall into a few L1 cache sets and evict itself while the block products reuse it.
  void load_rows(const RowSource& x, int64_t b, int64_t t0, int64_t n, int64_t h, float* dst) {
    for (int64_t i = 0; i < n; ++i) {
      float* r = dst + i * a.Dp;
      const float* src = x.row(b, t0 + i, h, a.Dh, r);
      if (src != r) std::memcpy(r, src, size_t(a.Dh) * sizeof(float));
      std::fill(r + a.Dh, r + a.Dp, 0.0f);
    }
  }
  void load_pairs(const RowSource& x, int64_t b, int64_t t0, int64_t n, int64_t h, float* dst) {
    load_rows(x, b, t0, n, h, dst);
  }
  void load_keys(const RowSource& x, int64_t b, int64_t j0, int64_t n, int64_t h, float* dst) {
    if (n < kBk)  // a partial block: the keys past n are zero (a full one overwrites every column)
      for (int64_t d = 0; d < a.Dh; ++d) std::fill(dst + d * kBk + n, dst + (d + 1) * kBk, 0.0f);
    rows_to_columns(n, a.Dh, dst, kBk, [&](int64_t j, int64_t slot) {
      return x.row(b, j0 + j, h, a.Dh, rows.data() + slot * a.Dh);
    });
  }
  void over_head(const float* A, int64_t n, const float* B, float* C) {
    block_matmul(A, a.Dp, n, a.Dh, B, kBk, kBk, C, kBk);
  }
  void over_rows(const float* S, int64_t lds, int64_t n, int64_t m, const float* B, float* C) {
    block_matmul(S, lds, n, m, B, a.Dp, a.Dp, C, a.Dp);
  }
};

#if defined(__x86_64__)
// bf16 blocks, the right operands in pairs along the contraction, multiplied on AMX tiles where the
// CPU has them (cpu_bf16_amx) and the block has 16 rows or more, else by VDPBF16PS. Both kernels
// read the same layouts; the tiles need the contraction zero-padded to whole 32s on both sides.
struct Bf16Blocks {
  using Rows = uint16_t;   // [n][Dp] bf16
  using Keys = uint32_t;   // [Dp/2][kBk] words: word (p, j) holds key j's values 2p, 2p + 1
  using Pairs = uint32_t;  // [kB/2][Dp] words: word (p, d) holds rows 2p and 2p + 1's value d
  static constexpr bool kPairsAreRows = false;
  static int64_t rows_size(const Attn& a, int64_t n) { return n * a.Dp; }
  static int64_t keys_size(const Attn& a) { return a.Dp / 2 * kBk; }
  static int64_t pairs_size(const Attn& a, int64_t n) { return (n + kPad - 1) / kPad * kPad / 2 * a.Dp; }

  const Attn& a;
  int64_t K2;                       // pairs along the head dimension, (Dh + 1) / 2
  std::vector<uint16_t> even, odd;  // [Dp] a row's bf16 values, zero past Dh
  std::vector<uint16_t> keys;       // [kLanes][Dp] rows of keys, zero past Dh: what load_keys transposes at once
  std::vector<uint16_t> rounded;    // [kB][kB] probabilities rounded to bf16
  std::optional<AmxScope> tiles;    // configured on this thread while the blocks live, where the CPU has them
  explicit Bf16Blocks(const Attn& attn)
      : a(attn), K2((attn.Dh + 1) / 2), even(zeros<uint16_t>(attn.Dp)), odd(zeros<uint16_t>(attn.Dp)),
        keys(zeros<uint16_t>(kLanes * attn.Dp)), rounded(zeros<uint16_t>(kB * kB)) {
    if (cpu_bf16_amx()) tiles.emplace();
  }
  Bf16Blocks(const Bf16Blocks&) = delete;
  Bf16Blocks& operator=(const Bf16Blocks&) = delete;

  void load_rows(const RowSource& x, int64_t b, int64_t t0, int64_t n, int64_t h, uint16_t* dst) {
    for (int64_t i = 0; i < n; ++i) {
      x.row_bf16(b, t0 + i, h, a.Dh, dst + i * a.Dp);
      std::fill(dst + i * a.Dp + a.Dh, dst + (i + 1) * a.Dp, uint16_t(0));
    }
  }
  // Rows 2p and 2p + 1 interleaved value by value; a last odd row is paired with zeros, and the
  // pairs past it up to n rounded up to kPad rows are zero.
  void load_pairs(const RowSource& x, int64_t b, int64_t t0, int64_t n, int64_t h, uint32_t* dst) {
    const int64_t pairs = (n + 1) / 2, padded = (n + kPad - 1) / kPad * kPad / 2;
    for (int64_t p = 0; p < pairs; ++p) {
      x.row_bf16(b, t0 + 2 * p, h, a.Dh, even.data());
      if (2 * p + 1 < n)
        x.row_bf16(b, t0 + 2 * p + 1, h, a.Dh, odd.data());
      else
        std::fill(odd.begin(), odd.end(), uint16_t(0));
      uint32_t* w = dst + p * a.Dp;
      for (int64_t d = 0; d < a.Dp; ++d) w[d] = uint32_t(even[size_t(d)]) | uint32_t(odd[size_t(d)]) << 16;
    }
    std::fill(dst + pairs * a.Dp, dst + padded * a.Dp, 0u);
  }
  // A key's row as words is already a pair layout along the head dimension: the block is the
  // transpose of its keys' words. Its rows from K2 to Dp / 2 stay zero (never written).
  void load_keys(const RowSource& x, int64_t b, int64_t j0, int64_t n, int64_t h, uint32_t* dst) {
    if (n < kBk)
      for (int64_t p = 0; p < K2; ++p) std::fill(dst + p * kBk + n, dst + (p + 1) * kBk, 0u);
    rows_to_columns(n, K2, dst, kBk, [&](int64_t j, int64_t slot) {
      uint16_t* r = keys.data() + slot * a.Dp;
      x.row_bf16(b, j0 + j, h, a.Dh, r);  // r[Dh] is 0: an odd Dh's last pair ends in zero
      return r;
    });
  }
  // Whether a product with n rows goes to the tiles: smaller ones would waste most of a tile.
  bool on_tiles(int64_t n) const { return tiles.has_value() && n >= 16; }

  void over_head(const uint16_t* A, int64_t n, const uint32_t* B, float* C) {
    if (on_tiles(n))
      amx_block_dot(A, a.Dp, n, a.Dp, B, kBk, kBk, C, kBk);
    else
      block_dot(A, a.Dp, n, K2, B, kBk, kBk, C, kBk);
  }
  void over_rows(const float* S, int64_t lds, int64_t n, int64_t m, const uint32_t* B, float* C) {
    round_rows(S, lds, n, m, rounded.data(), kB);
    if (on_tiles(n))
      amx_block_dot(rounded.data(), kB, n, (m + kPad - 1) / kPad * kPad, B, a.Dp, a.Dp, C, a.Dp);
    else
      block_dot(rounded.data(), kB, n, (m + 1) / 2, B, a.Dp, a.Dp, C, a.Dp);
  }
};
#endif

// Whether a call takes the bf16 products: bf16 q, k and v, and the CPU's bf16 path on.
bool bf16_products(const Tensor& q, const RowSource& k, const RowSource& v) {
  return kHaveBf16Products && q.dtype == DType::BF16 && k.dtype() == DType::BF16 && v.dtype() == DType::BF16 &&
         cpu_bf16_enabled();
}

// One row of a block pair in the backward: scores s_j (in p) become P_j = exp(scale s_j - lse)
// for the first `visible` keys of the query's segment and 0 for the rest, and dP_j (in ds) becomes
// dS_j = P_j (dP_j - D). The exp is taken for every key and the mask applied after, as a select:
// a call under a condition would keep the loop from vectorizing.
void probs_and_dscores_row(float* p, float* ds, int64_t visible, const int32_t* kseg, int32_t qs, float scale,
                           float lse, float D) {
  for (int64_t j = 0; j < kBk; ++j) {
    const float e = exp_nonpositive(p[j] * scale - lse);
    const float pj = j < visible && kseg[j] == qs ? e : 0.0f;
    p[j] = pj;
    ds[j] = pj * (ds[j] - D);
  }
}

// ---- Forward ---------------------------------------------------------------------------------------

// The forward over keys and values from k and v (tensors, or the blocks of a paged cache).
template <class Blocks>
void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const RowSource& k, const RowSource& v,
             const Attn& a, float scale) {
  const int64_t Dh = a.Dh, Dp = a.Dp, nqb = a.num_q_blocks();
  // Query heads per task: a few query rows (a decode step has one) take every query head of their
  // kv head's group into one block of rows, so each block of keys and values is loaded once for
  // the group rather than once per head (loading is most of a one-row block's work). Rows of the
  // block are (head, query) pairs, head-major; each row's products are those it has alone.
  const int64_t heads = std::min(a.Tq, kBq) * a.group <= kBq ? a.group : 1;
  const int64_t tasks = a.B * (a.H / heads) * nqb;
  float* lse_p = lse.f32();

  // One task is one (batch, head or group of heads, query block). Later query blocks see more
  // keys, so tasks are handed out dynamically, biggest first.
  parallel_region(a.worth_threads(), [&] {
    // Per-thread scratch, O(block * Dh).
    Blocks blocks(a);
    auto Q = zeros<typename Blocks::Rows>(Blocks::rows_size(a, kBq));    // [kBq, Dp] the query block
    auto Kt = zeros<typename Blocks::Keys>(Blocks::keys_size(a));        // the key block, transposed
    auto V = zeros<typename Blocks::Pairs>(Blocks::pairs_size(a, kBk));  // the value block
    std::vector<float> acc = floats(kBq * Dp);  // [kBq, Dp] unnormalized output
    std::vector<float> S = floats(kBq * kBk);   // [kBq, kBk] scores, then probabilities
    std::vector<float> m = floats(kBq), l = floats(kBq);  // [kBq] running max and sum
    std::vector<int32_t> kseg(static_cast<size_t>(kBk));  // [kBk] key segments

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t qb = nqb - 1 - task % nqb;
      const int64_t bh = task / nqb, b = bh / (a.H / heads), h0 = bh % (a.H / heads) * heads, g = h0 / a.group;
      const int64_t i0 = qb * kBq, nq = std::min(kBq, a.Tq - i0), rows = heads * nq;
      // Row r of the block: query i0 + r % nq of head h0 + r / nq.
      auto query_of = [&](int64_t r) { return i0 + r % nq; };

      // Only the block's rows are used (a decode step has one per head): the products read and
      // write rows [0, rows) alone, so the others are never cleared.
      for (int64_t hh = 0; hh < heads; ++hh)
        blocks.load_rows(q, b, i0, nq, h0 + hh, Q.data() + hh * Blocks::rows_size(a, nq));
      std::fill(acc.begin(), acc.begin() + rows * Dp, 0.0f);
      std::fill(m.begin(), m.begin() + rows, kNegInf);
      std::fill(l.begin(), l.begin() + rows, 0.0f);

      const int64_t nkb = a.visible_k_blocks(i0, nq);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBk, nk = std::min(kBk, a.Tk - j0);
        blocks.load_keys(k, b, j0, nk, g, Kt.data());
        blocks.load_pairs(v, b, j0, nk, g, V.data());
        a.key_segments(b, j0, nk, kseg.data());

        std::fill(S.begin(), S.begin() + rows * kBk, 0.0f);
        blocks.over_head(Q.data(), rows, Kt.data(), S.data());  // S = Q K^T

        for (int64_t i = 0; i < rows; ++i) {
          const int64_t qi = query_of(i), jmax = a.causal_limit(qi, j0, nk);
          const int32_t qs = a.query_segment(b, qi);
          float* s = &S[size_t(i * kBk)];
          float block_max = kNegInf;
#pragma omp simd reduction(max : block_max)
          for (int64_t j = 0; j < kBk; ++j) {
            const float x = j < jmax && kseg[size_t(j)] == qs ? s[j] * scale : kNegInf;
            s[j] = x;
            block_max = std::max(block_max, x);
          }
          // Nothing visible here (later keys, another segment): the row's state stays as it is,
          // and its zero probabilities add nothing to the output below.
          if (block_max == kNegInf) {
            std::fill(s, s + kBk, 0.0f);
            continue;
          }
          // Online softmax: move the row to the new max, then add this block's terms.
          const float m_new = std::max(m[size_t(i)], block_max);
          const float alpha = exp_nonpositive(m[size_t(i)] - m_new);  // 0 on the row's first visible block
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < kBk; ++j) {
            const float p = exp_nonpositive(s[j] - m_new);  // exactly 0 for masked keys
            s[j] = p;
            sum += p;
          }
          l[size_t(i)] = l[size_t(i)] * alpha + sum;
          m[size_t(i)] = m_new;
          if (alpha != 1.0f) {
            float* acc_i = &acc[size_t(i * Dp)];
#pragma omp simd
            for (int64_t d = 0; d < Dp; ++d) acc_i[d] *= alpha;
          }
        }
        blocks.over_rows(S.data(), kBk, rows, nk, V.data(), acc.data());  // acc += P V
      }

      // Normalize. A row with no visible key (impossible: a query always sees itself) would get
      // out = 0 and lse = -inf rather than 0/0.
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t qi = query_of(i), h = h0 + i / nq;
        const float inv = l[size_t(i)] > 0.0f ? 1.0f / l[size_t(i)] : 0.0f;
        float* acc_i = &acc[size_t(i * Dp)];
        for (int64_t d = 0; d < Dh; ++d) acc_i[d] *= inv;
        store_row(out, (b * a.Tq + qi) * a.H + h, Dh, acc_i);
        lse_p[(b * a.H + h) * a.Tq + qi] = l[size_t(i)] > 0.0f ? m[size_t(i)] + std::log(l[size_t(i)]) : kNegInf;
      }
    }
  });
}

void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const RowSource& k, const RowSource& v,
             const Attn& a, float scale) {
#if defined(__x86_64__)
  if (bf16_products(q, k, v)) return forward<Bf16Blocks>(out, lse, q, k, v, a, scale);
#endif
  forward<F32Blocks>(out, lse, q, k, v, a, scale);
}

// ---- Backward --------------------------------------------------------------------------------------

template <class Blocks>
void backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Attn& a, float scale) {
  const int64_t Dh = a.Dh, Dp = a.Dp, nqb = a.num_q_blocks(), nkb_all = a.num_k_blocks();
  const float* lse_p = lse.f32();
  float* dq_p = dq.f32();
  float* dk_p = dk.f32();
  float* dv_p = dv.f32();
  // D_i = dO_i . O_i for every query row, [B, H, Tq] like lse: the softmax-gradient correction
  // term, computed once here rather than in every block pair that needs it.
  std::vector<float> D = floats(a.B * a.H * a.Tq);

#pragma omp parallel if (a.worth_threads())
  {
    // Per-thread scratch, O(block * Dh).
    Blocks blocks(a);
    using Rows = typename Blocks::Rows;
    using Pairs = typename Blocks::Pairs;
    auto Q = zeros<Rows>(Blocks::rows_size(a, kBq)), dO = zeros<Rows>(Blocks::rows_size(a, kBq));  // [kBq, Dp]
    // The query block's q and dout as pair blocks, for dK and dV (a row block already is one on
    // the f32 path, which leaves these empty).
    auto Qp = zeros<Pairs>(Blocks::kPairsAreRows ? 0 : Blocks::pairs_size(a, kBq));
    auto dOp = zeros<Pairs>(Blocks::kPairsAreRows ? 0 : Blocks::pairs_size(a, kBq));
    auto Kt = zeros<typename Blocks::Keys>(Blocks::keys_size(a));  // k's key block, transposed
    auto Vt = zeros<typename Blocks::Keys>(Blocks::keys_size(a));  // v's key block, transposed
    auto K = zeros<Pairs>(Blocks::pairs_size(a, kBk));              // k's block as a pair block, for dQ
    std::vector<float> P = floats(kBq * kBk), dS = floats(kBq * kBk);    // [kBq, kBk]
    std::vector<float> Pt = floats(kBk * kBq), dSt = floats(kBk * kBq);  // [kBk, kBq]
    // dK and dV in pass 1 ([kBk, Dp] each), dQ in pass 2 ([kBq, Dp], in acc_a).
    std::vector<float> acc_a = floats(kB * Dp), acc_b = floats(kBk * Dp);
    std::vector<float> row_o = floats(Dh), row_do = floats(Dh);  // bf16 widening scratch of pass 0
    std::vector<int32_t> kseg(static_cast<size_t>(kBk));         // [kBk] key segments

    // The pair blocks of q and dout: the row blocks themselves where the layouts agree.
    const auto pairs_of = [](const auto& rows, const auto& pairs) -> const Pairs* {
      if constexpr (Blocks::kPairsAreRows)
        return rows.data();
      else
        return pairs.data();
    };
    const Pairs* q_pairs = pairs_of(Q, Qp);
    const Pairs* do_pairs = pairs_of(dO, dOp);

    // Loads the query block (b, h, rows i0..i0+nq): its rows of q and dout, and for pass 1 their
    // pair blocks too.
    auto load_query_block = [&](int64_t b, int64_t h, int64_t i0, int64_t nq, bool with_pairs) {
      blocks.load_rows(q, b, i0, nq, h, Q.data());
      blocks.load_rows(dout, b, i0, nq, h, dO.data());
      if (!Blocks::kPairsAreRows && with_pairs) {
        blocks.load_pairs(q, b, i0, nq, h, Qp.data());
        blocks.load_pairs(dout, b, i0, nq, h, dOp.data());
      }
    };

    // For the loaded query block (rows i0.., head h) against the loaded key block (Kt, Vt, kseg;
    // keys j0..j0+nk): P_ij, and dS_ij = P_ij (dP_ij - D_i), both zero where key j is masked.
    auto probs_and_dscores = [&](int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
      std::fill(P.begin(), P.end(), 0.0f);
      std::fill(dS.begin(), dS.end(), 0.0f);
      blocks.over_head(Q.data(), nq, Kt.data(), P.data());    // S = Q K^T
      blocks.over_head(dO.data(), nq, Vt.data(), dS.data());  // dP = dO V^T
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t qi = i0 + i, jmax = a.causal_limit(qi, j0, nk);
        const int32_t qs = a.query_segment(b, qi);
        const float row_lse = lse_p[(b * a.H + h) * a.Tq + qi], Di = D[(b * a.H + h) * a.Tq + qi];
        // A row with lse = -inf saw no key in the forward: it has no gradient.
        probs_and_dscores_row(&P[size_t(i * kBk)], &dS[size_t(i * kBk)], row_lse == kNegInf ? 0 : jmax, kseg.data(),
                              qs, scale, row_lse, Di);
      }
    };

    // Pass 0: D. The barrier at its end makes it complete before the passes that read it.
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < a.B * a.Tq; ++bt) {
      const int64_t b = bt / a.Tq, qi = bt % a.Tq;
      for (int64_t h = 0; h < a.H; ++h) {
        const int64_t r = bt * a.H + h;
        const float* dOi = row_f32(dout, r, Dh, row_do.data());
        const float* Oi = row_f32(out, r, Dh, row_o.data());
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < Dh; ++d) acc += dOi[d] * Oi[d];
        D[size_t((b * a.H + h) * a.Tq + qi)] = acc;
      }
    }

    // Pass 1: dK and dV. One task is one (batch, kv head, key block); it visits every query
    // block, of every query head of its group, that can see the key block. Pass 2 reads only
    // inputs, so a thread done with pass 1 goes straight on to it (nowait).
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < a.B * a.Hkv * nkb_all; ++task) {
      const int64_t kb = task % nkb_all, bg = task / nkb_all, b = bg / a.Hkv, g = bg % a.Hkv;
      const int64_t j0 = kb * kBk, nk = std::min(kBk, a.Tk - j0);
      blocks.load_keys(k, b, j0, nk, g, Kt.data());
      blocks.load_keys(v, b, j0, nk, g, Vt.data());
      a.key_segments(b, j0, nk, kseg.data());
      float* dK = acc_a.data();
      float* dV = acc_b.data();
      std::fill(acc_a.begin(), acc_a.end(), 0.0f);
      std::fill(acc_b.begin(), acc_b.end(), 0.0f);

      const int64_t first_q = std::max<int64_t>(0, j0 - a.off);  // the first query that reaches j0
      for (int64_t h = g * a.group; h < (g + 1) * a.group; ++h) {
        for (int64_t qb = first_q / kBq; qb < nqb; ++qb) {
          const int64_t i0 = qb * kBq, nq = std::min(kBq, a.Tq - i0);
          load_query_block(b, h, i0, nq, true);
          probs_and_dscores(b, h, i0, nq, j0, nk);
          transpose(P.data(), kBk, nq, nk, Pt.data(), kBq);
          transpose(dS.data(), kBk, nq, nk, dSt.data(), kBq);
          blocks.over_rows(Pt.data(), kBq, nk, nq, do_pairs, dV);  // dV += P^T dO
          blocks.over_rows(dSt.data(), kBq, nk, nq, q_pairs, dK);  // dK += dS^T Q (scaled below)
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t r = ((b * a.Tk + j0 + j) * a.Hkv + g) * Dh;
        for (int64_t d = 0; d < Dh; ++d) dk_p[r + d] = dK[j * Dp + d] * scale;
        std::memcpy(dv_p + r, dV + j * Dp, size_t(Dh) * sizeof(float));
      }
    }

    // Pass 2: dQ. One task is one (batch, head, query block) against its visible key blocks,
    // biggest first as in the forward.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < a.B * a.H * nqb; ++task) {
      const int64_t qb = nqb - 1 - task % nqb;
      const int64_t bh = task / nqb, b = bh / a.H, h = bh % a.H, g = h / a.group;
      const int64_t i0 = qb * kBq, nq = std::min(kBq, a.Tq - i0);
      load_query_block(b, h, i0, nq, false);
      float* dQ = acc_a.data();  // [kBq, Dp]
      std::fill(dQ, dQ + kBq * Dp, 0.0f);

      const int64_t nkb = a.visible_k_blocks(i0, nq);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBk, nk = std::min(kBk, a.Tk - j0);
        blocks.load_keys(k, b, j0, nk, g, Kt.data());
        blocks.load_keys(v, b, j0, nk, g, Vt.data());
        blocks.load_pairs(k, b, j0, nk, g, K.data());
        a.key_segments(b, j0, nk, kseg.data());
        probs_and_dscores(b, h, i0, nq, j0, nk);
        blocks.over_rows(dS.data(), kBk, nq, nk, K.data(), dQ);  // dQ += dS K (scaled below)
      }
      for (int64_t i = 0; i < nq; ++i) {
        float* dst = dq_p + ((b * a.Tq + i0 + i) * a.H + h) * Dh;
        for (int64_t d = 0; d < Dh; ++d) dst[d] = dQ[i * Dp + d] * scale;
      }
    }
  }
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& segment_ids, float scale) {
  forward(out, lse, q, k, v, Attn(q, k, segment_ids), scale);
}

void attention_forward_paged(const Tensor& out, const Tensor& lse, const Tensor& q, const std::vector<Tensor>& k_blocks,
                             const std::vector<Tensor>& v_blocks, int64_t Tk, float scale) {
  forward(out, lse, q, RowSource(k_blocks), RowSource(v_blocks), Attn(q, Tk, k_blocks.front().shape[1], Tensor{}),
          scale);
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& segment_ids, float scale) {
  const Attn a(q, k, segment_ids);
#if defined(__x86_64__)
  if (bf16_products(q, k, v)) return backward<Bf16Blocks>(dq, dk, dv, dout, q, k, v, out, lse, a, scale);
#endif
  backward<F32Blocks>(dq, dk, dv, dout, q, k, v, out, lse, a, scale);
}

}  // namespace shardlm::ops::cpu
