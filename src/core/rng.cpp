#include "core/rng.h"

#include <cmath>

namespace shardlm {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

inline std::array<uint32_t, 4> draw(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32({uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                    {uint32_t(seed), uint32_t(seed >> 32)});
}

inline float to_unit(uint32_t bits) { return float(bits >> 8) * (1.0f / 16777216.0f); }  // [0, 1)

inline float box_muller(uint32_t a, uint32_t b) {
  // u1 in (0, 1] so the log is finite; computed in double so every platform agrees closely.
  const double u1 = (double(a) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = double(b) * (1.0 / 4294967296.0);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
}  // namespace

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

uint64_t stream_id(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

float rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return to_unit(draw(seed, stream, index)[0]);
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const auto r = draw(seed, stream, index);
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
