#include "core/platform.h"

#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);

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

std::string blas_core() { return openblas_get_corename(); }

void select_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  // The cores OpenBLAS 0.3.21 falls back to, or detects on CPUs without AVX.
  static const char* const kGeneric[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                         "Katmai",   "Coppermine", "Northwood", "Banias", "Unknown"};
  const char* core = openblas_get_corename();
  bool generic = core == nullptr;
  for (const char* g : kGeneric) generic = generic || std::strcmp(core, g) == 0;
  if (!generic) return;
  // __builtin_cpu_supports checks the OS's XSAVE state too (libgcc's cpu model reads XCR0).
  const char* want = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    want = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    want = "Haswell";
  if (!want) return;
  // The program's own path, not /proc/self/exe: the kernel names a process after the file it runs,
  // and tools find shardlm's processes by that name (pgrep, the Kubernetes entry's signal relay).
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0 || n >= ssize_t(sizeof(self) - 1)) return;
  self[n] = '\0';
  ::setenv("OPENBLAS_CORETYPE", want, 1);
  ::execv(self, argv);  // returns only on failure: go on as we are
}

}  // namespace shardlm
