#include "core/alloc.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <new>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace shardlm {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Parameters: return "parameters";
    case MemCategory::Gradients: return "gradients";
    case MemCategory::Optimizer: return "optimizer";
    case MemCategory::Activations: return "activations";
    case MemCategory::Communication: return "communication";
    case MemCategory::Workspace: return "workspace";
    case MemCategory::Other: return "other";
    case MemCategory::OffloadedActivations: return "act_offloaded";
  }
  return "?";
}

const char* device_name(Device d) {
  switch (d) {
    case Device::CPU: return "cpu";
    case Device::CUDA: return "cuda";
    case Device::Meta: return "meta";
  }
  return "?";
}

MemoryTracker& MemoryTracker::for_device(Device d) {
  static MemoryTracker cpu, cuda, meta;
  return d == Device::CPU ? cpu : d == Device::CUDA ? cuda : meta;
}

void MemoryTracker::on_alloc(MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = int(c);
  s_.live[i] += bytes;
  s_.live_total += bytes;
  if (s_.live[i] > s_.peak[i]) s_.peak[i] = s_.live[i];
  if (s_.live_total > s_.peak_total) s_.peak_total = s_.live_total;
}

void MemoryTracker::on_free(MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.live[int(c)] -= bytes;
  s_.live_total -= bytes;
}

MemStats MemoryTracker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak = s_.live;
  s_.peak_total = s_.live_total;
}

