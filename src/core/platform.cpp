#include "core/platform.h"

#include <omp.h>
#include <unistd.h>

extern "C" char* openblas_get_config(void);

namespace shardlm {

#ifndef SHARDLM_HAVE_CUDA
std::vector<CudaDeviceInfo> cuda_devices(std::string* status) {
  if (status) *status = "built without CUDA";
  return {};
}
#endif

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

PlatformInfo platform_info() {
  PlatformInfo p;
  p.version = SHARDLM_VERSION;
  p.omp_threads = omp_get_max_threads();
  p.blas = openblas_get_config();
#ifdef SHARDLM_HAVE_MPI
  p.built_with_mpi = true;
#endif
#ifdef SHARDLM_HAVE_CUDA
  p.built_with_cuda = true;
#endif
  p.cuda_devices = cuda_devices(&p.cuda_status);
  return p;
}

}  // namespace shardlm
