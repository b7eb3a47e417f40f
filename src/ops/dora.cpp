// Front ends of the DoRA ops (ops.h): validation, then the backend.
#include "ops/check.h"
#include "ops/cpu/cpu_ops.h"

namespace shardlm::ops {

void row_norms(const Tensor& norms, const Tensor& x) {
  check_usable("row_norms", "x", x);
  check_dtype("row_norms", "x", x, {DType::F32, DType::BF16});
  SHARDLM_CHECK(x.ndim == 2, "row_norms: x must be [M, K], got {}", x.shape_str());
  check_arg("row_norms", "norms", norms, {DType::F32}, {x.shape[0]});
  const Device dev = check_same_device("row_norms", {{"norms", &norms}, {"x", &x}});
  SHARDLM_DISPATCH(dev, row_norms(norms, x));
  cpu::row_norms(norms, x);
}

namespace {
// y-like [N, M] and its per-column vectors, as both DoRA ops take them.
void check_dora(const char* op, const Tensor& y, std::initializer_list<NamedTensor> rows, const Tensor& m,
                const Tensor& norm) {
  check_usable(op, "y", y);
  SHARDLM_CHECK(y.ndim == 2, "{}: expected [N, M] rows, got {}", op, y.shape_str());
  for (const NamedTensor& r : rows) check_arg(op, r.name, *r.t, {DType::F32}, {y.shape[0], y.shape[1]});
  check_arg(op, "m", m, {DType::F32, DType::BF16}, {y.shape[1]});
  check_arg(op, "norm", norm, {DType::F32}, {y.shape[1]});
}
}  // namespace

void dora_forward(const Tensor& y, const Tensor& z, const Tensor& l, const Tensor& m, const Tensor& norm) {
  check_dora("dora_forward", y, {{"z", &z}, {"l", &l}}, m, norm);
  check_dtype("dora_forward", "y", y, {DType::F32, DType::BF16});
  const Device dev =
      check_same_device("dora_forward", {{"y", &y}, {"z", &z}, {"l", &l}, {"m", &m}, {"norm", &norm}});
  SHARDLM_DISPATCH(dev, dora_forward(y, z, l, m, norm));
  cpu::dora_forward(y, z, l, m, norm);
}

void dora_backward(const Tensor& dz, const Tensor& dl, const Tensor& dm, const Tensor& dy, const Tensor& z,
                   const Tensor& l, const Tensor& m, const Tensor& norm) {
  check_dora("dora_backward", dy, {{"dz", &dz}, {"dl", &dl}, {"dy", &dy}, {"z", &z}, {"l", &l}}, m, norm);
  check_arg("dora_backward", "dm", dm, {DType::F32}, {dy.shape[1]});
  const Device dev = check_same_device("dora_backward", {{"dz", &dz}, {"dl", &dl}, {"dm", &dm}, {"dy", &dy},
                                                         {"z", &z}, {"l", &l}, {"m", &m}, {"norm", &norm}});
  SHARDLM_DISPATCH(dev, dora_backward(dz, dl, dm, dy, z, l, m, norm));
  cpu::dora_backward(dz, dl, dm, dy, z, l, m, norm);
}

}  // namespace shardlm::ops
