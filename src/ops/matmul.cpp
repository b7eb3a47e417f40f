#include <tuple>

#include "core/q8_0.h"
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

void matmul_q8_0(const Tensor& C, const Tensor& A, const Tensor& W, float alpha, float beta) {
  constexpr const char* op = "matmul_q8_0";
  for (const auto& [name, t, dtype] : {std::tuple{"A", &A, DType::F32}, {"W", &W, DType::U8}, {"C", &C, DType::F32}}) {
    check_usable(op, name, *t);
    check_dtype(op, name, *t, {dtype});
  }
  SHARDLM_CHECK(A.ndim == 2 && W.ndim == 2 && C.ndim == 2, "matmul_q8_0: expected 2-D operands, got A {}, W {}, C {}",
                A.describe(), W.describe(), C.describe());
  const int64_t M = A.shape[0], K = A.shape[1], N = W.shape[0];
  SHARDLM_CHECK(K % kQ8_0Block == 0 && W.shape[1] == q8_0_bytes(K),
                "matmul_q8_0: A is [{}, {}], so W must be [N, {}] bytes (rows of {} q8_0 blocks), got {}", M, K,
                K % kQ8_0Block == 0 ? q8_0_bytes(K) : 0, K / kQ8_0Block, W.describe());
  check_shape(op, "C", C, {M, N});
  const Device dev = check_same_device(op, {{"C", &C}, {"A", &A}, {"W", &W}});
  SHARDLM_CHECK(dev == Device::CPU || dev == Device::Meta, "matmul_q8_0: q8_0 weights compute on the CPU only, not {}",
                device_name(dev));
  if (dev == Device::Meta) {
    cpu::matmul_q8_0_scratch(C, A, W, Device::Meta);  // counted, then freed
    meta_flops(2.0 * double(M) * double(N) * double(K));
    return;
  }
  cpu::matmul_q8_0(C, A, W, alpha, beta);
}

}  // namespace shardlm::ops
