#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

namespace {
void check_same(const char* op, const char* arg, const Tensor& t, const Tensor& like) {
  check_usable(op, arg, t);
  check_dtype(op, arg, t, {DType::F32, DType::BF16});
  SHARDLM_CHECK(same_shape(t, like), "{}: {}: expected shape {}, got {}", op, arg, like.shape_str(), t.describe());
}
}  // namespace

void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  constexpr const char* op = "swiglu_forward";
  check_same(op, "gate", gate, gate);
  check_same(op, "up", up, gate);
  check_same(op, "out", out, gate);
  const Device dev = check_same_device(op, {{"gate", &gate}, {"up", &up}, {"out", &out}});
  count_traffic(dev, {&out, &gate, &up});
  SHARDLM_DISPATCH(dev, swiglu_forward(out, gate, up));
  cpu::swiglu_forward(out, gate, up);
}

void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  constexpr const char* op = "swiglu_backward";
  check_same(op, "gate", gate, gate);
  check_same(op, "up", up, gate);
  check_same(op, "dout", dout, gate);
  check_same(op, "dgate", dgate, gate);
  check_same(op, "dup", dup, gate);
  const Device dev =
      check_same_device(op, {{"dgate", &dgate}, {"dup", &dup}, {"dout", &dout}, {"gate", &gate}, {"up", &up}});
  count_traffic(dev, {&dgate, &dup, &dout, &gate, &up});
  SHARDLM_DISPATCH(dev, swiglu_backward(dgate, dup, dout, gate, up));
  cpu::swiglu_backward(dgate, dup, dout, gate, up);
}

}  // namespace shardlm::ops
