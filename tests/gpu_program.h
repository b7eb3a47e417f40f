// The frame of the GPU test programs (gpu_train, gpu_generate): plain programs, built in every
// configuration, that compare a GPU run with the CPU's. Where there is no GPU (or the build has no
// CUDA) they print why nothing was compared and exit with kSkipped, which ctest reports as skipped
// (SKIP_RETURN_CODE), never as passed.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <string>

#include "core/device.h"

namespace shardlm::testing {

constexpr int kSkipped = 77;  // ctest's SKIP_RETURN_CODE

// run() where a GPU is present: its status (0 passed, 1 failed), or 1 when it throws. Otherwise
// "NAME: SKIPPED: no GPU to run on: WHY; nothing was compared (ELSEWHERE)" and kSkipped, where
// `elsewhere` says which tests check the CPU side.
template <class Run>
int run_gpu_program(const char* name, const char* elsewhere, Run run) {
  std::string why;
  if (!device::cuda_available(&why)) {
    fmt::print("{}: SKIPPED: no GPU to run on: {}; nothing was compared ({})\n", name, why, elsewhere);
    return kSkipped;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    fmt::print("FAIL {}: {}\n", name, e.what());
    return 1;
  }
}

}  // namespace shardlm::testing
