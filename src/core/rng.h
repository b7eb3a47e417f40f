// Counter-based random numbers (Philox 4x32-10).
//
// A value depends only on (seed, stream, index): element i of tensor "name" under seed s is the
// same number whichever rank computes it and however the tensor is sharded. That is what lets
// every rank initialize only its own shard and still agree with a single-process run.
//
// The generator and rng_uniform are defined here, inline, for host and device code alike
// (SHARDLM_HOST_DEVICE, core/float_bits.h: __host__ __device__ under nvcc, plain inline for the
// host compiler). CUDA kernels (ops/cuda) call the same functions, so a number drawn on the GPU
// is the CPU's bit for bit: integer arithmetic, and one exact f32 scaling.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "core/float_bits.h"

namespace shardlm {

namespace rng_detail {

// Philox4x32-10 on raw words: c is the 128-bit counter, (k0, k1) the key; c is replaced by the
// 4 x 32 random bits. The multiplies are 32 x 32 -> 64 bits, the same on every platform.
SHARDLM_HOST_DEVICE void philox4x32_10(uint32_t (&c)[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c[0];
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += 0x9E3779B9u;  // the Weyl sequence of the key schedule
    k1 += 0xBB67AE85u;
  }
}

// The draw for element `index` of `stream` under `seed`: counter (index, stream), key seed.
SHARDLM_HOST_DEVICE void draw(uint32_t (&r)[4], uint64_t seed, uint64_t stream, uint64_t index) {
  r[0] = uint32_t(index);
  r[1] = uint32_t(index >> 32);
  r[2] = uint32_t(stream);
  r[3] = uint32_t(stream >> 32);
  philox4x32_10(r, uint32_t(seed), uint32_t(seed >> 32));
}

// The top 24 bits as a float in [0, 1): exact (an integer below 2^24 times 2^-24).
SHARDLM_HOST_DEVICE float to_unit(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }

}  // namespace rng_detail

// The raw generator: 4 x 32 random bits for a 128-bit counter and a 64-bit key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// 64-bit FNV-1a: turns a tensor name into a stream id.
uint64_t stream_id(std::string_view name);

// Uniform in [0, 1) with 24 random bits (a multiple of 2^-24), for element `index`. Host and
// device (ops::dropout draws its mask with it on either).
SHARDLM_HOST_DEVICE float rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t r[4];
  rng_detail::draw(r, seed, stream, index);
  return rng_detail::to_unit(r[0]);
}

// Standard normal (Box-Muller, in double) for element `index`. Host only.
float rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

// Fill out[0..n) with elements [first, first + n) of the named stream: N(mean, std) or U[lo, hi).
void fill_normal(float* out, int64_t n, uint64_t seed, std::string_view name, uint64_t first,
                 float mean, float std);
void fill_uniform(float* out, int64_t n, uint64_t seed, std::string_view name, uint64_t first,
                  float lo, float hi);

}  // namespace shardlm
