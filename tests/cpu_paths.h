// The CPU's two matmul paths in tests (ops/cpu_bf16.h): a guard that sets one and restores the
// process's setting however the test ends, the paths this machine has, and why a test of the bf16
// path is skipped on a CPU without one.
#pragma once

#include <string>
#include <vector>

#include "ops/cpu_bf16.h"

namespace shardlm::testing {

// Sets the path for its lifetime (the default: keeps the current one), then restores what the
// process had: the path, and whether the bf16 path uses AMX tiles.
class CpuPath {
 public:
  CpuPath() : CpuPath(ops::cpu_bf16_enabled()) {}
  explicit CpuPath(bool bf16) : was_(ops::cpu_bf16_enabled()), amx_was_(ops::cpu_bf16_amx()) {
    ops::set_cpu_bf16_enabled(bf16);
  }
  ~CpuPath() {
    ops::set_cpu_bf16_enabled(was_);
    ops::set_cpu_bf16_amx(amx_was_);
  }
  CpuPath(const CpuPath&) = delete;
  CpuPath& operator=(const CpuPath&) = delete;

 private:
  bool was_, amx_was_;
};

// The f32 fallback, and the bf16 path where this CPU has one (false, then true).
inline std::vector<bool> cpu_paths() {
  std::vector<bool> paths{false};
  if (ops::cpu_bf16_status().hardware) paths.push_back(true);
  return paths;
}

// Each kernel family this CPU has: the f32 path; the bf16 path without AMX tiles (AVX512-BF16 dot
// products, and the f32 skinny kernel); the bf16 path with them. use() selects it (under a CpuPath).
struct CpuKernel {
  bool bf16_path, amx;
  void use() const {
    ops::set_cpu_bf16_enabled(bf16_path);
    ops::set_cpu_bf16_amx(amx);  // only kernels of a CPU with tiles have amx
  }
};
inline std::vector<CpuKernel> cpu_kernels() {
  std::vector<CpuKernel> kernels;
  for (bool bf16_path : cpu_paths()) kernels.push_back({bf16_path, false});
  if (ops::cpu_bf16_status().amx) kernels.push_back({true, true});  // the tiles are on (not switched off)
  return kernels;
}

// The skip message of a test that needs the bf16 path.
inline std::string no_cpu_bf16_path() {
  return "this CPU has no bf16 matmul path (needs AVX512-BF16 or AMX-BF16 and oneDNN): " + ops::cpu_bf16_status().line;
}

}  // namespace shardlm::testing
