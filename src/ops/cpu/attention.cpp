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
// Every block loop is written so the innermost loop runs over a contiguous f32 row (keys of a
// transposed K/V block, or the Dh elements of a row) and vectorizes at -O3 without
// reassociating a reduction. BLAS is not called: OpenBLAS here is the pthread build and must not
// be entered from inside an OpenMP region.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/elem.h"

namespace shardlm::ops::cpu {

namespace {

constexpr int64_t kBq = 64;  // query rows per block
constexpr int64_t kBk = 64;  // keys per block (the transposed blocks are padded to this width)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Sizes and the mask, shared by all kernels.
struct Attn {
  int64_t B, Tq, Tk, H, Hkv, Dh;
  int64_t group;       // query heads per kv head
  int64_t off;         // Tk - Tq: query i sits at key position i + off
  const int32_t* seg;  // [B, Tk] or nullptr

  Attn(const Tensor& q, const Tensor& k, const Tensor& segment_ids)
      : B(q.shape[0]), Tq(q.shape[1]), Tk(k.shape[1]), H(q.shape[2]), Hkv(k.shape[2]), Dh(q.shape[3]),
        group(H / Hkv), off(Tk - Tq), seg(segment_ids.defined() ? segment_ids.i32() : nullptr) {}

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
  // Whether key j shares query qi's segment (always true without segment_ids).
  bool same_segment(int64_t b, int64_t qi, int64_t j) const {
    return seg == nullptr || seg[b * Tk + j] == seg[b * Tk + qi + off];
  }
};

// Copies rows [t0, t0 + n) of head h, batch b of a [B, T, heads, Dh] tensor into dst as f32
// (n rows of Dh, contiguous).
void load_rows(const Tensor& x, int64_t b, int64_t t0, int64_t n, int64_t h, float* dst) {
  const int64_t T = x.shape[1], heads = x.shape[2], Dh = x.shape[3];
  for (int64_t i = 0; i < n; ++i) {
    float* row = dst + i * Dh;
    const float* src = row_f32(x, (b * T + t0 + i) * heads + h, Dh, row);
    if (src != row) std::memcpy(row, src, size_t(Dh) * sizeof(float));
  }
}

// Copies keys [j0, j0 + n) of kv head h as a transposed block dst[d * kBk + j], zero-padded to
// kBk columns, so a query row's scores against the block are a sum of contiguous axpys.
void load_rows_transposed(const Tensor& x, int64_t b, int64_t j0, int64_t n, int64_t h, float* dst,
                          float* row_scratch) {
  const int64_t T = x.shape[1], heads = x.shape[2], Dh = x.shape[3];
  std::fill(dst, dst + Dh * kBk, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float* src = row_f32(x, (b * T + j0 + j) * heads + h, Dh, row_scratch);
    for (int64_t d = 0; d < Dh; ++d) dst[d * kBk + j] = src[d];
  }
}

// s[0, kBk) = x . block columns, for a transposed block from load_rows_transposed.
inline void row_times_block(const float* x, const float* block_t, int64_t Dh, float* s) {
  for (int64_t j = 0; j < kBk; ++j) s[j] = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) {
    const float xd = x[d];
    const float* col = block_t + d * kBk;
    for (int64_t j = 0; j < kBk; ++j) s[j] += xd * col[j];
  }
}

// y[0, n) += a * x[0, n).
inline void axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// D_i = dO_i . O_i for the nq rows of a block (the softmax-gradient correction term).
void row_dots(const float* dout, const float* out, int64_t nq, int64_t Dh, float* D) {
  for (int64_t i = 0; i < nq; ++i) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < Dh; ++d) acc += dout[i * Dh + d] * out[i * Dh + d];
    D[i] = acc;
  }
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& segment_ids, float scale) {
  const Attn a(q, k, segment_ids);
  const int64_t Dh = a.Dh, nqb = a.num_q_blocks();
  const int64_t tasks = a.B * a.H * nqb;
  float* lse_p = lse.f32();

  // One task is one (batch, head, query block). Later query blocks see more keys, so tasks are
  // handed out dynamically, biggest first.
#pragma omp parallel if (a.worth_threads())
  {
    // Per-thread scratch, O(block * Dh).
    const size_t q_block = size_t(kBq * Dh), k_block = size_t(kBk * Dh);
    std::vector<float> Q(q_block), acc(q_block), Kt(k_block), V(k_block);
    std::vector<float> row(static_cast<size_t>(Dh)), s(static_cast<size_t>(kBk));
    std::vector<float> m(static_cast<size_t>(kBq)), l(static_cast<size_t>(kBq));

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t qb = nqb - 1 - task % nqb;
      const int64_t bh = task / nqb, b = bh / a.H, h = bh % a.H, g = h / a.group;
      const int64_t i0 = qb * kBq, nq = std::min(kBq, a.Tq - i0);

      load_rows(q, b, i0, nq, h, Q.data());
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);

      const int64_t nkb = a.visible_k_blocks(i0, nq);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBk, nk = std::min(kBk, a.Tk - j0);
        load_rows_transposed(k, b, j0, nk, g, Kt.data(), row.data());
        load_rows(v, b, j0, nk, g, V.data());

        for (int64_t i = 0; i < nq; ++i) {
          const int64_t qi = i0 + i;
          const int64_t jmax = a.causal_limit(qi, j0, nk);
          if (jmax <= 0) continue;  // this block lies wholly after query qi
          row_times_block(&Q[size_t(i * Dh)], Kt.data(), Dh, s.data());

          float block_max = kNegInf;
          for (int64_t j = 0; j < jmax; ++j) {
            s[j] = a.same_segment(b, qi, j0 + j) ? s[j] * scale : kNegInf;
            block_max = std::max(block_max, s[j]);
          }
          // Nothing visible here (another segment): leave the row's state alone; rescaling by
          // exp(-inf - -inf) would make it NaN.
          if (block_max == kNegInf) continue;

          // Online softmax: move the row to the new max, then add this block's terms.
          const float m_new = std::max(m[i], block_max);
          const float alpha = std::exp(m[i] - m_new);  // 0 on the row's first visible block
          float* acc_i = &acc[size_t(i * Dh)];
          if (alpha != 1.0f)
            for (int64_t d = 0; d < Dh; ++d) acc_i[d] *= alpha;
          float sum = l[i] * alpha;
          for (int64_t j = 0; j < jmax; ++j) {
            const float p = std::exp(s[j] - m_new);  // exactly 0 for masked keys
            if (p == 0.0f) continue;
            sum += p;
            axpy(acc_i, p, &V[size_t(j * Dh)], Dh);
          }
          l[i] = sum;
          m[i] = m_new;
        }
      }

      // Normalize. A row with no visible key (impossible: a query always sees itself) would get
      // out = 0 and lse = -inf rather than 0/0.
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t qi = i0 + i;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        float* acc_i = &acc[size_t(i * Dh)];
        for (int64_t d = 0; d < Dh; ++d) acc_i[d] *= inv;
        store_row(out, (b * a.Tq + qi) * a.H + h, Dh, acc_i);
        lse_p[(b * a.H + h) * a.Tq + qi] = l[i] > 0.0f ? m[i] + std::log(l[i]) : kNegInf;
      }
    }
  }
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& segment_ids, float scale) {
  const Attn a(q, k, segment_ids);
  const int64_t Dh = a.Dh, nqb = a.num_q_blocks(), nkb_all = a.num_k_blocks();
  const float* lse_p = lse.f32();
  float* dq_p = dq.f32();
  float* dk_p = dk.f32();
  float* dv_p = dv.f32();

#pragma omp parallel if (a.worth_threads())
  {
    // Per-thread scratch, O(block * Dh).
    const size_t q_block = size_t(kBq * Dh), k_block = size_t(kBk * Dh);
    std::vector<float> Q(q_block), dO(q_block), O(q_block), D(static_cast<size_t>(kBq));
    std::vector<float> Kt(k_block), Vt(k_block), K(k_block);
    // dK and dV in pass 1, dQ (in acc_a) in pass 2.
    std::vector<float> acc_a(std::max(q_block, k_block)), acc_b(k_block);
    std::vector<float> row(static_cast<size_t>(Dh)), s(static_cast<size_t>(kBk)), dp(static_cast<size_t>(kBk));

    // Loads query block (b, h, i0..i0+nq) with its dO, lse, and D = rowsum(dO * O).
    auto load_query_block = [&](int64_t b, int64_t h, int64_t i0, int64_t nq) {
      load_rows(q, b, i0, nq, h, Q.data());
      load_rows(dout, b, i0, nq, h, dO.data());
      load_rows(out, b, i0, nq, h, O.data());
      row_dots(dO.data(), O.data(), nq, Dh, D.data());
    };

    // For query row i (global index qi) of the loaded query block against the loaded key block
    // starting at j0: fills s with P_ij and dp with dS_ij for j < the returned count, which is
    // 0 when the row sees none of these keys.
    auto probs_and_dscores = [&](int64_t b, int64_t i, int64_t qi, int64_t j0, int64_t nk, float row_lse) {
      const int64_t jmax = a.causal_limit(qi, j0, nk);
      if (jmax <= 0 || row_lse == kNegInf) return int64_t(0);
      row_times_block(&Q[size_t(i * Dh)], Kt.data(), Dh, s.data());
      row_times_block(&dO[size_t(i * Dh)], Vt.data(), Dh, dp.data());
      for (int64_t j = 0; j < jmax; ++j) {
        const float p = a.same_segment(b, qi, j0 + j) ? std::exp(s[j] * scale - row_lse) : 0.0f;
        s[j] = p;
        dp[j] = p * (dp[j] - D[size_t(i)]);
      }
      return jmax;
    };

    // Pass 1: dK and dV. One task is one (batch, kv head, key block); it visits every query
    // block, of every query head of its group, that can see the key block. Pass 2 reads only
    // inputs, so a thread done with pass 1 goes straight on to it (nowait).
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < a.B * a.Hkv * nkb_all; ++task) {
      const int64_t kb = task % nkb_all, bg = task / nkb_all, b = bg / a.Hkv, g = bg % a.Hkv;
      const int64_t j0 = kb * kBk, nk = std::min(kBk, a.Tk - j0);
      load_rows_transposed(k, b, j0, nk, g, Kt.data(), row.data());
      load_rows_transposed(v, b, j0, nk, g, Vt.data(), row.data());
      float* dK = acc_a.data();
      float* dV = acc_b.data();
      std::fill(acc_a.begin(), acc_a.end(), 0.0f);
      std::fill(acc_b.begin(), acc_b.end(), 0.0f);

      const int64_t first_q = std::max<int64_t>(0, j0 - a.off);  // the first query that reaches j0
      for (int64_t h = g * a.group; h < (g + 1) * a.group; ++h) {
        for (int64_t qb = first_q / kBq; qb < nqb; ++qb) {
          const int64_t i0 = qb * kBq, nq = std::min(kBq, a.Tq - i0);
          load_query_block(b, h, i0, nq);
          for (int64_t i = 0; i < nq; ++i) {
            const int64_t qi = i0 + i;
            const int64_t n = probs_and_dscores(b, i, qi, j0, nk, lse_p[(b * a.H + h) * a.Tq + qi]);
            const float* Qi = &Q[size_t(i * Dh)];
            const float* dOi = &dO[size_t(i * Dh)];
            for (int64_t j = 0; j < n; ++j) {
              if (s[j] == 0.0f) continue;  // masked (or underflowed): contributes nothing
              axpy(dV + j * Dh, s[j], dOi, Dh);
              axpy(dK + j * Dh, dp[j] * scale, Qi, Dh);
            }
          }
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t r = ((b * a.Tk + j0 + j) * a.Hkv + g) * Dh;
        std::memcpy(dk_p + r, dK + j * Dh, size_t(Dh) * sizeof(float));
        std::memcpy(dv_p + r, dV + j * Dh, size_t(Dh) * sizeof(float));
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
      float* dQ = acc_a.data();  // kBq x Dh
      std::fill(dQ, dQ + kBq * Dh, 0.0f);

      const int64_t nkb = a.visible_k_blocks(i0, nq);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t j0 = kb * kBk, nk = std::min(kBk, a.Tk - j0);
        load_rows_transposed(k, b, j0, nk, g, Kt.data(), row.data());
        load_rows_transposed(v, b, j0, nk, g, Vt.data(), row.data());
        load_rows(k, b, j0, nk, g, K.data());
        for (int64_t i = 0; i < nq; ++i) {
          const int64_t qi = i0 + i;
          const int64_t n = probs_and_dscores(b, i, qi, j0, nk, lse_p[(b * a.H + h) * a.Tq + qi]);
          float* dQi = dQ + i * Dh;
          for (int64_t j = 0; j < n; ++j)
            if (dp[j] != 0.0f) axpy(dQi, dp[j], &K[size_t(j * Dh)], Dh);
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        float* dst = dq_p + ((b * a.Tq + i0 + i) * a.H + h) * Dh;
        for (int64_t d = 0; d < Dh; ++d) dst[d] = dQ[i * Dh + d] * scale;
      }
    }
  }
}

}  // namespace shardlm::ops::cpu
