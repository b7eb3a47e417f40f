#include "core/rng.h"

#include <cmath>

namespace shardlm {

namespace {
inline float box_muller(uint32_t a, uint32_t b) {
  // u1 in (0, 1] so the log is finite; computed in double so every platform agrees closely.
  const double u1 = (double(a) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = double(b) * (1.0 / 4294967296.0);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
}  // namespace

// The generator itself is rng_detail::philox4x32_10 (core/rng.h), shared with device code.
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  uint32_t r[4] = {c[0], c[1], c[2], c[3]};
  rng_detail::philox4x32_10(r, k[0], k[1]);
  return {r[0], r[1], r[2], r[3]};
}

uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t r[4];
  rng_detail::draw(r, seed, stream, index);
  return box_muller(r[0], r[1]);
}

void fill_normal(float* out, int64_t n, uint64_t seed, std::string_view name, uint64_t first,
                 float mean, float std) {
  const uint64_t s = stream_id(name);
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) out[i] = mean + std * rng_normal(seed, s, first + uint64_t(i));
}

void fill_uniform(float* out, int64_t n, uint64_t seed, std::string_view name, uint64_t first,
                  float lo, float hi) {
  const uint64_t s = stream_id(name);
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) out[i] = lo + (hi - lo) * rng_uniform(seed, s, first + uint64_t(i));
}

}  // namespace shardlm
