// Bytes a TCP socket has received, for the server's per-request byte budget (infer/server.cpp).
// Apart because the field is in Linux's <linux/tcp.h>, which cannot be included beside glibc's
// <netinet/tcp.h> (cpp-httplib's), whose struct tcp_info lacks it.
#pragma once

#include <cstdint>
#include <optional>

namespace shardlm::infer {

// tcpi_bytes_received of the socket, or nullopt when it is not a TCP socket (or the kernel is
// older than Linux 4.1).
std::optional<uint64_t> tcp_bytes_received(int fd);

}  // namespace shardlm::infer
