// Matrix multiply. Three paths, chosen per call:
//  - skinny: a few f32 rows times a transposed f32 or bf16 weight into f32 (a decode step: x W^T
//    with M = the batch, at most kSkinnyRows), by skinny_bt below, on every x86-64 CPU: each
//    weight row is read once, straight from memory, bf16 widened to f32 in registers (a 16-bit
//    shift), and every product and sum is f32. Decode is memory-bound, so a bf16 weight decodes
//    about twice as fast as an f32 one; this path is taken before the bf16 one even where oneDNN
//    has bf16 hardware, which would round x to bf16 and was slower at these shapes
//    (bench/generate_speed.sh, docs/generation.md).
//  - bf16: with a bf16 operand, on a CPU with bf16 hardware, through oneDNN (ops/cpu/onednn.h):
//    bf16 x bf16 products accumulated in f32, C written in its own dtype. An f32 operand beside a
//    bf16 one (the f32 gradient buffers of the backward) is rounded to a bf16 Workspace copy: the
//    policy of the CUDA matmul, and of torch.autocast.
//  - f32: OpenBLAS sgemm. bf16 operands are widened to f32 first (into a Workspace buffer):
//    OpenBLAS 0.3.21 has sbgemm only for some CPUs, and widening costs O(n^2) against the O(n^3)
//    multiply. Skinny shapes whose A or C is bf16 are widened and take skinny_bt too.
#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>

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
// (bench/RESULTS.md). A row of B is loaded a vector at a time, a bf16 one widened to f32 in the
// register (exact), and multiplied into up to kGroup rows of A at once, so each load feeds several
// multiply-adds. Every row's dot product is computed the same way whatever M is and whichever
// group it falls in (two vector accumulators, summed lane by lane, then the tail), so a sequence's
// logits do not depend on the batch it decodes in, and a bf16 B gives bit for bit the result of
// its f32 widening.
constexpr int64_t kSkinnyRows = 8;
constexpr int kGroup = 4;  // rows of A per pass over a row of B: 2 x kGroup accumulators in registers

typedef uint16_t vhalf_unaligned __attribute__((vector_size(kLanes * sizeof(uint16_t)), aligned(2), may_alias));
typedef uint32_t vuint __attribute__((vector_size(kLanes * sizeof(uint32_t))));
inline vfloat vload_f32(const float* p) { return vload(p); }
inline vfloat vload_f32(const bf16_t* p) {  // bf16 is the top half of an f32: widen, shift into place
  const vuint u = __builtin_convertvector(*reinterpret_cast<const vhalf_unaligned*>(p), vuint) << 16;
  return std::bit_cast<vfloat>(u);
}
inline float widen(float x) { return x; }
inline float widen(bf16_t x) { return bf16_to_f32(x); }

// Rows [0, R) of A (row stride lda) dotted with one row w of B: c[r * ldc] = alpha * dot + beta * c.
template <int R, class W>
inline void skinny_dots(float* c, int64_t ldc, const float* a, int64_t lda, const W* w, int64_t K, float alpha,
                        float beta) {
  vfloat acc0[R] = {}, acc1[R] = {};
  int64_t k = 0;
  for (; k + 2 * kLanes <= K; k += 2 * kLanes) {
    const vfloat w0 = vload_f32(w + k), w1 = vload_f32(w + k + kLanes);
    for (int r = 0; r < R; ++r) {
      acc0[r] += vload(a + r * lda + k) * w0;
      acc1[r] += vload(a + r * lda + k + kLanes) * w1;
    }
  }
  for (int r = 0; r < R; ++r) {
    const vfloat v = acc0[r] + acc1[r];
    float sum = 0.0f;
    for (int l = 0; l < kLanes; ++l) sum += v[l];
    // Explicit fused multiply-adds: whether the compiler would contract `sum + x * w` differs
    // between the f32 and the bf16 instantiation, and the two must agree bit for bit. (The vector
    // loop above is contracted in both; CpuBf16.DecodeShapesTakeTheSkinnyKernel checks it.)
    for (int64_t j = k; j < K; ++j) sum = std::fma(a[r * lda + j], widen(w[j]), sum);
    float& out = c[r * ldc];
    out = beta == 0.0f ? alpha * sum : std::fma(alpha, sum, beta * out);
  }
}

template <class W>
void skinny_bt(float* c, const float* a, const W* b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
               float alpha, float beta) {
  parallel_region(M * N * K >= kMinParallelWork, [&] {
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const W* w = b + n * ldb;
      for (int64_t m = 0; m < M; m += kGroup) {
        float* cm = c + m * N + n;
        const float* am = a + m * lda;
        switch (std::min<int64_t>(kGroup, M - m)) {
          case 1: skinny_dots<1>(cm, N, am, lda, w, K, alpha, beta); break;
          case 2: skinny_dots<2>(cm, N, am, lda, w, K, alpha, beta); break;
          case 3: skinny_dots<3>(cm, N, am, lda, w, K, alpha, beta); break;
          default: skinny_dots<4>(cm, N, am, lda, w, K, alpha, beta); break;
        }
      }
    }
  });
}
}  // namespace

// The skinny path takes a few f32 rows times a transposed weight (f32 or bf16) into f32.
static bool takes_skinny_path(const Tensor& C, const Tensor& A, bool trans_a, bool trans_b) {
  return C.shape[0] <= kSkinnyRows && !trans_a && trans_b && A.dtype == DType::F32 && C.dtype == DType::F32;
}

// The bf16 path takes a call with a bf16 operand and a non-empty product.
static bool takes_bf16_path(const Tensor& C, const Tensor& A, const Tensor& B) {
  return (A.dtype == DType::BF16 || B.dtype == DType::BF16) && C.numel() > 0 && A.numel() > 0 && cpu_bf16_enabled();
}

MatmulScratch matmul_scratch(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b,
                             Device device) {
  if (C.numel() == 0 || takes_skinny_path(C, A, trans_a, trans_b)) return {};
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
    if (B.dtype == DType::F32)
      skinny_bt(c, a, static_cast<const float*>(B.data), M, N, K, A.shape[1], B.shape[1], alpha, beta);
    else
      skinny_bt(c, a, static_cast<const bf16_t*>(B.data), M, N, K, A.shape[1], B.shape[1], alpha, beta);
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

}  // namespace shardlm::ops::cpu
