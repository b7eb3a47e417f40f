// Bytes the server has read from a TCP socket, for its per-request byte budget (infer/server.cpp).
// Apart because the field is in Linux's <linux/tcp.h>, which cannot be included beside glibc's
// <netinet/tcp.h> (cpp-httplib's), whose struct tcp_info lacks it.
#pragma once

#include <cstdint>
#include <optional>

namespace shardlm::infer {

// The bytes this process has read from the socket: tcpi_bytes_received less those still waiting
// in the kernel's receive queue (which cost the process no memory). Bytes arriving during the call
// can only make it smaller. nullopt when it is not a TCP socket (or the kernel is older than
// Linux 4.1).
std::optional<uint64_t> tcp_bytes_read(int fd);

}  // namespace shardlm::infer
