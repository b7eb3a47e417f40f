// Matrix multiply. Two paths, chosen per call (ops/cpu_bf16.h):
//  - bf16: with a bf16 operand, on a CPU with bf16 hardware, through oneDNN (ops/cpu/onednn.h):
//    bf16 x bf16 products accumulated in f32, C written in its own dtype. An f32 operand beside a
//    bf16 one (the f32 gradient buffers of the backward) is rounded to a bf16 Workspace copy: the
//    policy of the CUDA matmul, and of torch.autocast.
//  - f32: OpenBLAS sgemm. bf16 operands are widened to f32 first (into a Workspace buffer):
//    OpenBLAS 0.3.21 has sbgemm only for some CPUs, and widening costs O(n^2) against the O(n^3)
//    multiply. A few rows times a transposed weight (a decode step: x W^T with M = the batch) take
//    skinny_bt below instead.
#include <cblas.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/onednn.h"
#include "ops/cpu/parallel.h"
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
// C [M, N] = alpha * A [M, K] B^T + beta * C, B [N, K], for M <= kSkinnyRows: every row of B is
// read once, straight from memory, and dotted with each row of A (which stays in cache). OpenBLAS
// 0.3.21's sgemm packs all of B first, which for a decode step means copying every weight once
// more per token: this path decoded a 506M-parameter model 1.5x faster (bench/RESULTS.md). Each
// dot product is computed the same way whatever M is, so a sequence's logits do not depend on the
// batch it decodes in.
constexpr int64_t kSkinnyRows = 8;

void skinny_bt(float* c, const float* a, const float* b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
               float alpha, float beta) {
  parallel_region(M * N * K >= kMinParallelWork, [&] {
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* w = b + n * ldb;
      for (int64_t m = 0; m < M; ++m) {
        const float* x = a + m * lda;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t k = 0; k < K; ++k) acc += x[k] * w[k];
        float& out = c[m * N + n];
        out = beta == 0.0f ? alpha * acc : alpha * acc + beta * out;
      }
    }
  });
}
}  // namespace

// The bf16 path takes a call with a bf16 operand and a non-empty product.
static bool takes_bf16_path(const Tensor& C, const Tensor& A, const Tensor& B) {
  return (A.dtype == DType::BF16 || B.dtype == DType::BF16) && C.numel() > 0 && A.numel() > 0 && cpu_bf16_enabled();
}

MatmulScratch matmul_scratch(const Tensor& C, const Tensor& A, const Tensor& B, Device device) {
  if (C.numel() == 0) return {};
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

  const MatmulScratch scratch = matmul_scratch(C, A, B, Device::CPU);
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
