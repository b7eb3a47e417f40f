// RMSNorm front end: validates arguments once, then runs the backend kernel.
#include <cmath>

#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"

namespace shardlm::ops {

namespace {

// x [N, D] (f32|bf16) and w [D] (f32|bf16), shared by forward and backward; returns D.
int64_t check_x_w(const char* op, const Tensor& x, const Tensor& w) {
  check_usable(op, "x", x);
  check_dtype(op, "x", x, {DType::F32, DType::BF16});
  check_shape(op, "x", x, {-1, -1});
  const int64_t D = x.shape[1];
  // A row of zero elements has no mean square; refuse it rather than divide by zero.
  SHARDLM_CHECK(D > 0, "{}: x: rows must have at least one element, got {}", op, x.describe());
  check_usable(op, "w", w);
  check_dtype(op, "w", w, {DType::F32, DType::BF16});
  check_shape(op, "w", w, {D});
  return D;
}

}  // namespace

void rmsnorm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  const char* op = "rmsnorm_forward";
  const int64_t D = check_x_w(op, x, w);
  const int64_t N = x.shape[0];
  check_usable(op, "y", y);
  check_dtype(op, "y", y, {DType::F32, DType::BF16});
  check_shape(op, "y", y, {N, D});
  check_usable(op, "rstd", rstd);
  check_dtype(op, "rstd", rstd, {DType::F32});
  check_shape(op, "rstd", rstd, {N});
  SHARDLM_CHECK(eps >= 0.0f && std::isfinite(eps), "{}: eps: expected a finite value >= 0, got {}", op, eps);
  const Device dev = check_same_device(op, {{"y", &y}, {"rstd", &rstd}, {"x", &x}, {"w", &w}});
  SHARDLM_DISPATCH_CUDA(dev, rmsnorm_forward(y, rstd, x, w, eps));
  cpu::rmsnorm_forward(y, rstd, x, w, eps);
}

void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  const int64_t D = check_x_w(op, x, w);
  const int64_t N = x.shape[0];
  check_usable(op, "dy", dy);
  check_dtype(op, "dy", dy, {DType::F32, DType::BF16});
  check_shape(op, "dy", dy, {N, D});
  check_usable(op, "rstd", rstd);
  check_dtype(op, "rstd", rstd, {DType::F32});
  check_shape(op, "rstd", rstd, {N});
  check_usable(op, "dx", dx);
  check_dtype(op, "dx", dx, {DType::F32, DType::BF16});
  check_shape(op, "dx", dx, {N, D});
  check_usable(op, "dw", dw);
  check_dtype(op, "dw", dw, {DType::F32});
  check_shape(op, "dw", dw, {D});
  const Device dev =
      check_same_device(op, {{"dx", &dx}, {"dw", &dw}, {"dy", &dy}, {"x", &x}, {"w", &w}, {"rstd", &rstd}});
  SHARDLM_DISPATCH_CUDA(dev, rmsnorm_backward(dx, dw, dy, x, w, rstd));
  cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd);
}

}  // namespace shardlm::ops
