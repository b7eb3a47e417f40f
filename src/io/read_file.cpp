#include "io/read_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/alloc.h"

namespace shardlm::io {

std::string read_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // O_NONBLOCK: a FIFO must not block the open
  if (fd < 0) throw Error(fmt::format("cannot open the {}: {}", what, std::strerror(errno)), {.file = path});
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(fmt::format("cannot stat the {}: {}", what, std::strerror(errno)), {.file = path});
  if (S_ISDIR(st.st_mode)) throw Error(fmt::format("is a directory, not a {}", what), {.file = path});
  if (!S_ISREG(st.st_mode)) throw Error(fmt::format("is not a regular file (a device or a pipe?), so not a {}", what), {.file = path});
  if (uint64_t(st.st_size) > max_bytes)
    throw Error(fmt::format("the {} is {}, above the {} a file may have", what, format_bytes(int64_t(st.st_size)),
                            format_bytes(int64_t(max_bytes))),
                {.file = path});
  std::string out(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(fmt::format("cannot read the {}: {}", what, std::strerror(errno)), {.file = path});
    if (n == 0) break;  // it shrank while being read
    got += size_t(n);
  }
  out.resize(got);
  return out;
}

}  // namespace shardlm::io
