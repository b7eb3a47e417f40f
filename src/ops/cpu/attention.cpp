// Causal grouped-query attention on the CPU, FlashAttention style.
//
// The T x T score matrix never exists. Queries are processed kBq rows at a time against keys
// kBk at a time; each query row keeps a running max m and a running sum l of exp(s - m)
// (the "online softmax"), rescaling its output accumulator whenever m grows. Scratch is a few
// blocks of kBq x Dh / kBk x Dh floats per thread, so memory is O(block * Dh) on top of the
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
// All the arithmetic of a block pair is small matrix products (block_matmul: S = Q K^T,
// O += P V, dP = dO V^T, dV += P^T dO, dK += dS^T Q, dQ += dS K) on f32 blocks copied out of the
// tensors, each computed from a register tile of accumulators; the softmax between them runs over
// contiguous rows of kBk scores with a vectorized exp. Block rows are padded with zeros to Dp, a
// whole number of vectors, which leaves every product unchanged. BLAS is not called: OpenBLAS
// here is the pthread build and must not be entered from inside an OpenMP region, and its
// per-call overhead is large beside a 64 x 64 block.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/vec_math.h"

namespace shardlm::ops::cpu {

namespace {

constexpr int64_t kBq = 64;  // query rows per block
constexpr int64_t kBk = 64;  // keys per block (score rows are kBk wide, padded past the last key)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
static_assert(kBk % kLanes == 0 && kBq % kLanes == 0, "blocks must be whole vectors wide");

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

// dst[j][i] = src[i][j] for i < rows, j < cols (a block of scores, for the products with P^T).
void transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ld_dst + i] = src[i * ld_src + j];
}

// Sizes and the mask, shared by all kernels.
struct Attn {
  int64_t B, Tq, Tk, H, Hkv, Dh;
  int64_t Dp;          // Dh rounded up to whole vectors: the row length of every block
  int64_t group;       // query heads per kv head
  int64_t off;         // Tk - Tq: query i sits at key position i + off
  const int32_t* seg;  // [B, Tk] or nullptr

  Attn(const Tensor& q, int64_t Tk_, int64_t Hkv_, const Tensor& segment_ids)
      : B(q.shape[0]), Tq(q.shape[1]), Tk(Tk_), H(q.shape[2]), Hkv(Hkv_), Dh(q.shape[3]),
        Dp((Dh + kLanes - 1) / kLanes * kLanes), group(H / Hkv), off(Tk - Tq),
        seg(segment_ids.defined() ? segment_ids.i32() : nullptr) {}
  Attn(const Tensor& q, const Tensor& k, const Tensor& segment_ids) : Attn(q, k.shape[1], k.shape[2], segment_ids) {}

  int64_t num_q_blocks() const { return (Tq + kBq - 1) / kBq; }
  int64_t num_k_blocks() const { return (Tk + kBk - 1) / kBk; }
  // Whether the problem is big enough to pay for a parallel region: about a million
  // multiply-adds of causal scores (a fraction of a millisecond serially). Small calls, such as
  // the thousands a finite-difference check makes, stay serial, which also spares them
  // OpenMP's barrier spinning when the cores are oversubscribed.
  bool worth_threads() const { return B * H * Tq * Tk / 2 * Dh >= (int64_t(1) << 20); }
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

  // Position t, head h of batch row b, Dh values as f32 (the row itself, or widened into scratch).
  const float* row(int64_t b, int64_t t, int64_t h, int64_t Dh, float* scratch) const {
    if (whole) return row_f32(*whole, (b * whole->shape[1] + t) * whole->shape[2] + h, Dh, scratch);
    const Tensor& blk = (*blocks)[size_t(t / block)];
    return row_f32(blk, (t % block) * blk.shape[1] + h, Dh, scratch);
  }
};

// Copies rows [t0, t0 + n) of head h, batch b into dst as f32: n rows of Dp, zero past Dh. Always a
// copy, even of f32 rows: in the tensor, a head's rows lie heads * Dh floats apart, a power of two
// in practice, so a block of them would fall into a few L1 cache sets and evict itself while the
// block products reuse it.
void load_rows(const RowSource& x, int64_t b, int64_t t0, int64_t n, int64_t h, int64_t Dh, int64_t Dp, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = dst + i * Dp;
    const float* src = x.row(b, t0 + i, h, Dh, row);
    if (src != row) std::memcpy(row, src, size_t(Dh) * sizeof(float));
    std::fill(row + Dh, row + Dp, 0.0f);
  }
}

