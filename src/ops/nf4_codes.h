// The NF4 code search (ops/nf4.h), written once for the CPU kernels (ops/cpu/nf4.cpp) and the
// CUDA ones (ops/cuda/nf4.cu), so both pick the same codes. The search of the nested absmax codes
// is ops/dynamic_map.h's dynamic_code.
#pragma once

#include <cstdint>

#include "core/float_bits.h"
#include "ops/dynamic_map.h"

namespace shardlm::ops {

// The NF4 code of a scaled value: the number of bitsandbytes' 15 decision thresholds below x
// (its decision tree as a count; NaN: 0).
SHARDLM_HOST_DEVICE unsigned nf4_code(float x, const float* thresholds) {
  unsigned c = 0;
  for (int k = 0; k < 15; ++k) c += x > thresholds[k] ? 1u : 0u;
  return c;
}

}  // namespace shardlm::ops
