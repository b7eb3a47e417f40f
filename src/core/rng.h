// Counter-based random numbers (Philox 4x32-10).
//
// A value depends only on (seed, stream, index): element i of tensor "name" under seed s is the
// same number whichever rank computes it and however the tensor is sharded. That is what lets
// every rank initialize only its own shard and still agree with a single-process run.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace shardlm {

// The raw generator: 4 x 32 random bits for a 128-bit counter and a 64-bit key.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// 64-bit FNV-1a: turns a tensor name into a stream id.
uint64_t stream_id(std::string_view name);

// Uniform in [0, 1) with 24 random bits, and standard normal (Box-Muller), for element `index`.
float rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
float rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

// Fill out[0..n) with elements [first, first + n) of the named stream: N(mean, std) or U[lo, hi).
void fill_normal(float* out, int64_t n, uint64_t seed, std::string_view name, uint64_t first,
                 float mean, float std);
void fill_uniform(float* out, int64_t n, uint64_t seed, std::string_view name, uint64_t first,
                  float lo, float hi);

}  // namespace shardlm
