// What this build and this machine offer: threads, BLAS, MPI, CUDA devices.
#pragma once

#include <string>
#include <vector>

namespace shardlm {

struct CudaDeviceInfo {
  std::string name;
  int compute_major = 0, compute_minor = 0;
  size_t total_bytes = 0;
};

struct PlatformInfo {
  std::string version;
  int omp_threads = 1;
  std::string blas;          // OpenBLAS configuration string
  bool built_with_mpi = false;
  bool built_with_cuda = false;
  std::vector<CudaDeviceInfo> cuda_devices;  // empty without CUDA or without a GPU
  std::string cuda_status;                   // why there are no devices, when there are none
};

PlatformInfo platform_info();

// This machine's host name (gethostname), "localhost" if it has none: how ranks, locks and logs
// name a node.
std::string host_name();

// Implemented in ops/cuda/ when built with CUDA.
std::vector<CudaDeviceInfo> cuda_devices(std::string* status);

}  // namespace shardlm
