// Causal grouped-query attention on the GPU, FlashAttention style, on CUDA cores in f32.
//
// Layout of work. A thread block has 4 warps; each warp owns 4 rows (query rows in the forward
// and the dQ kernel, key rows in the dK/dV kernel), so a block owns 16 rows. The other side is
// streamed through shared memory 32 rows at a time, one row per lane: lane j computes the score
// of its key (or query) against each of the warp's rows, the warp combines the 32 scores with
// shuffles, and for the output accumulations each lane owns head dimensions d = lane + 32 c,
// c < NC (so head_dim <= 32 * NC, at most 256). Per-row state (accumulators, running max and
// sum) lives in registers, tiles in shared memory as f32 with a row stride of
// round_up(Dh, 32) + 1 floats, which makes lane-per-row reads conflict-free for any Dh.
//
// Memory is O(T * Dh): no T x T matrix exists. f32 and bf16 inputs are widened to f32 on load;
// all arithmetic and accumulation is f32.
//
// Forward: the online softmax. For each query row, a running max m and sum l of exp(s - m); on
// each key tile the accumulator is rescaled by exp(m_old - m_new). out = acc / l and
// lse = m + log(l) are written at the end. The paged forward (generation's KV cache) is the same
// kernel reading its key and value tiles through a block table (Attn::k_pages).
//
// Backward (FlashAttention-2, recomputing P from lse; D_i = dO_i . O_i precomputed):
//   P_ij = exp(scale q_i.k_j - lse_i),  dP_ij = dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i)
//   dQ_i = scale sum_j dS_ij k_j       (kernel 1: a block owns 16 queries of one head)
//   dK_j = scale sum_i dS_ij q_i, dV_j = sum_i P_ij dO_i
//                                      (kernel 2: a block owns 16 keys of one kv head and walks
//                                       every query of every query head of its group)
// Each output element is written by exactly one thread: no atomics, deterministic, and dq, dk
// and dv are written (not accumulated), as ops.h says.
//
// Masking: query i sits at key position i + (Tk - Tq); key j is visible to it iff
// j <= i + Tk - Tq and, with segment_ids, the two positions share a segment. Key tiles past the
// last visible key of a block are not visited. A row that sees no key would get out = 0,
// lse = -inf, and is skipped in the backward (cannot happen: a query always sees itself).
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace shardlm::ops::gpu {

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // rows a block owns
constexpr int kTile = 32;                     // rows streamed per step: one per lane
constexpr int kBlockThreads = kWarps * 32;
constexpr int kMaxHeadDim = 256;

struct Attn {
  const void* q;
  const void* k;
  const void* v;
  DType qt, kt, vt;
  int64_t B, Tq, Tk, H, Hkv, group, off;
  int Dh;
  int P;  // shared-memory row stride in floats
  const int32_t* seg;  // [B, Tk] or nullptr
  float scale;
  // Paged keys and values (attention_forward_paged; B = 1): position t in row t % page of block
  // t / page, each block [page, Hkv, Dh]; k_pages[i], v_pages[i] its base (a device array). Null:
  // k and v are whole [B, Tk, Hkv, Dh] tensors.
  const void* const* k_pages = nullptr;
  const void* const* v_pages = nullptr;
  int64_t page = 0;
};

// Whether key j is visible to query qi of batch row b (both in range).
__device__ __forceinline__ bool visible(const Attn& a, int64_t b, int64_t qi, int64_t j) {
  if (j > qi + a.off) return false;
  return a.seg == nullptr || a.seg[b * a.Tk + j] == a.seg[b * a.Tk + qi + a.off];
}

// Rows [t0, t0 + n) of head h, batch b of a [B, T, heads, Dh] tensor into shared memory as f32
// (row stride P); rows at or past T are zero. Called by all threads of the block.
__device__ void load_tile(float* dst, int P, const void* src, DType t, int64_t b, int64_t T, int64_t heads,
                          int64_t h, int Dh, int64_t t0, int n) {
  for (int e = threadIdx.x; e < n * Dh; e += blockDim.x) {
    const int r = e / Dh, d = e % Dh;
    const int64_t tt = t0 + r;
    dst[r * P + d] = tt < T ? load(src, t, ((b * T + tt) * heads + h) * Dh + d) : 0.0f;
  }
}

// Rows [t0, t0 + kTile) of kv head g, batch b of the keys (or values: `pages`, `whole`) into shared
// memory, from whole tensors or from a paged cache's blocks. Rows at or past Tk are zero.
__device__ void load_kv_tile(float* dst, const Attn& a, const void* whole, const void* const* pages, DType t,
                             int64_t b, int64_t g, int64_t t0) {
  if (pages == nullptr) return load_tile(dst, a.P, whole, t, b, a.Tk, a.Hkv, g, a.Dh, t0, kTile);
  for (int e = threadIdx.x; e < kTile * a.Dh; e += blockDim.x) {
    const int r = e / a.Dh, d = e % a.Dh;
    const int64_t tt = t0 + r;
    dst[r * a.P + d] = tt < a.Tk ? load(pages[tt / a.page], t, ((tt % a.page) * a.Hkv + g) * a.Dh + d) : 0.0f;
  }
}

// acc[c] += coef_jj * S[jj * P + lane + 32 c] for the kTile rows jj of a shared tile, where lane jj
// holds coef_jj: the "probabilities (or their gradients) times a tile" step of both kernels.
template <int NC>
__device__ __forceinline__ void accumulate_tile(float (&acc)[NC], float coef, const float* S, int P, int Dh, int lane) {
  for (int jj = 0; jj < kTile; ++jj) {
    const float cj = __shfl_sync(0xffffffffu, coef, jj);
    if (cj == 0.0f) continue;  // warp-uniform
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < Dh) acc[c] += cj * S[jj * P + d];
    }
  }
}

