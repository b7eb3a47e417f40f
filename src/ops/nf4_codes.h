// The two code searches of NF4 quantization (ops/nf4.h), written once for the CPU kernels
// (ops/cpu/nf4.cpp) and the CUDA ones (ops/cuda/nf4.cu), so both pick the same codes.
#pragma once

#include <cstdint>

#include "core/float_bits.h"

namespace shardlm::ops {

// The NF4 code of a scaled value: the number of bitsandbytes' 15 decision thresholds below x
// (its decision tree as a count; NaN: 0).
SHARDLM_HOST_DEVICE unsigned nf4_code(float x, const float* thresholds) {
  unsigned c = 0;
  for (int k = 0; k < 15; ++k) c += x > thresholds[k] ? 1u : 0u;
  return c;
}

// bitsandbytes' dQuantize<0> over the 256-value dynamic map `code`: a binary search from index
// 127 in steps 64, 32, ..., 1 that remembers the last index below and above x, then a comparison
// with the f32 midpoint to the neighbour on x's side. Ties go to the searched index. (a + b) * 0.5f
// has no product to fuse, so host and device round it alike.
SHARDLM_HOST_DEVICE unsigned dynamic_code(float x, const float* code) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[pivot];
  for (int step = 64; step > 0; step >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += step;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= step;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[255];
  if (lower_pivot == 0) lower = code[0];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return unsigned(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return unsigned(x < midpoint ? lower_pivot : pivot);
}

}  // namespace shardlm::ops
