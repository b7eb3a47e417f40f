// Tracked memory: every large buffer in shardlm is a Buffer charged to a category.
//
// The tracker keeps live and peak bytes per category and the peak of their sum, so training can
// report where memory goes and `estimate-memory` can be checked against what was measured.
// A Buffer owns its bytes (move-only) and uncharges them when destroyed; Tensors are non-owning
// views into Buffers (see tensor.h).
//
// A Buffer lives on a Device. CPU buffers are 64-byte aligned host memory, optionally pinned
// (page-locked, for fast and asynchronous copies to and from a GPU: see Buffer::pinned_host).
// CUDA buffers come from the caching allocator in ops/cuda/allocator.cu (through core/device.h,
// so this header and alloc.cpp never include CUDA headers); they are charged to
// MemoryTracker::for_device(Device::CUDA) with the bytes requested, while the allocator itself
// reports the rounded bytes it hands out and the bytes it has reserved from the driver.
//
// The meta device (Device::Meta) has buffers with sizes and no memory: dry runs (the memory
// estimator, memory/estimator.h) run the real engine and model on it. A meta buffer's data is a
// non-null address range of its own that must never be read: ops on meta tensors check their arguments and skip
// the math (ops/check.h), copies to or from it do nothing. Meta stands for a CPU rank's host
// memory: code that asks whether memory is on a GPU gets "no". Its allocations are charged to
// MemoryTracker::for_device(Device::Meta) and reported, in order, to the calling thread's
// MetaObserver, with the tag their owner gave them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/dtype.h"

namespace shardlm {

enum class MemCategory : uint8_t {
  Parameters,     // full or sharded parameters in compute dtype, master weights
  Gradients,      // gradient accumulators
  Optimizer,      // AdamW moments
  Activations,    // what forward keeps for backward
  Communication,  // gather/scatter staging buffers
  Workspace,      // scratch that dies within an op (conversions, logits chunks)
  Other,
  // Saved activations moved to host memory between a layer's forward and its backward
  // (offload_activations): pinned beside a GPU; on a CPU rank the same RAM, counted apart so the
  // offload's accounting is visible and tested there.
  OffloadedActivations,
};
constexpr int kNumMemCategories = 8;
const char* mem_category_name(MemCategory c);

enum class Device : uint8_t { CPU, CUDA, Meta };
const char* device_name(Device d);  // "cpu", "cuda", "meta"

// What a buffer is for, finer than its category, where its owner says so. Only a MetaObserver
// (the memory estimator's table) reads it.
using MemTag = uint8_t;
namespace mem_tag {
constexpr MemTag kNone = 0;
constexpr MemTag kLossScratch = 1;   // linear_cross_entropy's logits chunk and widened copies
constexpr MemTag kRingScratch = 2;   // the ring collectives' scratch (comm/ring_collectives.h)
constexpr MemTag kEngineRole = 16;   // + shard::BufferRole: the sharding engine's buffers
constexpr MemTag kHost = 0x80;       // or-ed in: host memory standing beside a GPU (offload)
}  // namespace mem_tag

struct MemStats {
  std::array<int64_t, kNumMemCategories> live{};
  std::array<int64_t, kNumMemCategories> peak{};  // the highest `live` each category reached
  int64_t live_total = 0;
  int64_t peak_total = 0;  // the highest sum over categories (not the sum of per-category peaks)
};

// Thread-safe counters for one device. Allocation is rare (large buffers), so a mutex is fine.
class MemoryTracker {
 public:
  static MemoryTracker& for_device(Device d);
  void on_alloc(MemCategory c, int64_t bytes);
  void on_free(MemCategory c, int64_t bytes);
  MemStats stats() const;
  void reset_peaks();  // peaks := current live values

 private:
  mutable std::mutex mu_;
  MemStats s_;
};

// Owning, move-only allocation charged to a category, on the CPU (64-byte aligned) or on the
// current CUDA device (256-byte aligned, from the caching allocator; zeroing is enqueued on the
// compute stream). A CUDA Buffer in a build without CUDA throws "built without CUDA".
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, MemCategory category, bool zero = true, Device device = Device::CPU, MemTag tag = 0);
  // Page-locked host memory (cudaHostAlloc): a CPU buffer the GPU can copy from and to
  // asynchronously, for CPU offload. Throws in a build without CUDA.
  static Buffer pinned_host(size_t bytes, MemCategory category, bool zero = true, MemTag tag = 0);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }
  MemTag tag() const { return tag_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::Other;
  Device device_ = Device::CPU;
  bool pinned_ = false;  // CPU only: allocated with cudaHostAlloc, freed with cudaFreeHost
  MemTag tag_ = 0;
};

// A collective of a shape-only communicator (comm::make_shape_communicator), as a dry run sees it.
enum class DryCollective : uint8_t { AllGather, ReduceScatter, AllReduce, Broadcast, Scalar };

// Sees what a dry run does on this thread while it is installed: every allocation and release of
// meta buffers (the memory estimate), and the work in order (the step-time model,
// memory/step_time.h): the arithmetic of each op run on meta tensors (the FLOPs of matmuls and
// attention; the bytes elementwise ops, norms and the optimizer read and write), and each collective
// of a shape-only communicator from issue to wait.
class MetaObserver {
 public:
  virtual ~MetaObserver() = default;
  virtual void on_alloc(const Buffer& b) = 0;
  virtual void on_free(const Buffer& b) = 0;
  virtual void on_flops(double /*flops*/) {}
  virtual void on_traffic(double /*bytes*/) {}
  // `group` identifies the communicator; ring_bytes are what this rank sends (comm::CommStats's
  // accounting). Returns an id that on_wait receives when the caller waits for the collective.
  virtual int64_t on_collective(const void* /*group*/, DryCollective /*kind*/, int64_t /*ring_bytes*/) { return 0; }
  virtual void on_wait(int64_t /*id*/) {}
};
// Report to this thread's observer, if any: an op's floating-point operations on meta tensors, the
// bytes a memory-bound op reads and writes, a shape-only collective's issue, and its wait.
void meta_flops(double flops);
void meta_traffic(double bytes);
int64_t meta_collective(const void* group, DryCollective kind, int64_t ring_bytes);
void meta_wait(int64_t id);
// Installs `o` as this thread's MetaObserver for its lifetime (and restores the previous one).
class ObserveMeta {
 public:
  explicit ObserveMeta(MetaObserver& o);
  ~ObserveMeta();
  ObserveMeta(const ObserveMeta&) = delete;
  ObserveMeta& operator=(const ObserveMeta&) = delete;

 private:
  MetaObserver* previous_;
};

// The host block cache (alloc.cpp): freed CPU buffers of 1 MiB and more are kept and reused for
// the same size instead of going back to the system, without ever raising the footprint above the
// peak live bytes. What it holds is not charged to any category (it is not live).
struct HostCacheStats {
  int64_t cached_bytes = 0;  // held, free, for reuse
  int64_t blocks = 0;
  int64_t hits = 0;          // allocations served from the cache since start-up
  bool enabled = true;       // false under SHARDLM_HOST_CACHE=0 and in sanitizer builds
};
HostCacheStats host_cache_stats();
// Returns every cached block to the system (after training, before a phase of different sizes),
// and starts a new phase: from here the cache keeps blocks within the peak of the live bytes that
// follow, not of those before.
void release_host_cache();

std::string format_bytes(int64_t bytes);  // "1.50 GiB", "12.0 MiB", "512 B"

}  // namespace shardlm