__device__ __forceinline__ float dot_shared(const float* x, const float* y, int Dh) {
  float s = 0.0f;
  for (int d = 0; d < Dh; ++d) s += x[d] * y[d];
  return s;
}

template <int NC>
__global__ void __launch_bounds__(kBlockThreads) attn_forward_kernel(Attn a, void* out, DType ot, float* lse) {
  extern __shared__ float smem[];
  const int P = a.P, Dh = a.Dh;
  float* Qs = smem;              // kRows x P
  float* Ks = Qs + kRows * P;    // kTile x P
  float* Vs = Ks + kTile * P;    // kTile x P

  const int64_t nqt = (a.Tq + kRows - 1) / kRows;
  const int64_t qtile = nqt - 1 - int64_t(blockIdx.x) % nqt;  // longest rows first
  const int64_t bh = int64_t(blockIdx.x) / nqt, b = bh / a.H, h = bh % a.H, g = h / a.group;
  const int64_t i0 = qtile * kRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  load_tile(Qs, P, a.q, a.qt, b, a.Tq, a.H, h, Dh, i0, kRows);

  float acc[kRowsPerWarp][NC];
  float m[kRowsPerWarp], l[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
  }

  const int64_t last_q = min(i0 + kRows, a.Tq) - 1;
  const int64_t key_end = min(a.Tk, last_q + a.off + 1);  // no row of the block sees a key past this
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous tile is no longer read (and Qs is complete on the first pass)
    load_kv_tile(Ks, a, a.k, a.k_pages, a.kt, b, g, j0);
    load_kv_tile(Vs, a, a.v, a.v_pages, a.vt, b, g, j0);
    __syncthreads();
    const int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const int64_t qi = i0 + row;
      const bool vis = qi < a.Tq && j < a.Tk && visible(a, b, qi, j);
      const float s = vis ? dot_shared(Qs + row * P, Ks + lane * P, Dh) * a.scale : -INFINITY;
      const float tile_max = warp_max(s);  // the same in every lane, so the branch is warp-uniform
      if (tile_max == -INFINITY) continue;  // nothing visible: leave the row's state alone
      const float m_new = fmaxf(m[r], tile_max);
      const float alpha = expf(m[r] - m_new);  // 0 on the row's first visible tile
      const float p = vis ? expf(s - m_new) : 0.0f;
      l[r] = l[r] * alpha + warp_sum(p);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < NC; ++c) acc[r][c] *= alpha;
      accumulate_tile(acc[r], p, Vs, P, Dh, lane);
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = i0 + warp * kRowsPerWarp + r;
    if (qi >= a.Tq) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int64_t base = ((b * a.Tq + qi) * a.H + h) * Dh;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < Dh) store(out, ot, base + d, acc[r][c] * inv);
    }
    if (lane == 0) lse[(b * a.H + h) * a.Tq + qi] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

// D[(b * H + h) * Tq + i] = dout[b, i, h, :] . out[b, i, h, :], one warp per row.
__global__ void attn_rowdot_kernel(const void* dout, DType dt, const void* out, DType ot, float* D, int64_t B,
                                   int64_t Tq, int64_t H, int Dh) {
  const int64_t rows = B * Tq * H;
  const int lane = threadIdx.x % 32;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < rows;
       w += int64_t(gridDim.x) * blockDim.x / 32) {
    float s = 0.0f;
    for (int d = lane; d < Dh; d += 32) s += load(dout, dt, w * Dh + d) * load(out, ot, w * Dh + d);
    s = warp_sum(s);
    const int64_t h = w % H, bi = w / H, i = bi % Tq, b = bi / Tq;
    if (lane == 0) D[(b * H + h) * Tq + i] = s;
  }
}

