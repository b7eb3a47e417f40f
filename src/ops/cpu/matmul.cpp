// Matrix multiply through OpenBLAS sgemm. bf16 operands are widened to f32 first (into a
// Workspace buffer): OpenBLAS 0.3.21 has sbgemm only for some CPUs, and widening costs O(n^2)
// against the O(n^3) multiply.
#include <cblas.h>

#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops::cpu {

namespace {
// f32 view of a tensor: the tensor itself, or a widened copy kept alive by `holder`.
const float* as_f32(const Tensor& t, Buffer& holder) {
  if (t.dtype == DType::F32) return static_cast<const float*>(t.data);
  holder = Buffer(size_t(t.numel()) * 4, MemCategory::Workspace, false);
  float* out = static_cast<float*>(holder.data());
  convert_bf16_to_f32(static_cast<const bf16_t*>(t.data), out, size_t(t.numel()));
  return out;
}
}  // namespace

void matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha, float beta) {
  const int64_t M = C.shape[0], N = C.shape[1];
  const int64_t K = trans_a ? A.shape[0] : A.shape[1];
  if (M == 0 || N == 0) return;

  Buffer a_hold, b_hold, c_hold;
  const float* a = as_f32(A, a_hold);
  const float* b = as_f32(B, b_hold);
  float* c;
  if (C.dtype == DType::F32) {
    c = static_cast<float*>(C.data);
  } else {
    c_hold = Buffer(size_t(M * N) * 4, MemCategory::Workspace, false);
    c = static_cast<float*>(c_hold.data());
    if (beta != 0.0f) convert_bf16_to_f32(static_cast<const bf16_t*>(C.data), c, size_t(M * N));
  }

  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, a, int(A.shape[1]), b, int(B.shape[1]), beta, c, int(N));

  if (C.dtype == DType::BF16) convert_f32_to_bf16(c, static_cast<bf16_t*>(C.data), size_t(M * N));
}

}  // namespace shardlm::ops::cpu