// Copies keys [j0, j0 + n) of kv head h as a transposed block dst[d * kBk + j] (Dh rows of kBk),
// zero past key n, so that a block of rows times it is block_matmul's B.
void load_rows_transposed(const RowSource& x, int64_t b, int64_t j0, int64_t n, int64_t h, int64_t Dh, float* dst,
                          float* row_scratch) {
  if (n < kBk)  // a partial block: the keys past n are zero (a full one overwrites every column)
    for (int64_t d = 0; d < Dh; ++d) std::fill(dst + d * kBk + n, dst + (d + 1) * kBk, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float* src = x.row(b, j0 + j, h, Dh, row_scratch);
    for (int64_t d = 0; d < Dh; ++d) dst[d * kBk + j] = src[d];
  }
}

std::vector<float> floats(int64_t n) { return std::vector<float>(static_cast<size_t>(n)); }

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

}  // namespace

namespace {
// The forward over keys and values from k and v (tensors, or the blocks of a paged cache).
void forward(const Tensor& out, const Tensor& lse, const Tensor& q, const RowSource& k, const RowSource& v,
             const Attn& a, float scale) {
  const int64_t Dh = a.Dh, Dp = a.Dp, nqb = a.num_q_blocks();
  const int64_t tasks = a.B * a.H * nqb;
  float* lse_p = lse.f32();

  // One task is one (batch, head, query block). Later query blocks see more keys, so tasks are
  // handed out dynamically, biggest first.
  parallel_region(a.worth_threads(), [&] {
    // Per-thread scratch, O(block * Dh).
    std::vector<float> Q = floats(kBq * Dp);    // [kBq, Dp] the query block
    std::vector<float> acc = floats(kBq * Dp);  // [kBq, Dp] unnormalized output
    std::vector<float> Kt = floats(Dh * kBk);   // [Dh, kBk] the key block, transposed
    std::vector<float> V = floats(kBk * Dp);    // [kBk, Dp] the value block
    std::vector<float> S = floats(kBq * kBk);   // [kBq, kBk] scores, then probabilities
    std::vector<float> m = floats(kBq), l = floats(kBq);  // [kBq] running max and sum
    std::vector<float> row = floats(Dh);                   // bf16 widening scratch
    std::vector<int32_t> kseg(static_cast<size_t>(kBk));  // [kBk] key segments

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t qb = nqb - 1 - task % nqb;
      const int64_t bh = task / nqb, b = bh / a.H, h = bh % a.H, g = h / a.group;
      const int64_t i0 = qb * kBq, nq = std::min(kBq, a.Tq - i0);

      // Only the block's nq rows are used (a decode step has one): block_matmul reads and writes
      // rows [0, nq) alone, so the others are never cleared.
      load_rows(q, b, i0, nq, h, Dh, Dp, Q.data());
      std::fill(acc.begin(), acc.begin() + nq * Dp, 0.0f);
      std::fill(m.begin(), m.begin() + nq, kNegInf);
      std::fill(l.begin(), l.begin() + nq, 0.0f);

      const int64_t nkb = a.visible_k_blocks(i0, nq);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBk, nk = std::min(kBk, a.Tk - j0);
        load_rows_transposed(k, b, j0, nk, g, Dh, Kt.data(), row.data());
        load_rows(v, b, j0, nk, g, Dh, Dp, V.data());
        a.key_segments(b, j0, nk, kseg.data());

        std::fill(S.begin(), S.begin() + nq * kBk, 0.0f);
        block_matmul(Q.data(), Dp, nq, Dh, Kt.data(), kBk, kBk, S.data(), kBk);  // S = Q K^T

        for (int64_t i = 0; i < nq; ++i) {
          const int64_t qi = i0 + i, jmax = a.causal_limit(qi, j0, nk);
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
        block_matmul(S.data(), kBk, nq, nk, V.data(), Dp, Dp, acc.data(), Dp);  // acc += P V
      }

      // Normalize. A row with no visible key (impossible: a query always sees itself) would get
      // out = 0 and lse = -inf rather than 0/0.
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t qi = i0 + i;
        const float inv = l[size_t(i)] > 0.0f ? 1.0f / l[size_t(i)] : 0.0f;
        float* acc_i = &acc[size_t(i * Dp)];
        for (int64_t d = 0; d < Dh; ++d) acc_i[d] *= inv;
        store_row(out, (b * a.Tq + qi) * a.H + h, Dh, acc_i);
        lse_p[(b * a.H + h) * a.Tq + qi] = l[size_t(i)] > 0.0f ? m[size_t(i)] + std::log(l[size_t(i)]) : kNegInf;
      }
    }
  });
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
    std::vector<float> Q = floats(kBq * Dp), dO = floats(kBq * Dp);        // [kBq, Dp]
    std::vector<float> Kt = floats(Dh * kBk), Vt = floats(Dh * kBk);       // [Dh, kBk]
    std::vector<float> K = floats(kBk * Dp);                               // [kBk, Dp]
    std::vector<float> P = floats(kBq * kBk), dS = floats(kBq * kBk);      // [kBq, kBk]
    std::vector<float> Pt = floats(kBk * kBq), dSt = floats(kBk * kBq);    // [kBk, kBq]
    // dK and dV in pass 1 ([kBk, Dp] each), dQ in pass 2 ([kBq, Dp], in acc_a).
    std::vector<float> acc_a = floats(std::max(kBq, kBk) * Dp), acc_b = floats(kBk * Dp);
    std::vector<float> row = floats(Dh);  // bf16 widening scratch
    std::vector<int32_t> kseg(static_cast<size_t>(kBk));  // [kBk] key segments

    // Loads the query block (b, h, rows i0..i0+nq): its rows of q and dout.
    auto load_query_block = [&](int64_t b, int64_t h, int64_t i0, int64_t nq) {
      load_rows(q, b, i0, nq, h, Dh, Dp, Q.data());
      load_rows(dout, b, i0, nq, h, Dh, Dp, dO.data());
    };

    // For the loaded query block (rows i0.., head h) against the loaded key block (Kt, Vt, kseg;
    // keys j0..j0+nk): P_ij, and dS_ij = P_ij (dP_ij - D_i), both zero where key j is masked.
    auto probs_and_dscores = [&](int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
      std::fill(P.begin(), P.end(), 0.0f);
      std::fill(dS.begin(), dS.end(), 0.0f);
      block_matmul(Q.data(), Dp, nq, Dh, Kt.data(), kBk, kBk, P.data(), kBk);    // S = Q K^T
      block_matmul(dO.data(), Dp, nq, Dh, Vt.data(), kBk, kBk, dS.data(), kBk);  // dP = dO V^T
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
        const float* dOi = row_f32(dout, r, Dh, row.data());
        const float* Oi = row_f32(out, r, Dh, K.data());  // K is free until pass 2
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
      load_rows_transposed(k, b, j0, nk, g, Dh, Kt.data(), row.data());
      load_rows_transposed(v, b, j0, nk, g, Dh, Vt.data(), row.data());
      a.key_segments(b, j0, nk, kseg.data());
      float* dK = acc_a.data();
      float* dV = acc_b.data();
      std::fill(acc_a.begin(), acc_a.end(), 0.0f);
      std::fill(acc_b.begin(), acc_b.end(), 0.0f);

      const int64_t first_q = std::max<int64_t>(0, j0 - a.off);  // the first query that reaches j0
      for (int64_t h = g * a.group; h < (g + 1) * a.group; ++h) {
        for (int64_t qb = first_q / kBq; qb < nqb; ++qb) {
          const int64_t i0 = qb * kBq, nq = std::min(kBq, a.Tq - i0);
          load_query_block(b, h, i0, nq);
          probs_and_dscores(b, h, i0, nq, j0, nk);
          transpose(P.data(), kBk, nq, nk, Pt.data(), kBq);
          transpose(dS.data(), kBk, nq, nk, dSt.data(), kBq);
          block_matmul(Pt.data(), kBq, nk, nq, dO.data(), Dp, Dp, dV, Dp);  // dV += P^T dO
          block_matmul(dSt.data(), kBq, nk, nq, Q.data(), Dp, Dp, dK, Dp);  // dK += dS^T Q (scaled below)
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
      load_query_block(b, h, i0, nq);
      float* dQ = acc_a.data();  // [kBq, Dp]
      std::fill(dQ, dQ + kBq * Dp, 0.0f);

      const int64_t nkb = a.visible_k_blocks(i0, nq);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBk, nk = std::min(kBk, a.Tk - j0);
        load_rows_transposed(k, b, j0, nk, g, Dh, Kt.data(), row.data());
        load_rows_transposed(v, b, j0, nk, g, Dh, Vt.data(), row.data());
        load_rows(k, b, j0, nk, g, Dh, Dp, K.data());
        a.key_segments(b, j0, nk, kseg.data());
        probs_and_dscores(b, h, i0, nq, j0, nk);
        block_matmul(dS.data(), kBk, nq, nk, K.data(), Dp, Dp, dQ, Dp);  // dQ += dS K (scaled below)
      }
      for (int64_t i = 0; i < nq; ++i) {
        float* dst = dq_p + ((b * a.Tq + i0 + i) * a.H + h) * Dh;
        for (int64_t d = 0; d < Dh; ++d) dst[d] = dQ[i * Dp + d] * scale;
      }
    }
  }
}

}  // namespace shardlm::ops::cpu
