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

// OpenBLAS (Debian 12's 0.3.21, a DYNAMIC_ARCH build) picks its kernels by CPU model number when it
// is loaded, and a model newer than it (Intel's Emerald Rapids, family 6 model 207, for one) gets
// its generic "Prescott" kernels: sgemm 5.6x slower than its AVX-512 ones on such a machine
// (bench/RESULTS.md, 2026-11-26). When OpenBLAS chose a pre-AVX core on a CPU (and OS) with
// AVX-512 or AVX2, this names the core by those features (OPENBLAS_CORETYPE=SkylakeX or Haswell)
// and re-executes the program in place, once: OpenBLAS reads the variable only when it is loaded.
// Nothing happens when OPENBLAS_CORETYPE is set already (a user's choice, or the second run) or
// OpenBLAS recognised the CPU. Call it first in main, before threads or MPI start. If the
// re-execution fails, the program goes on with the generic kernels.
void select_blas_kernels(char** argv);
// The core OpenBLAS chose (its corename), for `shardlm env`.
std::string blas_core();

// This machine's host name (gethostname), "localhost" if it has none: how ranks, locks and logs
// name a node.
std::string host_name();

// Implemented in ops/cuda/ when built with CUDA.
std::vector<CudaDeviceInfo> cuda_devices(std::string* status);

}  // namespace shardlm
