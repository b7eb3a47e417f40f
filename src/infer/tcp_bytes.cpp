#include "infer/tcp_bytes.h"

#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstddef>

namespace shardlm::infer {

std::optional<uint64_t> tcp_bytes_read(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  if (len < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) return std::nullopt;
  // Queued after the count above: what arrives in between is counted as unread, never as read.
  int queued = 0;
  if (ioctl(fd, SIOCINQ, &queued) != 0 || queued < 0) return std::nullopt;
  return info.tcpi_bytes_received > uint64_t(queued) ? info.tcpi_bytes_received - uint64_t(queued) : 0;
}

}  // namespace shardlm::infer
