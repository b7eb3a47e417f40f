// Front ends of casts and elementwise ops.
#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

void cast(const Tensor& dst, const Tensor& src) {
  check_usable("cast", "dst", dst);
  check_usable("cast", "src", src);
  check_dtype("cast", "dst", dst, {DType::F32, DType::BF16, DType::F16});
  check_dtype("cast", "src", src, {DType::F32, DType::BF16, DType::F16});
  check_numel("cast", "dst", dst, src.numel());
  const Device dev = check_same_device("cast", {{"dst", &dst}, {"src", &src}});
  count_traffic(dev, {&dst, &src});
  SHARDLM_DISPATCH(dev, cast(dst, src));
  cpu::cast(dst, src);
}

void add_inplace(const Tensor& dst, const Tensor& src) {
  check_usable("add_inplace", "dst", dst);
  check_usable("add_inplace", "src", src);
  check_dtype("add_inplace", "dst", dst, {DType::F32, DType::BF16});
  check_dtype("add_inplace", "src", src, {DType::F32, DType::BF16});
  check_numel("add_inplace", "src", src, dst.numel());
  const Device dev = check_same_device("add_inplace", {{"dst", &dst}, {"src", &src}});
  count_traffic(dev, {&dst, &dst, &src});
  SHARDLM_DISPATCH(dev, add_inplace(dst, src));
  cpu::add_inplace(dst, src);
}

void scale_inplace(const Tensor& x, float s) {
  check_usable("scale_inplace", "x", x);
  check_dtype("scale_inplace", "x", x, {DType::F32, DType::BF16});
  count_traffic(x.device, {&x, &x});
  SHARDLM_DISPATCH(x.device, scale_inplace(x, s));
  cpu::scale_inplace(x, s);
}

void zero(const Tensor& x) {
  check_usable("zero", "x", x);
  count_traffic(x.device, {&x});
  SHARDLM_DISPATCH(x.device, zero(x));
  cpu::zero(x);
}

}  // namespace shardlm::ops

namespace shardlm::ops {

void add_bias(const Tensor& y, const Tensor& b) {
  check_usable("add_bias", "y", y);
  check_usable("add_bias", "b", b);
  check_dtype("add_bias", "y", y, {DType::F32, DType::BF16});
  check_dtype("add_bias", "b", b, {DType::F32, DType::BF16});
  check_shape("add_bias", "b", b, {y.size(-1)});
  const Device dev = check_same_device("add_bias", {{"y", &y}, {"b", &b}});
  count_traffic(dev, {&y, &y});
  SHARDLM_DISPATCH(dev, add_bias(y, b));
  cpu::add_bias(y, b);
}

void bias_backward(const Tensor& db, const Tensor& dy) {
  check_usable("bias_backward", "db", db);
  check_usable("bias_backward", "dy", dy);
  check_dtype("bias_backward", "db", db, {DType::F32});
  check_dtype("bias_backward", "dy", dy, {DType::F32, DType::BF16});
  check_shape("bias_backward", "db", db, {dy.size(-1)});
  const Device dev = check_same_device("bias_backward", {{"db", &db}, {"dy", &dy}});
  count_traffic(dev, {&dy});
  SHARDLM_DISPATCH(dev, bias_backward(db, dy));
  cpu::bias_backward(db, dy);
}

}  // namespace shardlm::ops
