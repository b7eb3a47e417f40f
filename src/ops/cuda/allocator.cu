// The CUDA side of core/device.h: the caching allocator, pinned host memory and copies.
//
// Caching: cudaMalloc and cudaFree are slow (cudaFree synchronizes the device), and training
// allocates and frees the same sizes every step (activations, workspaces). Blocks are therefore
// kept after they are freed, in a free list per size class, and handed out again to the next
// request of that class. Blocks are never split or merged: a request takes a whole block of its
// class, which wastes at most 25% (512 B below 1 MiB) and keeps the bookkeeping trivial.
//
// Reuse is safe without events because all device work is enqueued on the one compute stream:
// whatever the previous owner enqueued runs before anything the next owner enqueues.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "ops/cuda/runtime.h"

namespace shardlm::device {

namespace {

constexpr size_t kSmallGranule = 512;          // classes below 1 MiB are multiples of this
constexpr size_t kLargeThreshold = size_t(1) << 20;

// The size class a request of `bytes` is served from.
size_t size_class(size_t bytes) {
  if (bytes < kLargeThreshold) return (bytes + kSmallGranule - 1) / kSmallGranule * kSmallGranule;
  // Four classes per power of two: [2^k, 2^k * 1.25, 1.5, 1.75, 2^(k+1)).
  size_t p = kLargeThreshold;
  while (p <= bytes / 2) p *= 2;  // now p <= bytes < 2p
  const size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

class CachingAllocator {
 public:
  void* allocate(size_t bytes) {
    const size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto bin = free_.find(cls);
    if (bin != free_.end() && !bin->second.empty()) {
      void* p = bin->second.back();
      bin->second.pop_back();
      ++stats_.cache_hits;
      hand_out(p, cls);
      return p;
    }
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, cls);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the error this failure left behind before retrying
      release_cached_locked();
      err = cudaMalloc(&p, cls);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      if (err == cudaErrorMemoryAllocation)
        throw Error(fmt::format("out of CUDA memory allocating {} (allocated {}, reserved {} by shardlm)",
                                format_bytes(int64_t(bytes)), format_bytes(stats_.allocated_live),
                                format_bytes(stats_.reserved_live)));
      throw Error(fmt::format("CUDA error {}: cudaMalloc of {} failed: {}", cudaGetErrorName(err),
                              format_bytes(int64_t(bytes)), cudaGetErrorString(err)));
    }
    ++stats_.driver_mallocs;
    stats_.reserved_live += int64_t(cls);
    if (stats_.reserved_live > stats_.reserved_peak) stats_.reserved_peak = stats_.reserved_live;
    hand_out(p, cls);
    return p;
  }

  void free(void* p) noexcept {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;  // not ours: ignoring beats corrupting the free lists
    const size_t cls = it->second;
    live_.erase(it);
    stats_.allocated_live -= int64_t(cls);
    free_[cls].push_back(p);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

  CudaMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated_peak = stats_.allocated_live;
    stats_.reserved_peak = stats_.reserved_live;
  }

 private:
  void hand_out(void* p, size_t cls) {
    live_[p] = cls;
    stats_.allocated_live += int64_t(cls);
    if (stats_.allocated_live > stats_.allocated_peak) stats_.allocated_peak = stats_.allocated_live;
  }

  // cudaFree waits for the device, so no queued kernel can still be using a released block.
  void release_cached_locked() {
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) {
        SHARDLM_CUDA_CHECK(cudaFree(p));
        stats_.reserved_live -= int64_t(cls);
      }
      blocks.clear();
    }
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> cached free blocks
  std::unordered_map<void*, size_t> live_;               // handed-out block -> its size class
  CudaMemoryStats stats_;
};

// Never destroyed: Buffers in static storage may be freed after main returns, and the CUDA
// context may already be gone by then; the driver reclaims everything at exit.
CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();
  return *a;
}

}  // namespace

bool cuda_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = fmt::format("no usable CUDA device ({})", cudaGetErrorString(err));
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  if (why) *why = "ok";
  return true;
}