template <int NC>
__global__ void __launch_bounds__(kBlockThreads)
    attn_dq_kernel(Attn a, const void* dout, DType dt, const float* lse, const float* Dvec, float* dq) {
  extern __shared__ float smem[];
  const int P = a.P, Dh = a.Dh;
  float* Qs = smem;               // kRows x P
  float* dOs = Qs + kRows * P;    // kRows x P
  float* Ks = dOs + kRows * P;    // kTile x P
  float* Vs = Ks + kTile * P;     // kTile x P

  const int64_t nqt = (a.Tq + kRows - 1) / kRows;
  const int64_t qtile = nqt - 1 - int64_t(blockIdx.x) % nqt;
  const int64_t bh = int64_t(blockIdx.x) / nqt, b = bh / a.H, h = bh % a.H, g = h / a.group;
  const int64_t i0 = qtile * kRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  load_tile(Qs, P, a.q, a.qt, b, a.Tq, a.H, h, Dh, i0, kRows);
  load_tile(dOs, P, dout, dt, b, a.Tq, a.H, h, Dh, i0, kRows);

  float acc[kRowsPerWarp][NC];
  float row_lse[kRowsPerWarp], row_D[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = i0 + warp * kRowsPerWarp + r;
    row_lse[r] = qi < a.Tq ? lse[(b * a.H + h) * a.Tq + qi] : -INFINITY;
    row_D[r] = qi < a.Tq ? Dvec[(b * a.H + h) * a.Tq + qi] : 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
  }

  const int64_t last_q = min(i0 + kRows, a.Tq) - 1;
  const int64_t key_end = min(a.Tk, last_q + a.off + 1);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();
    load_kv_tile(Ks, a, a.k, a.k_pages, a.kt, b, g, j0);
    load_kv_tile(Vs, a, a.v, a.v_pages, a.vt, b, g, j0);
    __syncthreads();
    const int64_t j = j0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int row = warp * kRowsPerWarp + r;
      const int64_t qi = i0 + row;
      const bool vis = qi < a.Tq && j < a.Tk && row_lse[r] != -INFINITY && visible(a, b, qi, j);
      float ds = 0.0f;
      if (vis) {
        const float p = expf(dot_shared(Qs + row * P, Ks + lane * P, Dh) * a.scale - row_lse[r]);
        ds = p * (dot_shared(dOs + row * P, Vs + lane * P, Dh) - row_D[r]);
      }
      accumulate_tile(acc[r], ds, Ks, P, Dh, lane);
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = i0 + warp * kRowsPerWarp + r;
    if (qi >= a.Tq) continue;
    float* dst = dq + ((b * a.Tq + qi) * a.H + h) * Dh;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < Dh) dst[d] = acc[r][c] * a.scale;
    }
  }
}

