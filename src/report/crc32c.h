// CRC-32C (Castagnoli), the checksum TFRecord framing uses, and TFRecord's "masked" form of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardlm::report {

// CRC-32C of `n` bytes, continuing from `crc` (0 to start): crc32c(b, crc32c(a)) == crc32c(a + b).
// The reflected polynomial 0x82F63B78 (iSCSI, RFC 3720), initial value and final xor 0xFFFFFFFF.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view s, uint32_t crc = 0) { return crc32c(s.data(), s.size(), crc); }

// TFRecord stores CRCs rotated right by 15 bits plus a constant, because a CRC of data that itself
// contains CRCs is weak (TensorFlow's lib/hash/crc32c.h describes the reason).
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline uint32_t masked_crc32c(std::string_view s) { return mask_crc(crc32c(s)); }

}  // namespace shardlm::report