// ---- the host block cache ---------------------------------------------------------------------
//
// The engine allocates the same large buffers over and over: a unit's gathered parameters and
// gradient accumulators on every visit, the activations of every layer on every step. glibc
// serves blocks this large (above its 32 MiB mmap threshold at most) with a fresh mmap each time
// and returns them with munmap, so every visit paid a page fault and a kernel zeroing per 4 KiB
// page, then our own memset: measured on the 506M model, half of a 2-rank step went to that.
// So freed CPU blocks of kCacheMinBytes and more are kept here, keyed by their exact size, and
// handed out again for the same size. And blocks of kHugeMinBytes and more are 2 MiB aligned,
// rounded up to 2 MiB and advised as transparent huge pages (MADV_HUGEPAGE): a fresh one faults in
// 2 MiB at a time instead of 4 KiB (512x fewer faults, each a VM exit on a virtual machine), and
// the TLB covers a matrix product's operands. (The tracker charges the bytes asked for; the
// rounding adds under 2 MiB to each such buffer.)
//
// The cache never raises the footprint of the blocks it manages (live + cached) above the peak of
// their live bytes, which the MemoryTracker's peak covers: a block is cached only when freed
// (footprint unchanged), reused only for its exact size (unchanged), and an allocation that finds
// no block of its size releases only the excess, live + cached - peak after it is counted: the
// smallest cached block at least that large, or if there is none, cached blocks oldest first. In a
// training step that repeats the last one's pattern the peak is already known, so a miss
// usually releases nothing (releasing a block whenever a smaller size misses gave the 506M model a
// fresh 1 GiB gradient, page faults and all, in every 2-rank step). SHARDLM_HOST_CACHE=0 turns it off; sanitizer builds
// never cache, so AddressSanitizer still sees every use after free.
namespace {

constexpr size_t kCacheMinBytes = size_t(1) << 20;
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kHugeMinBytes = size_t(8) << 20;

// The bytes of the block that holds a buffer of `bytes`: a multiple of the alignment
// (aligned_alloc needs one), 2 MiB for huge-page blocks, else 64.
size_t host_block_bytes(size_t bytes) {
  const size_t align = bytes >= kHugeMinBytes ? kHugePage : 64;
  return (bytes + align - 1) / align * align;
}

// A block from the system (nullptr when it has none).
void* system_alloc(size_t block) {
  if (block < kHugeMinBytes) return std::aligned_alloc(64, block);
  void* p = std::aligned_alloc(kHugePage, block);
  if (p) ::madvise(p, block, MADV_HUGEPAGE);  // advice: where refused, the block keeps 4 KiB pages
  return p;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SHARDLM_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define SHARDLM_SANITIZED 1
#endif
#endif

class HostBlockCache {
 public:
  static HostBlockCache& get() {
    static HostBlockCache* cache = new HostBlockCache;  // never destroyed: buffers may outlive statics
    return *cache;
  }
  bool enabled() const { return enabled_; }

  // A block of exactly `rounded` bytes (64-byte aligned), from the cache or the system; nullptr
  // when the system has none.
  void* take(size_t rounded) {
    std::vector<void*> evicted;
    {
      std::lock_guard lock(mu_);
      live_ += rounded;
      for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
        if (it->bytes != rounded) continue;
        void* p = it->data;
        cached_ -= rounded;
        blocks_.erase(it);
        ++hits_;
        return p;
      }
      peak_ = std::max(peak_, live_);
      const size_t excess = live_ + cached_ > peak_ ? live_ + cached_ - peak_ : 0;
      auto best = blocks_.end();  // the smallest block at least as large as the excess
      for (auto it = blocks_.begin(); excess > 0 && it != blocks_.end(); ++it)
        if (it->bytes >= excess && (best == blocks_.end() || it->bytes < best->bytes)) best = it;
      size_t released = 0;
      if (best != blocks_.end()) {
        evicted.push_back(best->data);
        released = best->bytes;
        cached_ -= best->bytes;
        blocks_.erase(best);
      }
      while (!blocks_.empty() && released < excess) {  // else oldest first
        evicted.push_back(blocks_.front().data);
        released += blocks_.front().bytes;
        cached_ -= blocks_.front().bytes;
        blocks_.pop_front();
      }
    }
    for (void* p : evicted) std::free(p);
    void* p = system_alloc(rounded);
    if (!p) {
      std::lock_guard lock(mu_);
      live_ -= rounded;  // nothing was handed out
    }
    return p;
  }

  void give(void* p, size_t rounded) {
    std::lock_guard lock(mu_);
    blocks_.push_back({p, rounded});
    cached_ += rounded;
    live_ -= rounded;
  }

  HostCacheStats stats() {
    std::lock_guard lock(mu_);
    return {int64_t(cached_), int64_t(blocks_.size()), hits_, enabled_};
  }

  void release_all() {
    std::deque<Block> all;
    {
      std::lock_guard lock(mu_);
      all.swap(blocks_);
      cached_ = 0;
      peak_ = live_;  // a new phase: its own peak bounds what the cache keeps from here
    }
    for (const Block& b : all) std::free(b.data);
  }

 private:
  HostBlockCache() {
#ifdef SHARDLM_SANITIZED
    enabled_ = false;
#else
    const char* env = std::getenv("SHARDLM_HOST_CACHE");
    enabled_ = !env || std::string(env) != "0";
#endif
  }
  struct Block {
    void* data;
    size_t bytes;
  };
  std::mutex mu_;
  std::deque<Block> blocks_;  // oldest first; few (the engine's buffer sizes repeat), so a scan is fine
  size_t cached_ = 0;
  size_t live_ = 0;  // bytes of blocks of cached sizes handed out and not yet given back
  size_t peak_ = 0;  // the most live_ has been
  int64_t hits_ = 0;
  bool enabled_ = true;
};

bool host_cached_size(size_t bytes) { return bytes >= kCacheMinBytes && HostBlockCache::get().enabled(); }

}  // namespace

HostCacheStats host_cache_stats() { return HostBlockCache::get().stats(); }
void release_host_cache() { HostBlockCache::get().release_all(); }

namespace {
thread_local MetaObserver* t_meta_observer = nullptr;

// Where a meta buffer "is": an address range of its own (ops check that their arguments do not
// overlap), 256-byte aligned, never reused, and above the user half of the x86-64 and AArch64
// address spaces, so that a read through it faults instead of returning garbage.
void* meta_address(size_t bytes) {
  static std::atomic<uintptr_t> next{uintptr_t{1} << 62};
  return reinterpret_cast<void*>(next.fetch_add((bytes + 511) / 256 * 256));
}
}  // namespace