template <int NC>
__global__ void __launch_bounds__(kBlockThreads) attn_dkdv_kernel(Attn a, const void* dout, DType dt,
                                                                  const float* lse, const float* Dvec, float* dk,
                                                                  float* dv) {
  extern __shared__ float smem[];
  const int P = a.P, Dh = a.Dh;
  float* Ks = smem;                  // kRows x P   (the block's keys)
  float* Vs = Ks + kRows * P;        // kRows x P
  float* Qs = Vs + kRows * P;        // kTile x P   (streamed queries)
  float* dOs = Qs + kTile * P;       // kTile x P
  float* lse_s = dOs + kTile * P;    // kTile
  float* D_s = lse_s + kTile;        // kTile

  const int64_t nkt = (a.Tk + kRows - 1) / kRows;
  const int64_t ktile = int64_t(blockIdx.x) % nkt;
  const int64_t bg = int64_t(blockIdx.x) / nkt, b = bg / a.Hkv, g = bg % a.Hkv;
  const int64_t j0 = ktile * kRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  load_tile(Ks, P, a.k, a.kt, b, a.Tk, a.Hkv, g, Dh, j0, kRows);
  load_tile(Vs, P, a.v, a.vt, b, a.Tk, a.Hkv, g, Dh, j0, kRows);

  float dk_acc[kRowsPerWarp][NC], dv_acc[kRowsPerWarp][NC];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) dk_acc[r][c] = dv_acc[r][c] = 0.0f;

  // Query qi sees key j only if j <= qi + off: earlier queries see none of this block's keys.
  const int64_t first_q = j0 - a.off > 0 ? j0 - a.off : 0;
  for (int64_t h = g * a.group; h < (g + 1) * a.group; ++h) {
    for (int64_t i0 = first_q; i0 < a.Tq; i0 += kTile) {
      __syncthreads();  // the previous query tile is no longer read (and Ks, Vs are complete)
      load_tile(Qs, P, a.q, a.qt, b, a.Tq, a.H, h, Dh, i0, kTile);
      load_tile(dOs, P, dout, dt, b, a.Tq, a.H, h, Dh, i0, kTile);
      if (threadIdx.x < kTile) {
        const int64_t qi = i0 + threadIdx.x;
        lse_s[threadIdx.x] = qi < a.Tq ? lse[(b * a.H + h) * a.Tq + qi] : -INFINITY;
        D_s[threadIdx.x] = qi < a.Tq ? Dvec[(b * a.H + h) * a.Tq + qi] : 0.0f;
      }
      __syncthreads();
      const int64_t qi = i0 + lane;
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int kr = warp * kRowsPerWarp + r;
        const int64_t j = j0 + kr;
        const bool vis = qi < a.Tq && j < a.Tk && lse_s[lane] != -INFINITY && visible(a, b, qi, j);
        float p = 0.0f, ds = 0.0f;
        if (vis) {
          p = expf(dot_shared(Qs + lane * P, Ks + kr * P, Dh) * a.scale - lse_s[lane]);
          ds = p * (dot_shared(dOs + lane * P, Vs + kr * P, Dh) - D_s[lane]);
        }
        for (int ii = 0; ii < kTile; ++ii) {
          const float pi = __shfl_sync(0xffffffffu, p, ii);
          const float dsi = __shfl_sync(0xffffffffu, ds, ii);
          if (pi == 0.0f) continue;  // warp-uniform; P = 0 makes dS = 0 too
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const int d = lane + 32 * c;
            if (d < Dh) {
              dv_acc[r][c] += pi * dOs[ii * P + d];
              dk_acc[r][c] += dsi * Qs[ii * P + d];
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = j0 + warp * kRowsPerWarp + r;
    if (j >= a.Tk) continue;
    const int64_t base = ((b * a.Tk + j) * a.Hkv + g) * Dh;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int d = lane + 32 * c;
      if (d < Dh) {
        dk[base + d] = dk_acc[r][c] * a.scale;
        dv[base + d] = dv_acc[r][c];
      }
    }
  }
}

Attn make_attn(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
               float scale) {
  Attn a;
  a.q = q.data;
  a.k = k.data;
  a.v = v.data;
  a.qt = q.dtype;
  a.kt = k.dtype;
  a.vt = v.dtype;
  a.B = q.shape[0];
  a.Tq = q.shape[1];
  a.H = q.shape[2];
  a.Tk = k.shape[1];
  a.Hkv = k.shape[2];
  a.group = a.H / a.Hkv;
  a.off = a.Tk - a.Tq;
  SHARDLM_CHECK(q.shape[3] <= kMaxHeadDim, "{}: the CUDA kernels support a head dimension of at most {}, got q {}",
                op, kMaxHeadDim, q.describe());
  a.Dh = int(q.shape[3]);
  a.P = (a.Dh + 31) / 32 * 32 + 1;  // = 1 (mod 32): lane-per-row reads hit 32 different banks
  a.seg = segment_ids.defined() ? segment_ids.i32() : nullptr;
  a.scale = scale;
  return a;
}

// Chunks of 32 head dimensions each lane holds: the kernels are instantiated for 2, 4 and 8.
int lane_chunks(int Dh) { return Dh <= 64 ? 2 : Dh <= 128 ? 4 : 8; }

// Launches kernel<<<blocks, 128, smem>>> after allowing it that much dynamic shared memory
// (above 48 KiB a kernel must opt in; H100 allows up to 227 KiB per block).
template <class Kernel, class... Args>
void launch(Kernel kernel, int64_t blocks, size_t smem, const char* op, Args... args) {
  if (blocks == 0) return;
  SHARDLM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<checked_blocks(blocks, op), kBlockThreads, smem, cuda::compute_stream()>>>(args...);
  SHARDLM_CUDA_LAUNCH_CHECK();
}

// The forward kernel over every (batch row, query head, tile of kRows queries).
void launch_forward(const char* op, const Attn& a, const Tensor& out, const Tensor& lse) {
  const int64_t blocks = a.B * a.H * ((a.Tq + kRows - 1) / kRows);
  const size_t smem = size_t(kRows + 2 * kTile) * size_t(a.P) * sizeof(float);
  switch (lane_chunks(a.Dh)) {
    case 2: launch(attn_forward_kernel<2>, blocks, smem, op, a, out.data, out.dtype, lse.f32()); break;
    case 4: launch(attn_forward_kernel<4>, blocks, smem, op, a, out.data, out.dtype, lse.f32()); break;
    default: launch(attn_forward_kernel<8>, blocks, smem, op, a, out.data, out.dtype, lse.f32()); break;
  }
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& segment_ids, float scale) {
  const char* op = "attention_forward";
  launch_forward(op, make_attn(op, q, k, v, segment_ids, scale), out, lse);
}

void attention_forward_paged(const Tensor& out, const Tensor& lse, const Tensor& q, const std::vector<Tensor>& k_blocks,
                             const std::vector<Tensor>& v_blocks, int64_t Tk, float scale) {
  const char* op = "attention_forward_paged";
  const Tensor& k0 = k_blocks.front();
  // The sizes of the keys as one [1, Tk, Hkv, Dh] tensor; the kernel reads them through the table.
  const Tensor keys = Tensor::view(k0.data, k0.dtype, {1, Tk, k0.shape[1], k0.shape[2]}, Device::CUDA);
  Attn a = make_attn(op, q, keys, keys, Tensor{}, scale);
  a.k = a.v = nullptr;
  a.vt = v_blocks.front().dtype;
  a.page = k0.shape[0];
  // The block table: the keys' block bases, then the values', uploaded in order on the compute
  // stream without waiting for it (staged, so `table` may go when this call ends); the device
  // buffer goes back to the caching allocator, whose reuse is ordered on the compute stream.
  const size_t n = k_blocks.size();
  std::vector<const void*> table(2 * n);
  for (size_t i = 0; i < n; ++i) {
    table[i] = k_blocks[i].data;
    table[n + i] = v_blocks[i].data;
  }
  Buffer pages(table.size() * sizeof(void*), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
  cuda::upload_async(pages.data(), table.data(), table.size() * sizeof(void*));
  a.k_pages = static_cast<const void* const*>(pages.data());
  a.v_pages = a.k_pages + n;
  launch_forward(op, a, out, lse);
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& segment_ids, float scale) {
  const char* op = "attention_backward";
  const Attn a = make_attn(op, q, k, v, segment_ids, scale);
  const int64_t rows = a.B * a.Tq * a.H;
  Buffer d_buf;
  float* D = nullptr;
  if (rows > 0) {
    d_buf = Buffer(size_t(rows) * sizeof(float), MemCategory::Workspace, /*zero=*/false, Device::CUDA);
    D = static_cast<float*>(d_buf.data());
    attn_rowdot_kernel<<<grid_for(rows * 32), kThreads, 0, cuda::compute_stream()>>>(
        dout.data, dout.dtype, out.data, out.dtype, D, a.B, a.Tq, a.H, a.Dh);
    SHARDLM_CUDA_LAUNCH_CHECK();
  }
  const int64_t q_blocks = a.B * a.H * ((a.Tq + kRows - 1) / kRows);
  const int64_t k_blocks = a.B * a.Hkv * ((a.Tk + kRows - 1) / kRows);
  const size_t smem = size_t(2 * kRows + 2 * kTile) * size_t(a.P) * sizeof(float);
  const size_t smem_kv = smem + 2 * kTile * sizeof(float);
  switch (lane_chunks(a.Dh)) {
    case 2:
      launch(attn_dq_kernel<2>, q_blocks, smem, op, a, dout.data, dout.dtype, lse.f32(), D, dq.f32());
      launch(attn_dkdv_kernel<2>, k_blocks, smem_kv, op, a, dout.data, dout.dtype, lse.f32(), D, dk.f32(), dv.f32());
      break;
    case 4:
      launch(attn_dq_kernel<4>, q_blocks, smem, op, a, dout.data, dout.dtype, lse.f32(), D, dq.f32());
      launch(attn_dkdv_kernel<4>, k_blocks, smem_kv, op, a, dout.data, dout.dtype, lse.f32(), D, dk.f32(), dv.f32());
      break;
    default:
      launch(attn_dq_kernel<8>, q_blocks, smem, op, a, dout.data, dout.dtype, lse.f32(), D, dq.f32());
      launch(attn_dkdv_kernel<8>, k_blocks, smem_kv, op, a, dout.data, dout.dtype, lse.f32(), D, dk.f32(), dv.f32());
      break;
  }
}

}  // namespace shardlm::ops::gpu
