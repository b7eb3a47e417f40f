// bitsandbytes' 8-bit dynamic quantization maps and the search that picks a value's code in one.
// Shared by NF4's double quantization (ops/nf4.h: the signed map codes the absmax values) and the
// 8-bit optimizer state (ops.h quantize_blockwise8: signed for exp_avg, unsigned for exp_avg_sq),
// on the CPU and in the CUDA kernels, so every path picks the same codes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

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

// dynamic_code's result for every float (NaN and infinities included), found without its chain of
// seven dependent loads and branches: the CPU's quantizer (a few times faster). For x, k = the
// number of map values below x; x lies in (code[k-1], code[k]], which fixes the search's path, so
// the code is k - 1 or k by the same f32 midpoint, and on the midpoint itself what the search
// returns there (precomputed). k is counted from the bucket of x's top 13 bits (sign, exponent, 4
// mantissa bits): the map values below the whole bucket, plus those of the next kSpan that are
// below x (at most kSpan lie within a bucket of these maps; the ones after it are above x).
class DynamicCoder {
 public:
  static constexpr int kSpan = 5;
  explicit DynamicCoder(const float* code);
  unsigned operator()(float x) const {
    if (x != x) return 0;  // NaN: the search goes down every step
    uint32_t bits;  // std::bit_cast, which nvcc's C++17 lacks (this header is also the kernels')
    std::memcpy(&bits, &x, sizeof bits);
    const int first = first_[bits >> 19];
    int k = first;
    for (int i = 0; i < kSpan; ++i) k += padded_[std::size_t(first + i)] < x ? 1 : 0;
    // k = 0 and 256 (below or above the whole map) give 0 and 255: mid_[0] = -inf, mid_[256] = +inf
    // and clamping k - 1. Selects, not branches: which side of the midpoint is a coin flip.
    const float m = mid_[std::size_t(k)];
    const unsigned lower = unsigned(k > 0 ? k - 1 : 0), upper = unsigned(k < 256 ? k : 255);
    const unsigned code = x > m ? upper : lower;
    return x == m ? tie_[std::size_t(k)] : code;
  }

 private:
  std::array<float, 256 + kSpan> padded_{};  // the map, then +inf
  std::array<float, 257> mid_{};             // (code[k-1] + code[k]) * 0.5f, as the search computes it
  std::array<uint8_t, 257> tie_{};           // the search's code for x == mid_[k]
  std::array<uint16_t, 8192> first_{};       // per bucket: map values below every float in it
};

}  // namespace shardlm::ops