ObserveMeta::ObserveMeta(MetaObserver& o) : previous_(t_meta_observer) { t_meta_observer = &o; }
ObserveMeta::~ObserveMeta() { t_meta_observer = previous_; }

void meta_flops(double flops) {
  if (t_meta_observer) t_meta_observer->on_flops(flops);
}
void meta_traffic(double bytes) {
  if (t_meta_observer) t_meta_observer->on_traffic(bytes);
}
int64_t meta_collective(const void* group, DryCollective kind, int64_t ring_bytes) {
  return t_meta_observer ? t_meta_observer->on_collective(group, kind, ring_bytes) : 0;
}
void meta_wait(int64_t id) {
  if (t_meta_observer) t_meta_observer->on_wait(id);
}

Buffer::Buffer(size_t bytes, MemCategory category, bool zero, Device device, MemTag tag)
    : bytes_(bytes), category_(category), device_(device), tag_(tag) {
  if (bytes == 0) return;
  if (device == Device::Meta) {
    data_ = meta_address(bytes);
    MemoryTracker::for_device(device_).on_alloc(category_, int64_t(bytes_));
    if (t_meta_observer) t_meta_observer->on_alloc(*this);
    return;
  }
  if (device == Device::CUDA) {
    data_ = device::cuda_malloc(bytes);  // throws on failure, never returns nullptr
    if (zero) {
      try {
        device::cuda_memset_zero(data_, bytes);
      } catch (...) {
        device::cuda_free(data_);  // the destructor will not run for a throwing constructor
        throw;
      }
    }
  } else {
    const size_t rounded = host_block_bytes(bytes);
    data_ = host_cached_size(bytes) ? HostBlockCache::get().take(rounded) : system_alloc(rounded);
    if (!data_) {
      throw Error(fmt::format("out of host memory allocating {} for {}", format_bytes(int64_t(bytes)),
                              mem_category_name(category)));
    }
    if (zero) std::memset(data_, 0, rounded);
  }
  MemoryTracker::for_device(device_).on_alloc(category_, int64_t(bytes_));
}

Buffer Buffer::pinned_host(size_t bytes, MemCategory category, bool zero, MemTag tag) {
  Buffer b;
  b.bytes_ = bytes;
  b.category_ = category;
  b.tag_ = tag;
  if (bytes == 0) return b;
  b.data_ = device::pinned_malloc(bytes);  // throws on failure (and in a build without CUDA)
  b.pinned_ = true;
  if (zero) std::memset(b.data_, 0, bytes);
  MemoryTracker::for_device(Device::CPU).on_alloc(category, int64_t(bytes));
  return b;
}

Buffer::~Buffer() { release(); }

void Buffer::release() {
  if (data_) {
    if (device_ == Device::Meta) {
      if (t_meta_observer) t_meta_observer->on_free(*this);
    } else if (device_ == Device::CUDA)
      device::cuda_free(data_);
    else if (pinned_)
      device::pinned_free(data_);
    else if (host_cached_size(bytes_))
      HostBlockCache::get().give(data_, host_block_bytes(bytes_));
    else
      std::free(data_);
    MemoryTracker::for_device(device_).on_free(category_, int64_t(bytes_));
  }
  data_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(o.data_), bytes_(o.bytes_), category_(o.category_), device_(o.device_), pinned_(o.pinned_), tag_(o.tag_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
  o.pinned_ = false;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    bytes_ = o.bytes_;
    category_ = o.category_;
    device_ = o.device_;
    pinned_ = o.pinned_;
    tag_ = o.tag_;
    o.data_ = nullptr;
    o.bytes_ = 0;
    o.pinned_ = false;
  }
  return *this;
}

std::string format_bytes(int64_t bytes) {
  const double b = double(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

}  // namespace shardlm
