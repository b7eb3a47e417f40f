#include "ops/check.h"

#include <fmt/format.h>

#include "core/device.h"

namespace shardlm::ops {

void check_defined(const char* op, const char* arg, const Tensor& t) {
  SHARDLM_CHECK(t.defined(), "{}: {}: tensor is required but undefined", op, arg);
}

void check_usable(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  SHARDLM_CHECK(t.is_contiguous(), "{}: {}: expected a contiguous tensor, got {}", op, arg, t.describe());
#ifndef SHARDLM_HAVE_CUDA
  SHARDLM_CHECK(t.device != Device::CUDA, "{}: {}: {} is on a CUDA device, but this shardlm was built without CUDA", op,
                arg, t.describe());
#endif
}

void check_dtype(const char* op, const char* arg, const Tensor& t, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype == d) return;
  std::string names;
  for (DType d : allowed) names += fmt::format("{}{}", names.empty() ? "" : " or ", dtype_name(d));
  throw Error(fmt::format("{}: {}: expected dtype {}, got {}", op, arg, names, t.describe()));
}

void check_shape(const char* op, const char* arg, const Tensor& t, std::initializer_list<int64_t> shape) {
  bool ok = t.ndim == int(shape.size());
  int d = 0;
  for (int64_t s : shape) {
    if (ok && s >= 0 && t.shape[d] != s) ok = false;
    ++d;
  }
  if (ok) return;
  std::string want = "[";
  d = 0;
  for (int64_t s : shape) want += (d++ ? ", " : "") + (s < 0 ? std::string("*") : std::to_string(s));
  throw Error(fmt::format("{}: {}: expected shape {}], got {}", op, arg, want, t.describe()));
}

void check_numel(const char* op, const char* arg, const Tensor& t, int64_t n) {
  SHARDLM_CHECK(t.numel() == n, "{}: {}: expected {} elements, got {}", op, arg, n, t.describe());
}

Device check_same_device(const char* op, std::initializer_list<NamedTensor> tensors) {
  const NamedTensor* first = nullptr;
  for (const NamedTensor& n : tensors) {
    if (!n.t->defined()) continue;
    if (!first) {
      first = &n;
      continue;
    }
    SHARDLM_CHECK(n.t->device == first->t->device,
                  "{}: {}: on {}, but {} is on {} (all tensors of one op must be on one device)", op, n.name,
                  device_name(n.t->device), first->name, device_name(first->t->device));
  }
  return first ? first->t->device : Device::CPU;
}

std::vector<int32_t> host_i32(const Tensor& t) {
  std::vector<int32_t> v(size_t(t.numel()));
  device::copy_bytes(v.data(), Device::CPU, t.i32(), t.device, v.size() * sizeof(int32_t));
  return v;
}

void check_arg(const char* op, const char* arg, const Tensor& t, std::initializer_list<DType> allowed,
               std::initializer_list<int64_t> shape) {
  check_usable(op, arg, t);
  check_dtype(op, arg, t, allowed);
  check_shape(op, arg, t, shape);
}

void count_traffic(Device dev, std::initializer_list<const Tensor*> moved) {
  if (dev != Device::Meta) return;
  double bytes = 0;
  for (const Tensor* t : moved)
    if (t->defined()) bytes += double(t->nbytes());
  meta_traffic(bytes);
}

}  // namespace shardlm::ops
