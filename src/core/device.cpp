// The device-independent part of core/device.h (tensor copies), and, in a build without CUDA,
// the CUDA entry points, each of which throws a one-line Error. With CUDA those are defined in
// ops/cuda/allocator.cu instead.
#include "core/device.h"

#include <cstring>

#include "core/error.h"

namespace shardlm::device {

void copy(const Tensor& dst, const Tensor& src) {
  SHARDLM_CHECK(dst.defined() && src.defined(), "copy: both tensors must be defined");
  SHARDLM_CHECK(dst.is_contiguous() && src.is_contiguous(), "copy: expected contiguous tensors, got {} and {}",
                dst.describe(), src.describe());
  SHARDLM_CHECK(dst.dtype == src.dtype && same_shape(dst, src), "copy: destination {} does not match source {}",
                dst.describe(), src.describe());
  copy_bytes(dst.data, dst.device, src.data, src.device, src.nbytes());
}

#ifndef SHARDLM_HAVE_CUDA
// Without CUDA every copy is between host (or meta) tensors: synchronous, every fence passed.
struct CopyLane::Impl {};
CopyLane::CopyLane() = default;
CopyLane::~CopyLane() { delete impl_; }  // never allocated here: nothing to wait for
CopyLane::Fence CopyLane::copy(const Tensor& dst, const Tensor& src) {
  device::copy(dst, src);
  return 0;
}
void CopyLane::wait(Fence) {}
#endif

OwnedTensor copy_to_device(const Tensor& src, MemCategory category, Device device) {
  OwnedTensor out(src.dtype, src.shape.data(), src.ndim, category, /*zero=*/false, device);
  copy(out.t, src);
  return out;
}

OwnedTensor copy_to_host(const Tensor& src, MemCategory category) {
  return copy_to_device(src, category, Device::CPU);
}

#ifndef SHARDLM_HAVE_CUDA

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(fmt::format("{}: this shardlm was built without CUDA (configure with a CUDA toolkit and "
                          "SHARDLM_CUDA=AUTO or ON)", what));
}
}  // namespace

bool cuda_available(std::string* why) {
  if (why) *why = "built without CUDA";
  return false;
}

int64_t cuda_device_memory() { return 0; }
void* cuda_malloc(size_t) { no_cuda("cuda_malloc"); }
void cuda_free(void*) noexcept {}  // nothing can have been allocated
void cuda_memset_zero(void*, size_t) { no_cuda("cuda_memset_zero"); }
CudaMemoryStats cuda_memory_stats() { return {}; }
void cuda_reset_peak_stats() {}
void cuda_empty_cache() {}
void* pinned_malloc(size_t) { no_cuda("pinned host memory"); }
void pinned_free(void*) noexcept {}
void synchronize() {}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (dst_device == Device::Meta || src_device == Device::Meta) return;  // no bytes to move
  if (dst_device == Device::CUDA || src_device == Device::CUDA) no_cuda("copy to or from a CUDA tensor");
  if (bytes) std::memmove(dst, src, bytes);
}

#endif  // SHARDLM_HAVE_CUDA

}  // namespace shardlm::device
