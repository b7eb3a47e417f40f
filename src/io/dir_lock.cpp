#include "io/dir_lock.h"

#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/platform.h"

namespace shardlm::io {

namespace fs = std::filesystem;

namespace {
// What the holder wrote, on one line; "" when it has not written yet (it locks, then writes).
std::string holder_of(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  std::string s(buf, size_t(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s.substr(0, s.find('\n'));
}
}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& role) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create {}: {}", role, ec.message())).set_file(dir);
  const std::string path = (fs::path(dir) / kDirLockName).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("cannot open the lock of {}: {}", role, std::strerror(errno))).set_file(path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = holder_of(fd);
    ::close(fd);
    if (err == EWOULDBLOCK)
      throw Error(fmt::format("{} is in use by another run ({}); wait for it to end or choose another {}", role,
                              holder.empty() ? "a process that is just starting" : holder, role))
          .set_file(dir);
    throw Error(fmt::format("cannot lock {}: {}", role, std::strerror(err))).set_file(path);
  }
  fd_ = fd;
  const std::string me = fmt::format("pid {} on host {}, since {:%Y-%m-%d %H:%M:%S} UTC\n", ::getpid(), host_name(),
                                     fmt::gmtime(std::time(nullptr)));
  // Best effort: the lock is what protects; the text only explains.
  if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor drops the flock
}

DirLock::DirLock(DirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

}  // namespace shardlm::io
