// Device memory and host<->device copies, as the core library sees them: plain C++, no CUDA
// headers. With CUDA these functions are implemented in ops/cuda/allocator.cu; in a build
// without CUDA (SHARDLM_CUDA=OFF, or no toolkit) each of them, except cuda_available and the
// pure CPU cases of the copies, throws a one-line Error saying the build has no CUDA.
//
// One GPU per process: everything here uses the current CUDA device, and all device work is
// ordered on the compute stream (ops/cuda/runtime.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace shardlm::device {

// True when this build has CUDA and the process sees a usable GPU. Never throws; when false and
// `why` is given, *why says why in one line ("built without CUDA", "no CUDA device", a driver
// error).
bool cuda_available(std::string* why = nullptr);
// Total bytes of this process's GPU (cudaMemGetInfo), or 0 where cuda_available() is false: the
// default memory budget of estimate-memory and validate.
int64_t cuda_device_memory();

// ---- The CUDA caching allocator ------------------------------------------------------------------
// Requests are rounded up to a size class (multiples of 512 B below 1 MiB, then four classes per
// power of two) and served from a free list of that class, or from cudaMalloc when it is empty.
// A freed block goes back to its free list, not to the driver: it may be handed out again at
// once, which is safe because every user enqueues its work on the one compute stream, after the
// work of the previous owner. Memory used on another stream must be synchronized with the
// compute stream before its Buffer is destroyed. When cudaMalloc fails, all cached blocks are
// released and it is tried once more; then an Error reports the sizes.
void* cuda_malloc(size_t bytes);       // 256-byte aligned; bytes > 0
void cuda_free(void* ptr) noexcept;    // a pointer from cuda_malloc (nullptr is ignored)
void cuda_memset_zero(void* ptr, size_t bytes);  // enqueued on the compute stream

struct CudaMemoryStats {
  int64_t allocated_live = 0;  // bytes in blocks handed out (size-class rounded)
  int64_t allocated_peak = 0;
  int64_t reserved_live = 0;   // bytes held from cudaMalloc (handed out + cached free blocks)
  int64_t reserved_peak = 0;
  int64_t driver_mallocs = 0;  // cudaMalloc calls made, to see that blocks are reused
  int64_t cache_hits = 0;      // allocations served from a free list
};
CudaMemoryStats cuda_memory_stats();
void cuda_reset_peak_stats();  // peaks := live values
// Returns every cached free block to the driver (synchronizes the device).
void cuda_empty_cache();

// ---- Pinned host memory ------------------------------------------------------------------------
void* pinned_malloc(size_t bytes);
void pinned_free(void* ptr) noexcept;

// ---- Copies -------------------------------------------------------------------------------------
// Copies `bytes` between any two devices (nothing when either is the meta device). Synchronous: when it returns, the bytes are at `dst`
// and every earlier op on the compute stream has finished (it waits for the compute stream).
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Waits for all work on the compute stream (no-op without CUDA).
void synchronize();

// ---- Copies that overlap compute (activation offload) ---------------------------------------------
// A copy lane: copies on a CUDA stream of its own, so that they run while the compute stream
// computes. A copy starts after all work enqueued on the compute stream before it was issued (it
// may read what that work writes, and overwrite what it reads) and returns a fence; after
// wait(fence), work enqueued on the compute stream starts after the copy has finished. Where
// neither tensor is on a GPU (CPU and meta tensors) the copy is synchronous and its fence has
// passed. Destroying the lane waits for its copies. One thread uses a lane.
class CopyLane {
 public:
  using Fence = uint64_t;
  CopyLane();
  ~CopyLane();
  CopyLane(const CopyLane&) = delete;
  CopyLane& operator=(const CopyLane&) = delete;
  // dst = src: same dtype and shape, contiguous.
  Fence copy(const Tensor& dst, const Tensor& src);
  void wait(Fence fence);

 private:
  struct Impl;  // CUDA: the stream and the events of fences not yet waited for
  Impl* impl_ = nullptr;
};

// dst = src for tensors of the same dtype and shape, on any devices (synchronous, as above).
void copy(const Tensor& dst, const Tensor& src);
// A new contiguous copy of `src` on `device` (CUDA: the host waits until it is there).
OwnedTensor copy_to_device(const Tensor& src, MemCategory category, Device device = Device::CUDA);
OwnedTensor copy_to_host(const Tensor& src, MemCategory category);

}  // namespace shardlm::device
