// CUDA device discovery. The CUDA ops themselves arrive with the GPU backend; this file keeps the
// CUDA toolchain in every build that has one, so CI compiles CUDA code from the start.
#include <cuda_runtime.h>

#include "core/platform.h"

namespace shardlm {

std::vector<CudaDeviceInfo> cuda_devices(std::string* status) {
  std::vector<CudaDeviceInfo> out;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (status) *status = cudaGetErrorString(err);
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    out.push_back({prop.name, prop.major, prop.minor, prop.totalGlobalMem});
  }
  if (status) *status = count ? "ok" : "no CUDA device";
  return out;
}

}  // namespace shardlm
