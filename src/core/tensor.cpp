#include "core/tensor.h"

#include <fmt/format.h>

namespace shardlm {

Tensor Tensor::view(void* data, DType dtype, const int64_t* shape, int ndim, Device device) {
  SHARDLM_CHECK(ndim >= 0 && ndim <= kMaxDims, "tensor rank {} exceeds the maximum of {}", ndim, kMaxDims);
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = ndim;
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    SHARDLM_CHECK(shape[d] >= 0, "negative dimension {} in tensor shape", shape[d]);
    t.shape[d] = shape[d];
    t.stride[d] = s;
    s *= shape[d];
  }
  return t;
}

Tensor Tensor::view(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  return view(data, dtype, shape.begin(), int(shape.size()), device);
}

Tensor Tensor::of(const Buffer& buffer, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t = view(buffer.data(), dtype, shape, buffer.device());
  SHARDLM_CHECK(t.nbytes() <= buffer.bytes(), "view {} needs {} bytes but the buffer holds {}",
                t.describe(), t.nbytes(), buffer.bytes());
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

int64_t Tensor::size(int dim) const {
  const int d = dim < 0 ? dim + ndim : dim;
  SHARDLM_CHECK(d >= 0 && d < ndim, "dimension {} out of range for {}", dim, describe());
  return shape[d];
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != s) return false;
    s *= shape[d];
  }
  return true;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> new_shape) const {
  SHARDLM_CHECK(is_contiguous(), "reshape of non-contiguous {}", describe());
  Tensor t = view(data, dtype, new_shape.begin(), int(new_shape.size()), device);
  SHARDLM_CHECK(t.numel() == numel(), "cannot reshape {} to {}", describe(), t.shape_str());
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  SHARDLM_CHECK(ndim >= 1 && 0 <= begin && begin <= end && end <= shape[0],
                "slice [{}, {}) out of range for {}", begin, end, describe());
  Tensor t = *this;
  t.data = static_cast<char*>(data) + begin * stride[0] * int64_t(dtype_size(dtype));
  t.shape[0] = end - begin;
  return t;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += fmt::format("{}{}", d ? ", " : "", shape[d]);
  return s + "]";
}

std::string Tensor::describe() const {
  return fmt::format("{}{} on {}", dtype_name(dtype), shape_str(), device_name(device));
}

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

OwnedTensor::OwnedTensor(DType dtype, std::initializer_list<int64_t> shape, MemCategory category, bool zero,
                         Device device)
    : OwnedTensor(dtype, shape.begin(), int(shape.size()), category, zero, device) {}

OwnedTensor::OwnedTensor(DType dtype, const int64_t* shape, int ndim, MemCategory category, bool zero,
                         Device device) {
  t = Tensor::view(nullptr, dtype, shape, ndim, device);
  buffer = Buffer(t.nbytes(), category, zero, device);
  t.data = buffer.data();
}

}  // namespace shardlm
