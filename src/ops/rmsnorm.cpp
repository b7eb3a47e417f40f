// RMSNorm front end: validates arguments once, then runs the backend kernel.
#include <cmath>

#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"

namespace shardlm::ops {

namespace {

// x [N, D] (f32|bf16) and w [D] (f32|bf16), shared by forward and backward; returns D.
int64_t check_x_w(const char* op, const Tensor& x, const Tensor& w) {
  check_arg(op, "x", x, {DType::F32, DType::BF16}, {-1, -1});
  const int64_t D = x.shape[1];
  // A row of zero elements has no mean square; refuse it rather than divide by zero.
  SHARDLM_CHECK(D > 0, "{}: x: rows must have at least one element, got {}", op, x.describe());
  check_arg(op, "w", w, {DType::F32, DType::BF16}, {D});
  return D;
}

}  // namespace

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  const char* op = "rmsnorm_forward";
  const int64_t D = check_x_w(op, x, w);
  const int64_t N = x.shape[0];
  check_arg(op, "y", y, {DType::F32, DType::BF16}, {N, D});
  check_arg(op, "rstd", rstd, {DType::F32}, {N});
  SHARDLM_CHECK(eps >= 0.0f && std::isfinite(eps), "{}: eps: expected a finite value >= 0, got {}", op, eps);
  const Device dev = check_same_device(op, {{"y", &y}, {"rstd", &rstd}, {"x", &x}, {"w", &w}});
  count_traffic(dev, {&y, &x});
  SHARDLM_DISPATCH(dev, rmsnorm_forward(y, rstd, x, w, eps));
  cpu::rmsnorm_forward(y, rstd, x, w, eps);
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  const int64_t D = check_x_w(op, x, w);
  const int64_t N = x.shape[0];
  check_arg(op, "dy", dy, {DType::F32, DType::BF16}, {N, D});
  check_arg(op, "rstd", rstd, {DType::F32}, {N});
  check_arg(op, "dx", dx, {DType::F32, DType::BF16}, {N, D});
  if (dw.defined()) check_arg(op, "dw", dw, {DType::F32}, {D});  // undefined: a frozen weight, no dw
  const Device dev =
      check_same_device(op, {{"dx", &dx}, {"dw", &dw}, {"dy", &dy}, {"x", &x}, {"w", &w}, {"rstd", &rstd}});
  count_traffic(dev, {&dx, &dy, &x});
  SHARDLM_DISPATCH(dev, rmsnorm_backward(dx, dw, dy, x, w, rstd));
  cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd);
}

}  // namespace shardlm::ops
