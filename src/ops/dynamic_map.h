// bitsandbytes' 8-bit dynamic quantization maps and the search that picks a value's code in one.
// Shared by NF4's double quantization (ops/nf4.h: the signed map codes the absmax values) and the
// 8-bit optimizer state (ops.h quantize_blockwise8: signed for exp_avg, unsigned for exp_avg_sq),
// on the CPU and in the CUDA kernels, so every path picks the same codes.
#pragma once

#include <array>

#include "core/float_bits.h"

namespace shardlm::ops {

// create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8): 256 ascending f32 values;
// for exponent e = 0..6 the midpoints of float32 linspace(0.1, 1, k + 1) scaled by 10^(e - 6),
// k = 2^e signed (with their negatives) and 2^(e+1) unsigned; with 0 and 1. Signed spans
// [-0.993, 1], unsigned [0, 1].
extern const std::array<float, 256> kDynamicMapSigned;
extern const std::array<float, 256> kDynamicMapUnsigned;

inline const float* dynamic_map(bool is_signed) {
  return is_signed ? kDynamicMapSigned.data() : kDynamicMapUnsigned.data();
}

// bitsandbytes' dQuantize<0> over a 256-value dynamic map `code` (ascending): a binary search from
// index 127 in steps 64, 32, ..., 1 that remembers the last index below and above x, then a
// comparison with the f32 midpoint to the neighbour on x's side. Ties go to the searched index. (a + b) * 0.5f
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
