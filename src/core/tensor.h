// Tensor: a non-owning view of up to 4-D data.
//
// A Tensor is (pointer, dtype, shape, strides, device) and never frees anything: its memory
// belongs to a Buffer (alloc.h), an mmap'd file, or a caller's array, which must outlive it.
// Strides are in elements. Most ops require contiguous row-major tensors and check for it;
// slicing along the first dimension keeps a tensor contiguous.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/alloc.h"
#include "core/dtype.h"
#include "core/error.h"

namespace shardlm {

constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};

  // A contiguous row-major view of `data`.
  static Tensor view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                     Device device = Device::CPU);
  static Tensor view(void* data, DType dtype, const int64_t* shape, int ndim,
                     Device device = Device::CPU);
  // A contiguous view of a Buffer, on the buffer's device; checks that the buffer is large enough.
  static Tensor of(const Buffer& buffer, DType dtype, std::initializer_list<int64_t> shape);

  bool defined() const { return data != nullptr; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t size(int dim) const;  // negative dims count from the end
  bool is_contiguous() const;
  // Number of rows when viewed as 2-D [rows, last dim].
  int64_t rows() const { return ndim == 0 ? 1 : numel() / shape[ndim - 1]; }

  // Same data, new contiguous shape with the same element count (requires contiguity).
  Tensor reshape(std::initializer_list<int64_t> new_shape) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice(int64_t begin, int64_t end) const;

  template <class T>
  T* ptr() const {
    SHARDLM_CHECK(dtype == dtype_of<T>(), "tensor is {} but was accessed as {}", dtype_name(dtype),
                  dtype_name(dtype_of<T>()));
    return static_cast<T*>(data);
  }
  float* f32() const { return ptr<float>(); }
  int32_t* i32() const { return ptr<int32_t>(); }

  std::string shape_str() const;  // "[2, 3, 4]"
  std::string describe() const;   // "f32[2, 3, 4] on cpu"
};

bool same_shape(const Tensor& a, const Tensor& b);

// A Buffer together with a contiguous Tensor view of it: the usual way to own a tensor.
struct OwnedTensor {
  Buffer buffer;
  Tensor t;
  OwnedTensor() = default;
  OwnedTensor(DType dtype, std::initializer_list<int64_t> shape, MemCategory category, bool zero = true,
              Device device = Device::CPU);
  OwnedTensor(DType dtype, const int64_t* shape, int ndim, MemCategory category, bool zero = true,
              Device device = Device::CPU);
  operator const Tensor&() const { return t; }
};

}  // namespace shardlm
