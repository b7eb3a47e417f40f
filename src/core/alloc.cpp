#include "core/alloc.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <new>

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
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

MemoryTracker& MemoryTracker::for_device(Device d) {
  static MemoryTracker cpu, cuda;
  return d == Device::CPU ? cpu : cuda;
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

Buffer::Buffer(size_t bytes, MemCategory category, bool zero, Device device)
    : bytes_(bytes), category_(category), device_(device) {
  if (bytes == 0) return;
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
    const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
    data_ = std::aligned_alloc(64, rounded);
    if (!data_) {
      throw Error(fmt::format("out of host memory allocating {} for {}", format_bytes(int64_t(bytes)),
                              mem_category_name(category)));
    }
    if (zero) std::memset(data_, 0, rounded);
  }
  MemoryTracker::for_device(device_).on_alloc(category_, int64_t(bytes_));
}

Buffer Buffer::pinned_host(size_t bytes, MemCategory category, bool zero) {
  Buffer b;
  b.bytes_ = bytes;
  b.category_ = category;
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
    if (device_ == Device::CUDA)
      device::cuda_free(data_);
    else if (pinned_)
      device::pinned_free(data_);
    else
      std::free(data_);
    MemoryTracker::for_device(device_).on_free(category_, int64_t(bytes_));
  }
  data_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(o.data_), bytes_(o.bytes_), category_(o.category_), device_(o.device_), pinned_(o.pinned_) {
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
