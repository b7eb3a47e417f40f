#include "ops/cuda/runtime.h"

#include <fmt/format.h>

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

}  // namespace shardlm::cuda
