// The CPU's two matmul paths in tests (ops/cpu_bf16.h): a guard that sets one and restores the
// process's setting however the test ends, the paths this machine has, and why a test of the bf16
// path is skipped on a CPU without one.
#pragma once

#include <string>
#include <vector>

#include "ops/cpu_bf16.h"

namespace shardlm::testing {

// Sets the path for its lifetime (the default: keeps the current one), then restores what the
// process had.
class CpuPath {
 public:
  CpuPath() : CpuPath(ops::cpu_bf16_enabled()) {}
  explicit CpuPath(bool bf16) : was_(ops::cpu_bf16_enabled()) { ops::set_cpu_bf16_enabled(bf16); }
  ~CpuPath() { ops::set_cpu_bf16_enabled(was_); }
  CpuPath(const CpuPath&) = delete;
  CpuPath& operator=(const CpuPath&) = delete;

 private:
  bool was_;
};

// The f32 fallback, and the bf16 path where this CPU has one (false, then true).
inline std::vector<bool> cpu_paths() {
  std::vector<bool> paths{false};
  if (ops::cpu_bf16_status().hardware) paths.push_back(true);
  return paths;
}

// The skip message of a test that needs the bf16 path.
inline std::string no_cpu_bf16_path() {
  return "this CPU has no bf16 matmul path (needs AVX512-BF16 or AMX-BF16 and oneDNN): " + ops::cpu_bf16_status().line;
}

}  // namespace shardlm::testing