int64_t cuda_device_memory() {
  if (!cuda_available()) return 0;
  size_t free_bytes = 0, total = 0;
  SHARDLM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return int64_t(total);
}

void* cuda_malloc(size_t bytes) {
  SHARDLM_CHECK(bytes > 0, "cuda_malloc: zero bytes requested");
  return allocator().allocate(bytes);
}

void cuda_free(void* ptr) noexcept { allocator().free(ptr); }

void cuda_memset_zero(void* ptr, size_t bytes) {
  if (bytes == 0) return;
  SHARDLM_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, cuda::compute_stream()));
}

CudaMemoryStats cuda_memory_stats() { return allocator().stats(); }
void cuda_reset_peak_stats() { allocator().reset_peaks(); }
void cuda_empty_cache() { allocator().empty_cache(); }

void* pinned_malloc(size_t bytes) {
  void* p = nullptr;
  SHARDLM_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}

void pinned_free(void* ptr) noexcept {
  if (ptr) (void)cudaFreeHost(ptr);  // a destructor path: nothing useful to do with an error
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0 || dst_device == Device::Meta || src_device == Device::Meta) return;  // meta: no bytes to move
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memmove(dst, src, bytes);
    return;
  }
  // cudaMemcpyDefault infers the direction from the pointers (unified addressing). Enqueued on
  // the compute stream so it is ordered after the ops that produced `src`, then waited for.
  const cudaStream_t s = cuda::compute_stream();
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(s));
}

void synchronize() { SHARDLM_CUDA_CHECK(cudaStreamSynchronize(cuda::compute_stream())); }

// ---- CopyLane ---------------------------------------------------------------------------------------
// A stream made on the first copy that touches the GPU. Each such copy: an event recorded on the
// compute stream that the lane's stream waits for, the copy, an event recorded after it; wait()
// makes the compute stream wait for that event (the wait captures the event's state when it is
// enqueued, so the event can be recorded again afterwards and goes back to the free list).
struct CopyLane::Impl {
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> free;
  std::unordered_map<Fence, cudaEvent_t> pending;  // fences not waited for yet
  Fence next = 1;
  cudaEvent_t event() {
    if (!free.empty()) {
      cudaEvent_t e = free.back();
      free.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    SHARDLM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
};

CopyLane::CopyLane() : impl_(new Impl) {}

CopyLane::~CopyLane() {
  if (impl_->stream) (void)cudaStreamSynchronize(impl_->stream);  // may run at exit: errors ignored
  for (auto& [f, e] : impl_->pending) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : impl_->free) (void)cudaEventDestroy(e);
  if (impl_->stream) (void)cudaStreamDestroy(impl_->stream);
  delete impl_;
}

CopyLane::Fence CopyLane::copy(const Tensor& dst, const Tensor& src) {
  if (dst.device != Device::CUDA && src.device != Device::CUDA) {
    device::copy(dst, src);
    return 0;
  }
  SHARDLM_CHECK(dst.is_contiguous() && src.is_contiguous() && dst.dtype == src.dtype && same_shape(dst, src),
                "copy lane: destination {} does not match source {}", dst.describe(), src.describe());
  Impl& m = *impl_;
  if (!m.stream) SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  cudaEvent_t after_compute = m.event();
  SHARDLM_CUDA_CHECK(cudaEventRecord(after_compute, cuda::compute_stream()));
  SHARDLM_CUDA_CHECK(cudaStreamWaitEvent(m.stream, after_compute, 0));
  m.free.push_back(after_compute);
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDefault, m.stream));
  cudaEvent_t done = m.event();
  SHARDLM_CUDA_CHECK(cudaEventRecord(done, m.stream));
  const Fence f = m.next++;
  m.pending.emplace(f, done);
  return f;
}

void CopyLane::wait(Fence fence) {
  auto it = impl_->pending.find(fence);
  if (it == impl_->pending.end()) return;  // passed (a synchronous copy) or waited for already
  SHARDLM_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), it->second, 0));
  impl_->free.push_back(it->second);
  impl_->pending.erase(it);
}

}  // namespace shardlm::device
