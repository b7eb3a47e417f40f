#include "ops/cuda/runtime.h"

#include <fmt/format.h>

#include <cstring>
#include <mutex>

#include "core/error.h"

namespace shardlm::cuda {

void check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw Error(fmt::format("CUDA error {}: {} ({}:{})", cudaGetErrorName(err), what, file, line));
}

bool available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

cudaStream_t compute_stream() {
  static std::once_flag once;
  static cudaStream_t stream = nullptr;
  std::call_once(once, [] { SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); });
  return stream;
}

namespace {
// The staging slots of upload_async: pinned memory and the event recorded after the copy that read
// it. Created on first use, owned by the process, never freed (as the compute stream).
struct UploadSlots {
  static constexpr int kSlots = 64;
  std::mutex mutex;
  char* pinned = nullptr;
  cudaEvent_t read[kSlots] = {};
  bool used[kSlots] = {};
  int next = 0;
};
UploadSlots& upload_slots() {
  static UploadSlots* slots = [] {
    auto* s = new UploadSlots;
    SHARDLM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&s->pinned), UploadSlots::kSlots * kUploadSlotBytes,
                                     cudaHostAllocDefault));
    for (cudaEvent_t& e : s->read) SHARDLM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return s;
  }();
  return *slots;
}
}  // namespace

void upload_async(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (bytes > kUploadSlotBytes) {
    // Rare (a block table of over 4096 blocks): from pageable memory, which the driver stages
    // before returning, waiting for the stream if it must.
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_stream()));
    return;
  }
  UploadSlots& s = upload_slots();
  std::lock_guard<std::mutex> lock(s.mutex);
  const int i = s.next;
  s.next = (s.next + 1) % UploadSlots::kSlots;
  // The copy that last read this slot was enqueued kSlots uploads ago: it has almost always run.
  if (s.used[i]) SHARDLM_CUDA_CHECK(cudaEventSynchronize(s.read[i]));
  char* slot = s.pinned + size_t(i) * kUploadSlotBytes;
  std::memcpy(slot, src, bytes);
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, compute_stream()));
  SHARDLM_CUDA_CHECK(cudaEventRecord(s.read[i], compute_stream()));
  s.used[i] = true;
}

}  // namespace shardlm::cuda
