#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

void matmul(const Tensor& C, const Tensor& A, const Tensor& B, bool trans_a, bool trans_b, float alpha, float beta) {
  constexpr const char* op = "matmul";
  check_usable(op, "A", A);
  check_usable(op, "B", B);
  check_usable(op, "C", C);
  check_dtype(op, "A", A, {DType::F32, DType::BF16});
  check_dtype(op, "B", B, {DType::F32, DType::BF16});
  check_dtype(op, "C", C, {DType::F32, DType::BF16});
  SHARDLM_CHECK(A.ndim == 2 && B.ndim == 2 && C.ndim == 2, "matmul: expected 2-D operands, got A {}, B {}, C {}",
                A.describe(), B.describe(), C.describe());
  const int64_t M = trans_a ? A.shape[1] : A.shape[0];
  const int64_t K = trans_a ? A.shape[0] : A.shape[1];
  const int64_t Kb = trans_b ? B.shape[1] : B.shape[0];
  const int64_t N = trans_b ? B.shape[0] : B.shape[1];
  SHARDLM_CHECK(K == Kb, "matmul: inner dimensions differ: op(A) is [{}, {}], op(B) is [{}, {}]", M, K, Kb, N);
  check_shape(op, "C", C, {M, N});
  const Device dev = check_same_device(op, {{"C", &C}, {"A", &A}, {"B", &B}});
  if (dev == Device::Meta) {
    cpu::matmul_scratch(C, A, B, trans_a, trans_b, Device::Meta);  // counted, then freed
    meta_flops(2.0 * double(M) * double(N) * double(K));
  }
  SHARDLM_DISPATCH(dev, matmul(C, A, B, trans_a, trans_b, alpha, beta));
  cpu::matmul(C, A, B, trans_a, trans_b, alpha, beta);
}

}  // namespace shardlm::ops
