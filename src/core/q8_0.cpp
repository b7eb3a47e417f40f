#include "core/q8_0.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/float_bits.h"

namespace shardlm {

int64_t q8_0_bytes(int64_t n) {
  SHARDLM_CHECK(n % kQ8_0Block == 0, "Q8_0 needs a multiple of {} elements, not {}", kQ8_0Block, n);
  return n / kQ8_0Block * kQ8_0BlockBytes;
}

void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  SHARDLM_CHECK(n % kQ8_0Block == 0, "Q8_0 needs a multiple of {} elements, not {}", kQ8_0Block, n);
  for (int64_t b = 0; b < n / kQ8_0Block; ++b) {
    const float* xb = x + b * kQ8_0Block;
    uint8_t* ob = out + b * kQ8_0BlockBytes;
    float amax = 0;
    for (int64_t j = 0; j < kQ8_0Block; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    if (!std::isfinite(amax))
      throw Error(fmt::format("a non-finite value among elements {}..{}: Q8_0 cannot store it", b * kQ8_0Block,
                              b * kQ8_0Block + kQ8_0Block - 1));
    // The scale is computed and applied in f32 and only stored rounded to f16, as ggml's reference
    // quantizer (quantize_row_q8_0_ref) does, so the bits equal llama.cpp's own.
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = bits::f32_to_f16(std::bit_cast<uint32_t>(d));
    std::memcpy(ob, &dh, 2);
    for (int64_t j = 0; j < kQ8_0Block; ++j) ob[2 + j] = uint8_t(int8_t(std::roundf(xb[j] * id)));
  }
}

void dequantize_q8_0(const uint8_t* q, int64_t n, float* out) {
  SHARDLM_CHECK(n % kQ8_0Block == 0, "Q8_0 needs a multiple of {} elements, not {}", kQ8_0Block, n);
  for (int64_t b = 0; b < n / kQ8_0Block; ++b) {
    const uint8_t* qb = q + b * kQ8_0BlockBytes;
    const float d = q8_0_scale(qb);
    for (int64_t j = 0; j < kQ8_0Block; ++j) out[b * kQ8_0Block + j] = d * float(int8_t(qb[2 + j]));
  }
}

}  // namespace shardlm
