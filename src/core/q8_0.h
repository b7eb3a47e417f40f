// Q8_0, ggml's 8-bit block format: what `shardlm export --format gguf --type q8_0` writes
// (io/gguf.h) and what `generate --dtype q8_0` holds the decoder's Linear weights in
// (infer/param_store.h, ops::matmul_q8_0). One definition for both, so a weight generated from here
// has the bits llama.cpp would load.
//
// Blocks of 32 consecutive elements of a row, each stored as an f16 scale d = max|x| / 127 followed
// by 32 int8 q = round(x / d) (half away from zero; all 0 when d is 0), so x ~ d * q. A row of K
// elements (K a multiple of 32) is K / 32 * 34 bytes. A dequantized value d * q (an 11-bit scale
// times an 8-bit integer) is exact in f32.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/float_bits.h"

namespace shardlm {

inline constexpr int64_t kQ8_0Block = 32;
inline constexpr int64_t kQ8_0BlockBytes = 2 + kQ8_0Block;

// Bytes of n elements (n a multiple of 32; an Error otherwise).
int64_t q8_0_bytes(int64_t n);
// Quantizes n f32 values (n a multiple of 32) into n / 32 blocks at `out`. A non-finite value is an
// Error naming its block's elements.
void quantize_q8_0(const float* x, int64_t n, uint8_t* out);
// The scale d of the block at `block` (its first 2 bytes, an f16), as f32: by F16C where the build
// has it (the decode kernel reads one per 32 weights).
inline float q8_0_scale(const uint8_t* block) {
  uint16_t h;
  std::memcpy(&h, block, 2);
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return std::bit_cast<float>(bits::f16_to_f32(h));
#endif
}
// The n values the blocks at `q` stand for, d * q each, into `out`.
void dequantize_q8_0(const uint8_t* q, int64_t n, float* out);

}  // namespace shardlm
