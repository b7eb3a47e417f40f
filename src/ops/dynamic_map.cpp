// bitsandbytes' two 8-bit dynamic maps, as exact hex floats computed by
// tests/torch_ref/nf4_reference.py with torch's float32 linspace, as bitsandbytes builds them
// (Parity.Nf4DynamicMap and Parity.Quant8Blockwise compare them with that computation).
#include "ops/dynamic_map.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"

namespace shardlm::ops {

const std::array<float, 256> kDynamicMapSigned = {
    -0x1.fc6666p-1f, -0x1.f53332p-1f, -0x1.eep-1f, -0x1.e6ccccp-1f,
    -0x1.df9998p-1f, -0x1.d86666p-1f, -0x1.d13334p-1f, -0x1.cap-1f,
    -0x1.c2ccccp-1f, -0x1.bb9998p-1f, -0x1.b46666p-1f, -0x1.ad3332p-1f,
    -0x1.a6p-1f, -0x1.9eccccp-1f, -0x1.979998p-1f, -0x1.906666p-1f,
    -0x1.893334p-1f, -0x1.82p-1f, -0x1.7acccep-1f, -0x1.73999ap-1f,
    -0x1.6c6668p-1f, -0x1.653334p-1f, -0x1.5ep-1f, -0x1.56cccep-1f,
    -0x1.4f999ap-1f, -0x1.486666p-1f, -0x1.413334p-1f, -0x1.3ap-1f,
    -0x1.32ccccp-1f, -0x1.2b999ap-1f, -0x1.246668p-1f, -0x1.1d3334p-1f,
    -0x1.16p-1f, -0x1.0eccccp-1f, -0x1.07999ap-1f, -0x1.006666p-1f,
    -0x1.f26668p-2f, -0x1.e4p-2f, -0x1.d59998p-2f, -0x1.c73334p-2f,
    -0x1.b8ccccp-2f, -0x1.aa6664p-2f, -0x1.9cp-2f, -0x1.8d9998p-2f,
    -0x1.7f3334p-2f, -0x1.70ccccp-2f, -0x1.626664p-2f, -0x1.54p-2f,
    -0x1.459998p-2f, -0x1.373334p-2f, -0x1.28ccccp-2f, -0x1.1a6668p-2f,
    -0x1.0cp-2f, -0x1.fb3334p-3f, -0x1.de6668p-3f, -0x1.c1999ap-3f,
    -0x1.a4ccccp-3f, -0x1.88p-3f, -0x1.6b3332p-3f, -0x1.4e6666p-3f,
    -0x1.31999ap-3f, -0x1.14ccccp-3f, -0x1.fp-4f, -0x1.b66668p-4f,
    -0x1.93d70ap-4f, -0x1.8851eap-4f, -0x1.7ccccep-4f, -0x1.7147aep-4f,
    -0x1.65c290p-4f, -0x1.5a3d70p-4f, -0x1.4eb850p-4f, -0x1.433334p-4f,
    -0x1.37ae14p-4f, -0x1.2c28f6p-4f, -0x1.20a3d6p-4f, -0x1.151ebap-4f,
    -0x1.09999ap-4f, -0x1.fc28f4p-5f, -0x1.e51ebap-5f, -0x1.ce147ap-5f,
    -0x1.b70a3ep-5f, -0x1.ap-5f, -0x1.88f5c2p-5f, -0x1.71eb86p-5f,
    -0x1.5ae146p-5f, -0x1.43d70ap-5f, -0x1.2ccccep-5f, -0x1.15c28ep-5f,
    -0x1.fd70a4p-6f, -0x1.cf5c26p-6f, -0x1.a147aep-6f, -0x1.733334p-6f,
    -0x1.451eb8p-6f, -0x1.170a3ep-6f, -0x1.d1eb86p-7f, -0x1.75c290p-7f,
    -0x1.3e76c8p-7f, -0x1.2c0830p-7f, -0x1.19999ap-7f, -0x1.072b02p-7f,
    -0x1.e978d4p-8f, -0x1.c49ba6p-8f, -0x1.9fbe76p-8f, -0x1.7ae148p-8f,
    -0x1.56041ap-8f, -0x1.3126e8p-8f, -0x1.0c49bap-8f, -0x1.ced914p-9f,
    -0x1.851eb8p-9f, -0x1.3b645ap-9f, -0x1.e353f8p-10f, -0x1.4fdf3ap-10f,
    -0x1.eecbfep-11f, -0x1.b3d07cp-11f, -0x1.78d5p-11f, -0x1.3dd982p-11f,
    -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f,
    -0x1.040bfep-17f, -0x1.b43528p-19f, -0x1.27476ep-21f, 0.0f,
    0x1.27476ep-21f, 0x1.b43528p-19f, 0x1.040bfep-17f, 0x1.64840cp-16f,
    0x1.6f0068p-15f, 0x1.15df66p-14f, 0x1.743e96p-14f, 0x1.47ae16p-13f,
    0x1.19ce0ap-12f, 0x1.8fc506p-12f, 0x1.02de02p-11f, 0x1.3dd982p-11f,
    0x1.78d5p-11f, 0x1.b3d07cp-11f, 0x1.eecbfep-11f, 0x1.4fdf3ap-10f,
    0x1.e353f8p-10f, 0x1.3b645ap-9f, 0x1.851eb8p-9f, 0x1.ced914p-9f,
    0x1.0c49bap-8f, 0x1.3126e8p-8f, 0x1.56041ap-8f, 0x1.7ae148p-8f,
    0x1.9fbe76p-8f, 0x1.c49ba6p-8f, 0x1.e978d4p-8f, 0x1.072b02p-7f,
    0x1.19999ap-7f, 0x1.2c0830p-7f, 0x1.3e76c8p-7f, 0x1.75c290p-7f,
    0x1.d1eb86p-7f, 0x1.170a3ep-6f, 0x1.451eb8p-6f, 0x1.733334p-6f,
    0x1.a147aep-6f, 0x1.cf5c26p-6f, 0x1.fd70a4p-6f, 0x1.15c28ep-5f,
    0x1.2ccccep-5f, 0x1.43d70ap-5f, 0x1.5ae146p-5f, 0x1.71eb86p-5f,
    0x1.88f5c2p-5f, 0x1.ap-5f, 0x1.b70a3ep-5f, 0x1.ce147ap-5f,
    0x1.e51ebap-5f, 0x1.fc28f4p-5f, 0x1.09999ap-4f, 0x1.151ebap-4f,
    0x1.20a3d6p-4f, 0x1.2c28f6p-4f, 0x1.37ae14p-4f, 0x1.433334p-4f,
    0x1.4eb850p-4f, 0x1.5a3d70p-4f, 0x1.65c290p-4f, 0x1.7147aep-4f,
    0x1.7ccccep-4f, 0x1.8851eap-4f, 0x1.93d70ap-4f, 0x1.b66668p-4f,
    0x1.fp-4f, 0x1.14ccccp-3f, 0x1.31999ap-3f, 0x1.4e6666p-3f,
    0x1.6b3332p-3f, 0x1.88p-3f, 0x1.a4ccccp-3f, 0x1.c1999ap-3f,
    0x1.de6668p-3f, 0x1.fb3334p-3f, 0x1.0cp-2f, 0x1.1a6668p-2f,
    0x1.28ccccp-2f, 0x1.373334p-2f, 0x1.459998p-2f, 0x1.54p-2f,
    0x1.626664p-2f, 0x1.70ccccp-2f, 0x1.7f3334p-2f, 0x1.8d9998p-2f,
    0x1.9cp-2f, 0x1.aa6664p-2f, 0x1.b8ccccp-2f, 0x1.c73334p-2f,
    0x1.d59998p-2f, 0x1.e4p-2f, 0x1.f26668p-2f, 0x1.006666p-1f,
    0x1.07999ap-1f, 0x1.0eccccp-1f, 0x1.16p-1f, 0x1.1d3334p-1f,
    0x1.246668p-1f, 0x1.2b999ap-1f, 0x1.32ccccp-1f, 0x1.3ap-1f,
    0x1.413334p-1f, 0x1.486666p-1f, 0x1.4f999ap-1f, 0x1.56cccep-1f,
    0x1.5ep-1f, 0x1.653334p-1f, 0x1.6c6668p-1f, 0x1.73999ap-1f,
    0x1.7acccep-1f, 0x1.82p-1f, 0x1.893334p-1f, 0x1.906666p-1f,
    0x1.979998p-1f, 0x1.9eccccp-1f, 0x1.a6p-1f, 0x1.ad3332p-1f,
    0x1.b46666p-1f, 0x1.bb9998p-1f, 0x1.c2ccccp-1f, 0x1.cap-1f,
    0x1.d13334p-1f, 0x1.d86666p-1f, 0x1.df9998p-1f, 0x1.e6ccccp-1f,
    0x1.eep-1f, 0x1.f53332p-1f, 0x1.fc6666p-1f, 0x1.p+0f};

const std::array<float, 256> kDynamicMapUnsigned = {
    0.0f, 0x1.5cf754p-22f, 0x1.a0133p-21f, 0x1.1d367p-19f,
    0x1.2599ecp-18f, 0x1.bc98a2p-18f, 0x1.29cbaap-17f, 0x1.0624dcp-16f,
    0x1.c2e34p-16f, 0x1.3fd0dp-15f, 0x1.9e3p-15f, 0x1.fc8f34p-15f,
    0x1.2d7732p-14f, 0x1.5ca6c8p-14f, 0x1.8bd662p-14f, 0x1.0cb296p-13f,
    0x1.82a994p-13f, 0x1.f8a09p-13f, 0x1.374bc8p-12f, 0x1.724744p-12f,
    0x1.ad42c4p-12f, 0x1.e83e44p-12f, 0x1.119ce2p-11f, 0x1.2f1aap-11f,
    0x1.4c986p-11f, 0x1.6a162p-11f, 0x1.8793dep-11f, 0x1.a511ap-11f,
    0x1.c28f5ep-11f, 0x1.e00d1cp-11f, 0x1.fd8adcp-11f, 0x1.2b020cp-10f,
    0x1.74bc6ap-10f, 0x1.be76c8p-10f, 0x1.041892p-9f, 0x1.28f5c2p-9f,
    0x1.4dd2fp-9f, 0x1.72b01ep-9f, 0x1.978d4ep-9f, 0x1.bc6a7cp-9f,
    0x1.e147aep-9f, 0x1.03126ep-8f, 0x1.158104p-8f, 0x1.27ef9ep-8f,
    0x1.3a5e34p-8f, 0x1.4cccccp-8f, 0x1.5f3b64p-8f, 0x1.71a9fap-8f,
    0x1.841894p-8f, 0x1.968728p-8f, 0x1.a8f5c2p-8f, 0x1.bb645cp-8f,
    0x1.cdd2fp-8f, 0x1.e0418ap-8f, 0x1.f2b01ep-8f, 0x1.028f5cp-7f,
    0x1.0bc6a6p-7f, 0x1.14fdf2p-7f, 0x1.1e354p-7f, 0x1.276c8ap-7f,
    0x1.30a3d6p-7f, 0x1.39db2p-7f, 0x1.43126ep-7f, 0x1.5eb854p-7f,
    0x1.8ccccep-7f, 0x1.bae146p-7f, 0x1.e8f5c4p-7f, 0x1.0b851ep-6f,
    0x1.228f5cp-6f, 0x1.39999ap-6f, 0x1.50a3d6p-6f, 0x1.67ae16p-6f,
    0x1.7eb854p-6f, 0x1.95c29p-6f, 0x1.accccep-6f, 0x1.c3d70ep-6f,
    0x1.dae146p-6f, 0x1.f1eb86p-6f, 0x1.047aep-5f, 0x1.1p-5f,
    0x1.1b851ep-5f, 0x1.270a3ep-5f, 0x1.328f5ep-5f, 0x1.3e147ap-5f,
    0x1.49999ap-5f, 0x1.551eb6p-5f, 0x1.60a3d6p-5f, 0x1.6c28f6p-5f,
    0x1.77ae14p-5f, 0x1.833334p-5f, 0x1.8eb854p-5f, 0x1.9a3d7p-5f,
    0x1.a5c29p-5f, 0x1.b147aep-5f, 0x1.bccccep-5f, 0x1.c851eep-5f,
    0x1.d3d70ep-5f, 0x1.df5c2ap-5f, 0x1.eae146p-5f, 0x1.f66666p-5f,
    0x1.00f5c4p-4f, 0x1.06b852p-4f, 0x1.0c7ae2p-4f, 0x1.123d72p-4f,
    0x1.18p-4f, 0x1.1dc29p-4f, 0x1.23852p-4f, 0x1.2947aep-4f,
    0x1.2f0a3ep-4f, 0x1.34cccep-4f, 0x1.3a8f5ep-4f, 0x1.4051ecp-4f,
    0x1.46147ap-4f, 0x1.4bd70ap-4f, 0x1.51999ap-4f, 0x1.575c28p-4f,
    0x1.5d1eb8p-4f, 0x1.62e146p-4f, 0x1.68a3d6p-4f, 0x1.6e6666p-4f,
    0x1.7428f6p-4f, 0x1.79eb86p-4f, 0x1.7fae14p-4f, 0x1.8570a4p-4f,
    0x1.8b3334p-4f, 0x1.90f5c2p-4f, 0x1.96b852p-4f, 0x1.a8p-4f,
    0x1.c4ccccp-4f, 0x1.e1999ap-4f, 0x1.fe6666p-4f, 0x1.0d9998p-3f,
    0x1.1cp-3f, 0x1.2a6668p-3f, 0x1.38ccccp-3f, 0x1.473334p-3f,
    0x1.559998p-3f, 0x1.64p-3f, 0x1.726668p-3f, 0x1.80ccccp-3f,
    0x1.8f3334p-3f, 0x1.9d9998p-3f, 0x1.acp-3f, 0x1.ba6668p-3f,
    0x1.c8ccccp-3f, 0x1.d73334p-3f, 0x1.e5999cp-3f, 0x1.f4p-3f,
    0x1.013334p-2f, 0x1.086666p-2f, 0x1.0f999ap-2f, 0x1.16cccep-2f,
    0x1.1ep-2f, 0x1.253334p-2f, 0x1.2c6668p-2f, 0x1.33999ap-2f,
    0x1.3acccep-2f, 0x1.42p-2f, 0x1.493334p-2f, 0x1.506666p-2f,
    0x1.579998p-2f, 0x1.5eccccp-2f, 0x1.66p-2f, 0x1.6d3332p-2f,
    0x1.746666p-2f, 0x1.7b9998p-2f, 0x1.82ccccp-2f, 0x1.8ap-2f,
    0x1.913334p-2f, 0x1.986666p-2f, 0x1.9f9998p-2f, 0x1.a6ccccp-2f,
    0x1.aep-2f, 0x1.b53332p-2f, 0x1.bc6666p-2f, 0x1.c3999ap-2f,
    0x1.caccccp-2f, 0x1.d2p-2f, 0x1.d93334p-2f, 0x1.e06666p-2f,
    0x1.e7999ap-2f, 0x1.eeccccp-2f, 0x1.f6p-2f, 0x1.fd3332p-2f,
    0x1.023334p-1f, 0x1.05ccccp-1f, 0x1.096664p-1f, 0x1.0dp-1f,
    0x1.109998p-1f, 0x1.143334p-1f, 0x1.17ccccp-1f, 0x1.1b6668p-1f,
    0x1.1fp-1f, 0x1.22999ap-1f, 0x1.263334p-1f, 0x1.29ccccp-1f,
    0x1.2d6668p-1f, 0x1.31p-1f, 0x1.34999ap-1f, 0x1.383334p-1f,
    0x1.3bccccp-1f, 0x1.3f6666p-1f, 0x1.43p-1f, 0x1.469998p-1f,
    0x1.4a3334p-1f, 0x1.4dccccp-1f, 0x1.516668p-1f, 0x1.55p-1f,
    0x1.58999cp-1f, 0x1.5c3334p-1f, 0x1.5fccccp-1f, 0x1.636668p-1f,
    0x1.67p-1f, 0x1.6a999cp-1f, 0x1.6e3334p-1f, 0x1.71ccccp-1f,
    0x1.756668p-1f, 0x1.79p-1f, 0x1.7c9998p-1f, 0x1.803334p-1f,
    0x1.83ccccp-1f, 0x1.876668p-1f, 0x1.8bp-1f, 0x1.8e9998p-1f,
    0x1.923334p-1f, 0x1.95ccccp-1f, 0x1.996664p-1f, 0x1.9dp-1f,
    0x1.a09998p-1f, 0x1.a43334p-1f, 0x1.a7ccccp-1f, 0x1.ab6668p-1f,
    0x1.afp-1f, 0x1.b2999ap-1f, 0x1.b63334p-1f, 0x1.b9ccccp-1f,
    0x1.bd6668p-1f, 0x1.c1p-1f, 0x1.c4999ap-1f, 0x1.c83334p-1f,
    0x1.cbccccp-1f, 0x1.cf6666p-1f, 0x1.d3p-1f, 0x1.d69998p-1f,
    0x1.da3334p-1f, 0x1.ddccccp-1f, 0x1.e16668p-1f, 0x1.e5p-1f,
    0x1.e8999cp-1f, 0x1.ec3334p-1f, 0x1.efccccp-1f, 0x1.f36668p-1f,
    0x1.f7p-1f, 0x1.fa999cp-1f, 0x1.fe3334p-1f, 0x1p0f};

DynamicCoder::DynamicCoder(const float* code) {
  std::copy(code, code + 256, padded_.begin());
  std::fill(padded_.begin() + 256, padded_.end(), INFINITY);
  for (int k = 1; k < 256; ++k) {
    mid_[size_t(k)] = (code[k - 1] + code[k]) * 0.5f;
    tie_[size_t(k)] = uint8_t(dynamic_code(mid_[size_t(k)], code));
  }
  mid_[0] = -INFINITY;  // k = 0: x > -inf picks code 0 (x is not NaN, and -inf itself ties to 0)
  mid_[256] = INFINITY;  // k = 256: x > code[255] and below +inf, or +inf itself: code 255
  tie_[0] = 0;
  tie_[256] = 255;
  auto below = [&](float v) { return int(std::lower_bound(code, code + 256, v) - code); };  // count of code < v
  for (uint32_t b = 0; b < 8192; ++b) {
    const float lo_end = std::bit_cast<float>(b << 19), hi_end = std::bit_cast<float>((b << 19) | 0x7FFFFu);
    // Exponent all ones: ±inf at the bucket's start, then NaNs (which never reach the count).
    if (std::isnan(hi_end)) {
      first_[b] = uint16_t(below(lo_end));
      continue;
    }
    const float lo = std::min(lo_end, hi_end), hi = std::max(lo_end, hi_end);
    const int first = below(lo), last = below(hi);  // x in [lo, hi]: first <= count(code < x) <= last
    SHARDLM_CHECK(last - first <= kSpan, "dynamic map: {} values within one bucket (at most {})", last - first, kSpan);
    first_[b] = uint16_t(first);
  }
}

}  // namespace shardlm::ops
